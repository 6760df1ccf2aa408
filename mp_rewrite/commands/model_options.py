"""The model options every subcommand that reads a SavedModel shares: --tag-set (as saved_model_cli's --tag_set),
and reading a Keras .keras/.h5 file as the SavedModel model.export would write."""

from __future__ import annotations

import contextlib
import sys

TAG_SET_HELP = ("the MetaGraph to use, by its comma-separated tags (as saved_model_cli's --tag_set, e.g. serve,gpu); "
                "default: every MetaGraph for a conversion, the only (or only 'serve') one where the model is run")


def add_tag_set_option(parser) -> None:
    """Add --tag-set to a subcommand's parser."""
    parser.add_argument("--tag-set", dest="tag_set", metavar="TAGS", default=None, help=TAG_SET_HELP)


def add_effects_option(parser) -> None:
    """Add --run-effects to a subcommand that runs the model it is given."""
    parser.add_argument("--run-effects", action="store_true",
                        help="run the model as it is where it is run to measure or check it: the ops of its "
                             "signatures that write files, save checkpoints or write summaries then do so (by "
                             "default a copy in which they do nothing is run, and a note names them)")


def say(line: str) -> None:
    """A one-line note on stderr (stdout may be a report or a table)."""
    print(f"note: {line}", file=sys.stderr)


@contextlib.contextmanager
def saved_model_path(path):
    """Yield a SavedModel directory for `path`: the path, or for a Keras .keras/.h5 file a temporary export of its
    serving signature (said in one line, removed afterwards)."""
    from ..model.keras_file import saved_model_of
    with saved_model_of(path, say) as directory:
        yield directory
