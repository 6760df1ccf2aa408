"""Fusion-aware freezing (issue 19): what `mp_rewrite.rules.canonicalize` buys, float32 and bfloat16, side by side.

For each model, four variants of one frozen graph (weights folded, Grappler's constant folding as `--freeze` does):
  f32         the frozen float32 graph
  f32+rules   the same after canonicalize (rewritten into the patterns TF's CPU remapper fuses)
  bf16        f32 rewritten by mp_rewrite.rewrite_graph_def(..., precision="bfloat16"), constant Casts folded
  bf16+rules  f32+rules rewritten the same way
Each is a ConcreteFunction (TF runs its Grappler, remapper included, before the first call). Calls are interleaved:
every round times a block of calls of each variant in turn; the medians of CPU time and wall time per call are
reported, with the ratio to f32. Also printed: the ops TF executed per call (run metadata): fused contractions,
Casts, all nodes.

    TF_ENABLE_ONEDNN_OPTS=1 python tools/bench_fusion.py [--models ffn,transformer,bert,gpt2] [--batches 8]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

VARIANTS = ("f32", "f32+rules", "bf16", "bf16+rules")


def ffn():
    """Keras 3 FFN: Dense(1024, gelu) -> Dense(256) on (128, 256) tokens."""
    import keras
    inp = keras.Input((128, 256), name="x")
    return keras.Model(inp, keras.layers.Dense(256)(keras.layers.Dense(1024, activation="gelu")(inp)))


def transformer():
    """The Transformer encoder of tools/bench_saved_model.py: 4 layers, d=256, 8 heads, sequence 128."""
    from mp_rewrite.testing.example_models import token_transformer
    return token_transformer()


def hub(name: str):
    """A keras-hub BERT or GPT-2 backbone from its constructor (random weights), the Transformer's size."""
    import keras_hub
    size = dict(vocabulary_size=8000, num_layers=4, num_heads=8, hidden_dim=256, intermediate_dim=1024,
                max_sequence_length=128)
    return (keras_hub.models.BertBackbone if name == "bert" else keras_hub.models.GPT2Backbone)(**size)


MODELS = {"ffn": ffn, "transformer": transformer, "bert": lambda: hub("bert"), "gpt2": lambda: hub("gpt2")}


def inputs_of(model) -> tuple[list, object]:
    """([(name, shape, dtype)], a function calling the model on positional tensors) for list or dict inputs."""
    import tensorflow as tf
    structure = model.input
    named = structure if isinstance(structure, dict) else {t.name: t for t in model.inputs}
    specs = [(name, tuple(t.shape), tf.as_dtype(t.dtype)) for name, t in named.items()]
    if isinstance(structure, dict):
        return specs, lambda *args: model(dict(zip(named, args)), training=False)
    return specs, lambda *args: model(list(args) if len(args) > 1 else args[0], training=False)


def example(specs, batch: int, rng) -> list:
    """Inputs for one call: token ids below 8000, an all-ones padding mask, zero segment ids, normal floats."""
    import tensorflow as tf
    values = []
    for name, shape, dtype in specs:
        full = (batch, *[d or 128 for d in shape[1:]])  # an unknown sequence length: 128
        if not dtype.is_integer:
            values.append(tf.constant(rng.normal(size=full), dtype))
        else:
            value = rng.integers(0, 8000, full) if "mask" not in name and "segment" not in name else (
                rng.integers(1, 2, full) if "mask" in name else rng.integers(0, 1, full))
            values.append(tf.constant(value, dtype))
    return values


def nonzero_biases(model):
    """Biases a trained model has (a zero bias is folded away by Grappler and its fusion cannot happen)."""
    import numpy as np
    rng = np.random.default_rng(0)
    for weight in model.weights:
        if weight.path.endswith("bias") or weight.path.endswith("beta"):
            weight.assign(rng.normal(0, 0.05, weight.shape).astype(np.float32))
    return model


def variants(model) -> tuple[dict, list, list]:
    """({variant: GraphDef}, fetches, input specs) for a model, frozen and folded as `--freeze` does."""
    import tensorflow as tf
    from tensorflow.python.framework import convert_to_constants

    from mp_rewrite import rewrite_graph_def
    from mp_rewrite.rules import canonicalize, fold_constant_casts
    from mp_rewrite.analysis.grappler import FOLDING, optimize_graph

    named, call = inputs_of(model)
    specs = [tf.TensorSpec(shape, dtype, name=name) for name, shape, dtype in named]
    function = tf.function(call)
    constant = convert_to_constants.convert_variables_to_constants_v2(function.get_concrete_function(*specs))
    fetches = [t.name for t in constant.outputs]
    feeds = [t.name for t in constant.inputs]
    f32 = optimize_graph(constant.graph.as_graph_def(), fetches, FOLDING)
    rules, records = canonicalize(f32, fetches)
    graphs = {"f32": f32, "f32+rules": rules}
    for name, source in (("bf16", f32), ("bf16+rules", rules)):
        low = rewrite_graph_def(source, "bfloat16", fetches).graph_def
        graphs[name] = fold_constant_casts(low, fetches)[0]
    return graphs, fetches, feeds, records


