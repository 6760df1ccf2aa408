"""From a graph to what its cost assignment needs: the op signatures of its candidates (measured by
analysis.op_timing into a MachineCosts), and the per-node core.assignment.CostTable made from a MachineCosts.

The candidates are the nodes Grappler's lists make low precision (a rewrite with the default lists); their shapes
come from TensorFlow's shape inference (analysis.shapes) on the rewritten graph, so a node's inputs are seen with
the dtypes each variant reads. Fusions TF's remapper performs (MatMul/Conv2D + BiasAdd, or an Add of a rank-1 bias
under oneDNN, + activation) are priced as pairs: the fused consumer costs nothing while it runs in its producer's
precision, and its standalone time when the two differ.
"""

from __future__ import annotations

import dataclasses
import json
import statistics

from ..core.graph_view import parse_input

FUSE_PRODUCERS = frozenset({"MatMul", "Conv2D", "Conv3D", "DepthwiseConv2dNative"})
FUSE_BIAS = frozenset({"BiasAdd", "AddV2", "Add"})
FUSE_ACTIVATIONS = frozenset({"Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid"})
FLOAT_TYPES = frozenset({1, 14, 19})  # float, bfloat16, half
NOISE_MS, NOISE_SHARE = 0.002, 0.03  # differences below these are not resolved by the timer
MAIN = "graph"  # the label of the main graph (core.body.rewrite_body's default)


@dataclasses.dataclass
class NodeSpec:
    """One candidate node: its signature key, both variants and their inputs ((shape, dtype, Const or None))."""

    label: str
    name: str
    key: str
    fp32_node: object
    low_node: object
    fp32_inputs: list
    low_inputs: list
    measurable: bool


_CANDIDATES = {}  # the last graph's candidates: measuring and then assigning read the same graph twice


def graph_candidates(graph_def, precision: str, fetches=(), batch: int | None = None):
    """(specs, output shapes per label, original graphs per label) of the lists' candidates of a graph."""
    fetches = (fetches,) if isinstance(fetches, str) else tuple(fetches or ())
    key = (id(graph_def), len(graph_def.node), precision, fetches, batch)
    if key not in _CANDIDATES:  # the graph is kept with its answer, so its id cannot name another graph meanwhile
        _CANDIDATES.clear()
        _CANDIDATES[key] = (graph_def, _find_candidates(graph_def, precision, fetches, batch))
    return _CANDIDATES[key][1]


def label_graphs(graph_def, result) -> dict:
    """{label: (the graph before, its RewriteResult)} for the main graph (MAIN) and every function body `result`
    rewrote, each body as a GraphDef (core.functions.function_to_graph)."""
    from ..core.functions import function_to_graph
    from ..core.op_support import Signatures
    signatures = Signatures(graph_def.library)
    fdefs = {f.signature.name: f for f in graph_def.library.function}
    graphs = {MAIN: (graph_def, result)}
    graphs.update((name, (function_to_graph(fdefs[name], signatures).graph_def, sub))
                  for name, sub in result.functions.items() if name in fdefs)
    return graphs


def _find_candidates(graph_def, precision: str, fetches, batch):
    from ..core.rewrite import rewrite_graph_def
    from .shapes import result_shapes
    result = rewrite_graph_def(graph_def, precision, fetches)
    shapes = result_shapes(result, batch=1 if batch is None else batch)
    graphs = label_graphs(graph_def, result)
    originals = {label: original for label, (original, _) in graphs.items()}
    specs = []
    for label, (_, sub) in graphs.items():
        nodes = {n.name: n for n in sub.graph_def.node}
        before = {n.name: n for n in originals[label].node}
        label_shapes = shapes.get("" if label == MAIN else label, {})
        for name in sub.converted_nodes:
            if name in before and name in nodes:
                specs.append(_spec(label, before[name], nodes[name], before, nodes, label_shapes))
    return specs, {label: shapes.get("" if label == MAIN else label, {}) for label in graphs}, originals


