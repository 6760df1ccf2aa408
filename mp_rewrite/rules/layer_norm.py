"""`layer_norm`: a layer normalization over the last axis, however it is spelled, rewritten in the spelling
TensorFlow 2.21's oneDNN remapper fuses into one `_MklLayerNorm` kernel.

Keras 3 writes LayerNormalization as `moments` (Mean, SquaredDifference against a StopGradient of the mean, Mean),
`rsqrt(variance + epsilon) * gamma`, and `x * inv + (beta - mean * inv)` spread over a Neg, Muls and an AddN after
`--freeze`'s arithmetic optimization; keras-hub uses Keras 3's layer; the remapper matches none of these (measured:
about ten separate kernels per LayerNorm). Its "common norm" pattern is

    AddV2(Mul(x, Mul(Rsqrt(AddV2(Mean(SquaredDifference(x, Mean(x, axis)), axis), epsilon)), gamma)),
          Sub(beta, Mul(Mul(Rsqrt(...), gamma), Mean(x, axis))))

with Const gamma, beta and epsilon, `axis` the positive last axis, x of rank 2 or 3 whose shape Grappler can prove
the output's (an input of any other rank, or reshaped by a computed shape, is normalized as rows, [-1, C], and
reshaped back). The region is recognized by what it computes: the nodes after a last-axis Mean of x whose inputs
are x, the region, constants or variables are evaluated (float64) on rows of known mean and variance, which gives
gamma, beta and epsilon; rows of random values must then agree with the layer normalization they define. So every
spelling of the same function is found, and nothing else. A variable's value is drawn at random, twice: gamma and
beta are then the variables whose draws they equal.

Where gamma or beta is a variable (a function rewritten in place), the common norm pattern, which wants constants,
cannot match: the region is written in TF's tf_keras pattern instead (`_variable_form`), which takes any gamma and
beta and keeps its own epsilon.

Before the remapper, TF's arithmetic optimizer sorts the inputs of commutative ops by name (grappler's
CanonicalizeNode), and the pattern is order-sensitive: the canonical nodes are named so that sorting keeps them in the
pattern's order (and marked, as the GELU's are, so that the broadcast minimizer leaves the Muls alone).
"""

from __future__ import annotations

import numpy as np

from .evaluate import BINARY, REDUCTIONS, UNARY, evaluate
from .gelu import ARITHMETIC_MARK
from .graph import FLOAT_TYPES, EditableGraph, is_first_output
from .record import Match

MARK = "/layer_norm_form/"
# Identities are left out: a fetch's Identity ends the region rather than joining it.
REGION_OPS = (frozenset(UNARY) | frozenset(BINARY) | frozenset(REDUCTIONS) | {"AddN"}) - {"Identity", "Snapshot"}
MAX_NODES = 24
TOLERANCE = 1e-5  # relative: float32 constants through float64 arithmetic
# The roles of the nodes TF fuses into _MklLayerNorm (named <output>/layer_norm_form/<role>; the output itself when
# the input is rank 2, else the role "normalized_flat" before the Reshape back).
FUSED_ROLES = ("mean", "squared_difference", "variance", "variance_plus", "rsqrt", "inv", "mean_inv", "shift",
               "normalized", "normalized_flat", "b_image", "b_normalized", "b_post", "c_scale")
FUSED_EPSILON = 1e-3  # the epsilon TF 2.21's _MklLayerNorm runs with (its attribute's default)


