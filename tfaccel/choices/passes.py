"""Forward and backward passes on one cached batch: timed by the precision and XLA
probes (`timing`) and by the doctor, which compare settings on the same work."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tfaccel.choices.agreement import agree
from tfaccel.data.elements import unpack


class GradientLoops:
    """Forward and backward passes only, with and without the gradient all-reduce.

    The replica step computes the loss and the gradients of the model's trainable
    variables exactly as a training step does (`PerExampleLoss`, mean over the global
    batch); `with_all_reduce` then sums them over the replicas with the call the Keras
    optimizer makes (`ReplicaContext.all_reduce("SUM", grads)`), `without` does not. No
    optimizer runs: the difference between the two is the all-reduce's cost inside a step.
    A training-mode forward pass still updates BatchNormalization's moving statistics:
    the caller restores them.
    """

    def __init__(
        self,
        model: keras.Model,
        loss: Callable[..., Any],
        strategy: tf.distribute.Strategy,
        jit_compile: bool = False,
    ) -> None:
        self.model, self.loss, self.strategy = model, loss, strategy
        # With jit_compile the replica's passes are one XLA cluster (`diagnose(deep=True)`).
        self._replica_fn = tf.function(self._replica, jit_compile=True) if jit_compile else None
        self.with_all_reduce = tf.function(lambda it, n: self._loop(it, n, True))
        self.without = tf.function(lambda it, n: self._loop(it, n, False))
        self._loss: Any = None

    def _replica(self, data, reduce: bool):
        x, y, sample_weight = unpack(data)
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            per_example = self.loss(y, self.model(x, training=True), sample_weight)
            loss = tf.nn.compute_average_loss(per_example)
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables) if g is not None]
        if reduce:
            grads = tf.distribute.get_replica_context().all_reduce("SUM", grads)
        # One element of each gradient keeps every gradient alive, at no cost.
        return tf.add_n([tf.cast(tf.reshape(g, [-1])[0], tf.float32) for g in grads])

    def _loop(self, iterator, steps, reduce: bool):
        total = tf.constant(0.0)
        for _ in tf.range(steps):
            replica = self._replica_fn or self._replica
            out = self.strategy.run(replica, args=(next(iterator), reduce))
            total += tf.add_n(list(self.strategy.experimental_local_results(out)))
        return total

    def loss_once(self, iterator: Any) -> float:
        """The loss of the next batch in inference mode (no dropout), compiled as the passes."""
        if self._loss is None:
            replica = self._replica_loss
            if self._replica_fn is not None:
                replica = tf.function(replica, jit_compile=True)
            self._loss = tf.function(
                lambda it: self.strategy.reduce(
                    "SUM", self.strategy.run(replica, args=(next(it),)), axis=None
                )
            )
        return float(self._loss(iterator))

    def _replica_loss(self, data):
        x, y, sample_weight = unpack(data)
        per_example = self.loss(y, self.model(x, training=False), sample_weight)
        return tf.cast(tf.nn.compute_average_loss(per_example), tf.float32)

    def seconds(self, reduce: bool, iterator: Any, steps: int, calls: int) -> list[float]:
        """`calls` timed calls of `steps` passes, with or without the all-reduce."""
        fn = self.with_all_reduce if reduce else self.without
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            fn(iterator, tf.constant(steps, tf.int32)).numpy()
            times.append(time.perf_counter() - start)
        return times


def warm_up(
    loops: dict,
    cached: Any,
    admit: Callable[[dict], str | None] | None,
    strategy: tf.distribute.Strategy,
) -> tuple[dict, dict]:
    """Traces and times one step of each candidate's loops (`{(policy, jit): GradientLoops}`),
    the un-jitted first; a policy whose step fails (e.g. float token ids rounded past an
    embedding's range under bfloat16) is dropped with the error, its jitted step too; then
    `admit(readings)` may say why the jitted ones are not worth compiling
    (`timing.time_steps`). Returns `({candidate: (first call s, step s)}, {candidate: why it
    was dropped})`; the workers of a multi-worker job agree on both."""
    first, dropped = {}, {}
    for i, c in enumerate(c for c in loops if not c[1]):
        try:
            first[c] = tuple(loops[c].seconds(False, cached, 1, 2))
        except tf.errors.OpError as error:
            if i == 0:  # the reference: the step as the job runs it fails
                raise
            dropped[c] = f"the step fails under {c[0]} ({_unsupported(error)})"
    for c in [c for c in loops if not c[1]][1:]:  # one candidate set on every worker
        if agree(strategy, float(c in dropped)) and c not in dropped:
            dropped[c] = f"the step fails under {c[0]} on another worker"
            del first[c]
    jitted = [c for c in loops if c[1] and (c[0], False) not in dropped]
    for c in [c for c in loops if c[1] and c not in jitted]:
        dropped[c] = f"the step fails under {c[0]}"
    why = admit(first) if admit is not None and jitted else None
    if jitted and agree(strategy, float(why is not None)) and not why:  # the workers agree
        why = "declined: another worker's first readings project a probe over its share"
    for c in jitted:
        if why:
            dropped[c] = why
            continue
        try:
            first[c] = tuple(loops[c].seconds(False, cached, 1, 2))
        except tf.errors.OpError as error:  # the plain step ran: XLA does not work here
            dropped[c] = f"XLA cannot compile the model's step ({_unsupported(error)})"
    for c in jitted:  # one candidate set on every worker: the rounds' collectives match
        if agree(strategy, float(c in dropped)) and c not in dropped:
            dropped[c] = "XLA failed on another worker"
            del first[c]
    return first, dropped


def _unsupported(error: Exception) -> str:
    """The ops XLA named as unsupported, else the first root error's message."""
    text = str(error).strip()
    found = re.search(r"on XLA_\w+: (.+?) \(No registered", text)
    if found:
        return f"unsupported op(s): {found.group(1)}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    roots = [line for line in lines if re.match(r"\(\d+\) [A-Z_]+: ", line)]
    line = (roots or lines or [type(error).__name__])[0]
    line = re.sub(r"^\(\d+\) [A-Z_]+: (\{\{[^}]*\}\} )?", "", line)
    return re.sub(r" \(defined @ [^)]*\)", "", line)[:200]
