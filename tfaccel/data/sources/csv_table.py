"""`from_csv`: a CSV table checked whole (line and column of a bad cell), then read."""

from __future__ import annotations

import csv
import os
import warnings

import numpy as np
import tensorflow as tf

from tfaccel.data import fingerprint
from tfaccel.data.elements import AUTOTUNE
from tfaccel.data.sources import csv_rules
from tfaccel.data.sources.info import SourceInfo, attach_source

_CSV_SAMPLE_ROWS = 1000


def from_csv(
    path: str,
    *,
    label: str,
    select: list[str] | None = None,
    missing: str = "zero",
    encoding: str = "utf-8",
    label_vocabulary: list[str] | None = None,
) -> tf.data.Dataset:
    """Reads a CSV table (with a header row) as `(features_dict, label)` rows.

    Column types are inferred from the first 1,000 rows: integers → int64,
    other numbers → float32, anything else → string. The whole file is checked
    once, with the rules of TensorFlow's CSV reader, before TensorFlow reads it, so
    a bad cell is reported by its line and column. A file up to 64 MiB that
    TensorFlow's own decoder checked is served from that decoding (read once, from
    memory); larger files, and those checked row by row, stream from disk.

    Args:
        path: the CSV file.
        label: the label column's name.
        select: feature columns to keep (default: every column but the label).
        missing: what an empty cell of a numeric feature column reads as: "zero"
            (0, as TensorFlow's CSV readers do, with one warning naming the columns),
            "nan" (NaN; such a column reads as float32), or "error" (refuse the file).
        encoding: the file's text encoding (a UTF-8 byte-order mark is skipped);
            string cells of another encoding are transcoded to UTF-8.
        label_vocabulary: the label's values, in class order: each label reads as
            its index here (int64), e.g. `["cat", "dog"]` → 0, 1.

    Returns:
        An unbatched dataset of `({column: value}, label)`.

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: `label` or a `select` name is not a column, `select` names the
            label, a column name repeats, the file is empty, has no rows or is not
            text in `encoding`, a row has more or fewer cells than the header, a label
            cell is empty or not in `label_vocabulary`, or a numeric cell the reader
            would refuse or read as inf (each names the line and column); an empty
            numeric cell with `missing="error"`; an unknown `missing` or `encoding`.
    """
    if missing not in _MISSING:
        raise ValueError(f"from_csv: missing must be one of {_MISSING}, got {missing!r}.")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"from_csv: no CSV file at {path!r}.")
    vocabulary = _check_vocabulary(label_vocabulary)
    codec = csv_rules.check_encoding(path, encoding)
    header, features, wanted, kinds, empty, scan = check_csv(
        path, label, select, missing, codec, encoding, vocabulary
    )
    names = [header[i] for i in wanted]
    defaults = [_DEFAULTS[kind]() for kind in kinds]
    if empty and missing == "nan":
        defaults = [
            tf.constant(np.nan, tf.float32) if name in empty else default
            for name, default in zip(names, defaults, strict=True)
        ]
    elif empty:
        listing = ", ".join(
            f"{name!r}: {count} (first at line {line})" for name, (count, line) in empty.items()
        )
        warnings.warn(
            f"from_csv: empty numeric cell(s) in {path!r} read as 0 — {listing}. Pass "
            "missing='nan' to read them as NaN, or missing='error' to refuse the file.",
            stacklevel=2,
        )
    table = None
    if vocabulary:
        table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(vocabulary), tf.range(len(vocabulary), dtype=tf.int64)
            ),
            default_value=-1,
        )

    def to_pair(*values):  # one row, or whole columns
        columns = dict(zip(names, values, strict=True))
        if codec != "utf-8-sig":
            columns = {
                k: tf.strings.unicode_transcode(v, encoding, "UTF-8") if v.dtype == tf.string else v
                for k, v in columns.items()
            }
        target = columns.pop(label)
        if table is not None:
            target = table.lookup(tf.strings.strip(target))
        return {name: columns[name] for name in features}, target

    columns = _checked_columns(path, wanted, scan, missing)
    if columns is None:
        dataset = tf.data.experimental.CsvDataset(
            path, defaults, header=True, select_cols=wanted, na_value=""
        ).map(to_pair, num_parallel_calls=AUTOTUNE)
    else:  # the check decoded the file already: read once, served from memory
        dataset = tf.data.Dataset.from_tensor_slices(to_pair(*columns))
    info = SourceInfo(
        "csv",
        {"path": path, "label": label},
        identity=fingerprint.files_identity([path], names, missing),
    )
    return attach_source(dataset, info)


