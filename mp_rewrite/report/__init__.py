"""Inspection reports of a RewriteResult: text, JSON, DOT/SVG, HTML, TensorBoard, a Model Explorer overlay, and
`explain` for one node.

Every report renders the Decisions and Reasons the pass recorded; none works a decision out again.

    from mp_rewrite import report
    print(report.to_text(result))
    print(report.explain(result, "dense_1/BiasAdd").text())
    open("report.html", "w").write(report.to_html(result))

Names are imported lazily (the HTML and picture modules pull in networkx and graphviz; the Model Explorer overlay
needs the `viz` extra). No module is named like a name it exports: importing a submodule sets it as the package's
attribute, which would hide the function of that name (`explain` lives in explanation.py).
"""

import importlib

_EXPORTS = {
    "to_text": "text", "to_json": "json_report", "to_dict": "json_report", "SCHEMA_VERSION": "json_report",
    "to_dot": "dot", "to_svg": "dot", "picture": "dot", "to_html": "html",
    "write_tensorboard": "tensorboard", "annotated_graph_def": "tensorboard",
    "explain": "explanation", "explain_all": "explanation", "Explanation": "explanation",
    "build_tables": "node_table", "summarize": "stats", "to_model_explorer": "model_explorer",
    "whole_model_svg": "whole_model", "layer_picture": "whole_model", "network_table": "network",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mp_rewrite.report' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
