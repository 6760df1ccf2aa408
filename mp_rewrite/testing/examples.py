"""Real GraphDefs from real Keras models, for tests, benchmarks and ``mp-rewrite demo``.

Every graph here is what TensorFlow itself produces for a Keras 3 model: the forward pass traced with
``tf.function(...).get_concrete_function`` (frozen into constants, or not), or a whole training step (forward,
``tape.gradient``, ``optimizer.apply``) traced in one ``tf.function``, which is the graph Grappler sees when such a
step runs. The model builders live in ``mp_rewrite.testing.example_models`` and are re-exported here. ``synthetic_graph``
builds large regular graphs straight from NodeDef protos, for scale benchmarks.

The graphs are deterministic (fixed seeds, Keras naming reset by each builder) up to the order of nodes in the
GraphDef and TF's internal ``_has_manual_control_dependencies`` attribute, which varies from process to process.

Importing this module imports TensorFlow and Keras (a few seconds); the core package never does.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.framework import graph_pb2, node_def_pb2, types_pb2  # noqa: E402
from tensorflow.python.framework import convert_to_constants, versions  # noqa: E402

from mp_rewrite.testing.example_models import (  # noqa: E402,F401  (re-exported: the builders belong to this API)
    SEED,
    FusedBatchNormalization,
    cnn_bn,
    densenet121,
    lstm,
    mlp,
    mobilenet_v2,
    resnet50,
    transformer_encoder,
)


@dataclasses.dataclass
class ExampleGraph:
    """A GraphDef with what is needed to run it.

    Attributes:
        name: short identifier, e.g. ``"cnn_bn/inference"``.
        graph_def: the ``tf.compat.v1.GraphDef``.
        fetches: node names of the outputs (the loss first, for training steps).
        inputs: a sample feed, placeholder node name -> numpy array.
        kind: ``"inference"`` or ``"train"``.
    """

    name: str
    graph_def: graph_pb2.GraphDef
    fetches: list[str]
    inputs: dict[str, np.ndarray]
    kind: str

    @property
    def num_nodes(self) -> int:
        """Number of nodes in the main graph (function bodies not counted)."""
        return len(self.graph_def.node)


# --------------------------------------------------------------------------------------------- tracing


def _input_specs(model: keras.Model, batch: int) -> list[tf.TensorSpec]:
    """TensorSpecs for the model's inputs with a fixed batch size, named after the Keras inputs."""
    specs = []
    for i, t in enumerate(model.inputs):
        name = getattr(t, "name", None) or f"input_{i}"
        shape = [batch] + list(t.shape[1:])
        specs.append(tf.TensorSpec(shape, tf.as_dtype(t.dtype), name=name))
    return specs


def _sample(spec: tf.TensorSpec, rng: np.random.Generator, high: int = 10) -> np.ndarray:
    """A deterministic sample array for ``spec`` (standard normal floats, integers in [0, high))."""
    if spec.dtype.is_floating:
        return rng.standard_normal(spec.shape).astype(spec.dtype.as_numpy_dtype)
    return rng.integers(0, high, spec.shape).astype(spec.dtype.as_numpy_dtype)


def _call(model: keras.Model, xs: tuple, training: bool):
    return model(xs[0] if len(xs) == 1 else list(xs), training=training)


def _without_dangling_placeholders(graph_def: graph_pb2.GraphDef, keep: list[str]) -> graph_pb2.GraphDef:
    # Lowering control flow while freezing leaves "unused_control_flow_input_<i>" Placeholders that nothing
    # reads, and how many varies from run to run; they are not inputs of the model.
    used = {name.lstrip("^").split(":")[0] for node in graph_def.node for name in node.input}
    dangling = [
        i for i, node in enumerate(graph_def.node)
        if node.op == "Placeholder" and node.name not in used and node.name not in keep
    ]
    for i in reversed(dangling):
        del graph_def.node[i]
    return graph_def


