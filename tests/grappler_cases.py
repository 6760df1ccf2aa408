"""The graphs of Grappler's C++ auto mixed precision suite, rebuilt in Python.

One function per ``TEST``/``TEST_P`` of TensorFlow's
``tensorflow/core/grappler/optimizers/auto_mixed_precision_test.cc`` (TF 2.21; the Machina mirror
``machina/core/grappler/optimizers/auto_mixed_precision_test.cc`` is the newest copy), named after the test.
Each builds the graph with ``tf.raw_ops`` inside a ``tf.Graph`` so node names, ops, inputs and devices match the
C++ test, and returns ``(graph_def, fetches)``. The loop-shaped graphs of the Python companion suite
(``tensorflow/python/grappler/auto_mixed_precision_test.py``, ``test_propagation_through_simple_loop_*``) are here
too, built with a v1 ``while_loop``.

``grappler_oracle`` runs TensorFlow's own pass on a graph (``mp_rewrite.testing.oracle``, the recipe of the research note,
section 7) in the modes these cases need, so tests can check that the builders reproduce Grappler's cases on this
CPU-only machine.
"""

from __future__ import annotations

import contextlib
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.framework import function_pb2, node_def_pb2, types_pb2  # noqa: E402
from tensorflow.python.grappler import tf_optimizer  # noqa: E402
from tensorflow.python.ops import control_flow_util  # noqa: E402

from mp_rewrite.testing import oracle  # noqa: E402

CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"

# Unary infer ops of TestSimpleUnaryInferOp with their input ranges (min, max) from the C++ test.
UNARY_INFER_OPS = {
    "Elu": (-5.0, 5.0),
    "Erf": (-5.0, 5.0),
    "Erfc": (-5.0, 5.0),
    "Inv": (0.01, 10.0),
    "Log": (0.01, 10.0),
    "Log1p": (-0.99, 9.0),
    "LogSoftmax": (-8.0, 8.0),
    "Reciprocal": (0.01, 10.0),
    "Sigmoid": (-5.0, 5.0),
    "Softmax": (-8.0, 8.0),
    "Softplus": (-5.0, 5.0),
    "Sqrt": (0.0, 10.0),
    "Tanh": (-5.0, 5.0),
}

# Colour strings of test_propagation_through_simple_loop_1..8: (input, body, output); upper case = float16.
SIMPLE_LOOP_CASES = {
    1: ("W", "C", "C"),
    2: ("C", "C", "W"),
    3: ("W", "G", "W"),
    4: ("W", "gbg", "W"),
    5: ("b", "gWC", "c"),
    6: ("b", "CWCG", "C"),
    7: ("C", "GWCG", "C"),
    8: ("C", "CgbgWC", "g"),
}


# ----------------------------------------------------------------------------------------------- helpers


def _const(value, shape=None, dtype=tf.float32, name=None):
    """A Const node like ``ops::Const(s.WithOpName(name), value, shape)`` (a scalar broadcast to ``shape``)."""
    if shape is not None and np.ndim(value) == 0:
        value = np.full(shape, value, dtype=dtype.as_numpy_dtype)
    proto = tf.make_tensor_proto(value, dtype=dtype)
    return tf.raw_ops.Const(value=proto, dtype=dtype, name=name)


@contextlib.contextmanager
def _graph(device=None):
    g = tf.Graph()
    with g.as_default():
        if device is None:
            yield g
        else:
            with tf.device(device):
                yield g


def _node(graph_def, name):
    for node in graph_def.node:
        if node.name == name:
            return node
    raise KeyError(name)


def _simple_graph(deny2_op="Log", names=("infer2", "deny2")):
    """The chain of ``Simple``: Exp, Relu, Sqrt, Relu, MatMul, Relu, Log, Relu, SparseMatMul, Relu, Identity."""
    inp = _const(1.0 / 32, [32, 32], name="input")
    deny1 = tf.raw_ops.Exp(x=inp, name="deny1")
    clr1 = tf.raw_ops.Relu(features=deny1, name="clr1")
    infer1 = tf.raw_ops.Sqrt(x=clr1, name="infer1")
    clr2 = tf.raw_ops.Relu(features=infer1, name="clr2")
    allow1 = tf.raw_ops.MatMul(a=clr2, b=clr2, name="allow1")
    clr3 = tf.raw_ops.Relu(features=allow1, name="clr3")
    mid = getattr(tf.raw_ops, deny2_op)(x=clr3, name=names[0])
    clr4 = tf.raw_ops.Relu(features=mid, name="clr4")
    smm = tf.raw_ops.SparseMatMul(a=clr4, b=clr4, name=names[1])
    clr5 = tf.raw_ops.Relu(features=smm, name="clr5")
    tf.raw_ops.Identity(input=clr5, name="fetch")


