"""The angles of Sin/Cos computed from integer positions stay float32 in the default conversion (core.angles), and
only there: Grappler's lists (assign="lists") convert them, node for node as TF does.

A rotary position embedding as keras-hub writes it (positions cast to float, an Einsum with the inverse
frequencies, Sin and Cos of the product) in bfloat16 is noise at positions near 1000: keras-hub's Gemma 4 failed
`--verify` with cosine 0.78 for that one Einsum.
"""

import dataclasses

import numpy as np
import tensorflow as tf

import mp_rewrite
from mp_rewrite.analysis.execution import run_graph_def
from mp_rewrite.core.angles import position_angles

DIM, LENGTH = 32, 16


def _rotary_graph():
    """A rotary embedding applied to x (a matmul of it first, so Grappler's lists have low-precision work), and a
    SIREN-like sin of activations beside it."""
    weights = np.random.default_rng(0).normal(size=(DIM, DIM)).astype(np.float32) / np.sqrt(DIM)
    inverse = (1.0 / 10000 ** (np.arange(0, DIM, 2) / DIM)).astype(np.float32)

    @tf.function(input_signature=[tf.TensorSpec([None, LENGTH, DIM]), tf.TensorSpec([None, LENGTH], tf.int32)])
    def rotary(x, positions):
        h = tf.einsum("btd,de->bte", x, weights)
        angles = tf.einsum("bi,j->bij", tf.cast(positions, tf.float32), inverse)
        cos, sin = tf.cos(tf.concat([angles, angles], -1)), tf.sin(tf.concat([angles, angles], -1))
        half = tf.concat([-h[..., DIM // 2:], h[..., :DIM // 2]], -1)
        rotated = tf.identity(h * cos + half * sin, name="rotated")
        siren = tf.identity(tf.sin(tf.einsum("btd,de->bte", rotated, weights)), name="siren")
        return rotated, siren

    graph = rotary.get_concrete_function().graph
    return graph.as_graph_def(), [t.name for t in graph.outputs]


def _op_dtypes(graph_def, op):
    return {n.name: tf.dtypes.as_dtype(n.attr["T"].type).name for n in graph_def.node if n.op == op}


def test_the_angle_from_positions_is_found_and_a_sin_of_activations_is_not():
    graph_def, _ = _rotary_graph()
    found = position_angles(graph_def)
    ops = {n.name: n.op for n in graph_def.node}
    assert {ops[name] for name in found} >= {"Cast", "Einsum", "ConcatV2", "Sin", "Cos"}
    periodic = {name for name, op in ops.items() if op in ("Sin", "Cos")}
    siren = next(name for name in periodic if name not in found)  # the sin of a matmul of activations
    assert set(found.values()) == periodic - {siren}
    assert not any(ops[name] == "Einsum" and found[name] == siren for name in found)


def test_the_default_conversion_keeps_the_angles_float32_and_its_outputs_near_float32():
    graph_def, fetches = _rotary_graph()
    lists = mp_rewrite.make_options("bfloat16", device="cpu")  # Grappler's lists, as `--assign lists` asks
    assert not lists.float32_angles
    guarded = dataclasses.replace(lists, float32_angles=True)  # the default's lists candidate (assign="cost")
    grappler = mp_rewrite.rewrite_graph_def(graph_def, fetches=fetches, options=lists)
    ours = mp_rewrite.rewrite_graph_def(graph_def, fetches=fetches, options=guarded)
    angle = next(name for name, op in ((n.name, n.op) for n in graph_def.node)
                 if op == "Einsum" and name in position_angles(graph_def))
    assert _op_dtypes(grappler.graph_def, "Einsum")[angle] == "bfloat16"  # what TF's own pass does
    assert _op_dtypes(ours.graph_def, "Einsum")[angle] == "float32"
    decision = ours.coloring[angle, "T"]
    assert decision.reason.rule == "position_angle" and decision.reason.source.endswith(("Sin", "Cos"))
    # The other matmuls still convert.
    assert list(_op_dtypes(ours.graph_def, "Einsum").values()).count("bfloat16") == 2
    rng = np.random.default_rng(1)
    feeds = {"x": rng.normal(size=(2, LENGTH, DIM)).astype(np.float32),
             "positions": rng.integers(0, 1000, size=(2, LENGTH)).astype(np.int32)}
    want = run_graph_def(graph_def, feeds, fetches)[0]
    kept = run_graph_def(ours.graph_def, feeds, fetches)[0].astype(np.float32)
    converted = run_graph_def(grappler.graph_def, feeds, fetches)[0].astype(np.float32)

    def outside(got):  # the share of elements --verify's bfloat16 tolerance refuses
        return float(np.mean(~np.isclose(got, want, rtol=0.05, atol=0.05)))
    assert outside(kept) < 0.01, outside(kept)
    assert outside(converted) > 0.1, outside(converted)  # 20%: the fast-turning angles in bfloat16 are noise
