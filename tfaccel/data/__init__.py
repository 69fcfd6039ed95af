"""Input pipelines: sources, the ordered builder, its plan, and a benchmark.

Example:
    >>> from tfaccel import data
    >>> ds = data.pipeline(data.from_arrays(x, y), batch_size=64, training=True)  # doctest: +SKIP
    >>> print(data.explain(ds))                                                 # doctest: +SKIP
"""

from tfaccel.data import service
from tfaccel.data.arrays import from_arrays
from tfaccel.data.bench import benchmark
from tfaccel.data.cache import (
    CacheBusyWarning,
    CacheMismatchError,
    CacheMismatchWarning,
    StaleCacheWarning,
)
from tfaccel.data.csv_source import from_csv
from tfaccel.data.feed import Feed
from tfaccel.data.generators import from_generator
from tfaccel.data.images import from_image_folder
from tfaccel.data.label_contract import check
from tfaccel.data.pipeline import DatasetFn, pipeline
from tfaccel.data.plan import Plan, Step, explain, graph_ops, plan_of
from tfaccel.data.tfds_source import from_tfds
from tfaccel.data.tfrecords import from_tfrecords

__all__ = [
    "CacheBusyWarning",
    "CacheMismatchError",
    "CacheMismatchWarning",
    "DatasetFn",
    "Feed",
    "Plan",
    "StaleCacheWarning",
    "Step",
    "benchmark",
    "check",
    "explain",
    "from_arrays",
    "from_csv",
    "from_generator",
    "from_image_folder",
    "from_tfds",
    "from_tfrecords",
    "graph_ops",
    "pipeline",
    "service",
    "plan_of",
]