# ------------------------------------------------------------------------- AutoMixedPrecisionParamTest


def no_op():
    """NoOp: deny -> clear -> infer -> clear; no allow op, so the graph is unchanged."""
    with _graph() as g:
        inp = _const(1.234, [32], name="input")
        deny1 = tf.raw_ops.Exp(x=inp, name="deny1")
        clr1 = tf.raw_ops.Relu(features=deny1, name="clr1")
        infer1 = tf.raw_ops.Sqrt(x=clr1, name="infer1")
        clr2 = tf.raw_ops.Relu(features=infer1, name="clr2")
        tf.raw_ops.Identity(input=clr2, name="fetch")
    return g.as_graph_def(), ["fetch"]


def _already_low(dtype, device=None):
    with _graph(device) as g:
        inp = _const(1.0, [32, 32], name="input")
        cst1 = tf.raw_ops.Cast(x=inp, DstT=dtype, name="cst1")
        allow1 = tf.raw_ops.MatMul(a=cst1, b=cst1, name="allow1")
        clr1 = tf.raw_ops.Relu(features=allow1, name="clr1")
        cst2 = tf.raw_ops.Cast(x=clr1, DstT=tf.float32, name="cst2")
        clr2 = tf.raw_ops.Relu(features=cst2, name="clr2")
        tf.raw_ops.Identity(input=clr2, name="fetch")
    return g.as_graph_def(), ["fetch"]


def already_fp16():
    """AlreadyFp16: a graph already in half between two Casts is left as it is."""
    return _already_low(tf.float16)


def simple():
    """Simple: the allow MatMul pulls the Relus next to it to half; infer/deny stay float."""
    with _graph() as g:
        _simple_graph()
    return g.as_graph_def(), ["fetch"]


def no_infer_op():
    """NoInferOp (run with LEVEL=TREAT_INFER_AS_DENY): the Logs behave as deny ops."""
    with _graph() as g:
        inp = _const(1.0 / 32, [32, 32], name="input")
        deny1 = tf.raw_ops.Exp(x=inp, name="deny1")
        clr1 = tf.raw_ops.Relu(features=deny1, name="clr1")
        infer1 = tf.raw_ops.Sqrt(x=clr1, name="infer1")
        clr2 = tf.raw_ops.Relu(features=infer1, name="clr2")
        allow1 = tf.raw_ops.MatMul(a=clr2, b=clr2, name="allow1")
        clr3 = tf.raw_ops.Relu(features=allow1, name="clr3")
        infer2 = tf.raw_ops.Log(x=clr3, name="infer2")
        clr4 = tf.raw_ops.Relu(features=infer2, name="clr4")
        allow2 = tf.raw_ops.MatMul(a=clr4, b=clr4, name="allow2")
        infer3 = tf.raw_ops.Log(x=allow2, name="infer3")
        tf.raw_ops.Identity(input=infer3, name="fetch")
    return g.as_graph_def(), ["fetch"]


def bidirectional_clear_chain():
    """BidirectionalClearChain: allow spreads upstream through clr1, across ShapeN's T to clr2 and clr4."""
    with _graph() as g:
        inp = _const(1.0 / 32, [32, 32], name="input")
        clr1 = tf.raw_ops.Relu(features=inp, name="clr1")
        clr2 = tf.raw_ops.Relu(features=inp, name="clr2")
        allow1 = tf.raw_ops.MatMul(a=clr1, b=clr1, name="allow1")
        tf.raw_ops.ShapeN(input=[clr1, clr2], out_type=tf.int32, name="clr3")
        clr4 = tf.raw_ops.Relu(features=clr2, name="clr4")
        tf.raw_ops.Identity(input=allow1, name="fetch1")
        tf.raw_ops.Identity(input=clr4, name="fetch2")
    return g.as_graph_def(), ["fetch1", "fetch2"]


def preserve_fetches():
    """PreserveFetches: fetched nodes (allow1, clr2, clr3) are never converted."""
    with _graph() as g:
        inp = _const(1.0 / 32, [32, 32], name="input")
        allow1 = tf.raw_ops.MatMul(a=inp, b=inp, name="allow1")
        clr1 = tf.raw_ops.Relu(features=allow1, name="clr1")
        infer1 = tf.raw_ops.Sqrt(x=clr1, name="infer1")
        deny1 = tf.raw_ops.Exp(x=infer1, name="deny1")
        clr2 = tf.raw_ops.Relu(features=deny1, name="clr2")
        allow2 = tf.raw_ops.MatMul(a=clr2, b=clr2, name="allow2")
        clr3 = tf.raw_ops.Relu(features=allow2, name="clr3")
        deny2 = tf.raw_ops.Exp(x=clr3, name="deny2")
        tf.raw_ops.Relu(features=deny2, name="clr4")
    return g.as_graph_def(), ["allow1", "clr2", "clr3"]