def callable_of(graph_def, feeds, fetches):
    import tensorflow as tf
    wrapped = tf.compat.v1.wrap_function(lambda: tf.graph_util.import_graph_def(graph_def, name=""), [])
    graph = wrapped.graph
    return wrapped.prune([graph.get_tensor_by_name(f) for f in feeds], [graph.get_tensor_by_name(f) for f in fetches])


def executed(function, inputs) -> dict:
    """{fused, casts, nodes}: what TF executed for one call (run metadata of the function's partitions)."""
    from mp_rewrite.analysis.execution import executed_nodes
    nodes = executed_nodes(function, *inputs)
    fused = [f"{n.op}[{','.join(s.decode() for s in n.attr['fused_ops'].list.s)}]" for n in nodes
             if n.op.startswith("_Fused") or n.op.startswith("_Mkl")]
    return {"fused": fused, "casts": sum(n.op == "Cast" for n in nodes), "nodes": len(nodes),
            "bf16 contractions": sum(any(k in n.op for k in ("MatMul", "Conv", "Einsum")) and n.attr["T"].type == 14
                                  for n in nodes)}


def measure(functions: dict, inputs, rounds: int, block_seconds: float) -> dict:
    """{variant: (median CPU ms per call, median wall ms per call)}, interleaved round by round."""
    for function in functions.values():  # warm up: Grappler and oneDNN primitive creation happen here
        for _ in range(3):
            function(*inputs)
    calls = {}
    for name, function in functions.items():
        start = time.perf_counter()
        function(*inputs)
        calls[name] = max(3, int(block_seconds / max(time.perf_counter() - start, 1e-5)))
    samples = {name: ([], []) for name in functions}
    for _ in range(rounds):
        for name, function in functions.items():
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(calls[name]):
                function(*inputs)
            samples[name][0].append((time.process_time() - cpu) / calls[name] * 1e3)
            samples[name][1].append((time.perf_counter() - wall) / calls[name] * 1e3)
    return {name: (statistics.median(c), statistics.median(w)) for name, (c, w) in samples.items()}


def machine() -> str:
    flags = open("/proc/cpuinfo").read()
    model = re.search(r"model name\s*:\s*(.*)", flags)
    bf16 = [f for f in ("avx512_bf16", "amx_bf16", "avx512f", "avx2") if re.search(rf"\b{f}\b", flags)]
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    return (f"CPU: {model.group(1) if model else platform.processor()} ({os.cpu_count()} cores), flags: "
            f"{' '.join(bf16)}; load average {load}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="ffn,transformer")
    parser.add_argument("--batches", default="8")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--block-seconds", type=float, default=0.25)
    args = parser.parse_args(argv)

    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras
    print(machine())
    print(f"TF {tf.__version__}, Keras {keras.__version__}, oneDNN {os.environ['TF_ENABLE_ONEDNN_OPTS']}, "
          "2 intra-op threads, 1 inter-op")
    for name in args.models.split(","):
        keras.utils.set_random_seed(0)
        model = nonzero_biases(MODELS[name]())
        graphs, fetches, feeds, records = variants(model)
        applied = {}
        for record in records:
            if record.applied:
                applied[record.rule] = applied.get(record.rule, 0) + 1
        declined = [str(r) for r in records if not r.applied]
        print(f"\n== {name}: rules applied {applied}; declined {len(declined)}")
        for line in declined[:5]:
            print("   ", line)
        for batch in map(int, args.batches.split(",")):
            rng = np.random.default_rng(0)
            inputs = example(inputs_of(model)[0], batch, rng)
            functions = {v: callable_of(graphs[v], feeds, fetches) for v in VARIANTS}
            reference = functions["f32"](*inputs)[0].numpy()
            times = measure(functions, inputs, args.rounds, args.block_seconds)
            print(f"-- batch {batch} (median of {args.rounds} interleaved rounds)")
            print(f"{'variant':<11} {'CPU ms':>8} {'x f32':>6} {'wall ms':>8} {'x f32':>6} {'max|diff|':>10}  executed")
            for variant in VARIANTS:
                cpu, wall = times[variant]
                diff = np.abs(functions[variant](*inputs)[0].numpy().astype(np.float32) - reference).max()
                # A fresh instance: run metadata holds a function's graphs only from its first (optimizing) call.
                ran = executed(callable_of(graphs[variant], feeds, fetches), inputs)
                kinds = {k: ran["fused"].count(k) for k in dict.fromkeys(ran["fused"])}
                print(f"{variant:<11} {cpu:8.2f} {times['f32'][0] / cpu:5.2f}x {wall:8.2f} {times['f32'][1] / wall:5.2f}x "
                      f"{diff:10.2g}  "
                      f"{ran['nodes']} nodes, {ran['casts']} Casts, bf16 contractions {ran['bf16 contractions']}, "
                      f"fused {kinds}")
    print(f"\nload average after: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
