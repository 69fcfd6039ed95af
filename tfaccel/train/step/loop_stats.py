"""A step loop's logs and the workers' stop vote in one all-reduce.

Under `MultiWorkerMirroredStrategy` every read of a metric variable outside the step
function is a cross-worker collective of its own: reading the loss, the metrics, the
example count and the divergence check one by one after each loop cost about 230 ms
of waiting per loop with two CPU workers here (each read ~25 ms), more than a 10-step
loop of the MLP itself. `LoopStats` packs the local values of every metric variable
and the stop flag into one vector, all-reduces it once, and computes each metric's
result from the reduced values (`Metric.stateless_result`).

On one worker there is no cross-worker collective to save: there the packed read is a
`tf.function` whose trace (and first run) was paid before the first step ended, 0.04 s
on one replica and 0.24 s on two here, for nothing in return. So one worker reads the
metrics eagerly: always on one replica (as fast as the traced read, 0.4 ms a loop), and
for the first `EAGER_LOOPS` loops on several (2.4 ms a loop against 0.4 ms traced): a
short job never traces the read, a long one traces it once those loops are past.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

import keras
import tensorflow as tf

from tfaccel.choices.agreement import is_multi_worker
from tfaccel.train.step import traces

EAGER_LOOPS = 16  # eager reads before the traced one, on one worker with several replicas


class LoopStats:
    """Reads `metrics`' results and sums a per-worker flag with one collective.

    Args:
        strategy: the Trainer's strategy.
        metrics: Keras metrics whose variables are summed across replicas (the Keras
            default for metric state).
    """

    def __init__(
        self, strategy: tf.distribute.Strategy, metrics: Iterable[keras.metrics.Metric]
    ) -> None:
        self.strategy = strategy
        self.metrics = list(metrics)
        self.variables = [v for m in self.metrics for v in m.variables]
        self.packable = all(getattr(v, "aggregation", "sum") == "sum" for v in self.variables)
        self.traces: collections.Counter[str] = collections.Counter()
        tpu = "TPU" in type(strategy).__name__
        self.one_worker = not is_multi_worker(strategy) and not tpu
        self.eager_reads = 0  # reads made without the traced collective (one worker)
        # No tensor-dependent Python control flow: traced as written, without AutoGraph.
        self._read = tf.function(
            traces.counted(self._reduce, "loop logs", self.traces), autograph=False
        )

    def _local_vector(self, flag):
        context = tf.distribute.get_replica_context()
        # Only the first replica votes: the flag is per worker, not per replica.
        first = tf.cast(tf.equal(context.replica_id_in_sync_group, 0), tf.float32)
        parts = [tf.reshape(tf.cast(v.value, tf.float32), [-1]) for v in self.variables]
        parts.append(tf.reshape(tf.cast(flag, tf.float32) * first, [1]))
        return context.all_reduce("SUM", tf.concat(parts, axis=0))

    def _reduce(self, flag):
        packed = self.strategy.run(self._local_vector, args=(flag,))
        packed = self.strategy.experimental_local_results(packed)[0]
        values, offset = [], 0
        for variable in self.variables:
            size = max(int(tf.TensorShape(variable.shape).num_elements()), 1)
            chunk = tf.reshape(packed[offset : offset + size], variable.shape)
            values.append(tf.cast(chunk, variable.dtype))
            offset += size
        results, start = {}, 0
        for metric in self.metrics:
            count = len(metric.variables)
            results[metric.name] = metric.stateless_result(values[start : start + count])
            start += count
        return results, values, packed[-1]

    def _eager(self) -> bool:
        if not self.one_worker:
            return False
        return self.strategy.num_replicas_in_sync == 1 or self.eager_reads < EAGER_LOOPS

    def read(self, stop_flag: int = 0) -> tuple[dict, dict, int | None]:
        """Reads everything with one collective.

        Returns:
            ({metric name: result}, {id(variable): reduced value}, the sum of every
            worker's `stop_flag`, or None when the metrics of several workers could not be
            packed and the caller must agree on stopping itself). The values by id are
            those of the scalar variables only, when read eagerly (on one worker).
        """
        if not self.packable or self._eager():
            results = {m.name: float(m.result()) for m in self.metrics}
            values = {id(v): float(v.numpy()) for v in self.variables if len(v.shape) == 0}
            self.eager_reads += 1
            return results, values, int(stop_flag) if self.one_worker else None
        results, values, votes = self._read(tf.constant(stop_flag, tf.int32))
        by_id = {id(v): x.numpy() for v, x in zip(self.variables, values, strict=True)}
        return {k: float(v) for k, v in results.items()}, by_id, int(round(float(votes)))