def preserve_cpu_nodes():
    """PreserveCPUNodes: allow2 is placed on CPU:0, so a GPU pass leaves it (and clr2 after it) in float."""
    with _graph() as g:
        inp = _const(1.0 / 32, [32, 32], name="input")
        clr1 = tf.raw_ops.Relu(features=inp, name="clr1")
        allow1 = tf.raw_ops.MatMul(a=clr1, b=clr1, name="allow1")
        infer1 = tf.raw_ops.Tanh(x=allow1, name="infer1")
        with tf.device(CPU0):
            allow2 = tf.raw_ops.MatMul(a=infer1, b=infer1, name="allow2")
        clr2 = tf.raw_ops.Relu(features=allow2, name="clr2")
        tf.raw_ops.Identity(input=clr2, name="fetch")
    return g.as_graph_def(), ["fetch"]


def preserve_identity_after_variable():
    """PreserveIdentityAfterVariable: Identity(VariableV2) is not painted; Identity(Const) is."""
    with _graph() as g:
        inp = _const(1.0 / 32, [32, 32], name="input")
        var1 = tf.raw_ops.VariableV2(shape=[32, 32], dtype=tf.float32, name="var1")
        clr1 = tf.raw_ops.Identity(input=var1, name="clr1")
        allow1 = tf.raw_ops.MatMul(a=inp, b=clr1, name="allow1")
        input2 = _const(1.0 / 32, [32, 32], name="input2")
        clr2 = tf.raw_ops.Identity(input=input2, name="clr2")
        allow2 = tf.raw_ops.MatMul(a=inp, b=clr2, name="allow2")
        tf.raw_ops.Identity(input=allow1, name="fetch1")
        tf.raw_ops.Identity(input=allow2, name="fetch2")
    return g.as_graph_def(), ["fetch1", "fetch2"]


def fused_batch_norm():
    """FusedBatchNorm: FBN/FBNGrad become V2 with T=half, U=float."""
    with _graph() as g:
        inp = _const(1.0 / 32, [8, 56, 56, 16], name="input")
        weight = _const(2.0, [3, 3, 16, 16], name="weight")
        scale = _const(3.0, [16], name="scale")
        offset = _const(4.0, [16], name="offset")
        mean = _const(5.0, [0], name="mean")
        variance = _const(6.0, [0], name="variance")
        conv = dict(strides=[1, 1, 1, 1], padding="SAME", data_format="NHWC")
        allow1 = tf.raw_ops.Conv2D(input=inp, filter=weight, name="allow1", **conv)
        fbn1 = tf.raw_ops.FusedBatchNorm(
            x=allow1, scale=scale, offset=offset, mean=mean, variance=variance, data_format="NHWC", name="fbn1"
        )
        bng1 = tf.raw_ops.FusedBatchNormGrad(
            y_backprop=fbn1.y,
            x=allow1,
            scale=scale,
            reserve_space_1=fbn1.reserve_space_1,
            reserve_space_2=fbn1.reserve_space_2,
            data_format="NHWC",
            name="bng1",
        )
        infer1 = tf.raw_ops.Add(x=fbn1.y, y=bng1.x_backprop, name="infer1")
        allow2 = tf.raw_ops.Conv2D(input=infer1, filter=weight, name="allow2", **conv)
        tf.raw_ops.Identity(input=allow2, name="fetch")
    return g.as_graph_def(), ["fetch"]


def repeated_and_list_type_attrs():
    """RepeatedAndListTypeAttrs: every element of IdentityN's list attr T and AddN's T go to half."""
    with _graph() as g:
        inp = _const(1.0 / 32, [32, 32], name="input")
        allow1 = tf.raw_ops.MatMul(a=inp, b=inp, name="allow1")
        clr1 = tf.raw_ops.IdentityN(input=[allow1, allow1, allow1], name="clr1")
        infer1 = tf.raw_ops.AddN(inputs=list(clr1), name="infer1")
        allow2 = tf.raw_ops.MatMul(a=infer1, b=infer1, name="allow2")
        tf.raw_ops.Identity(input=allow2, name="fetch")
    return g.as_graph_def(), ["fetch"]


def existing_cast():
    """ExistingCast: Cast(bool->float) feeding only allow ops becomes Cast(bool->half)."""
    with _graph() as g:
        inp = _const(True, [32, 32], dtype=tf.bool, name="input")
        cst1 = tf.raw_ops.Cast(x=inp, DstT=tf.float32, name="cst1")
        allow1 = tf.raw_ops.MatMul(a=cst1, b=cst1, name="allow1")
        tf.raw_ops.Identity(input=allow1, name="fetch")
    return g.as_graph_def(), ["fetch"]


