"""DataType enum values and names, without importing TensorFlow's Python runtime."""

from tensorflow.core.framework import types_pb2

FLOAT = types_pb2.DT_FLOAT
HALF = types_pb2.DT_HALF
BFLOAT16 = types_pb2.DT_BFLOAT16
VARIANT = types_pb2.DT_VARIANT
INVALID = types_pb2.DT_INVALID
QUANTIZED = frozenset({types_pb2.DT_QINT8, types_pb2.DT_QUINT8, types_pb2.DT_QINT16,
                       types_pb2.DT_QUINT16, types_pb2.DT_QINT32})

KNOWN = frozenset(types_pb2.DataType.values())  # every enum value TF knows, reference types included

PRECISIONS = {"float16": HALF, "bfloat16": BFLOAT16}
# Grappler's cast-name fragments (TF 2.21 BuildCastNode).
CAST_KIND = {HALF: "CastToFp16", BFLOAT16: "CastToBf16", FLOAT: "CastToFp32"}


def name(dtype: int) -> str:
    """Return the short name of a DataType enum value ("float", "half", "int32", "float_ref")."""
    return types_pb2.DataType.Name(dtype)[3:].lower()


def by_name(short: str) -> int:
    """Return the DataType enum for a short name ("float", "half", "bfloat16")."""
    return types_pb2.DataType.Value("DT_" + short.upper())


def target_dtype(precision: str) -> int:
    """Return the DataType enum for a precision name.

    Raises:
        OptionError: the precision is not "float16" or "bfloat16".
    """
    from ..errors import OptionError
    try:
        return PRECISIONS[precision]
    except (KeyError, TypeError):
        raise OptionError(f"unknown precision {precision!r}: use 'float16' or 'bfloat16'") from None

LOW = frozenset({HALF, BFLOAT16})  # the low precisions, as DataType enums
