"""`matmul_transpose`: a batched matmul whose output is transposed in its last two axes, `Transpose(A @ B,
[..., -1, -2])`, becomes `B^T @ A^T`: a BatchMatMul of the operands swapped, each read transposed (adj_x, adj_y,
which oneDNN reads through strides, no copy).

keras-hub's attention (`CachedMultiHeadAttention`, every keras-hub Transformer: BERT, GPT-2, ...) computes its scores
with `einsum("aecd,abcd->acbe", key, query)`, which TensorFlow spells key @ query then a Transpose of the scores
[batch, heads, T, S] in their last two axes: a pass over the model's largest activation in every layer. Exact:
(AB)^T = B^T A^T, the same products summed in the same order.
"""

from __future__ import annotations

from .graph import EditableGraph
from .record import Match
from .reshape import BATCH_MATMULS


def match_matmul_transpose(graph: EditableGraph, transpose) -> Match | None:
    """`Transpose(BatchMatMul(a, b), perm)` with perm swapping the last two axes alone; None otherwise."""
    matmul, perm = graph.producer(transpose.input[0]), graph.constant(transpose.input[1])
    if matmul is None or matmul.op not in BATCH_MATMULS or perm is None or perm.ndim != 1 or perm.size < 3:
        return None
    rank = perm.size
    if perm.tolist() != list(range(rank - 2)) + [rank - 1, rank - 2]:
        return None
    if graph.is_kept(matmul) or graph.only_reader(matmul.name) is not transpose or len(graph.data_inputs(matmul)) != 2:
        return None
    return Match(nodes={"transpose": transpose, "matmul": matmul})


def rewrite_matmul_transpose(graph: EditableGraph, match: Match) -> str:
    """The Transpose becomes the swapped matmul (its name kept, so its readers read the same tensor)."""
    transpose, matmul = match.nodes["transpose"], match.nodes["matmul"]
    a, b = graph.data_inputs(matmul)
    adj_x, adj_y = (key in matmul.attr and matmul.attr[key].b for key in ("adj_x", "adj_y"))
    transpose.op = matmul.op
    transpose.attr.clear()
    for key in matmul.attr:
        transpose.attr[key].CopyFrom(matmul.attr[key])
    transpose.attr["adj_x"].b, transpose.attr["adj_y"].b = not adj_y, not adj_x
    if matmul.op == "BatchMatMulV3":  # its operands' dtypes travel with them
        transpose.attr["Ta"].type, transpose.attr["Tb"].type = matmul.attr["Tb"].type, matmul.attr["Ta"].type
    waits = [t for t in matmul.input if t.startswith("^") and t not in transpose.input]
    graph.set_inputs(transpose, [b, a, *waits])
    graph.remove([matmul.name])
    return f"'{transpose.name}' is '{matmul.name}' with its operands swapped and read transposed"
