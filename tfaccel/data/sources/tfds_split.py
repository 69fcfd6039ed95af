"""`from_tfds`: a TensorFlow Datasets split as `(features, label)` pairs."""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf

from tfaccel.data.sources.info import SourceInfo, attach_source


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