def _spec(label, fp32_node, low_node, before, nodes, shapes) -> NodeSpec:
    """Both variants of one candidate. Constant inputs stay constants (embedded when timing): oneDNN reorders a
    constant filter once and keeps it, so feeding weights as arguments would time a reorder per call. A float
    constant the rewrite casts to low precision is embedded as that Cast of the constant, which TF folds, as it
    does in the frozen graph."""
    from .op_timing import input_dtypes
    data32 = [parse_input(t) for t in fp32_node.input if not t.startswith("^")]
    data = [parse_input(t) for t in low_node.input if not t.startswith("^")]
    fp32_types, low_types = input_dtypes(fp32_node), input_dtypes(low_node)
    fp32_inputs, low_inputs, consts = [], [], []
    measurable = len(data) == len(data32) == len(fp32_types) == len(low_types)
    for (src32, _), (src, port), t32, tlow in zip(data32, data, fp32_types, low_types):
        outs = shapes.get(src) or []
        shape = outs[port] if port < len(outs) else None
        const32 = _skip_identities(before, src32)
        const32 = const32 if getattr(const32, "op", "") == "Const" else None
        const_low = _constant_source(nodes, src)
        if const32 is not None and const_low is not None:
            # A float constant (a weight) is keyed like a fed tensor: the same signature whether the graph is frozen
            # or reads variables, so a table measured on a SavedModel's functions serves its frozen graph.
            consts.append(None if t32 in FLOAT_TYPES else _const_text(const32))
        else:
            const32 = const_low = None
            known = shape is not None and all(d is not None for d in shape)
            measurable = measurable and known and (t32 in FLOAT_TYPES or t32 in (3, 9, 10))  # int32, int64, bool
            consts.append(None)
        fp32_inputs.append((shape, t32, const32 and [const32]))
        low_inputs.append((shape, tlow, const_low))
    shapes_text = [list(s) if s is not None else None for s, _, _ in fp32_inputs]
    key = json.dumps([fp32_node.op, shapes_text, _attrs_text(fp32_node), _attrs_text(low_node, types_only=True),
                      consts], separators=(",", ":"))
    return NodeSpec(label, fp32_node.name, key, fp32_node, low_node, fp32_inputs, low_inputs, measurable)


def _constant_source(nodes: dict, src: str):
    """[Const] or [Const, Cast] when the tensor `src` is a constant or a Cast of one (through Identity nodes: a
    frozen variable read), else None."""
    node = _skip_identities(nodes, src)
    if node is not None and node.op == "Const":
        return [node]
    if node is not None and node.op == "Cast" and node.input:
        const = _skip_identities(nodes, parse_input(node.input[0])[0])
        if const is not None and const.op == "Const":
            return [const, node]
    return None


def _skip_identities(nodes: dict, name: str):
    node = nodes.get(name)
    for _ in range(8):
        if node is None or node.op != "Identity" or not node.input:
            break
        node = nodes.get(parse_input(node.input[0])[0])
    return node


def _attrs_text(node, types_only: bool = False) -> dict:
    """The node's attrs as text, OpDef defaults filled in (FunctionDefs drop attrs at their default values, frozen
    graphs keep them: both must give the same signature)."""
    from google.protobuf import text_format
    from tensorflow.python.framework import op_def_registry
    attrs = dict(node.attr.items())
    op_def = op_def_registry.get(node.op)
    for attr in op_def.attr if op_def is not None else ():
        if attr.name not in attrs and attr.HasField("default_value"):
            attrs[attr.name] = attr.default_value
    return {k: text_format.MessageToString(v, as_one_line=True) for k, v in sorted(attrs.items())
            if not k.startswith("_") and (not types_only or v.HasField("type") or v.list.type)}


def _const_text(const) -> str:
    tensor = const.attr["value"].tensor
    text = tensor.SerializeToString(deterministic=True)
    return text.hex() if len(text) <= 256 else f"sha1:{__import__('hashlib').sha1(text).hexdigest()}"


def measure_missing(table, graph_def, fetches=(), batch=None, progress=None) -> bool:
    """Measure into `table` the graph's candidate signatures (and the Cast sizes) it does not hold yet.

    Returns:
        True if anything was measured.
    """
    from .op_timing import Timer
    specs, _, _ = graph_candidates(graph_def, table.precision, fetches, batch)
    todo = list({s.key: s for s in specs if s.key not in table.ops}.values())
    timer = Timer()
    import tensorflow as tf
    level = tf.get_logger().level
    tf.get_logger().setLevel("ERROR")  # each timed op is a new tf.function: TF's retracing warning is expected
    try:
        for done, spec in enumerate(todo, 1):
            table.ops[spec.key] = _measure(timer, spec) if spec.measurable else None
            if progress is not None:
                progress(done, len(todo))
    finally:
        tf.get_logger().setLevel(level)
    return measure_casts(table, timer) or bool(todo)