def match_layer_norm(graph: EditableGraph, mean) -> Match | None:
    """A layer normalization whose first node is `mean` (a Mean of x over its last axis); None if `mean` does not
    start one, a declined Match when it does but cannot be fused."""
    if not mean.attr["keep_dims"].b or mean.attr["T"].type not in FLOAT_TYPES or not is_first_output(mean.input[0]):
        return None
    axis = graph.constant(mean.input[1])
    if axis is None or axis.size != 1:
        return None
    x, region = mean.input[0], _region(graph, mean)
    if region is None or MARK in mean.name:
        return None
    names = {n.name for n in region}
    exits = [n for n in region if graph.is_kept(n) or any(r.name not in names for r in graph.readers(n.name))]
    if len(exits) != 1 or sum(n.op == "Mean" for n in region) != 2:
        return None
    shape, axis = graph.inferred_shape(x), int(axis.reshape(()))
    rank = None if shape is None else len(shape)
    if rank is None:
        return Match().fail(f"the rank of '{x}' is unknown, so which axis is its last is too")
    if rank < 2 or axis not in (-1, rank - 1):
        return Match().fail(f"the mean over axis {axis} of a rank-{rank} input is not over the last axis")
    variables = _variables(graph, region, x)
    channels = shape[-1] or _channels(graph, region, variables)
    if channels is None:
        return Match().fail("the size of the last axis is unknown (not inferred, and no per-channel scale or shift)")
    params = _parameters(graph, mean, region, exits[0], rank, channels, variables)
    if params is None:
        return None
    variable = isinstance(params["gamma"], str) or isinstance(params["beta"], str)  # tf_keras's pattern, not 3
    no_scale = not isinstance(params["gamma"], str) and np.allclose(params["gamma"], 1.0, rtol=0.0, atol=TOLERANCE)
    if isinstance(params["beta"], str) and no_scale:
        return Match().fail("its shift is a variable and it has no scale: TF's pattern for variable parameters needs "
                            "a Mul by gamma, and Grappler removes a Mul by ones")
    if not params["epsilon"] > 0:
        return Match().fail("its epsilon is 0 (TF's fused kernel adds 0.001, and no rescaling makes that exact)")
    unscaled = abs(params["epsilon"] - FUSED_EPSILON) <= 1e-7 * FUSED_EPSILON
    if rank == 2 and unscaled and not variable and not f"{exits[0].name}{MARK}" > x.split(":")[0]:
        return Match().fail(f"'{x}' sorts after the normalization's own nodes, so TF would reorder the pattern")
    return Match(nodes={"mean": mean, "exit": exits[0]},
                 values={"region": region, "x": x, "rank": rank, "channels": channels, **params})


def _region(graph: EditableGraph, mean) -> list | None:
    """The nodes after `mean` whose data inputs are x, the region or constants, in graph order. A reduction joins
    only if it is another of `mean` (the variance's): a pooling Mean over another axis after the normalization
    (a Transformer's last LayerNorm before GlobalAveragePooling1D) ends the region."""
    x = mean.input[0]
    axis = graph.constant(mean.input[1])
    found = {mean.name: mean}
    changed = True
    while changed:
        changed = False
        for node in list(found.values()):
            for reader in graph.readers(node.name):
                if reader.name in found or reader.op not in REGION_OPS or graph.is_kept(reader):
                    continue
                if reader.op in REDUCTIONS and not _same_reduction(graph, reader, mean, axis):
                    continue
                if all(t == x or t.split(":")[0] in found or graph.constant(t) is not None or _is_variable(graph, t)
                       for t in graph.data_inputs(reader)):
                    found[reader.name] = reader
                    changed = True
        if len(found) > MAX_NODES:
            return None
    order = {node.name: i for i, node in enumerate(graph.graph_def.node)}
    return sorted(found.values(), key=lambda n: order[n.name])


def _same_reduction(graph: EditableGraph, node, mean, axis: np.ndarray) -> bool:
    """Whether reduction `node` reduces as `mean` does (the same axis, kept)."""
    other = graph.constant(node.input[1])
    return (node.op == mean.op and node.attr["keep_dims"].b and other is not None
            and np.array_equal(other.reshape(-1), axis.reshape(-1)))


def _is_variable(graph: EditableGraph, tensor: str) -> bool:
    """Whether `tensor` is a weight read from a variable (its shape known, its value not): a LayerNorm's gamma or
    beta in a function whose weights stay variables (the in-place conversion)."""
    if not is_first_output(tensor) or graph.constant(tensor) is not None:
        return False
    shape = graph.weight_shape(tensor)
    return shape is not None and None not in shape


def _variables(graph: EditableGraph, region: list, x: str) -> dict:
    """{tensor: shape} of the variables the region reads."""
    names = {n.name for n in region}
    return {t: tuple(graph.weight_shape(t)) for node in region for t in graph.data_inputs(node)
            if t != x and t.split(":")[0] not in names and _is_variable(graph, t)}


