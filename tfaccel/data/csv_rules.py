"""What TensorFlow's CSV reader (`CsvDataset`) accepts, checked in Python with its rules.

Python's `int()` / `float()` accept cells the reader refuses (`1_000`, `١٢`), and the
reader turns a number float32 cannot hold (`1e40`) into inf without a word; these rules
let `from_csv` name such a cell by line and column before TensorFlow reads the file.
"""

from __future__ import annotations

import codecs
import re

import numpy as np
import tensorflow as tf

_SPACE = r"[ \t\r\f\v]*"
_INT = re.compile(_SPACE + r"[+-]?[0-9]+" + _SPACE, re.ASCII)
_DECIMAL = re.compile(
    _SPACE + r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?" + _SPACE, re.ASCII
)
_SPECIAL = re.compile(_SPACE + r"[+-]?(inf|infinity|nan)" + _SPACE, re.ASCII | re.IGNORECASE)
_INT64 = (-(2**63), 2**63 - 1)
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def is_int64(cell: str) -> bool:
    """Whether the reader reads `cell` as an int64 (ASCII digits, in range)."""
    return bool(_INT.fullmatch(cell)) and _INT64[0] <= int(cell) <= _INT64[1]


def float32_problem(cell: str) -> str | None:
    """None when the reader reads `cell` as the float32 it says, else what is wrong."""
    if _SPECIAL.fullmatch(cell):
        return None  # inf / nan written out: read as written
    if not _DECIMAL.fullmatch(cell):
        return "is not a number TensorFlow's CSV reader accepts"
    if abs(float(cell)) > _FLOAT32_MAX:
        return f"is beyond float32's range (±{_FLOAT32_MAX:.4g}) and would read as inf"
    return None


def column_kind(values: list[str]) -> str:
    """ "int64", "float32" or "string" for a column's sample cells.

    Inferred from what Python reads as numbers (`int()`, `float()`), so that a cell
    that looks like a number but that the reader refuses (`1_000`) makes no string
    column: `is_int64` / `float32_problem` then name it by line and column.
    """
    present = [v for v in values if v.strip()]
    if present and all(_parses(v, int) for v in present):
        return "int64"
    if present and all(_parses(v, float) for v in present):
        return "float32"
    return "string"


def _parses(cell: str, kind: type) -> bool:
    try:
        kind(cell)
    except ValueError:
        return False
    return True


def check_encoding(path: str, encoding: str) -> str:
    """The codec to open `path` with (a UTF-8 byte-order mark is skipped).

    Raises:
        ValueError: an unknown encoding, or one TensorFlow's reader cannot split
            (commas and quotes are not single ASCII bytes) or transcode.
    """
    try:
        name = codecs.lookup(encoding).name
    except LookupError:
        raise ValueError(f"from_csv: unknown encoding={encoding!r}.") from None
    if name == "utf-8":
        return "utf-8-sig"
    if ',"\n'.encode(name, errors="replace") != b',"\n':
        raise ValueError(
            f"from_csv: encoding={encoding!r} does not write commas and quotes as single "
            f"bytes, so TensorFlow's CSV reader cannot split {path!r}. Re-save the file as "
            "UTF-8 (e.g. iconv -f <encoding> -t UTF-8)."
        )
    try:
        tf.strings.unicode_transcode(tf.constant(b"a"), encoding, "UTF-8")
    except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError):
        raise ValueError(
            f"from_csv: TensorFlow cannot transcode encoding={encoding!r} to UTF-8. Re-save "
            f"{path!r} as UTF-8 (e.g. iconv -f <encoding> -t UTF-8)."
        ) from None
    return name
