"""Running variants of one model side by side, timed (a front end: this module runs TensorFlow).

Each variant -- a GraphDef, or a SavedModel directory -- runs in its own TF1 session configured as TF serves a
model (remapper and oneDNN fusions on, auto mixed precision off: the graph says its own dtypes), on the same
made-up inputs, in alternation, so that whatever else runs on the machine disturbs them alike. `traced_times`
reads each node's time from TF's step stats (analysis.graph_profile builds costs from them); `race` times whole
runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time

import numpy as np

WARMUP = 2  # untimed runs of each variant first (graph optimization, oneDNN primitive caches)


def made_up_values(specs, batch: int | None) -> list:
    """Random values for [(dtype enum, shape with None or -1 for unknown dimensions)]: floats in [0, 1), zeros for
    integers (a valid id for any embedding or table); an unknown dimension is `batch` (default 1)."""
    import tensorflow as tf
    rng = np.random.default_rng(0)
    values = []
    for dtype, shape in specs:
        dtype = tf.as_dtype(dtype)
        shape = [(1 if batch is None else batch) if d is None or d < 0 else d for d in shape]
        values.append(rng.uniform(0, 1, shape).astype(dtype.as_numpy_dtype) if dtype.is_floating
                      else np.zeros(shape, dtype.as_numpy_dtype))
    return values


class Runner:
    """One variant in its own session (feeds and fetches named as tensors, "x:0", or as nodes, "x")."""

    def __init__(self, session, feeds, fetches):
        from .execution import tensor_name
        graph = session.graph
        self.session = session
        self.feed_dict = {graph.get_tensor_by_name(tensor_name(k)): v for k, v in feeds.items()}
        self.fetches = [graph.get_tensor_by_name(tensor_name(f)) for f in fetches]

    @classmethod
    def of_graph(cls, graph_def, feeds, fetches) -> "Runner":
        import tensorflow as tf
        from .execution import session_config
        graph = tf.Graph()
        with graph.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
        return cls(tf.compat.v1.Session(graph=graph, config=session_config(fuse=True)), feeds, fetches)

    @classmethod
    def of_saved_model(cls, export_dir: str, tags, feeds, fetches) -> "Runner":
        import tensorflow as tf
        from tensorflow.python.util import deprecation
        from .execution import session_config
        session = tf.compat.v1.Session(graph=tf.Graph(), config=session_config(fuse=True))
        with session.graph.as_default(), deprecation.silence():  # the TF1 loader says to use tf.saved_model.load
            tf.compat.v1.saved_model.loader.load(session, tags, export_dir)
        return cls(session, feeds, fetches)

    def run(self, metadata=None) -> None:
        from tensorflow.core.protobuf import config_pb2
        options = config_pb2.RunOptions(trace_level=config_pb2.RunOptions.FULL_TRACE) if metadata else None
        self.session.run(self.fetches, self.feed_dict, options=options, run_metadata=metadata)


@contextlib.contextmanager
def opened(stack: list):
    """Close every Runner appended to `stack` on the way out."""
    try:
        yield stack
    finally:
        for runner in stack:
            runner.session.close()


def saved_model_copy(export_dir: str, meta_graph_def, directory: str) -> str:
    """Write into `directory` a SavedModel holding `meta_graph_def` whose variables and assets are links to
    `export_dir`'s (nothing is copied, nothing of `export_dir` is written)."""
    from tensorflow.core.protobuf import saved_model_pb2
    model = saved_model_pb2.SavedModel(saved_model_schema_version=1)
    model.meta_graphs.add().CopyFrom(meta_graph_def)
    with open(os.path.join(directory, "saved_model.pb"), "wb") as f:
        f.write(model.SerializeToString())
    for part in ("variables", "assets"):
        if os.path.isdir(os.path.join(export_dir, part)):
            shutil.copytree(os.path.join(export_dir, part), os.path.join(directory, part), copy_function=os.symlink)
    return directory


def traced_times(runners, runs: int, progress=None):
    """Per runner, {node name: median ms of its op in context}, and the wall ms of each traced run."""
    from tensorflow.core.protobuf import config_pb2
    samples = [{} for _ in runners]
    walls = [[] for _ in runners]
    for runner in runners:
        for _ in range(WARMUP):
            runner.run()
    for done in range(runs):
        for i, runner in enumerate(runners):
            metadata = config_pb2.RunMetadata()
            begin = time.perf_counter()
            runner.run(metadata)
            walls[i].append((time.perf_counter() - begin) * 1e3)
            for device in metadata.step_stats.dev_stats:
                for stat in device.node_stats:
                    ms = (stat.op_end_rel_micros - stat.op_start_rel_micros) / 1e3
                    samples[i].setdefault(stat.node_name.split(":")[0], []).append(ms)
        if progress is not None:
            progress(done + 1, runs)
    return [{name: float(np.median(ms)) for name, ms in s.items()} for s in samples], walls


def race(runners, runs: int) -> list[float]:
    """Median wall ms of one run of each runner (untraced), over `runs` alternated rounds after a warm-up."""
    for runner in runners:
        for _ in range(WARMUP):
            runner.run()
    walls = [[] for _ in runners]
    for _ in range(runs):
        for i, runner in enumerate(runners):
            begin = time.perf_counter()
            runner.run()
            walls[i].append((time.perf_counter() - begin) * 1e3)
    return [float(np.median(w)) for w in walls]