def recurrent_edge_color_mismatch():
    """RecurrentEdgeColorMismatch: a v1 loop whose Merge is denied forces NextIteration and mrg2 back to float.

    Built like the C++ test: ``mrg1`` first takes ``ent1`` twice; its second input is then rewired to the
    NextIteration ``nxt1`` (the back edge), and ``con1`` gets a control input ``^mrg1``.
    """
    with _graph() as g:
        inp = _const(1.0 / 32, [32, 32], name="input")
        deny1 = tf.raw_ops.Exp(x=inp, name="deny1")
        ent1 = tf.raw_ops.Enter(data=deny1, frame_name="loop1", name="ent1")
        mrg1 = tf.raw_ops.Merge(inputs=[ent1, ent1], name="mrg1")
        con1 = _const(False, [], dtype=tf.bool, name="con1")
        lpc1 = tf.raw_ops.LoopCond(input=con1, name="lpc1")
        swt1 = tf.raw_ops.Switch(data=mrg1.output, pred=lpc1, name="swt1")
        infer1 = tf.raw_ops.Sqrt(x=swt1.output_true, name="infer1")
        allow1 = tf.raw_ops.MatMul(a=infer1, b=infer1, name="allow1")
        nxt1 = tf.raw_ops.NextIteration(data=allow1, name="nxt1")
        ext1 = tf.raw_ops.Exit(data=swt1.output_false, name="ext1")
        tf.raw_ops.Identity(input=ext1, name="fetch")
        tf.raw_ops.Merge(inputs=[ent1, nxt1], name="mrg2")
    gd = g.as_graph_def()
    _node(gd, "mrg1").input[1] = "nxt1"
    _node(gd, "con1").input.append("^mrg1")
    return gd, ["fetch"]


def _tensor_list_set_get(infer_op, device=None):
    shape = [32, 32]
    with _graph(device) as g:
        tl1 = tf.raw_ops.TensorListReserve(element_shape=shape, num_elements=8, element_dtype=tf.float32, name="tl1")
        inp = _const(1.0 / 32, shape, name="input")
        idx1 = _const(1, dtype=tf.int32, name="idx1")
        idx2 = _const(2, dtype=tf.int32, name="idx2")
        idx3 = _const(3, dtype=tf.int32, name="idx3")
        tf.raw_ops.TensorListSetItem(input_handle=tl1, index=idx1, item=inp, name="tl1w1")
        allow1 = tf.raw_ops.MatMul(a=inp, b=inp, name="allow1")
        tl1w2 = tf.raw_ops.TensorListSetItem(input_handle=tl1, index=idx2, item=allow1, name="tl1w2")
        tl1rs = tf.raw_ops.TensorListResize(input_handle=tl1w2, size=6, name="tl1rs")
        tl1r1 = tf.raw_ops.TensorListGetItem(
            input_handle=tl1rs, index=idx2, element_shape=shape, element_dtype=tf.float32, name="tl1r1"
        )
        if infer_op == "Mul":
            infer1 = tf.raw_ops.Mul(x=tl1r1, y=tl1r1, name="infer1")
        else:
            infer1 = getattr(tf.raw_ops, infer_op)(x=tl1r1, name="infer1")
        allow2 = tf.raw_ops.MatMul(a=infer1, b=infer1, name="allow2")
        tl1w3 = tf.raw_ops.TensorListSetItem(input_handle=tl1, index=idx3, item=allow2, name="tl1w3")
        tl1r2 = tf.raw_ops.TensorListGetItem(
            input_handle=tl1w3, index=idx3, element_shape=shape, element_dtype=tf.float32, name="tl1r2"
        )
        tl2 = tf.raw_ops.TensorListReserve(element_shape=shape, num_elements=8, element_dtype=tf.float32, name="tl2")
        tl2w1 = tf.raw_ops.TensorListSetItem(input_handle=tl2, index=idx1, item=inp, name="tl2w1")
        tl2r1 = tf.raw_ops.TensorListGetItem(
            input_handle=tl2w1, index=idx1, element_shape=shape, element_dtype=tf.float32, name="tl2r1"
        )
        tf.raw_ops.Identity(input=tl1r2, name="fetch1")
        tf.raw_ops.Identity(input=tl2r1, name="fetch2")
    return g.as_graph_def(), ["fetch1", "fetch2"]


def tensor_list_set_get():
    """TensorListSetGet: list tl1 (written with allow1, read into infer1) goes half; list tl2 stays float."""
    return _tensor_list_set_get("Tanh")


