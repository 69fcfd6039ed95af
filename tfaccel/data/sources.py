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
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

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
    """

    kind: str
    details: dict[str, Any]
    raw: tf.data.Dataset | None = None
    finish: Callable[[tf.data.Dataset], tf.data.Dataset] | None = None
    units: str = "elements"
    count: int | None = None


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
        ValueError: the arrays do not all have the same number of rows.
    """
    lengths = {int(np.shape(a)[0]) for a in tf.nest.flatten(x)} if x is not None else set()
    if y is not None:
        lengths |= {int(np.shape(a)[0]) for a in tf.nest.flatten(y)}
    if len(lengths) > 1:
        raise ValueError(
            f"from_arrays: x and y must have the same number of rows, got lengths "
            f"{sorted(lengths)}. Pass one label per example."
        )
    dataset = tf.data.Dataset.from_tensor_slices(x if y is None else (x, y))
    count = lengths.pop() if lengths else None
    return attach_source(dataset, SourceInfo("arrays", {"elements": count}, count=count))


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


def from_csv(path: str, *, label: str, select: list[str] | None = None) -> tf.data.Dataset:
    """Reads a CSV table (with a header row) as `(features_dict, label)` rows.

    Column types are inferred from the first 1,000 rows: integers → int64,
    other numbers → float32, anything else → string. Empty numeric cells read
    as 0.

    Args:
        path: the CSV file.
        label: the label column's name.
        select: feature columns to keep (default: every column but the label).

    Returns:
        An unbatched dataset of `({column: value}, label)`.

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: `label` or a `select` name is not a column, or the file is empty.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"from_csv: no CSV file at {path!r}.")
    with open(path, newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        rows = [row for _, row in zip(range(_CSV_SAMPLE_ROWS), reader, strict=False)]
    if not header:
        raise ValueError(f"from_csv: {path!r} is empty; expected a header row of column names.")
    if label not in header:
        raise ValueError(
            f"from_csv: label column {label!r} is not in {path!r}; its columns are {header}. "
            "Pass label=<one of those>."
        )
    features = [c for c in header if c != label] if select is None else list(select)
    unknown = [c for c in features if c not in header]
    if unknown:
        raise ValueError(f"from_csv: select names unknown column(s) {unknown}; columns: {header}.")
    wanted = [i for i, c in enumerate(header) if c in features or c == label]
    defaults = [_column_default([row[i] for row in rows if i < len(row)]) for i in wanted]
    names = [header[i] for i in wanted]
    dataset = tf.data.experimental.CsvDataset(
        path, defaults, header=True, select_cols=wanted, na_value=""
    )

    def to_pair(*values):
        columns = dict(zip(names, values, strict=True))
        target = columns.pop(label)
        return {name: columns[name] for name in features}, target

    dataset = dataset.map(to_pair, num_parallel_calls=AUTOTUNE)
    return attach_source(dataset, SourceInfo("csv", {"path": path, "label": label}))


def _column_default(values: list[str]) -> tf.Tensor:
    present = [v.strip() for v in values if v.strip()]
    if present and all(_parses(v, int) for v in present):
        return tf.constant(0, tf.int64)
    if present and all(_parses(v, float) for v in present):
        return tf.constant(0.0, tf.float32)
    return tf.constant("", tf.string)


def _parses(value: str, kind: type) -> bool:
    try:
        kind(value)
    except ValueError:
        return False
    return True


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
    info = SourceInfo(
        "tfrecords",
        {"files": len(files), "pattern": patterns[0] if len(patterns) == 1 else patterns},
        raw=raw,
        finish=finish,
        units="files",
        count=len(files),
    )
    return attach_source(dataset, info)
