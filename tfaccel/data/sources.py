"""Sources: arrays, TFDS, CSV tables and TFRecord files as unbatched `tf.data.Dataset`s.

Every source returns `(features, label)` elements (or bare features from
`from_arrays(x)`), unbatched: batching, shuffling and caching are the
pipeline's job (`tfaccel.data.pipeline`). Sources whose raw units are files
record them on the dataset, so that a multi-worker pipeline can shard files
before decoding them instead of every worker reading everything.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import re
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from tfaccel.data import csv_rules, fingerprint

AUTOTUNE = tf.data.AUTOTUNE
_SOURCE_ATTR = "_tfaccel_source"
_CSV_SAMPLE_ROWS = 1000


@dataclasses.dataclass
class SourceInfo:
    """How a source was made, for `explain` and for sharding before decoding.

    Attributes:
        kind: short name of the source ("arrays", "tfds", "csv", ...).
        details: settings shown by `explain`.
        raw: a dataset of the shardable units (e.g. file names), or None.
        finish: turns a (sharded) `raw` dataset into the source's elements.
        units: what `raw` holds ("files" or "elements").
        count: how many units `raw` holds.
        identity: returns `(content digest, what it covers)` for `tfaccel.data.fingerprint`;
            None when the content cannot be seen cheaply.
    """

    kind: str
    details: dict[str, Any]
    raw: tf.data.Dataset | None = None
    finish: Callable[[tf.data.Dataset], tf.data.Dataset] | None = None
    units: str = "elements"
    count: int | None = None
    identity: Callable[[], tuple[str, str]] | None = None


def attach_source(dataset: tf.data.Dataset, info: SourceInfo) -> tf.data.Dataset:
    """Records `info` on `dataset` and returns the dataset."""
    setattr(dataset, _SOURCE_ATTR, info)
    return dataset


def source_info(dataset: tf.data.Dataset) -> SourceInfo | None:
    """Returns the `SourceInfo` a tfaccel source recorded, or None."""
    return getattr(dataset, _SOURCE_ATTR, None)


def is_pair(element_spec: Any) -> bool:
    """Whether a dataset's elements are `(features, label)` pairs."""
    return isinstance(element_spec, tuple) and len(element_spec) == 2


def require_pair(element_spec: Any, where: str) -> None:
    """Raises TypeError unless elements are `(features, label)` pairs.

    Args:
        element_spec: a dataset's `element_spec`.
        where: what needed the pair, for the message.
    """
    if not is_pair(element_spec):
        raise TypeError(
            f"{where} needs (features, label) pairs, but the elements are "
            f"{_describe_spec(element_spec)}. Return a 2-tuple `(features, label)` "
            "(features may be a dict), e.g. `lambda x: (x['image'], x['label'])`."
        )


def _describe_spec(spec: Any) -> str:
    if isinstance(spec, tuple):
        return f"a tuple of {len(spec)}: {spec}"
    return f"{type(spec).__name__} {spec}"


def from_arrays(x: Any, y: Any = None) -> tf.data.Dataset:
    """Slices NumPy arrays or tensors into `(features, label)` elements.

    Args:
        x: an array, or a dict / tuple of arrays, sliced along the first axis.
        y: labels with the same first dimension, or None for features only.

    Returns:
        An unbatched dataset of `(x[i], y[i])` (or `x[i]` when `y` is None).

    Raises:
        TypeError: `x` is None, or an array has dtype object and holds anything but
            strings (named, with the Python types it holds).
        ValueError: a scalar, a ragged (nested lists of unequal lengths) array,
            or arrays that do not all have the same number of rows.
    """
    if x is None:
        raise TypeError(
            "from_arrays: x is None; expected the features as an array (or a dict / tuple "
            "of arrays) with one row per example, e.g. from_arrays(x_train, y_train)."
        )
    lengths = {_rows(a, name) for name, a in _leaves(x, "x")}
    if y is not None:
        lengths |= {_rows(a, name) for name, a in _leaves(y, "y")}
    if len(lengths) > 1:
        raise ValueError(
            f"from_arrays: x and y must have the same number of rows, got lengths "
            f"{sorted(lengths)}. Pass one label per example."
        )
    dataset = tf.data.Dataset.from_tensor_slices(x if y is None else (x, y))
    count = lengths.pop() if lengths else None
    digest = fingerprint.digest_arrays(x if y is None else (x, y))
    how = f"{count} rows' arrays (each over 8 MiB by evenly spaced rows)"
    info = SourceInfo("arrays", {"elements": count}, count=count, identity=lambda: (digest, how))
    return attach_source(dataset, info)