def _channels(graph: EditableGraph, region: list, variables: dict) -> int | None:
    """The size of the normalized axis, when shape inference does not know it, from a per-channel constant or
    variable."""
    constants = (graph.constant(t) for node in region for t in graph.data_inputs(node))
    for shape in [value.shape for value in constants if value is not None] + list(variables.values()):
        size = int(np.prod(shape))
        if size > 1 and shape[-1] == size:
            return size
    return None


def _parameters(graph: EditableGraph, mean, region: list, exit_node, rank: int, channels: int,
                variables: dict) -> dict | None:
    """{gamma, beta, epsilon} of the layer normalization the region computes, or None if it computes none. Gamma and
    beta are arrays (constants), or the names of the variables that hold them: the region is evaluated with random
    values for its variables, the effective gamma and beta are matched to those values, and a second draw must
    give the layer normalization they define too."""
    rng = np.random.default_rng(0)
    unit = rng.normal(size=channels)
    unit = (unit - unit.mean()) / unit.std()  # mean 0, variance 1

    start = graph.producer(mean.input[0])

    def draw() -> dict:
        return {t.split(":")[0]: rng.normal(size=shape) + 2.0 for t, shape in variables.items()}

    def run(rows: np.ndarray, given: dict) -> np.ndarray | None:
        shaped = rows.reshape((1,) * (rank - 2) + rows.shape)
        out = None if start is None else evaluate(graph, start, region, exit_node, shaped, given)
        return None if out is None or out.shape != shaped.shape else out.reshape(rows.shape)

    first = draw()
    scales = np.array([1e3, 1e-1, 1e-2, 1e-3, 1e-4, 1e-6])
    out = run(np.vstack([np.full(channels, 0.7)] + [s * unit for s in scales]), first)
    if out is None or not np.all(np.isfinite(out)):
        return None
    beta = out[0]
    ratios = (out[1:] - beta) / unit  # gamma * s / sqrt(s^2 + epsilon), per scale
    gamma = ratios[0]
    if not np.all(np.isfinite(gamma)):
        return None
    epsilon = _epsilon(ratios[1:], gamma, scales[1:])
    gamma, beta = _source(gamma, first, variables), _source(beta, first, variables)
    second = draw()

    def value(source, given: dict) -> np.ndarray:
        return source if not isinstance(source, str) else given[source.split(":")[0]].reshape(-1)

    rows = rng.normal(size=(8, channels)) * np.array([[1e-3], [1e-2], [0.1], [1], [10], [100], [1], [3]]) + 2.0
    expected = _layer_norm(rows, value(gamma, second), value(beta, second), epsilon)
    got = run(rows, second)
    if got is None or np.any(np.abs(got - expected) > TOLERANCE * np.maximum(1.0, np.abs(expected))):
        return None
    return {"gamma": gamma, "beta": beta, "epsilon": epsilon}


def _source(effective: np.ndarray, given: dict, variables: dict):
    """The variable (tensor name) whose drawn value `effective` is, else `effective` itself (a constant)."""
    for tensor in variables:
        drawn = given[tensor.split(":")[0]].reshape(-1)
        if drawn.size == effective.size and np.allclose(effective, drawn, rtol=TOLERANCE, atol=0.0):
            return tensor
    return effective


def _epsilon(ratios: np.ndarray, gamma: np.ndarray, scales: np.ndarray) -> float:
    """Epsilon from the shrink of a row of standard deviation s: ratio / gamma = s / sqrt(s^2 + epsilon)."""
    channel = int(np.argmax(np.abs(gamma)))
    shrink = ratios[:, channel] / gamma[channel]
    usable = (shrink > 1e-3) & (shrink < 0.999)
    if not usable.any():
        return 0.0 if np.all(shrink >= 0.999) else float(np.square(scales[-1]) / 1e-6)
    s, k = scales[usable][0], shrink[usable][0]
    return float(s * s * (1.0 / (k * k) - 1.0))


