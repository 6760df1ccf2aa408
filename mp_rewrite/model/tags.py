"""Tag-sets: which MetaGraph of a SavedModel a command works on.

A TF1 / Estimator export holds several MetaGraphs (`serve`, `serve,gpu`, `train`), each named by its set of tags;
`saved_model_cli --tag_set serve,gpu` and `tf.saved_model.load(path, tags=[...])` choose one by its exact set. The
default conversion rewrites every MetaGraph; what loads the model in TensorFlow (freezing, verifying, the guard)
needs exactly one, and refuses to guess between several.
"""

from __future__ import annotations

from ..errors import ModelError, OptionError

SERVE = frozenset({"serve"})


def parse_tag_set(text) -> frozenset | None:
    """"serve,gpu" (or a list of tags) -> frozenset({"serve", "gpu"}); None or "" -> None (no choice made).

    Raises:
        OptionError: an empty tag in the list ("serve,,gpu").
    """
    if text is None or text == "" or text == ():
        return None
    tags = [t.strip() for t in text.split(",")] if isinstance(text, str) else [str(t).strip() for t in text]
    if not all(tags):
        raise OptionError(f"--tag-set {text!r} has an empty tag; give comma-separated tags, e.g. --tag-set serve,gpu")
    return frozenset(tags)


def tag_text(meta_graph) -> str:
    """A MetaGraph's tag-set as saved_model_cli prints it ("serve,gpu"); "(no tags)" when it has none."""
    return ",".join(meta_graph.meta_info_def.tags) or "(no tags)"


def _known(saved_model) -> str:
    return "; ".join(tag_text(m) for m in saved_model.meta_graphs)


def select_meta_graphs(saved_model, tag_set=None) -> list:
    """The MetaGraphs to work on: every one when `tag_set` is None, else the one whose tags are exactly `tag_set`.

    Returns:
        [(index in saved_model.meta_graphs, MetaGraphDef)].

    Raises:
        ModelError: no MetaGraph has that tag-set (the line lists the tag-sets there are).
    """
    wanted = parse_tag_set(tag_set) if not isinstance(tag_set, frozenset) else tag_set
    graphs = list(enumerate(saved_model.meta_graphs))
    if wanted is None:
        return graphs
    chosen = [(i, m) for i, m in graphs if frozenset(m.meta_info_def.tags) == wanted]
    if not chosen:
        raise ModelError(f"the SavedModel has no MetaGraph tagged '{','.join(sorted(wanted))}' (its tag-sets: "
                         f"{_known(saved_model)}); pass one of them to --tag-set")
    return chosen[:1]


def single_meta_graph(saved_model, tag_set=None, purpose: str = "loading the model in TensorFlow"):
    """The one MetaGraph that `purpose` loads: the one tagged `tag_set`, else the only one, else the only one
    tagged exactly "serve".

    Returns:
        (index, MetaGraphDef).

    Raises:
        ModelError: no MetaGraph has `tag_set`, or several could be meant (the line lists them and names --tag-set).
    """
    if tag_set is not None:
        return select_meta_graphs(saved_model, tag_set)[0]
    graphs = list(enumerate(saved_model.meta_graphs))
    if len(graphs) == 1:
        return graphs[0]
    serving = [(i, m) for i, m in graphs if frozenset(m.meta_info_def.tags) == SERVE]
    if len(serving) == 1:
        return serving[0]
    raise ModelError(f"the SavedModel has {len(graphs)} MetaGraphs (tag-sets: {_known(saved_model)}) and {purpose} "
                     "needs one; choose it with --tag-set (tag_set= in Python), e.g. --tag-set "
                     f"{tag_text(graphs[0][1]) if graphs[0][1].meta_info_def.tags else 'serve'}")


def inspected_meta_graph(saved_model, tag_set=None):
    """The MetaGraph `inspect` and `explain` show: the one tagged `tag_set`; without one, the one tagged exactly
    "serve", else one tagged "serve", else the first (a picture or a report never refuses to guess).

    Raises:
        ModelError: no MetaGraph has `tag_set`.
    """
    if tag_set is not None:
        return select_meta_graphs(saved_model, tag_set)[0][1]
    graphs = list(saved_model.meta_graphs)
    return next((m for m in graphs if frozenset(m.meta_info_def.tags) == SERVE),
                next((m for m in graphs if "serve" in m.meta_info_def.tags), graphs[0]))


def load_tags(meta_graph) -> list | None:
    """The `tags=` argument of tf.saved_model.load for this MetaGraph (None: TF's default, "serve")."""
    tags = list(meta_graph.meta_info_def.tags)
    return tags or None