def _leaves(structure: Any, name: str) -> list[tuple[str, Any]]:
    """`(name, array)` for each array of a `from_tensor_slices` structure (dicts and
    tuples nest; lists do not)."""
    if isinstance(structure, dict):
        return [leaf for k, v in structure.items() for leaf in _leaves(v, f"{name}[{k!r}]")]
    if isinstance(structure, tuple):
        return [leaf for i, v in enumerate(structure) for leaf in _leaves(v, f"{name}[{i}]")]
    return [(name, structure)]


def _rows(array: Any, name: str) -> int:
    """The number of rows of one array, with a clear error for scalars and ragged lists."""
    given = array
    if array is None:
        raise TypeError(
            f"from_arrays: {name} holds None; expected arrays with one row per example."
        )
    if not isinstance(array, (np.ndarray, tf.Tensor)) and not hasattr(array, "shape"):
        try:
            array = np.asarray(array)
        except ValueError as error:
            lengths = sorted({len(r) for r in array if hasattr(r, "__len__")})
            raise ValueError(
                f"from_arrays: {name} is ragged (rows of lengths {lengths[:10]}), so it is not "
                "an array. Pad the rows to one length (keras.utils.pad_sequences), or pass "
                f"a tf.RaggedTensor (tf.ragged.constant({name})). NumPy said: {error}"
            ) from None
    if getattr(getattr(array, "dtype", None), "kind", None) == "O":
        _check_objects(np.asarray(array), name)
    shape = np.shape(array)
    if not shape:
        raise ValueError(
            f"from_arrays: {name} is a scalar ({given!r}); expected an array whose first axis "
            "indexes the examples, e.g. shape (num_examples, ...)."
        )
    return int(shape[0])


def _check_objects(array: np.ndarray, name: str) -> None:
    """Raises TypeError for an object array that is not all strings (those read as text)."""
    kinds = sorted({type(v).__name__ for v in array.ravel()})
    if kinds and set(kinds) <= {"str", "bytes"}:
        return
    raise TypeError(
        f"from_arrays: {name} has dtype object (holding {', '.join(kinds[:5]) or 'nothing'}), "
        "which TensorFlow cannot slice. Convert it to a numeric dtype first, e.g. "
        f"{name}.astype('float32') (fill missing values before: pandas' fillna), or to "
        "strings with .astype(str)."
    )


def from_tfds(
    name: str,
    split: str,
    *,
    data_dir: str | None = None,
    shuffle_files: bool | None = None,
    input_context: tf.distribute.InputContext | None = None,
    **kwargs: Any,
) -> tf.data.Dataset:
    """Loads a TensorFlow Datasets split as `(features, label)` pairs.

    With an `input_context` each input pipeline (worker) reads its own subset of
    the dataset's files (`tfds.ReadConfig(input_context=...)`), so use it inside
    the source function of a multi-worker pipeline::

        pipeline(lambda ctx: from_tfds("mnist", "train", input_context=ctx), ...)

    Args:
        name: TFDS dataset name, e.g. "mnist".
        split: split, e.g. "train" or "train[:90%]".
        data_dir: where TFDS keeps its data (TFDS default when None).
        shuffle_files: shuffle the file order; None means True for training
            splits (names starting with "train"), False otherwise.
        input_context: shards files per input pipeline when given.
        **kwargs: passed to `tfds.load` (e.g. `download=False`, `read_config`).

    Returns:
        An unbatched dataset of `(features, label)`.
    """
    import tensorflow_datasets as tfds

    if shuffle_files is None:
        shuffle_files = split.startswith("train")
    read_config = kwargs.pop("read_config", None) or tfds.ReadConfig()
    if input_context is not None:
        read_config = dataclasses.replace(read_config, input_context=input_context)
    dataset = tfds.load(
        name,
        split=split,
        data_dir=data_dir,
        shuffle_files=shuffle_files,
        as_supervised=True,
        read_config=read_config,
        **kwargs,
    )
    details = {"dataset": name, "split": split, "shuffle_files": shuffle_files}
    if input_context is not None:
        details["files"] = (
            f"pipeline {input_context.input_pipeline_id} of {input_context.num_input_pipelines}"
        )
    return attach_source(dataset, SourceInfo("tfds", details))


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


def check_csv(path, label, select, missing, codec, encoding, vocabulary):
    """`from_csv`'s check of the whole file: `(header, features, wanted column indices,
    kinds, empty numeric cells, csv_rules.Scan or None)`, or ValueError naming the line
    and column at fault. The scan (the decoded file) is None when the row-by-row check ran."""
    with open(path, newline="", encoding=codec) as handle:
        reader = csv.reader(handle)
        try:
            header = next(reader, None)
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

    def __init__(self, path, header, label, wanted, kinds, refuse_empty=False, vocabulary=None):
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