def inference_graph(
    model: keras.Model, batch: int = 2, frozen: bool = True, lower_control_flow: bool = True
) -> ExampleGraph:
    """The forward pass of ``model`` (``training=False``) as a GraphDef.

    Args:
        model: a Keras 3 model built with explicit ``keras.Input`` shapes.
        batch: the fixed batch size of the input placeholders.
        frozen: fold the variables into Const nodes with ``convert_variables_to_constants_v2``, so the graph is
            self-contained (placeholders only for the real inputs) and runnable by ``run_graph_def``. If False,
            the traced graph is returned as is: every variable is a ``resource`` Placeholder (a capture) read by
            ``ReadVariableOp``, and the graph cannot run standalone.
        lower_control_flow: when freezing, lower functional ``While``/``If`` to Switch/Merge/Enter/Exit loops.
            With False, an LSTM keeps its functional ``While`` over TensorLists and the GraphDef carries a
            function library with the loop's cond and body.

    Returns:
        An ExampleGraph of kind ``"inference"`` named ``"<model>/inference"``; its ``inputs`` feed every real input
        placeholder.
    """
    specs = _input_specs(model, batch)
    fn = tf.function(lambda *xs: _call(model, xs, training=False))
    cf = fn.get_concrete_function(*specs)
    if frozen:
        cf = convert_to_constants.convert_variables_to_constants_v2(cf, lower_control_flow=lower_control_flow)
        placeholders = [t.op.name for t in cf.inputs]
    else:
        placeholders = [t.op.name for t in cf.inputs[: len(specs)]]
    rng = np.random.default_rng(SEED)
    return ExampleGraph(
        name=f"{model.name}/inference",
        graph_def=_without_dangling_placeholders(cf.graph.as_graph_def(), keep=placeholders),
        fetches=[t.op.name for t in cf.outputs],
        inputs={p: _sample(s, rng) for p, s in zip(placeholders, specs)},
        kind="inference",
    )


def train_step_graph(model: keras.Model, batch: int = 2, optimizer: str = "sgd") -> ExampleGraph:
    """One training step of ``model`` traced into a single ``tf.function`` graph, as Grappler sees it.

    The step computes the logits with ``training=True``, a sparse softmax cross-entropy loss against integer
    ``labels``, the gradients with ``tf.GradientTape`` and applies them with the Keras optimizer (for SGD,
    ``AssignSubVariableOp`` per variable; BatchNormalization also updates its moving statistics).

    The graph is NOT runnable standalone: every variable (weights, optimizer slots, the iteration counter) is
    captured as a ``resource`` Placeholder with no value. Use it to compare rewrites, not to execute.

    Args:
        model: a Keras 3 classifier (logits output) built with explicit ``keras.Input`` shapes.
        batch: the fixed batch size.
        optimizer: a Keras optimizer identifier (``keras.optimizers.get``), e.g. ``"sgd"`` or ``"adam"``.

    Returns:
        An ExampleGraph of kind ``"train"``; ``fetches`` are the loss and the logits (the step's outputs), and
        ``inputs`` holds sample values for the real inputs and ``labels``.
    """
    opt = keras.optimizers.get(optimizer)
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    specs = _input_specs(model, batch) + [tf.TensorSpec([batch], tf.int32, name="labels")]

    def step(*args):
        *xs, labels = args
        with tf.GradientTape() as tape:
            logits = _call(model, tuple(xs), training=True)
            loss = loss_fn(labels, logits)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
        return loss, logits

    cf = tf.function(step).get_concrete_function(*specs)
    classes = int(model.outputs[0].shape[-1])
    rng = np.random.default_rng(SEED)
    inputs = {t.op.name: _sample(s, rng, high=classes) for t, s in zip(cf.inputs, specs)}
    return ExampleGraph(
        name=f"{model.name}/train",
        graph_def=cf.graph.as_graph_def(),
        fetches=[t.op.name for t in cf.outputs],
        inputs=inputs,
        kind="train",
    )


# --------------------------------------------------------------------------------------------- synthetic


def _const_node(name: str, array: np.ndarray) -> node_def_pb2.NodeDef:
    node = node_def_pb2.NodeDef(name=name, op="Const")
    node.attr["dtype"].type = types_pb2.DT_FLOAT
    tensor = node.attr["value"].tensor
    tensor.dtype = types_pb2.DT_FLOAT
    for d in array.shape:
        tensor.tensor_shape.dim.add(size=d)
    tensor.tensor_content = array.astype(np.float32).tobytes()
    return node