def check_csv(
    path: str,
    label: str,
    select: list[str] | None,
    missing: str,
    codec: str,
    encoding: str,
    vocabulary: list[str] | None,
) -> tuple:
    """`from_csv`'s check of the whole file: `(header, features, wanted column indices,
    kinds, empty numeric cells, csv_rules.Scan or None)`, or ValueError naming the line
    and column at fault. The scan (the decoded file) is None when the row-by-row check ran."""
    with open(path, newline="", encoding=codec) as handle:
        reader = csv.reader(handle)
        try:
            header = next(reader, [])  # none: `_columns` says the file is empty
            features, wanted = _columns(path, header, label, select)
            head = _take(reader, 1)
            if not head:
                raise ValueError(
                    f"from_csv: {path!r} has a header but no rows: the file has no rows to "
                    "read. Check that the file was written completely."
                )
            fast = csv_rules.fast_scan(
                path, codec, header, wanted, label, vocabulary, missing == "error", _CSV_SAMPLE_ROWS
            )
            if fast is None:  # row by row, naming the line of what is wrong
                sample = head + _take(reader, _CSV_SAMPLE_ROWS - len(head))
                kinds, empty = _check_rows(
                    path, header, label, wanted, vocabulary, sample, reader, missing
                )
            else:
                kinds, empty = fast.kinds, fast.empty
        except UnicodeDecodeError as error:
            raise ValueError(
                f"from_csv: {path!r} is not {encoding} text (byte "
                f"{error.object[error.start]:#04x} after line {reader.line_num}: "
                f"{error.reason}). Pass the file's encoding, e.g. encoding='latin-1', or "
                "re-save it as UTF-8."
            ) from None
    return header, features, wanted, kinds, empty, fast


def _checked_columns(path, wanted, scan, missing) -> list[tf.Tensor] | None:
    """The wanted columns as `CsvDataset` would read them, from the check's decoding
    (a file up to `_SERVED_FROM_MEMORY` bytes), or None to stream the file instead."""
    if scan is None or os.path.getsize(path) > _SERVED_FROM_MEMORY:
        return None
    columns = []
    for index, kind, values in zip(wanted, scan.kinds, scan.values, strict=True):
        rows = scan.blanks.get(index)
        if rows is not None and missing == "nan" and kind == "int64":
            return None  # such a column reads as float32: let the reader parse it
        if rows is not None and missing == "zero":
            values = tf.tensor_scatter_nd_update(
                values, rows[:, None], tf.zeros(len(rows), values.dtype)
            )
        columns.append(values)
    return columns


def _take(reader, count: int) -> list[tuple[int, list[str]]]:
    """The next `count` rows of a `csv.reader`, each with its (last) line number."""
    return [(reader.line_num, row) for _, row in zip(range(count), reader, strict=False)]


def _check_rows(path, header, label, wanted, vocabulary, sample, reader, missing):
    """Infers the column kinds from `sample` and checks every row in Python, raising
    ValueError at the first bad line; returns (kinds, empty numeric cells per column)."""
    kinds = [
        "string"
        if vocabulary and header[i] == label
        else csv_rules.column_kind([row[i] for _, row in sample if len(row) == len(header)])
        for i in wanted
    ]
    checker = _RowChecker(path, header, label, wanted, kinds, missing == "error", vocabulary)
    for line, row in sample:
        checker.check(line, row)
    for row in reader:
        checker.check(reader.line_num, row)
    return kinds, checker.empty


def _check_vocabulary(vocabulary) -> list[str] | None:
    if vocabulary is None:
        return None
    if isinstance(vocabulary, str) or not all(isinstance(v, str) for v in vocabulary):
        raise TypeError(
            f"from_csv: label_vocabulary must be a list of strings, got {vocabulary!r}."
        )
    vocabulary = [v.strip() for v in vocabulary]
    repeated = sorted({v for v in vocabulary if vocabulary.count(v) > 1})
    if not vocabulary or repeated:
        raise ValueError(
            "from_csv: label_vocabulary must list each label value once, in class order; "
            f"got {vocabulary!r}" + (f" (repeated: {repeated})." if repeated else ".")
        )
    return vocabulary