def _layer_norm(rows: np.ndarray, gamma, beta, epsilon: float) -> np.ndarray:
    mean = rows.mean(axis=-1, keepdims=True)
    variance = np.square(rows - mean).mean(axis=-1, keepdims=True)
    return gamma * (rows - mean) / np.sqrt(variance + epsilon) + beta


def rewrite_layer_norm(graph: EditableGraph, match: Match) -> str:
    """Replace the region by the remapper's spelling; its output node takes the old output's name."""
    import tensorflow as tf
    from tensorflow.core.framework.attr_value_pb2 import AttrValue
    exit_node, x, values = match.nodes["exit"], match.values["x"], match.values
    name, dtype, device = exit_node.name, exit_node.attr["T"].type, exit_node.device
    numpy_type = tf.dtypes.as_dtype(dtype).as_numpy_dtype
    old = [n.name for n in values["region"]]
    graph.remove(old)
    scope = f"{name}{MARK}"

    def const(role: str, value, kind=numpy_type) -> str:
        return graph.add_constant(scope + role, np.asarray(value, kind), device).name

    def op(role: str, kind: str, *inputs, node_name: str | None = None, **attrs) -> str:
        node = graph.add_node(node_name or scope + role, kind, list(inputs), device)
        node.attr["T"].type = dtype
        for key, value in attrs.items():
            node.attr[key].CopyFrom(value)
        if kind in ("Mul", "AddV2"):
            node.attr[ARITHMETIC_MARK].b = True
        return node.name

    int32 = AttrValue(type=tf.int32.as_datatype_enum)
    # _MklLayerNorm takes rank 2 or 3, and Grappler checks that the input's and output's shapes are symbolically
    # equal, which a Keras Dense's output (reshaped by a computed shape) never is: the normalization runs on the
    # rows, [-1, C], and is reshaped back (a channels-last ConvNeXt LayerNorm, rank 4, too).
    rows = op("flat", "Reshape", x, const("flat_shape", [-1, values["channels"]], np.int32), Tshape=int32) \
        if values["rank"] != 2 else x
    # TF 2.21's remapper gives _MklLayerNorm its default epsilon, 0.001, whatever the common norm pattern's constant
    # says (measured). A layer normalization is unchanged when x is scaled by k and epsilon by k^2, so x is scaled to
    # make epsilon 0.001. (The tf_keras pattern keeps the FusedBatchNormV3's epsilon: measured too.)
    variable = isinstance(values["gamma"], str) or isinstance(values["beta"], str)
    scale = float(np.sqrt(FUSED_EPSILON / values["epsilon"]))
    if variable:
        output = _variable_form(graph, values, rows, scope, dtype, const, op)
    else:
        if abs(scale - 1.0) > 1e-7:
            rows = op("flat_scaled", "Mul", rows, const("flat_scale", scale))
        axis = const("axis", [1], np.int32)
        mean = op("mean", "Mean", rows, axis, keep_dims=AttrValue(b=True), Tidx=int32)
        variance = op("variance", "Mean", op("squared_difference", "SquaredDifference", rows, mean), axis,
                      keep_dims=AttrValue(b=True), Tidx=int32)
        rsqrt = op("rsqrt", "Rsqrt", op("variance_plus", "AddV2", variance, const("variance_epsilon", FUSED_EPSILON)))
        # Names sort as the pattern reads: flat < inv < mean, normalized < shift, variance < variance_epsilon,
        # rsqrt < scale (for an unscaled rank-2 input the matcher checks x < inv and x < mean).
        inv = op("inv", "Mul", rsqrt, const("scale", values["gamma"]))
        shift = op("shift", "Sub", const("offset", values["beta"]), op("mean_inv", "Mul", inv, mean))
        output = ("AddV2", op("normalized", "Mul", rows, inv), shift)
    if values["rank"] != 2:
        normalized = op("normalized_flat", *output)
        shape = graph.add_node(scope + "shape", "Shape", [x], device)
        shape.attr["T"].type, shape.attr["out_type"].type = dtype, tf.int32.as_datatype_enum
        op(None, "Reshape", normalized, shape.name, node_name=name, Tshape=int32)
    else:
        op(None, *output, node_name=name)
    form = "tf_keras" if variable else "common norm"
    return (f"rewrote the {len(old)}-node layer normalization of '{x}' (epsilon {values['epsilon']:.3g}) as the "
            f"remapper's LayerNorm spelling ({form} pattern)")


