"""Compare mp_rewrite's built-in op lists with the lists compiled into the installed TensorFlow.

TensorFlow's lists are read from the binary itself, not from its headers: Grappler's auto mixed
precision pass runs once per precision on a one-MatMul graph with
``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_LOG_PATH`` set, and the ``paintbuckets*.txt`` file it dumps
(sections ``AllowList:``, ``DenyList:``, ``InferList:``, ``ClearList:``) is parsed.

- float16 runs ``auto_mixed_precision_cpu``: CPU mode builds ``AutoMixedPrecisionListsFp16`` with
  ``use_cuda_`` and cuda 10000 / cudnn 8000, i.e. the CUDA lists with every version gate on.
- bfloat16 runs ``auto_mixed_precision_onednn_bfloat16`` (``AutoMixedPrecisionListsMkl``).

The environment variables that edit TF's lists (``..._ADD``/``..._REMOVE``, ``..._LEVEL``) are
removed while the pass runs, so the built-in lists are compared.

Usage::

    python3 tools/compare_lists.py                 # both precisions
    python3 tools/compare_lists.py -p bfloat16     # one precision

Exit status: 0 if every compared precision is identical, 1 if any differs, 2 on error.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Mapping

PRECISIONS = ("float16", "bfloat16")
LIST_KINDS = ("allow", "infer", "deny", "clear")

# Grappler optimizer name per precision (see the module docstring for why CPU mode for float16).
GRAPPLER_OPTIMIZER = {
    "float16": "auto_mixed_precision_cpu",
    "bfloat16": "auto_mixed_precision_onednn_bfloat16",
}

# Section headers of the paintbuckets dump, mapped to our list names.
_DUMP_SECTIONS = {"AllowList:": "allow", "DenyList:": "deny", "InferList:": "infer", "ClearList:": "clear"}

_ENV_PREFIX = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_"
# Variables that change what the pass's list functions return (new and legacy list names).
_LIST_ENV_VARS = tuple(
    f"{_ENV_PREFIX}{name}_{verb}"
    for name in ("ALLOWLIST", "INFERLIST", "DENYLIST", "CLEARLIST", "WHITELIST", "GRAYLIST", "BLACKLIST")
    for verb in ("ADD", "REMOVE")
) + (f"{_ENV_PREFIX}LEVEL",)


@dataclass(frozen=True)
class ListDiff:
    """Our lists and TensorFlow's for one precision, and how they differ.

    Attributes:
        precision: "float16" or "bfloat16".
        ours: list kind -> op names in mp_rewrite's built-in lists.
        tf: list kind -> op names in the installed TensorFlow's compiled lists.
    """

    precision: str
    ours: Mapping[str, frozenset[str]]
    tf: Mapping[str, frozenset[str]]

    def only_ours(self, kind: str) -> frozenset[str]:
        """Ops in our ``kind`` list that TF's ``kind`` list lacks."""
        return self.ours[kind] - self.tf[kind]

    def only_tf(self, kind: str) -> frozenset[str]:
        """Ops in TF's ``kind`` list that our ``kind`` list lacks."""
        return self.tf[kind] - self.ours[kind]

    @property
    def identical(self) -> bool:
        """True when every list matches."""
        return all(self.ours[kind] == self.tf[kind] for kind in LIST_KINDS)


def _matmul_meta_graph():
    """Build a MetaGraphDef holding ``a -> MatMul -> fetch`` on the CPU, with ``fetch`` preserved.

    The pass only writes its post-op dump when it finds an allowlist op it may process, hence the
    MatMul on the CPU (the device CPU mode processes).
    """
    import tensorflow as tf
    from tensorflow.core.protobuf import meta_graph_pb2

    graph = tf.Graph()
    with graph.as_default(), tf.device("/device:CPU:0"):
        a = tf.compat.v1.placeholder(tf.float32, [2, 2], name="a")
        tf.identity(tf.raw_ops.MatMul(a=a, b=a, name="matmul"), name="fetch")
    meta_graph = meta_graph_pb2.MetaGraphDef()
    meta_graph.graph_def.CopyFrom(graph.as_graph_def())
    meta_graph.collection_def["train_op"].node_list.value.append("fetch")
    return meta_graph


