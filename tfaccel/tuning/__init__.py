"""Batch-size and learning-rate tuning: what fits, what is fastest, the rate to train at.

The job tuned is a `TuningJob` (the model builder, the data, the loss and optimizer, the
strategy, the job's size and the tuning's time); the batch tuners and `tune` take one, or
its fields as keywords. `find_batch_size` probes candidate batches (memory, examples/s;
how: a `BatchSearch`) and reports the batch to train with (the throughput knee and other
limits); `largest_batch_size` asks memory alone; `BatchSizeHyperModel` lets keras-tuner
search the batch size with the user's learning rate scaled to it (by an `LRScaling`, the
rule with the batch and rate it scales from); `scaled_learning_rate` applies the scaling
rule on its own, `rule_for` picks it from the optimizer;
`gradient_noise_scale` estimates the critical batch (McCandlish et al. 2018);
`recommend` turns a report into the batch and learning rate to train a job with, and
`before_probing` makes that choice when the data alone decides (no probe worth running).
`find_learning_rate` runs a learning-rate range test (`LRRangeTest`, along an `LRRamp`)
and suggests a rate, or says why its curve cannot (`LearningRateReport`); `tune` does the
batch, then the rate at that batch, and prints the arguments to pass (`Tuned`).
"""

from tfaccel.tuning.batch.hypermodel import BatchSizeHyperModel
from tfaccel.tuning.batch.largest import largest_batch_size
from tfaccel.tuning.batch.noise import NoiseScale, gradient_noise_scale
from tfaccel.tuning.batch.recommend import Recommendation, before_probing, recommend
from tfaccel.tuning.batch.report import BatchSizeReport, ProbeRow
from tfaccel.tuning.batch.search import NoBatchSizeFitsError, find_batch_size
from tfaccel.tuning.batch.settings import BatchSearch
from tfaccel.tuning.job import TuningJob
from tfaccel.tuning.joint import Tuned, tune
from tfaccel.tuning.lr.finder import LRRangeTest, find_learning_rate
from tfaccel.tuning.lr.ramp import LRRamp
from tfaccel.tuning.lr.report import LearningRateReport
from tfaccel.tuning.oom import is_out_of_memory, release_memory
from tfaccel.tuning.scaling import LRScaling, resolve_lr_scaling, rule_for, scaled_learning_rate

__all__ = [
    "BatchSearch",
    "BatchSizeHyperModel",
    "BatchSizeReport",
    "LRRamp",
    "LRRangeTest",
    "LRScaling",
    "LearningRateReport",
    "NoBatchSizeFitsError",
    "NoiseScale",
    "ProbeRow",
    "Recommendation",
    "Tuned",
    "TuningJob",
    "before_probing",
    "find_batch_size",
    "find_learning_rate",
    "gradient_noise_scale",
    "is_out_of_memory",
    "largest_batch_size",
    "recommend",
    "release_memory",
    "resolve_lr_scaling",
    "rule_for",
    "scaled_learning_rate",
    "tune",
]