def synthetic_graph(num_nodes: int, dim: int = 8) -> ExampleGraph:
    """A large regular float32 GraphDef built directly from NodeDef protos (no TF ops; 1M nodes in seconds).

    ``input`` (Placeholder ``[dim, dim]``) feeds a chain of blocks ``blockN/``: ``MatMul(x, w)`` -> ``BiasAdd(b)``
    -> ``Relu`` -> ``Softmax``, where ``w`` and ``b`` are per-block Const nodes (same seeded values in every
    block). Every block has 6 nodes, so the graph has ``1 + 6 * max(1, (num_nodes - 1) // 6)`` nodes. It imports
    with ``tf.graph_util.import_graph_def`` and runs (Softmax keeps the values bounded however deep it is).

    Args:
        num_nodes: the approximate number of nodes wanted.
        dim: the side of the square activations and weights.

    Returns:
        An ExampleGraph named ``"synthetic/<n>"`` of kind ``"inference"``; the fetch is the last Softmax.
    """
    rng = np.random.default_rng(SEED)
    w_node = _const_node("w", rng.standard_normal((dim, dim)) / np.sqrt(dim))
    b_node = _const_node("b", rng.standard_normal((dim,)))
    gd = graph_pb2.GraphDef()
    gd.versions.producer = versions.GRAPH_DEF_VERSION
    placeholder = gd.node.add(name="input", op="Placeholder")
    placeholder.attr["dtype"].type = types_pb2.DT_FLOAT
    placeholder.attr["shape"].shape.dim.add(size=dim)
    placeholder.attr["shape"].shape.dim.add(size=dim)
    nodes, prev = gd.node, "input"
    for i in range(max(1, (num_nodes - 1) // 6)):
        p = f"block{i}/"
        nodes.add().CopyFrom(w_node)
        nodes[-1].name = p + "w"
        nodes.add().CopyFrom(b_node)
        nodes[-1].name = p + "b"
        for op, inputs in (("MatMul", [prev, p + "w"]), ("BiasAdd", [p + "MatMul", p + "b"]),
                           ("Relu", [p + "BiasAdd"]), ("Softmax", [p + "Relu"])):
            node = nodes.add(name=p + op, op=op, input=inputs)
            node.attr["T"].type = types_pb2.DT_FLOAT
        prev = p + "Softmax"
    x = rng.standard_normal((dim, dim)).astype(np.float32)
    return ExampleGraph(f"synthetic/{len(gd.node)}", gd, [prev], {"input": x}, "inference")


# --------------------------------------------------------------------------------------------- registry


def _named(name: str, build: Callable[[], ExampleGraph]) -> Callable[[], ExampleGraph]:
    def named_build() -> ExampleGraph:
        graph = build()
        graph.name = name
        return graph

    return named_build


EXAMPLES: dict[str, Callable[[], ExampleGraph]] = {
    name: _named(name, build)
    for name, build in {
        "cnn_bn/inference": lambda: inference_graph(cnn_bn()),
        "cnn_bn/train": lambda: train_step_graph(cnn_bn()),
        "transformer/inference": lambda: inference_graph(transformer_encoder()),
        "transformer/train": lambda: train_step_graph(transformer_encoder()),
        "lstm/inference": lambda: inference_graph(lstm()),
        "lstm/train": lambda: train_step_graph(lstm()),
        # Functional While over TensorLists, cond/body in the function library.
        "lstm_functional/inference": lambda: inference_graph(lstm(), lower_control_flow=False),
        # Variables as resource Placeholders read by ReadVariableOp (not runnable standalone).
        "cnn_bn/inference_unfrozen": lambda: inference_graph(cnn_bn(), frozen=False),
        "mlp/inference": lambda: inference_graph(mlp()),
    }.items()
}
"""The standard test set: name -> zero-argument builder of a small ExampleGraph (each well under 1 s)."""

BENCHMARKS: dict[str, Callable[[], ExampleGraph]] = {
    name: _named(name, build)
    for name, build in {
        # Adam: the design's reference figure (ResNet-50 training step, 14,481 nodes) was measured with it.
        "resnet50/train": lambda: train_step_graph(resnet50(), optimizer="adam"),
        "resnet50/inference": lambda: inference_graph(resnet50()),
        "densenet121/train": lambda: train_step_graph(densenet121(), optimizer="adam"),
        "mobilenet_v2/train": lambda: train_step_graph(mobilenet_v2(), optimizer="adam"),
    }.items()
}
"""Big real graphs for benchmarks (seconds to build each)."""