def from_tfrecords(
    pattern: str | list[str],
    parse_fn: Callable[[tf.Tensor], Any],
    *,
    compression: str | None = None,
) -> tf.data.Dataset:
    """Reads TFRecord files in parallel (interleaved) and parses each record.

    Args:
        pattern: a glob (e.g. "data/train-*.tfrecord") or a list of globs / paths.
        parse_fn: maps one serialized record to a `(features, label)` pair,
            e.g. with `tf.io.parse_single_example`.
        compression: "", "ZLIB" or "GZIP" (None: uncompressed).

    Returns:
        An unbatched dataset of parsed `(features, label)` pairs; the files are
        listed in sorted order and read `min(files, AUTOTUNE)` at a time.

    Raises:
        FileNotFoundError: the pattern matches no file.
        TypeError: `parse_fn` does not return a `(features, label)` pair.
        ValueError: the first record does not match `parse_fn`'s feature spec
            (names the feature, what the spec expects and what the record holds).
    """
    patterns = [pattern] if isinstance(pattern, str) else list(pattern)
    files = sorted({f for p in patterns for f in tf.io.gfile.glob(p)})
    if not files:
        raise FileNotFoundError(f"from_tfrecords: no file matches {patterns}.")

    def finish(names: tf.data.Dataset) -> tf.data.Dataset:
        records = names.interleave(
            lambda f: tf.data.TFRecordDataset(f, compression_type=compression),
            cycle_length=min(len(files), 16),
            num_parallel_calls=AUTOTUNE,
        )
        return records.map(parse_fn, num_parallel_calls=AUTOTUNE)

    raw = tf.data.Dataset.from_tensor_slices(files)
    dataset = finish(raw)
    require_pair(dataset.element_spec, "from_tfrecords (the output of parse_fn)")
    _check_first_record(files[0], parse_fn, compression)
    info = SourceInfo(
        "tfrecords",
        {"files": len(files), "pattern": patterns[0] if len(patterns) == 1 else patterns},
        raw=raw,
        finish=finish,
        units="files",
        count=len(files),
        identity=fingerprint.files_identity(
            files, getattr(parse_fn, "__qualname__", ""), compression
        ),
    )
    return attach_source(dataset, info)


_FEATURE_ERRORS = (
    r"Key: (?P<key>[^.\s]+)\.\s+(?P<what>.*)",
    r"Feature: (?P<key>\S+) \(data type: (?P<what>\w+)\) is required but could not be found",
    r"Name: [^,]*, Key: (?P<key>[^,]+), Index: \d+\.\s+(?P<what>.*)",
)


def _check_first_record(file: str, parse_fn: Callable, compression: str | None) -> None:
    """Parses the first record eagerly; re-raises a spec mismatch naming the feature."""
    records = tf.data.TFRecordDataset(file, compression_type=compression).take(1)
    for record in records:
        try:
            parse_fn(record)
        except tf.errors.InvalidArgumentError as error:
            text = error.message if hasattr(error, "message") else str(error)
            feature, expected = "?", text.strip()
            for pattern in _FEATURE_ERRORS:
                match = re.search(pattern, text)
                if match:
                    feature, expected = match.group("key"), match.group("what").strip()
                    break
            expected = re.sub(r"\s*\[Op:\w+\]$", "", expected).rstrip(".")
            if "could not be found" in text:
                expected = f"the spec requires it as {expected}, but the record lacks it"
            found = _record_features(record.numpy())
            raise ValueError(
                f"from_tfrecords: the first record of {file!r} does not match parse_fn's "
                f"feature spec at feature {feature!r}: {expected}. The record holds "
                f"{found.get(feature, 'no such feature')} for {feature!r}; all its features: "
                f"{found}. Make the spec's names, dtypes and shapes match what was written "
                "(tf.io.FixedLenFeature([n], dtype) for n values)."
            ) from None


def _record_features(serialized: bytes) -> dict[str, str]:
    """`{name: "int64_list[3]"}` for each feature of a serialized `tf.train.Example`."""
    try:
        example = tf.train.Example.FromString(serialized)
    except Exception:  # noqa: BLE001 - not an Example: nothing to describe
        return {}
    found = {}
    for name, feature in sorted(example.features.feature.items()):
        kind = feature.WhichOneof("kind")
        values = getattr(feature, kind).value if kind else []
        found[name] = f"{kind}[{len(values)}]" if kind else "empty"
    return found
