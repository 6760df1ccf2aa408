"""Timing one op on this machine: K copies of the node in one `tf.function`, called a few times (a front end: this
module runs TensorFlow).

Why the copies carry a distinct `_mp_copy` attribute: TF's function runtime eliminates common subexpressions
before Grappler sees the graph, so K identical nodes on the same inputs would run once. The per-call overhead of a
`tf.function` (~0.2 ms here) is measured once per number of arguments and subtracted; K grows until the copies
take ~2 ms, so small elementwise ops are not lost in that overhead.
"""

from __future__ import annotations

import math
import time

import numpy as np

from tensorflow.core.framework import graph_pb2

TARGET_MS = 2.0  # what the copies of one op should take per call, so the call overhead is small beside them
MAX_COPIES = 64
CAST_SIZES = tuple(4 ** k for k in range(4, 13))  # 256 .. 16M elements


def input_dtypes(node) -> list:
    """The dtype enum of each data input of a NodeDef, from its OpDef and type attrs (None: not a data input)."""
    from tensorflow.python.framework import op_def_registry

    from ..core.op_support import attr_or_default  # never node.attr[...]: a map lookup would add an empty attr
    op_def = op_def_registry.get(node.op)
    found = []
    for arg in op_def.input_arg:
        count = attr_or_default(node, arg.number_attr).i if arg.number_attr else 1
        if arg.type_list_attr:
            found += list(attr_or_default(node, arg.type_list_attr).list.type)
        else:
            found += [arg.type or attr_or_default(node, arg.type_attr).type] * count
    return found


class Timer:
    """Times ops and casts; keeps the call overhead it measured per number of arguments."""

    def __init__(self, repeats: int = 5):
        self.repeats, self._overhead = repeats, {}

    def time_node(self, node, inputs) -> float:
        """Milliseconds one run of `node` takes, its inputs fed as given.

        Args:
            node: the NodeDef (its own inputs are ignored; input i reads inputs[i]).
            inputs: per data input, (shape, dtype enum, None or the NodeDefs to embed: [Const] or [Const, Cast]).

        Raises:
            Whatever TensorFlow raises for an op it cannot build or run (the caller records it as unmeasurable).
        """
        return self.time_variants([(node, inputs)])[0]

    def time_variants(self, variants) -> list[float]:
        """Milliseconds per run of each (node, inputs) variant, timed in alternation: the float32 and the low
        precision variant of an op see the same load from whatever else runs on the machine."""
        fed = [[(shape, dtype) for shape, dtype, const in inputs if const is None] for _, inputs in variants]
        overhead = [self.overhead_ms(f) for f in fed]
        ones = [self._function(node, inputs, 1) for node, inputs in variants]
        est = [max(t - o, 0.0) for t, o in zip(self._alternate(ones, fed), overhead)]
        if min(est) >= TARGET_MS:
            return est
        copies = min(MAX_COPIES, max(2, math.ceil(TARGET_MS / max(min(est), 0.005))))
        many = [self._function(node, inputs, copies) for node, inputs in variants]
        return [max(t - o, 0.0) / copies for t, o in zip(self._alternate(many, fed), overhead)]

    def overhead_ms(self, fed) -> float:
        """The cost of calling a function with these arguments that computes nothing."""
        key = len(fed)
        if key not in self._overhead:
            specs = [((), 1)] * len(fed)
            identity = graph_pb2.GraphDef()
            identity.node.add(name="out", op="Const").attr["dtype"].type = 1
            identity.node[0].attr["value"].tensor.dtype = 1
            self._overhead[key] = self._best_ms(self._wrap(identity, ["out:0"], len(fed)), specs)
        return self._overhead[key]

    def time_cast(self, elements: int, src: int, dst: int) -> float:
        """Milliseconds of one Cast of a tensor of `elements` elements from dtype src to dst."""
        cast = graph_pb2.GraphDef()
        node = cast.node.add(name="cast", op="Cast")
        node.attr["SrcT"].type, node.attr["DstT"].type = src, dst
        node.attr["Truncate"].b = False
        return max(self.time_node(node, [((elements,), src, None)]), 0.0)

    def _function(self, node, inputs, copies: int):
        graph = graph_pb2.GraphDef()
        names = []
        for i, (shape, dtype, const) in enumerate(inputs):
            if const is not None:
                for j, part in enumerate(const):  # the last one is the input; a Cast reads the Const before it
                    graph.node.add().CopyFrom(part)
                    graph.node[-1].name, graph.node[-1].device = f"in{i}" + "_src" * (len(const) - 1 - j), ""
                    del graph.node[-1].input[:]
                    graph.node[-1].input.extend([f"in{i}_src"] if j else [])
                    for attr in [a for a in graph.node[-1].attr if a.startswith("_")]:
                        del graph.node[-1].attr[attr]
            else:
                graph.node.add(name=f"in{i}", op="Placeholder").attr["dtype"].type = dtype
            names.append(f"in{i}")
        outputs = []
        for k in range(copies):
            copy = graph.node.add()
            copy.CopyFrom(node)
            copy.name, copy.device = f"op{k}", ""
            del copy.input[:]
            copy.input.extend(names)
            for attr in [a for a in copy.attr if a.startswith("_")]:
                del copy.attr[attr]
            copy.attr["_mp_copy"].i = k  # keeps TF's CSE from merging the copies
            outputs.append(f"op{k}:0")
        fed = [i for i, (_, _, const) in enumerate(inputs) if const is None]
        return self._wrap(graph, outputs, len(fed), [f"in{i}:0" for i in fed])

    @staticmethod
    def _wrap(graph, outputs, n_args: int, feeds=()):
        import tensorflow as tf

        def run(*args):  # the outputs are returned, so nothing is pruned; returning them copies nothing
            return tf.graph_util.import_graph_def(graph, input_map=dict(zip(feeds, args)),
                                                  return_elements=outputs, name="")
        return tf.function(run)

    def _best_ms(self, function, fed) -> float:
        return self._alternate([function], [fed])[0]

    def _alternate(self, functions, feds) -> list[float]:
        """The fastest call of each function (the least disturbed by other work on the machine), calling them in
        turn after one warm-up call each (which builds and optimizes it): at least 3 calls each, more while the
        round takes under ~40 ms, at most `repeats` * 3."""
        import tensorflow as tf
        rng = np.random.default_rng(0)
        args = [[tf.cast(tf.constant(rng.uniform(0.5, 1.5, shape).astype(np.float32)), tf.as_dtype(dtype))
                 if tf.as_dtype(dtype).is_floating else tf.zeros(shape, tf.as_dtype(dtype)) for shape, dtype in fed]
                for fed in feds]
        for function, a in zip(functions, args):
            function(*a)
        best, spent, calls = [math.inf] * len(functions), 0.0, 0
        while calls < 3 or (spent < 0.04 * len(functions) and calls < 3 * self.repeats):
            for i, (function, a) in enumerate(zip(functions, args)):
                start = time.perf_counter()
                function(*a)
                elapsed = time.perf_counter() - start
                best[i], spent = min(best[i], elapsed), spent + elapsed
            calls += 1
        return [b * 1e3 for b in best]
