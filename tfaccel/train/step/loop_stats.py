"""A step loop's logs and the workers' stop vote in one all-reduce.

Under `MultiWorkerMirroredStrategy` every read of a metric variable outside the step
function is a cross-worker collective of its own: reading the loss, the metrics, the
example count and the divergence check one by one after each loop cost about 230 ms
of waiting per loop with two CPU workers here (each read ~25 ms), more than a 10-step
loop of the MLP itself. `LoopStats` packs the local values of every metric variable
and the stop flag into one vector, all-reduces it once, and computes each metric's
result from the reduced values (`Metric.stateless_result`).
"""

from __future__ import annotations

import collections

import tensorflow as tf

from tfaccel.train.step import traces


class LoopStats:
    """Reads `metrics`' results and sums a per-worker flag with one collective.

    Args:
        strategy: the Trainer's strategy.
        metrics: Keras metrics whose variables are summed across replicas (the Keras
            default for metric state).
    """

    def __init__(self, strategy: tf.distribute.Strategy, metrics):
        self.strategy = strategy
        self.metrics = list(metrics)
        self.variables = [v for m in self.metrics for v in m.variables]
        self.packable = all(getattr(v, "aggregation", "sum") == "sum" for v in self.variables)
        self.traces = collections.Counter()
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

    def read(self, stop_flag: int = 0) -> tuple[dict, dict, int | None]:
        """Reads everything with one collective.

        Returns:
            ({metric name: result}, {id(variable): reduced value}, the sum of every
            worker's `stop_flag`, or None when the metrics could not be packed and the
            caller must agree on stopping itself).
        """
        if not self.packable:
            results = {m.name: float(m.result()) for m in self.metrics}
            return results, {id(v): float(v.numpy()) for v in self.variables if not v.shape}, None
        results, values, votes = self._read(tf.constant(stop_flag, tf.int32))
        by_id = {id(v): x.numpy() for v, x in zip(self.variables, values, strict=True)}
        return {k: float(v) for k, v in results.items()}, by_id, int(round(float(votes)))