def tensor_list_push_pop():
    """TensorListPushPop: SetGet with EmptyTensorList / PushBack / PopBack."""
    shape = [32, 32]
    f32 = tf.float32
    with _graph() as g:
        tl1 = tf.raw_ops.EmptyTensorList(element_shape=shape, max_num_elements=8, element_dtype=f32, name="tl1")
        inp = _const(1.0 / 32, shape, name="input")
        tl1w1 = tf.raw_ops.TensorListPushBack(input_handle=tl1, tensor=inp, name="tl1w1")
        allow1 = tf.raw_ops.MatMul(a=inp, b=inp, name="allow1")
        tl1w2 = tf.raw_ops.TensorListPushBack(input_handle=tl1w1, tensor=allow1, name="tl1w2")
        tl1r1 = tf.raw_ops.TensorListPopBack(input_handle=tl1w2, element_shape=shape, element_dtype=f32, name="tl1r1")
        infer1 = tf.raw_ops.Tanh(x=tl1r1.tensor, name="infer1")
        allow2 = tf.raw_ops.MatMul(a=infer1, b=infer1, name="allow2")
        tl1w3 = tf.raw_ops.TensorListPushBack(input_handle=tl1, tensor=allow2, name="tl1w3")
        tl1r2 = tf.raw_ops.TensorListPopBack(input_handle=tl1w3, element_shape=shape, element_dtype=f32, name="tl1r2")
        tl2 = tf.raw_ops.EmptyTensorList(element_shape=shape, max_num_elements=8, element_dtype=f32, name="tl2")
        tl2w1 = tf.raw_ops.TensorListPushBack(input_handle=tl2, tensor=inp, name="tl2w1")
        tl2r1 = tf.raw_ops.TensorListPopBack(input_handle=tl2w1, element_shape=shape, element_dtype=f32, name="tl2r1")
        tf.raw_ops.Identity(input=tl1r2.tensor, name="fetch1")
        tf.raw_ops.Identity(input=tl2r1.tensor, name="fetch2")
    return g.as_graph_def(), ["fetch1", "fetch2"]


def tensor_list_from_tensor():
    """TensorListFromTensor: tl2/tl2w1 are not fetched, but are forced to match tl2's (half) colour."""
    shape = [32]
    with _graph() as g:
        inp = _const(1.0 / 32, [32, 32], name="input")
        allow1 = tf.raw_ops.MatMul(a=inp, b=inp, name="allow1")
        tl1 = tf.raw_ops.TensorListFromTensor(tensor=allow1, element_shape=shape, name="tl1")
        tl1r1 = tf.raw_ops.TensorListStack(
            input_handle=tl1, element_shape=shape, element_dtype=tf.float32, name="tl1r1"
        )
        infer1 = tf.raw_ops.Tanh(x=tl1r1, name="infer1")
        allow2 = tf.raw_ops.MatMul(a=infer1, b=infer1, name="allow2")
        tf.raw_ops.Identity(input=allow2, name="fetch1")
        tl2 = tf.raw_ops.TensorListFromTensor(tensor=allow1, element_shape=shape, name="tl2")
        tf.raw_ops.TensorListPushBack(input_handle=tl2, tensor=inp, name="tl2w1")
    return g.as_graph_def(), ["fetch1"]


def tensor_list_push_back_batch_and_concat_lists():
    """TensorListPushBackBatchAndConcatLists: handles pass through Pack, Split and Reshape into ConcatLists."""
    shape = [32, 32]
    f32 = tf.float32
    with _graph() as g:
        tl1 = tf.raw_ops.EmptyTensorList(element_shape=shape, max_num_elements=8, element_dtype=f32, name="tl1")
        tl2 = tf.raw_ops.EmptyTensorList(element_shape=shape, max_num_elements=8, element_dtype=f32, name="tl2")
        inp = _const(1.0 / 32, shape, name="input")
        allow1 = tf.raw_ops.MatMul(a=inp, b=inp, name="allow1")
        tl1_tl2 = tf.raw_ops.Pack(values=[tl1, tl2], name="tl1_tl2")
        allow1_allow1 = tf.raw_ops.Pack(values=[allow1, allow1], name="allow1_allow1")
        tl12w1 = tf.raw_ops.TensorListPushBackBatch(input_handles=tl1_tl2, tensor=allow1_allow1, name="tl12w1")
        split = tf.raw_ops.Split(axis=0, value=tl12w1, num_split=2, name="tl12w1_outputs")
        scalar_shape = _const(np.zeros([0], np.int32), dtype=tf.int32, name="scalar_shape")
        out0 = tf.raw_ops.Reshape(tensor=split[0], shape=scalar_shape, name="tl12w1_output0")
        out1 = tf.raw_ops.Reshape(tensor=split[1], shape=scalar_shape, name="tl12w1_output1")
        tl3 = tf.raw_ops.TensorListConcatLists(input_a=out0, input_b=out1, element_dtype=f32, name="tl3")
        tl3r1 = tf.raw_ops.TensorListPopBack(input_handle=tl3, element_shape=shape, element_dtype=f32, name="tl3r1")
        infer1 = tf.raw_ops.Tanh(x=tl3r1.tensor, name="infer1")
        allow2 = tf.raw_ops.MatMul(a=infer1, b=infer1, name="allow2")
        tf.raw_ops.Identity(input=allow2, name="fetch1")
    return g.as_graph_def(), ["fetch1"]


