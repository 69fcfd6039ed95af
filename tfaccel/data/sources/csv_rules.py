"""What TensorFlow's CSV reader (`CsvDataset`) accepts, checked in Python with its rules.

Python's `int()` / `float()` accept cells the reader refuses (`1_000`, `١٢`), and the
reader turns a number float32 cannot hold (`1e40`) into inf without a word; these rules
let `from_csv` name such a cell by line and column before TensorFlow reads the file.
"""

from __future__ import annotations

import codecs
import csv
import functools
import re
from collections.abc import Sequence
from typing import NamedTuple

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


_INT_CHARS = b"0123456789+- \t"
_FLOAT_CHARS = _INT_CHARS + b".eE" + b"infatyINFATY"  # and inf, infinity, nan
_MISSING_INT = -(2**63)
_DECODE_ERROR = re.compile(r"Field (\d+) in record \d+ is not a valid")


def _guess(cells: Sequence[bytes], codec: str) -> str:
    """`column_kind` of the cells (bytes), from their characters alone where that is
    enough (C speed); TensorFlow's decoder then confirms the numbers."""
    joined = b"".join(cells)
    if not joined.strip(b" \t"):
        return "string"
    if not joined.translate(None, _INT_CHARS):
        return "int64"
    if not joined.translate(None, _FLOAT_CHARS):
        return "float32"
    return column_kind([c.decode(codec) for c in cells])  # text: stops at its first cell


class Scan(NamedTuple):
    """What `fast_scan` found: the wanted columns' kinds, their empty numeric cells
    (name → (count, first line)), and the decoded values of each wanted column (empty
    cells hold `blank_value`) with the row indices of its empty cells."""

    kinds: list
    empty: dict
    values: list
    blanks: dict


def fast_scan(
    path: str,
    codec: str,
    header: list[str],
    wanted: list[int],
    label: str,
    vocabulary: list[str] | None,
    refuse_empty: bool,
    sample_count: int,
) -> Scan | None:
    """A `Scan` whose kinds and empties are what the row-by-row check would find, from
    one `tf.io.decode_csv` over every line (TensorFlow's own rules, C++ speed), or None
    when anything needs the row-by-row check (which then names the line): a cell the
    reader refuses, an empty label, a float32 overflow, a blank line, a quoted line
    break, an empty cell with `missing="error"`.

    Kinds are guessed from the characters of the first `sample_count` rows; a column the
    decoder refuses as guessed gets `column_kind` of those rows.
    """
    with open(path, "rb") as handle:
        raw = handle.read()
    try:
        raw.decode(codec)
    except UnicodeDecodeError:
        return None
    lines = raw.splitlines()[1:]
    width = len(header)
    if b"" in lines:
        return None
    if b'"' in raw:
        rows = [[c.encode(codec) for c in row] for row in sample_rows(path, codec, sample_count)]
        if any(len(row) != width for row in rows):
            return None
        columns: list[Sequence[bytes]] = list(zip(*rows, strict=True))
    else:  # no quotes: a comma always separates cells (decode_csv checks the counts)
        cells = b",".join(lines[:sample_count]).split(b",")
        if len(cells) != width * min(len(lines), sample_count):
            return None
        columns = [cells[i::width] for i in range(width)]
    kinds = [
        "string" if vocabulary and header[i] == label else _guess(columns[i], codec) for i in wanted
    ]
    records = tf.constant(np.array(lines, dtype=bytes))  # C++ copy, not a Python loop
    for _ in range(8):
        defaults = [_default("string")] * width
        for i, kind in zip(wanted, kinds, strict=True):
            defaults[i] = _default(kind)
        try:
            decoded = tf.io.decode_csv(records, defaults, na_value="")
            break
        except tf.errors.InvalidArgumentError as error:
            match = _DECODE_ERROR.search(error.message)
            if not match or int(match.group(1)) not in wanted:
                return None
            column = int(match.group(1))
            kind = column_kind([c.decode(codec) for c in columns[column]])
            if kind == kinds[wanted.index(column)]:
                return None  # a cell the reader refuses in a column of its kind
            kinds[wanted.index(column)] = kind
    else:
        return None
    written: set[bytes] | list[str] | None = vocabulary
    if vocabulary:  # as the file writes them
        written = {v.encode("utf-8" if codec == "utf-8-sig" else codec) for v in vocabulary}
    found = _scan_values(lines, header, wanted, kinds, decoded, label, written, refuse_empty)
    if found is None:
        return None
    empty, blanks = found
    return Scan(kinds, empty, [decoded[i] for i in wanted], blanks)


def blank_value(kind: str) -> int | float | bytes:
    """What an empty cell of a `kind` column holds in `Scan.values`."""
    blanks: dict[str, int | float | bytes] = {
        "int64": _MISSING_INT,
        "float32": np.nan,
        "string": b"",
    }
    return blanks[kind]


@functools.cache
def _default(kind: str) -> tf.Tensor:
    """What an empty cell decodes to: a value no cell holds for numbers (NaN, int64's
    least), so empty cells can be found; made once."""
    return tf.constant(blank_value(kind), kind)


def sample_rows(path: str, codec: str, count: int) -> list[list[str]]:
    """The first `count` rows after the header."""
    with open(path, newline="", encoding=codec) as handle:
        reader = csv.reader(handle)
        next(reader, None)
        return [row for _, row in zip(range(count), reader, strict=False)]


def _scan_values(lines, header, wanted, kinds, decoded, label, vocabulary, refuse_empty):
    texts = None  # every cell as text, decoded only when a missing value needs a look
    empty, blanks = {}, {}
    for i, kind in zip(wanted, kinds, strict=True):
        values = decoded[i].numpy()
        if kind == "string":
            if header[i] == label:
                cells = [v.strip() for v in values.tolist()]
                if b"" in cells or (vocabulary and set(cells) - vocabulary):
                    return None
            continue
        odd = values == _MISSING_INT if kind == "int64" else ~np.isfinite(values)
        if not odd.any():
            continue
        if texts is None:
            texts = tf.io.decode_csv(
                tf.constant(np.array(lines, dtype=bytes)),
                [tf.constant("", tf.string)] * len(header),
            )
        where = np.flatnonzero(odd)
        cells = np.char.strip(texts[i].numpy()[where].astype(bytes))
        blank = cells == b""
        if kind == "float32" and any(
            not blank[j] and not _SPECIAL.fullmatch(cells[j].decode()) for j in range(len(where))
        ):
            return None  # beyond float32: named row by row
        if blank.any():
            if header[i] == label or refuse_empty:
                return None
            empty[header[i]] = (int(blank.sum()), int(where[np.argmax(blank)]) + 2)
            blanks[i] = where[blank]
    return empty, blanks
