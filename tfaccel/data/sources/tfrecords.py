"""`from_tfrecords`: TFRecord files read interleaved, parsed, shardable by file."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfaccel.data import fingerprint
from tfaccel.data.elements import AUTOTUNE, require_pair
from tfaccel.data.sources.info import SourceInfo, attach_source


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
