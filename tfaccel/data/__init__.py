"""Input pipelines: sources, the ordered builder, its plan, and a benchmark.

Example:
    >>> from tfaccel import data
    >>> ds = data.pipeline(data.from_arrays(x, y), batch_size=64, training=True)  # doctest: +SKIP
    >>> print(data.explain(ds))                                                 # doctest: +SKIP
"""

from tfaccel.data import service
from tfaccel.data.assembly.bench import benchmark
from tfaccel.data.assembly.cache import (
    CacheBusyWarning,
    CacheMismatchError,
    CacheMismatchWarning,
    StaleCacheWarning,
)
from tfaccel.data.assembly.feed import Feed
from tfaccel.data.assembly.pipeline import DatasetFn, pipeline
from tfaccel.data.assembly.plan import PipelinePlan, Plan, Step, explain, graph_ops, plan_of
from tfaccel.data.contracts.label_contract import check
from tfaccel.data.iterators import freed_in_background
from tfaccel.data.sources.arrays import from_arrays
from tfaccel.data.sources.csv_table import from_csv
from tfaccel.data.sources.generators import from_generator
from tfaccel.data.sources.images import from_image_folder
from tfaccel.data.sources.tfds_split import from_tfds
from tfaccel.data.sources.tfrecords import from_tfrecords

__all__ = [
    "CacheBusyWarning",
    "CacheMismatchError",
    "CacheMismatchWarning",
    "DatasetFn",
    "Feed",
    "PipelinePlan",
    "Plan",
    "StaleCacheWarning",
    "Step",
    "benchmark",
    "check",
    "explain",
    "freed_in_background",
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