def _columns(path: str, header, label: str, select) -> tuple[list[str], list[int]]:
    """The feature names and the indices of the columns to read (features and label)."""
    if not header:
        raise ValueError(f"from_csv: {path!r} is empty; expected a header row of column names.")
    repeated = sorted({c for c in header if header.count(c) > 1})
    if repeated:
        where = {c: [i + 1 for i, h in enumerate(header) if h == c] for c in repeated}
        raise ValueError(
            f"from_csv: {path!r} names column(s) more than once: "
            + ", ".join(f"{c!r} (columns {where[c]})" for c in repeated)
            + f"; header {header}. Give each column its own name."
        )
    if label not in header:
        raise ValueError(
            f"from_csv: label column {label!r} is not in {path!r}; its columns are "
            f"{header}. Pass label=<one of those>."
        )
    if isinstance(select, str):
        raise ValueError(
            f"from_csv: select={select!r} is a string; pass a list of feature columns, e.g. "
            f"select=[{select!r}]."
        )
    if select is not None and label in select:
        raise ValueError(
            f"from_csv: select={select!r} includes the label column {label!r}. The label is "
            "returned apart from the features; leave it out of select=."
        )
    features = [c for c in header if c != label] if select is None else list(select)
    unknown = [c for c in features if c not in header]
    if unknown:
        raise ValueError(f"from_csv: select names unknown column(s) {unknown}; columns: {header}.")
    return features, [i for i, c in enumerate(header) if c in features or c == label]


_MISSING = ("zero", "nan", "error")
_SERVED_FROM_MEMORY = 64 * 2**20  # bytes: a checked file this small is decoded once
_DEFAULTS = {
    "int64": lambda: tf.constant(0, tf.int64),
    "float32": lambda: tf.constant(0.0, tf.float32),
    "string": lambda: tf.constant("", tf.string),
}


class _RowChecker:
    """Checks each CSV row against the header and the inferred column types."""

    def __init__(
        self,
        path: str,
        header: list[str],
        label: str,
        wanted: list[int],
        kinds: list[str],
        refuse_empty: bool = False,
        vocabulary: list[str] | None = None,
    ) -> None:
        self.path, self.header, self.label = path, header, label
        self.vocabulary = vocabulary
        self.columns = list(zip(wanted, kinds, strict=True))
        self.refuse_empty = refuse_empty
        self.empty: dict[str, tuple[int, int]] = {}  # numeric column → (count, first line)

    def check(self, line: int, row: list[str]) -> None:
        where = f"from_csv: line {line} of {self.path!r}"
        if not row:
            raise ValueError(
                f"{where} is blank; TensorFlow's CSV reader needs one cell per column on "
                "every line. Remove the blank line(s)."
            )
        if len(row) != len(self.header):
            raise ValueError(
                f"{where} has {len(row)} cell(s) but the header has {len(self.header)} "
                f"columns ({self.header}): {row!r}. Give every row one cell per column "
                "(an empty cell is written as nothing between two commas)."
            )
        for index, kind in self.columns:
            cell = row[index]
            name = self.header[index]
            if not cell.strip():
                if name == self.label:
                    raise ValueError(
                        f"{where} has an empty label cell (column {name!r}). A missing label "
                        "would silently become class 0; fill it in or remove the row."
                    )
                if kind != "string":
                    if self.refuse_empty:
                        raise ValueError(
                            f"{where} has an empty cell in numeric column {name!r} "
                            "(missing='error'). Fill it in, or pass missing='zero' or "
                            "missing='nan'."
                        )
                    count, first = self.empty.get(name, (0, line))
                    self.empty[name] = (count + 1, first)
                continue
            if name == self.label and self.vocabulary and cell.strip() not in self.vocabulary:
                raise ValueError(
                    f"{where}: label {cell!r} (column {name!r}) is not in label_vocabulary="
                    f"{self.vocabulary}. Add it to the vocabulary or fix the cell."
                )
            problem = _cell_problem(cell, kind)
            if problem:
                raise ValueError(
                    f"{where}: column {name!r} holds {cell!r}, which {problem}; the column "
                    f"reads as {kind} (inferred from the first {_CSV_SAMPLE_ROWS} rows). Fix "
                    "or empty that cell (see from_csv's missing=), or make the column's type "
                    "clear in its first rows."
                )


def _cell_problem(cell: str, kind: str) -> str | None:
    if kind == "int64":
        return None if csv_rules.is_int64(cell) else "is not an int64 TensorFlow's reader accepts"
    if kind == "float32":
        return csv_rules.float32_problem(cell)
    return None