def _func1_fdef():
    """``Func1(ihandle: variant, x: float) -> (ohandle: variant, y: float)``: a PushBack then a PopBack."""
    fdef = function_pb2.FunctionDef()
    sig = fdef.signature
    sig.name = "Func1"
    for arg_list, names in ((sig.input_arg, ("ihandle", "x")), (sig.output_arg, ("ohandle", "y"))):
        for arg_name, dt in zip(names, (types_pb2.DT_VARIANT, types_pb2.DT_FLOAT)):
            arg = arg_list.add()
            arg.name, arg.type = arg_name, dt

    def add(name, op, inputs, **attrs):
        node = fdef.node_def.add(name=name, op=op, input=inputs)
        for key, value in attrs.items():
            node.attr[key].CopyFrom(value)

    f32 = tf.compat.v1.AttrValue(type=types_pb2.DT_FLOAT)
    add("tl1w1_handle", "TensorListPushBack", ["ihandle", "x"], element_dtype=f32)
    shape = tf.compat.v1.AttrValue(tensor=tf.make_tensor_proto([32, 32], dtype=tf.int32))
    add("shape", "Const", [], value=shape, dtype=tf.compat.v1.AttrValue(type=types_pb2.DT_INT32))
    add("tl1r1", "TensorListPopBack", ["tl1w1_handle:output_handle:0", "shape:output:0"], element_dtype=f32)
    add("ohandle_id", "Identity", ["tl1r1:output_handle:0"], T=tf.compat.v1.AttrValue(type=types_pb2.DT_VARIANT))
    add("y_id", "Identity", ["tl1r1:tensor:0"], T=f32)
    fdef.ret["ohandle"] = "ohandle_id:output:0"
    fdef.ret["y"] = "y_id:output:0"
    return fdef


def tensor_list_through_function():
    """TensorListThroughFunction: a list handle passing through a direct call of ``Func1`` keeps its list float.

    The call node is a direct function call (op ``Func1``, named ``Func1``), as the C++ test builds it with
    ``NodeBuilder("Func1", "Func1")``. It is created here as a variant Placeholder and then turned into the call.
    """
    shape = [32, 32]
    f32 = tf.float32
    with _graph() as g:
        inp = _const(1.0 / 32, shape, name="input")
        allow1 = tf.raw_ops.MatMul(a=inp, b=inp, name="allow1")
        infer1 = tf.raw_ops.Tanh(x=allow1, name="infer1")
        tl1 = tf.raw_ops.EmptyTensorList(element_shape=shape, max_num_elements=8, element_dtype=f32, name="tl1")
        tf.raw_ops.TensorListPushBack(input_handle=tl1, tensor=infer1, name="tl1w1")
        func1 = tf.raw_ops.Placeholder(dtype=tf.variant, name="Func1")
        tl1r1 = tf.raw_ops.TensorListPopBack(input_handle=func1, element_shape=shape, element_dtype=f32, name="tl1r1")
        tl2 = tf.raw_ops.EmptyTensorList(element_shape=shape, max_num_elements=8, element_dtype=f32, name="tl2")
        tl2w1 = tf.raw_ops.TensorListPushBack(input_handle=tl2, tensor=infer1, name="tl2w1")
        tl2r1 = tf.raw_ops.TensorListPopBack(input_handle=tl2w1, element_shape=shape, element_dtype=f32, name="tl2r1")
        allow2 = tf.raw_ops.MatMul(a=tl1r1.tensor, b=tl2r1.tensor, name="allow2")
        tf.raw_ops.Identity(input=allow2, name="fetch1")
    gd = g.as_graph_def()
    call = _node(gd, "Func1")
    call.CopyFrom(node_def_pb2.NodeDef(name="Func1", op="Func1", input=["tl1w1", "infer1"]))
    gd.library.function.add().CopyFrom(_func1_fdef())
    return gd, ["fetch1"]


def batch_mat_mul():
    """BatchMatMul: in the allow list when CUDA >= 9.1 (always in CPU mode)."""
    with _graph() as g:
        inp = _const(1.0 / 33, [64, 32, 32], name="input")
        allow1 = tf.raw_ops.BatchMatMul(x=inp, y=inp, name="allow1")
        tf.raw_ops.Identity(input=allow1, name="fetch1")
    return g.as_graph_def(), ["fetch1"]


