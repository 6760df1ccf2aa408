"""A SavedModel run as TF2 serves it, and each node's time in one call (a front end: this module runs TensorFlow).

`SignatureRunner` loads a SavedModel with tf.saved_model.load and calls its signatures, as a user's server does;
analysis.graph_profile races the variants with it and, for a TF2 export, times their nodes with it. A TF1 session
gives step stats; a TF2 function call gives none (eager run metadata records the graphs of a function's first
call, not its kernels' times). TF's profiler does: each kernel the executor runs is an event named
"node:KernelType" on the thread that ran it. `traced_call` runs one call under the profiler and returns those
events as StepStats, the form analysis.graph_runs.traced_times and run_times.counted_once read, each node named as
a TF1 session names it (`prefix`: the main graph's call node of the signature, "StatefulPartitionedCall_1/",
before the name inside the signature's function). The profiler costs the call little (ResNet-50 at batch 8: 280
ms traced, 285 ms untraced), where a session's full trace slows a run by a third.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import tempfile
import time

NODE = re.compile(r"^([A-Za-z0-9.][A-Za-z0-9_.\-/>]*):([A-Za-z_][A-Za-z0-9_]*)$")  # "name:Type" of a kernel


def traced_call(call, prefix: str = "") -> tuple:
    """(StepStats of the kernels one `call()` ran, the call's wall ms without the profiler's start and export): a
    signature's or tf.function's call, each node named `prefix` + its name in the function (nested calls TF inlined
    under their call nodes' names, as a session names them)."""
    import tensorflow as tf
    from tensorflow.core.framework import step_stats_pb2
    from tensorflow.tsl.profiler.protobuf import xplane_pb2
    logdir = tempfile.mkdtemp(prefix="mp_rewrite_trace_")
    try:
        tf.profiler.experimental.start(logdir)
        try:
            begin = time.perf_counter()
            call()
            wall = (time.perf_counter() - begin) * 1e3
        finally:
            tf.profiler.experimental.stop()
        space = xplane_pb2.XSpace()
        for path in glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True):
            with open(path, "rb") as f:
                space.MergeFromString(f.read())
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    stats = step_stats_pb2.StepStats()
    device = stats.dev_stats.add(device="/host:CPU")
    for plane in space.planes:
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                match = NODE.match(names.get(event.metadata_id, ""))
                if match is None:
                    continue
                start = line.timestamp_ns + event.offset_ps // 1000
                nanos = event.duration_ps // 1000
                node = device.node_stats.add(node_name=prefix + match.group(1),
                                             timeline_label=f"{prefix}{match.group(1)} = {match.group(2)}()",
                                             all_start_nanos=start, op_end_rel_nanos=nanos, all_end_rel_nanos=nanos,
                                             all_start_micros=start // 1000)
                node.op_end_rel_micros = node.all_end_rel_micros = nanos // 1000
    return stats, wall


class SignatureRunner:
    """A SavedModel variant run as TF2 serves it: loaded with tf.saved_model.load, each signature in `signatures`
    ({key: {argument: input tensor name}}) called with the values `feeds` gives those names. A TF1 session of the
    same SavedModel is no stand-in for that: it inlines the signatures' functions without the shapes they were
    traced with, and TF's remapper then leaves a convolution's residual add and Relu unfused (ResNet-50's bfloat16
    at batch 32: 446 ms per run in a session, 220 ms served; float32 1118 ms in both).

    A traced run (`run(metadata)`) fills the RunMetadata's step stats from TF's profiler (traced_call),
    each node named as a TF1 session of the SavedModel names it: under `prefixes[key]`, the main graph's call node
    of the signature ("StatefulPartitionedCall_1/"). `kernels()` are those of the first call, which TF records as
    it builds the signatures' graphs."""

    def __init__(self, export_dir: str, tags, signatures: dict, feeds: dict, prefixes: dict | None = None):
        import tensorflow as tf
        self.loaded = tf.saved_model.load(export_dir, tags=list(tags))
        self.signatures, self.prefixes = signatures, prefixes or {}
        self.feed(feeds)
        self._kernels = None

    def feed(self, feeds) -> None:
        """Call on these inputs from now on ({input tensor name: value})."""
        import tensorflow as tf
        self.calls = [(key, self.loaded.signatures[key], {arg: tf.constant(feeds[name]) for arg, name in args.items()})
                      for key, args in self.signatures.items()]

    def run(self, metadata=None) -> float:
        """One call of each signature (traced into `metadata`'s step stats when given); returns their wall ms,
        without the profiler's own start and export."""
        begin = time.perf_counter()
        if self._kernels is None:  # the first call: TF records the graphs it builds
            self._kernels = self._first_kernels()
            if metadata is None:
                return (time.perf_counter() - begin) * 1e3
        took = 0.0
        for key, function, arguments in self.calls:
            if metadata is None:
                function(**arguments)
            else:
                stats, ms = traced_call(lambda: function(**arguments), self.prefixes.get(key, ""))
                metadata.step_stats.MergeFrom(stats)
                took += ms
        return took if metadata is not None else (time.perf_counter() - begin) * 1e3

    def kernels(self) -> dict:
        """{executed node name (as a session names it): kernel label} of the first call (run_times.kernel_label)."""
        if self._kernels is None:
            self._kernels = self._first_kernels()
        return self._kernels

    def _first_kernels(self) -> dict:
        from .execution import executed_nodes
        from .run_times import kernel_label
        return {self.prefixes.get(key, "") + node.name: kernel_label(node)
                for key, function, arguments in self.calls for node in executed_nodes(function, **arguments)}

    def close(self) -> None:
        self.loaded, self.calls = None, []
