"""Source metadata: how a tfaccel source was made, recorded on its dataset.

`SourceInfo` tells `explain` what the source is, lets a multi-worker pipeline shard
file sources before decoding, and gives `tfaccel.data.fingerprint` the content's
identity. Every source module records one with `attach_source`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf

_SOURCE_ATTR = "_tfaccel_source"


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