def simple_unary_infer_op(op_name):
    """TestSimpleUnaryInferOp: ``MatMul(input, eye) -> <op_name> -> MatMul(., eye)``; the infer op goes half."""
    with _graph() as g:
        eye = _const(np.eye(128, dtype=np.float32), name="eye")
        inp = tf.raw_ops.Placeholder(dtype=tf.float32, name="input")
        allow1 = tf.raw_ops.MatMul(a=inp, b=eye, name="allow1")
        arg = {"Elu": "features", "Softplus": "features", "Softmax": "logits", "LogSoftmax": "logits"}.get(op_name, "x")
        infer1 = getattr(tf.raw_ops, op_name)(**{arg: allow1}, name="infer1")
        allow2 = tf.raw_ops.MatMul(a=infer1, b=eye, name="allow2")
        tf.raw_ops.Identity(input=allow2, name="fetch1")
    return g.as_graph_def(), ["fetch1"]


# ------------------------------------------------------- AutoMixedPrecisionCpuTest (emulation) and SimulateGpu


def cpu_simple():
    """CpuTest.Simple: the Simple graph on CPU:0 (emulation: allow1 stays float between Casts)."""
    with _graph(CPU0) as g:
        _simple_graph()
    return g.as_graph_def(), ["fetch"]


def cpu_mixed_fanout():
    """CpuTest.MixedFanout: allow1 feeds an allow MatMul and a deny Exp."""
    with _graph(CPU0) as g:
        input1 = _const(1.0 / 32, [32, 32], name="input1")
        input2 = _const(2.0 / 32, [32, 32], name="input2")
        allow1 = tf.raw_ops.MatMul(a=input1, b=input2, name="allow1")
        allow2 = tf.raw_ops.MatMul(a=allow1, b=input2, name="allow2")
        deny = tf.raw_ops.Exp(x=allow1, name="deny")
        infer = tf.raw_ops.Add(x=deny, y=allow2, name="infer")
        tf.raw_ops.Identity(input=infer, name="fetch")
    return g.as_graph_def(), ["fetch"]


def simple_simulated_gpu_cpu_scope():
    """SimulateGpuTest.Simple_SimulatedGpu_CpuScope: Simple on CPU:0 under a GPU pass is left unchanged."""
    return cpu_simple()


# ------------------------------------------------------------------------------ AutoMixedPrecisionMkl(Param)Test


def already_bf16():
    """MklTest.AlreadyBf16: AlreadyFp16 with bfloat16, on CPU:0."""
    return _already_low(tf.bfloat16, CPU0)


def mkl_simple():
    """MklTest.Simple: the Simple graph on CPU:0, its Log named deny2 and SparseMatMul deny3."""
    with _graph(CPU0) as g:
        _simple_graph(names=("deny2", "deny3"))
    return g.as_graph_def(), ["fetch"]


def tensor_list_set_get_bf16():
    """MklTest.TensorListSetGet: SetGet on CPU:0 with ``infer1 = Mul(tl1r1, tl1r1)``."""
    return _tensor_list_set_get("Mul", CPU0)


def infer_follow_upstream_allow():
    """MklParamTest.InferFollowUpStreamAllow: Conv2D -> BiasAdd -> Relu all go to the low precision."""
    with _graph(CPU0) as g:
        input1 = _const(1.0 / 32, [8, 56, 56, 16], name="input1")
        weight = _const(2.0, [3, 3, 16, 16], name="weight")
        allow = tf.raw_ops.Conv2D(
            input=input1, filter=weight, strides=[1, 1, 1, 1], padding="SAME", data_format="NHWC", name="allow"
        )
        input2 = _const(1.0 / 32, [16], name="input2")
        infer = tf.raw_ops.BiasAdd(value=allow, bias=input2, name="infer")
        clr = tf.raw_ops.Relu(features=infer, name="clr")
        tf.raw_ops.Identity(input=clr, name="fetch")
    return g.as_graph_def(), ["fetch"]


def infer_follow_upstream_deny():
    """MklParamTest.InferFollowUpStreamDeny: Pow -> BiasAdd -> Relu; nothing changes."""
    with _graph(CPU0) as g:
        input1 = _const(1.0 / 32, [8, 56, 56, 16], name="input1")
        input2 = _const(1.0, [16], name="input2")
        input3 = _const(1.0 / 32, [16], name="input3")
        deny = tf.raw_ops.Pow(x=input1, y=input2, name="deny")
        infer = tf.raw_ops.BiasAdd(value=deny, bias=input3, name="infer")
        clr = tf.raw_ops.Relu(features=infer, name="clr")
        tf.raw_ops.Identity(input=clr, name="fetch")
    return g.as_graph_def(), ["fetch"]


# ------------------------------------------------ Python suite: test_propagation_through_simple_loop_1..8


