"""Sources: arrays, TFDS, CSV tables and TFRecord files as unbatched `tf.data.Dataset`s.

Every source returns `(features, label)` elements (or bare features from
`from_arrays(x)`), unbatched: batching, shuffling and caching are the pipeline's job
(`tfaccel.data.pipeline`). Each kind lives in its own module (`arrays`, `tfds_split`,
`csv_table` with `csv_rules`, `tfrecords`, `images` with `image_checks`, `generators`);
the metadata they record lives in `info`.
"""

from tfaccel.data.elements import AUTOTUNE, is_pair, require_pair
from tfaccel.data.sources.arrays import from_arrays
from tfaccel.data.sources.csv_table import (  # noqa: F401
    _SERVED_FROM_MEMORY,
    _check_rows,
    _checked_columns,
    check_csv,
    from_csv,
)
from tfaccel.data.sources.info import SourceInfo, attach_source, source_info
from tfaccel.data.sources.tfds_split import from_tfds
from tfaccel.data.sources.tfrecords import from_tfrecords

__all__ = [
    "AUTOTUNE",
    "SourceInfo",
    "attach_source",
    "check_csv",
    "from_arrays",
    "from_csv",
    "from_tfds",
    "from_tfrecords",
    "is_pair",
    "require_pair",
    "source_info",
]
