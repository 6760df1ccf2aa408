"""Batch-1 splits of a frozen GraphDef (issue 40, item 3), for tools/bench_batch_one.py: one sample's work in N
branches that TensorFlow's inter-op pool runs at once (served with one intra-op thread, no hand-off per op).

- `split_rows`: a Transformer's token rows -- the product's row split (mp_rewrite/analysis/token_rows.py plans it,
  mp_rewrite/savedmodel/row_split.py builds it; `convert --freeze --split` calls it at batch 1), here in the
  benchmark's form: (GraphDef, {output: tensor}, [(node, op, why)] of the ops fed every row).
- `split_bands` (batch_one_bands.py): a CNN's image in N horizontal bands with halos.
- `split_columns` (batch_one_columns.py): the large weights by columns (heads, channels).
"""

from __future__ import annotations

from mp_rewrite.savedmodel.row_split import split_token_rows as split_rows

__all__ = ["split_rows"]