def _variable_form(graph: EditableGraph, values: dict, rows: str, scope: str, dtype: int, const, op) -> tuple:
    """The remapper's first LayerNorm pattern, tf_keras's spelling, which takes any gamma and beta where the common
    norm pattern wants constants, up to its last AddV2: (op, inputs...) of that AddV2.

        AddV2(beta, Mul(Reshape(FusedBatchNormV3(Reshape(x, [1, N, C, 1]), Fill([N], 1), Fill([N], 0), [], [],
                                                 is_training, NCHW), shape of x), gamma))

    N is the number of rows, computed from x's shape so that Grappler cannot fold the Fills into constants (the
    pattern wants the Fills). The commutative inputs are sorted by name before the remapper looks, so they are named
    in the pattern's order (a_beta < c_scale, b_post < z_gamma); gamma and beta are read from their variables by
    reads named so too (Grappler drops a Reshape of a read to its own shape, and the function may keep the old
    reads, as control outputs, under their names)."""
    from tensorflow.core.framework.attr_value_pb2 import AttrValue
    int32, channels = AttrValue(type=3), values["channels"]

    def int_op(role: str, kind: str, *inputs, **attrs) -> str:
        node = graph.add_node(scope + role, kind, list(inputs), graph.nodes[rows.split(":")[0]].device)
        for key, value in attrs.items():
            node.attr[key].CopyFrom(value)
        return node.name

    shape = int_op("rows_shape", "Shape", rows, T=AttrValue(type=dtype), out_type=int32)
    count = int_op("rows_count", "StridedSlice", shape, const("begin", [0], np.int32), const("end", [1], np.int32),
                   const("stride", [1], np.int32), T=int32, Index=int32, shrink_axis_mask=AttrValue(i=1))
    image = int_op("image_shape", "Pack", const("one", 1, np.int32), count, const("channels", channels, np.int32),
                   const("one_more", 1, np.int32), T=int32, N=AttrValue(i=4), axis=AttrValue(i=0))
    dims = int_op("fill_dims", "Pack", count, T=int32, N=AttrValue(i=1), axis=AttrValue(i=0))
    unit = AttrValue(type=1)
    ones = int_op("fill_scale", "Fill", dims, const("unit", 1.0, np.float32), T=unit, index_type=int32)
    zeros = int_op("fill_offset", "Fill", dims, const("zero", 0.0, np.float32), T=unit, index_type=int32)
    empty = const("empty", np.zeros([0], np.float32), np.float32)
    normalized = op("b_normalized", "FusedBatchNormV3", op("b_image", "Reshape", rows, image, Tshape=int32),
                    ones, zeros, empty, empty, U=unit, epsilon=AttrValue(f=values["epsilon"]),
                    data_format=AttrValue(s=b"NCHW"), is_training=AttrValue(b=True),
                    exponential_avg_factor=AttrValue(f=1.0))
    post = op("b_post", "Reshape", normalized, shape, Tshape=int32)

    def parameter(role: str, source) -> str:
        if not isinstance(source, str):
            return const(role, source)
        read = _variable_read(graph, source)
        if read is not None:  # a read of its own (the function may keep the old one as a control output)
            source = graph.add_node(scope + role + "_read", read.op, read.input[:1], read.device,
                                    dict(read.attr)).name
        return op(role, "Reshape", source, const(f"{role}_shape", [channels], np.int32), Tshape=int32)

    return "AddV2", parameter("a_beta", values["beta"]), op("c_scale", "Mul", post, parameter("z_gamma",
                                                                                             values["gamma"]))


def _variable_read(graph: EditableGraph, tensor: str):
    """The ReadVariableOp a weight tensor comes from through Reshapes and Identities, or None."""
    node = graph.producer(tensor)
    while node is not None and node.op in ("Reshape", "Identity"):
        node = graph.producer(node.input[0])
    return node if node is not None and node.op == "ReadVariableOp" else None
