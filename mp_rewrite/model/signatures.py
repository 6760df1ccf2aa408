"""Signature keys: which signatures of a model a command works on, checked the same way everywhere."""

from __future__ import annotations

from ..errors import ModelError

DEFAULT_KEY = "serving_default"


def signature_keys(meta_graphs) -> list[str]:
    """The user signature keys of the given MetaGraphs, sorted (internal ones like __saved_model_init_op left out)."""
    from ..core.meta_graph import INTERNAL_PREFIX  # here: the CLI imports this module before TensorFlow starts
    return sorted({k for mg in meta_graphs for k in mg.signature_def if not k.startswith(INTERNAL_PREFIX)})


def check_signature_keys(wanted, known, where: str = "the SavedModel") -> tuple | None:
    """The requested keys, each checked against `known`; None (every signature) stays None.

    Raises:
        ModelError: a requested key is not one of `known` (the line lists them).
    """
    if not wanted:
        return None
    wanted = (wanted,) if isinstance(wanted, str) else tuple(wanted)
    known = sorted(known)
    for key in wanted:
        if key not in known:
            raise ModelError(f"{where} has no signature '{key}' (its signatures: {', '.join(known) or 'none'}); "
                             "pass one of them to --signature")
    return tuple(dict.fromkeys(wanted))


def default_signature(known) -> str | None:
    """"serving_default" when there is one, else the first key in sorted order (None for none)."""
    known = sorted(known)
    return DEFAULT_KEY if DEFAULT_KEY in known else (known[0] if known else None)


def require_signatures(known, path) -> list[str]:
    """The keys, refusing a model without any (nothing to run or freeze).

    Raises:
        ModelError: the model has no signatures, with how to export one.
    """
    if not known:
        raise ModelError(f"'{path}' has no signatures, so there is nothing to run; export the model with signatures "
                         "(model.export(path) or tf.saved_model.save(obj, path, signatures=...))")
    return sorted(known)


def function_key(fdef) -> bytes:
    """A FunctionDef as written, but for its name and the names its arguments were given by the user (traced twice,
    one function gets two names): equal for a Keras export's "serve" and "serving_default". An attr with no value
    still tells two apart."""
    fdef_copy = type(fdef)()
    fdef_copy.CopyFrom(fdef)
    fdef_copy.signature.name = ""
    for attrs in fdef_copy.arg_attr.values():
        name = attrs.attr.get("_user_specified_name")
        if name is not None and name.WhichOneof("value") == "s":
            name.s = b""
    return fdef_copy.SerializeToString(deterministic=True)