def measure_casts(table, timer=None) -> bool:
    """Time a Cast each way per tensor size into `table` unless it has them. Returns True if it measured."""
    from .op_timing import CAST_SIZES, Timer
    from ..core import dtypes
    if table.casts or not table.low_units:
        return False
    timer = timer or Timer()
    low = dtypes.target_dtype(table.precision)
    table.casts = [(n, round(timer.time_cast(n, dtypes.FLOAT, low), 6),
                    round(timer.time_cast(n, low, dtypes.FLOAT), 6)) for n in CAST_SIZES]
    return True


def _measure(timer, spec):
    try:
        times = timer.time_variants([(spec.fp32_node, spec.fp32_inputs), (spec.low_node, spec.low_inputs)])
        return [round(t, 6) for t in times]
    except Exception:  # noqa: BLE001 -- any op TF cannot build or run here is unmeasurable: the documented default
        return None


def cost_table(table, graph_def, fetches=(), batch=None):
    """The core.assignment.CostTable of a graph from a MachineCosts.

    Raises:
        CostTableError: the table holds none of the graph's measurable candidate signatures (another model).
    """
    from ..core.assignment import CostTable
    from ..errors import CostTableError
    if not table.low_units:
        return CostTable(table.precision, low_units=False, note=table.no_units_note())
    specs, shapes, originals = graph_candidates(graph_def, table.precision, fetches, batch)
    nodes, known = {}, 0
    for spec in specs:
        times = table.ops.get(spec.key)
        known += spec.key in table.ops
        if times is not None:
            nodes.setdefault(spec.label, {})[spec.name] = within_noise(*times)
    if specs and not known and not table.measure:  # a measuring table (training) only lacks what it could not time
        raise CostTableError(f"the cost table ({table.source}) holds none of this model's {len(specs)} candidate "
                             "op signatures (another model, batch size or op set); measure it for this one with: "
                             "mp-rewrite costs MODEL -o FILE")
    casts = {label: cast_costs(table, label_shapes, constant_names(originals.get(label)))
             for label, label_shapes in shapes.items()}
    fusions = {}
    for label, original in originals.items():
        fusions[label] = _fusions(original)
        for (_, consumer) in fusions[label]:
            standalone = nodes.get(label, {}).pop(consumer, None)
            fusions[label][(_, consumer)] = max(standalone) if standalone else 0.0
    note = f"costs from {table.source}; {known} of {len(specs)} candidate ops measured"
    return CostTable(table.precision, nodes, casts, fusions, True, note)


def measured_pair(fp32_runs, low_runs) -> tuple:
    """A node's (float32 ms, low precision ms) from its times in alternated traced runs (run k of both precisions
    back to back): each the least of its runs (whatever else runs on the machine only adds time), and a tie (their
    mean, twice: the casts around the node then decide) unless the runs agree which precision is faster -- every
    pair of run k beyond what timing resolves (within_noise) the same way. A node whose difference is inside the
    noise of this machine's state is so told from one whose difference is real, and a busy machine makes more of
    them ties, not the other precision."""
    fp32, low = min(fp32_runs, default=0.0), min(low_runs, default=0.0)
    if len(fp32_runs) == len(low_runs) > 1:
        faster = {_faster(a, b) for a, b in zip(fp32_runs, low_runs)}
        if len(faster) > 1 or 0 in faster:
            return ((fp32 + low) / 2,) * 2
    return within_noise(fp32, low)