@contextlib.contextmanager
def _control_flow_v1():
    """Build v1 while loops (Enter/Merge/Switch/NextIteration/Exit) regardless of the global v2 switch."""
    saved = control_flow_util.ENABLE_CONTROL_FLOW_V2
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = False
    try:
        yield
    finally:
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = saved


def _ref_variable(value):
    """A TF1 (ref) variable, as the Python suite's ``_input``/``_weight`` make under ``run_v1_only``."""
    return tf.compat.v1.Variable(value, use_resource=False)


def _node_with_color(color, x, name):
    """W=MatMul(x, weight variable), G=Add(x, .1), C=Relu, B=Sqrt(Pow(x, 2)), as ``_make_node_with_color``."""
    color = color.lower()
    if color == "w":
        weight = _ref_variable(lambda: tf.compat.v1.glorot_uniform_initializer(seed=0)(x.shape.as_list()))
        return tf.linalg.matmul(x, weight, name=name)
    if color == "g":
        return tf.math.add(x, 0.1, name=name)
    if color == "c":
        return tf.nn.relu(x, name=name)
    if color == "b":
        return tf.math.sqrt(tf.math.pow(x, 2.0), name=name)
    raise ValueError(f"invalid node color {color!r}")


def simple_loop(inp_colors, body_colors, out_colors):
    """``_build_simple_loop_graph``: nodes ``input_i`` -> v1 while loop of ``while/body_i`` -> ``output_i``.

    Returns:
        ``(graph_def, fetches)``; the fetch is the final ``Identity``.
    """
    with _graph() as g, _control_flow_v1():
        a = _ref_variable(tf.random.truncated_normal([8, 8], seed=0))
        a = a.value()
        for i, color in enumerate(inp_colors):
            a = _node_with_color(color, a, f"input_{i}")

        def body(i, x):
            for k, color in enumerate(body_colors):
                x = _node_with_color(color, x, f"body_{k}")
            return i + 1, x

        _, a = tf.compat.v1.while_loop(lambda i, j: i < 4, body, (tf.constant(0), a))
        for i, color in enumerate(out_colors):
            a = _node_with_color(color, a, f"output_{i}")
        out = tf.identity(a)
    return g.as_graph_def(), [out.op.name]


def simple_loop_expected(inp_colors, body_colors, out_colors):
    """The expected ``T`` per named node: ``"h"`` for upper-case colours, ``"f"`` otherwise."""
    expected = {}
    for prefix, colors in (("input", inp_colors), ("while/body", body_colors), ("output", out_colors)):
        for i, color in enumerate(colors):
            expected[f"{prefix}_{i}"] = "h" if color.isupper() else "f"
    return expected


# ------------------------------------------------------------------------------------------------ the oracle

LEVEL_ENV = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LEVEL"
SIMULATE_GPU_ENV = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_SIMULATE_GPU"
# mode -> (precision, emulate_fp16) for mp_rewrite.testing.oracle.grappler_rewrite
_ORACLE_MODES = {"cpu_f16": ("float16", False), "cpu_emulate": ("float16", True), "bf16": ("bfloat16", False)}


def grappler_oracle(graph_def, fetches, mode, level=None):
    """Run TensorFlow's own auto mixed precision pass on ``graph_def`` (through ``mp_rewrite.testing.oracle``).

    Args:
        graph_def: the GraphDef to rewrite (not modified).
        fetches: node names to fetch; Grappler preserves them.
        mode: ``"cpu_f16"`` (``auto_mixed_precision_cpu`` with emulation off: real half retyping with the CUDA
            lists), ``"cpu_emulate"`` (the same with TF's default emulation on), ``"bf16"``
            (``auto_mixed_precision_onednn_bfloat16``) or ``"cuda_simulated"`` (the CUDA pass with
            ``SIMULATE_GPU=1``; this CPU-only build has no GPU kernels, so only graphs whose nodes are all placed on
            the CPU give a meaningful, i.e. unchanged, result).
        level: value for ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LEVEL`` (e.g. ``"TREAT_INFER_AS_DENY"``) or None.

    Returns:
        The rewritten GraphDef. The environment is restored afterwards.
    """
    env = {LEVEL_ENV: level}
    if mode == "cuda_simulated":
        config = oracle.oracle_config("float16")
        config.graph_options.rewrite_options.optimizers[:] = ["auto_mixed_precision"]
        env[SIMULATE_GPU_ENV] = "1"
        with oracle.environment(env):
            return tf_optimizer.OptimizeGraph(config, oracle.oracle_meta_graph(graph_def, fetches), verbose=False)
    precision, emulate = _ORACLE_MODES[mode]
    with oracle.environment(env):
        return oracle.grappler_rewrite(graph_def, fetches, precision, emulate_fp16=emulate)