def _run_grappler_pass(optimizer: str, log_dir: str) -> None:
    """Run one Grappler optimizer on the MatMul graph, dumping its debug files into ``log_dir``."""
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.grappler import tf_optimizer

    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.optimizers.append(optimizer)
    rewrite.min_graph_nodes = -1
    from mp_rewrite.testing.oracle import environment
    with environment({f"{_ENV_PREFIX}LOG_PATH": log_dir, **dict.fromkeys(_LIST_ENV_VARS)}):
        tf_optimizer.OptimizeGraph(config, _matmul_meta_graph())


def parse_paintbuckets(text: str) -> dict[str, frozenset[str]]:
    """Parse a ``paintbuckets*.txt`` dump into list kind -> op names.

    Args:
        text: the file contents: ``AllowList:`` then one op per line, a blank line, ``DenyList:``...

    Returns:
        A dict with keys "allow", "infer", "deny", "clear".

    Raises:
        ValueError: if an op line comes before any section header or a section is missing.
    """
    lists: dict[str, set[str]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if line in _DUMP_SECTIONS:
            current = lists.setdefault(_DUMP_SECTIONS[line], set())
        elif line:
            if current is None:
                raise ValueError(f"paintbuckets dump: op {line!r} before any section header")
            current.add(line)
    missing = [kind for kind in LIST_KINDS if kind not in lists]
    if missing:
        raise ValueError(f"paintbuckets dump: sections missing for {missing}")
    return {kind: frozenset(ops) for kind, ops in lists.items()}


def tensorflow_lists(precision: str) -> dict[str, frozenset[str]]:
    """Return the op lists the installed TensorFlow binary uses for ``precision``.

    Args:
        precision: "float16" or "bfloat16".

    Returns:
        list kind -> frozenset of op names, as TF's pass dumped them.

    Raises:
        RuntimeError: if the pass did not write exactly one paintbuckets file.
    """
    with tempfile.TemporaryDirectory(prefix="mp_rewrite_paintbuckets_") as log_dir:
        _run_grappler_pass(GRAPPLER_OPTIMIZER[precision], log_dir)
        dumps = glob.glob(os.path.join(log_dir, "paintbuckets*.txt"))
        if len(dumps) != 1:
            raise RuntimeError(
                f"TF's {GRAPPLER_OPTIMIZER[precision]} pass wrote {len(dumps)} paintbuckets files in "
                f"{log_dir}, expected 1; does this TF build support the {precision} pass?"
            )
        with open(dumps[0], encoding="utf-8") as f:
            return parse_paintbuckets(f.read())


def our_lists(precision: str) -> dict[str, frozenset[str]]:
    """Return mp_rewrite's built-in lists for ``precision`` (all version-gated groups enabled).

    Args:
        precision: "float16" or "bfloat16".

    Returns:
        list kind -> frozenset of op names.
    """
    from mp_rewrite.core.oplists import builtin_lists

    lists = builtin_lists(precision)
    return {kind: frozenset(getattr(lists, kind)) for kind in LIST_KINDS}


def compare(precision: str) -> ListDiff:
    """Compare our lists with the installed TensorFlow's for one precision.

    Args:
        precision: "float16" or "bfloat16".

    Returns:
        The ListDiff (``.identical`` is True when they match).
    """
    return ListDiff(precision=precision, ours=our_lists(precision), tf=tensorflow_lists(precision))


def render(diff: ListDiff) -> None:
    """Print a rich table of both sides' sizes and the differences for one precision."""
    from rich.console import Console
    from rich.table import Table

    import tensorflow as tf

    table = Table(title=f"{diff.precision}: mp_rewrite vs TF {tf.__version__} binary")
    for column in ("list", "ours", "TF", "only in ours", "only in TF"):
        table.add_column(column)
    for kind in LIST_KINDS:
        table.add_row(
            kind,
            str(len(diff.ours[kind])),
            str(len(diff.tf[kind])),
            ", ".join(sorted(diff.only_ours(kind))) or "-",
            ", ".join(sorted(diff.only_tf(kind))) or "-",
        )
    console = Console()
    console.print(table)
    console.print(f"{diff.precision}: " + ("identical" if diff.identical else "[bold red]DIFFERENT[/]"))


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-p", "--precision", choices=PRECISIONS, action="append",
                        help="precision to compare (repeatable; default: both)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TF's INFO/WARNING lines off the table
    status = 0
    try:
        for precision in args.precision or PRECISIONS:
            diff = compare(precision)
            render(diff)
            if not diff.identical:
                status = 1
    except Exception as exc:  # CLI: one line, non-zero exit, no traceback
        print(f"compare_lists: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    sys.exit(main())