def pooled_pairs(fp32_runs: dict, low_runs: dict, op_of: dict) -> dict:
    """{node: (float32 ms, low precision ms)} of the nodes of `op_of` ({name: op type}) from their times in
    alternated traced runs ({name: [ms per run]} of each variant): a node's float32 time is its least, and its low
    precision time that times its op type's ratio -- the median over the runs of the low-precision time of every
    node of that op over their float32 time, a tie (1) unless every run agrees which precision is faster
    (measured_pair's rule, on the sums). One node's difference is often inside the noise of one run; pooled over
    its op type's nodes it is not, and the cut then moves whole op types, not the nodes the noise favoured in one
    measurement (the README's MobileNetV2 kept 28-52 nodes of 170 in bfloat16 in four conversions priced node by
    node). A node not timed in every run of both variants is priced alone (measured_pair), and so are an op type's
    nodes where some run timed them all at 0 in float32 (step stats count whole microseconds: a tiny step's cheap
    ops often read 0, and no ratio is read over 0)."""
    runs = max((len(t) for times in (fp32_runs, low_runs) for t in times.values()), default=0)
    by_op, pairs = {}, {}
    for name, op in op_of.items():
        if runs > 1 and len(fp32_runs.get(name, ())) == len(low_runs.get(name, ())) == runs:
            by_op.setdefault(op, []).append(name)
        else:
            pairs[name] = measured_pair(fp32_runs.get(name, ()), low_runs.get(name, ()))
    for names in by_op.values():
        sums = [(sum(fp32_runs[n][k] for n in names), sum(low_runs[n][k] for n in names)) for k in range(runs)]
        if not all(a > 0 for a, _ in sums):  # a run timed the op type at 0 us in float32: no ratio to read
            pairs.update({n: measured_pair(fp32_runs[n], low_runs[n]) for n in names})
            continue
        faster = {_faster(a, b) for a, b in sums}
        ratio = statistics.median(b / a for a, b in sums) if faster in ({1}, {-1}) else 1.0
        pairs.update({n: (min(fp32_runs[n]), min(fp32_runs[n]) * ratio) for n in names})
    return pairs


def within_noise(fp32: float, low: float) -> tuple:
    """(fp32, low), or their mean twice when they differ by less than timing resolves (NOISE_MS, or NOISE_SHARE of
    the larger): a difference that small is noise, and the tie then goes to float32 unless casts say otherwise."""
    if not _faster(fp32, low):
        return ((fp32 + low) / 2,) * 2
    return fp32, low


def _faster(fp32: float, low: float) -> int:
    """1 where the low precision is faster, -1 where float32 is, 0 where timing does not resolve the difference."""
    if abs(fp32 - low) < max(NOISE_MS, NOISE_SHARE * max(fp32, low)):
        return 0
    return 1 if low < fp32 else -1


def constant_names(graph_def) -> set:
    """Names of the Const nodes and the Identity chains reading them: TF folds a Cast of them into a constant, so
    casting them costs nothing at run time (a frozen graph's weights)."""
    if graph_def is None:
        return set()
    nodes = {n.name: n for n in graph_def.node}
    return {name for name in nodes if getattr(_skip_identities(nodes, name), "op", "") == "Const"}


def cast_costs(table, shapes: dict, constants=frozenset()) -> dict:
    casts = {}
    for name, outs in shapes.items():
        if name in constants:
            casts.update(((name, port), (0.0, 0.0)) for port in range(len(outs or ())))
            continue
        for port, shape in enumerate(outs or ()):
            elements = None
            if shape is not None and all(d is not None for d in shape):
                elements = 1
                for d in shape:
                    elements *= d
            casts[(name, port)] = table.cast_ms(elements)
    return casts


def _fusions(graph_def) -> dict:
    """(producer, consumer) -> 0.0 for every pair TF's remapper fuses: MatMul/Conv + bias (+ activation)."""
    nodes = {n.name: n for n in graph_def.node}
    readers = {}
    for n in graph_def.node:
        for t in n.input:
            if not t.startswith("^"):
                readers.setdefault(parse_input(t)[0], []).append(n)
    found = {}
    for n in graph_def.node:
        if n.op not in FUSE_PRODUCERS or len(readers.get(n.name, ())) != 1:
            continue
        bias = readers[n.name][0]
        if bias.op not in FUSE_BIAS or (bias.op != "BiasAdd" and not _is_rank1_const(bias, n.name, nodes)):
            continue
        found[(n.name, bias.name)] = 0.0
        after = readers.get(bias.name, ())
        if len(after) == 1 and after[0].op in FUSE_ACTIVATIONS:
            found[(bias.name, after[0].name)] = 0.0
    return found


def _is_rank1_const(add, producer: str, nodes: dict) -> bool:
    """An Add whose other input is a rank-1 Const (Keras 3 adds its bias so; oneDNN's remapper fuses it)."""
    others = [parse_input(t)[0] for t in add.input if not t.startswith("^") and parse_input(t)[0] != producer]
    other = nodes.get(others[0]) if len(others) == 1 else None
    return other is not None and other.op == "Const" and len(other.attr["value"].tensor.tensor_shape.dim) == 1
