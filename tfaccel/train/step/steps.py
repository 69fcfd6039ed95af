"""The inner loop: N train or test steps in one `tf.function`; step errors explained."""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from tfaccel.data.elements import unpack
from tfaccel.train.step import traces
from tfaccel.train.step.losses import PerExampleLoss
from tfaccel.train.step.out_of_memory import is_out_of_memory

# The replica steps hold no tensor-dependent Python control flow: traced as written, not
# converted by AutoGraph (as `model.fit`'s steps), which would cost seconds at the first trace.
_plain = tf.autograph.experimental.do_not_convert


@dataclasses.dataclass(frozen=True)
class Tracking:
    """What the step loops update beside the model and the optimizer (the Runner's own).

    Attributes:
        loss_tracker: a `keras.metrics.Mean` of the loss since the metrics were reset
            (the logs' `loss`).
        loop_loss: a `keras.metrics.Mean` of the last train loop's loss (the divergence
            check; reset before each loop).
        step_counter: the int64 global step, one per applied optimizer step.
    """

    loss_tracker: Any
    loop_loss: Any
    step_counter: tf.Variable


class StepLoops:
    """Builds the replica steps and the multi-step loops for one Trainer.

    Loss contract: per-example loss → `tf.nn.compute_average_loss` with the actual
    global batch of the step, plus `tf.nn.scale_regularization_loss(model.losses)`;
    then the optimizer's loss scaling. Summed over replicas, the gradients equal
    single-device gradients of the same global batch.

    Gradient accumulation (`accumulate_steps=k > 1`): one applied step reads k
    batches; each replica adds `gradient × global batch` of each batch to local
    accumulators, and the optimizer applies `sum / examples` once — the gradient of
    the mean loss over all k batches, exact for uneven batches too. The all-reduce
    (inside `optimizer.apply`) and the loss-scale update happen once per applied step.

    Micro-batches (`micro_batches=m > 1`, the Trainer's answer to running out of
    memory): each replica cuts its batch into m parts and adds each part's gradient of
    `sum of its per-example losses / G + regularisation / (replicas × m)`, times G, to
    the same accumulators (G: the whole batch's global size); the applied gradient is
    then the whole batch's, exactly. BatchNormalization sees each part's statistics
    (and updates its moving statistics once per part).

    What the loops update beside the model's and the optimizer's variables (the loss
    trackers and the global step) comes in one `Tracking`.
    """

    def __init__(
        self,
        *,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer,
        loss: PerExampleLoss,
        metrics: list[keras.metrics.Metric],
        tracking: Tracking,
        strategy: tf.distribute.Strategy,
        jit_compile: bool,
        accumulate_steps: int = 1,
        micro_batches: int = 1,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.loss = loss
        self.metrics = metrics
        self.loss_tracker = tracking.loss_tracker
        self.loop_loss = tracking.loop_loss
        self.strategy = strategy
        self.step_counter = tracking.step_counter
        self.jit_compile = jit_compile
        # Index of the first non-finite trainable variable after the last train loop, or -1.
        self.first_nonfinite = tf.Variable(-1, dtype=tf.int32, trainable=False)
        # Seconds the last train loop waited for its batches (`_next`), timed in the graph.
        self.input_wait = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.accumulate_steps = accumulate_steps
        self.micro_batches = micro_batches
        replica_train = tf.function(self._train_step, jit_compile=True) if jit_compile else None
        self._replica_train = replica_train or self._train_step
        # Traces of each loop (`traces.counted`).
        self.traces: collections.Counter[str] = collections.Counter()
        train_loop = self._train_loop
        if accumulate_steps > 1 or micro_batches > 1:
            self._create_accumulators()
            step = self._accumulate_step
            if micro_batches > 1:  # a loop over the parts: converted by AutoGraph
                step = functools.partial(tf.autograph.to_graph(StepLoops._accumulate_micro), self)
            self._replica_accumulate = tf.function(step, jit_compile=True) if jit_compile else step
            # Nested loops with breaks: converted by AutoGraph (bound to self after).
            converted = tf.autograph.to_graph(StepLoops._accumulating_train_loop)
            train_loop = functools.partial(converted, self)
        self.train_loop = tf.function(traces.counted(train_loop, "train loop", self.traces))
        self.test_loop = tf.function(traces.counted(self._test_loop, "test loop", self.traces))
        self.held_step = tf.function(traces.counted(self._held_step, "held step", self.traces))

    @_plain
    def _forward(self, data, training: bool, global_batch=None, parts: int = 1):
        """The replica's loss; `global_batch`/`parts`: a part of a batch of that global size."""
        x, y, sample_weight = unpack(data)
        y_pred = self.model(x, training=training)
        per_example = self.loss(y, y_pred, sample_weight)
        local = tf.shape(per_example)[0]
        if global_batch is None:
            global_batch = _global_batch(per_example)
        if getattr(self.loss, "sums", False):  # reduction="sum": the global batch's sum
            per_example *= tf.cast(global_batch, per_example.dtype)
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        if self.model.losses:
            regularization = tf.nn.scale_regularization_loss(tf.add_n(self.model.losses))
            loss += regularization / parts
        # This replica's share of the global mean, weighted so that the sum over
        # replicas of value * weight / global_batch is the global loss.
        global_f = tf.cast(global_batch, tf.float32)
        local_f = tf.cast(local, tf.float32)
        share = tf.math.divide_no_nan(loss * global_f, local_f)
        self.loss_tracker.update_state(share, sample_weight=local_f)
        if training:
            self.loop_loss.update_state(share, sample_weight=local_f)
        for metric in self.metrics:  # `metrics` ignore sample weights, as in model.fit
            weighted = getattr(metric, "tfaccel_weighted", True)
            metric.update_state(y, y_pred, sample_weight if weighted else None)
        return loss, global_f

    @_plain
    def _gradients(self, data, global_batch=None, parts: int = 1):
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            loss, global_batch = self._forward(data, True, global_batch, parts)
            scaled = self.optimizer.scale_loss(loss)
        return tape.gradient(scaled, variables), global_batch

    @_plain
    def _train_step(self, data):
        grads, _ = self._gradients(data)
        self.optimizer.apply(grads, self.model.trainable_variables)

    # -- gradient accumulation -------------------------------------------------------------

    def _create_accumulators(self):
        """Per-replica sums of `gradient × global batch`, and of the examples seen."""

        def local(shape, dtype, name):
            return tf.Variable(
                tf.zeros(shape, dtype),
                trainable=False,
                name=name,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM,
            )

        with self.strategy.scope():
            self._grad_sums = [
                local(v.shape, v.dtype, f"grad_sum_{i}")
                for i, v in enumerate(self.model.trainable_variables)
            ]
            self._examples = local((), tf.float32, "accumulated_examples")

    @_plain
    def _accumulate_step(self, data):
        grads, global_batch = self._gradients(data)
        self._add_gradients(grads, global_batch)
        self._examples.assign_add(global_batch)

    @_plain
    def _add_gradients(self, grads, global_batch):
        for total, grad in zip(self._grad_sums, grads, strict=True):
            if grad is not None:
                grad = tf.convert_to_tensor(grad)  # IndexedSlices from embeddings
                total.assign_add(grad * tf.cast(global_batch, grad.dtype))

    def _accumulate_micro(self, data):
        """One batch as `micro_batches` parts, accumulated as the whole batch's gradient."""
        m = self.micro_batches
        first = tf.nest.flatten(data)[0]
        local, static = tf.shape(first)[0], first.shape[0]
        global_batch = _global_batch(first)
        weight = tf.cast(global_batch, tf.float32)
        size = (local + m - 1) // m  # the last part may be smaller
        for i in tf.range(m):
            if static is not None and static % m == 0:  # equal static parts (XLA-friendly)
                part = tf.nest.map_structure(lambda t, i=i: _equal_part(t, i, m), data)
            else:
                start = tf.minimum(i * size, local)
                end = tf.minimum(start + size, local)
                part = tf.nest.map_structure(lambda t, a=start, b=end: t[a:b], data)
            grads, _ = self._gradients(part, global_batch, m)
            self._add_gradients(grads, weight)
        self._examples.assign_add(weight)

    @_plain
    def _held_step(self, batches):
        """One applied step over `batches` (held by the caller, so it can retry them)."""
        accumulating = hasattr(self, "_grad_sums")
        step = self._replica_accumulate if accumulating else self._replica_train
        for batch in batches:
            self.strategy.run(step, args=(batch,))
        if accumulating:
            self.strategy.run(self._apply_accumulated)
        self.step_counter.assign_add(1)
        self.first_nonfinite.assign(self._first_nonfinite())

    def clear_accumulators(self) -> None:
        """Zeroes what a failed step may have accumulated."""
        for total in getattr(self, "_grad_sums", []):
            total.assign(tf.zeros_like(total))
        if hasattr(self, "_examples"):
            self._examples.assign(0.0)

    @_plain
    def _apply_accumulated(self):
        # Every replica counted the same global batches, so its local count is the total.
        examples = self._examples.read_value()
        grads = [
            tf.math.divide_no_nan(total.read_value(), tf.cast(examples, total.dtype))
            for total in self._grad_sums
        ]
        self.optimizer.apply(grads, self.model.trainable_variables)
        for total in self._grad_sums:
            total.assign(tf.zeros_like(total))
        self._examples.assign(0.0)

    def _accumulating_train_loop(self, iterator, num_steps):
        """Up to `num_steps` applied steps of `accumulate_steps` batches each.

        When the data ends inside a group, the batches read so far are applied as one
        (smaller) step, and the loop stops.
        """
        self.input_wait.assign(0.0)
        done = tf.constant(0, tf.int32)
        for _ in tf.range(num_steps):
            read = tf.constant(0, tf.int32)
            for _ in tf.range(self.accumulate_steps):
                optional = self._next(iterator)
                if not optional.has_value():
                    break
                self.strategy.run(self._replica_accumulate, args=(optional.get_value(),))
                read += 1
            if read == 0:
                break
            self.strategy.run(self._apply_accumulated)
            done += 1
            if read < self.accumulate_steps:
                break
        self.step_counter.assign_add(tf.cast(done, tf.int64))
        self.first_nonfinite.assign(self._first_nonfinite())
        return done

    @_plain
    def _next(self, iterator):
        """The next batch as an optional; the time spent waiting for it joins `input_wait`.

        The two timestamps and the fetch are stateful ops, so the graph keeps their order:
        the difference is the time the loop was blocked on the input pipeline.
        """
        began = tf.timestamp()
        optional = iterator.get_next_as_optional()
        with tf.control_dependencies([optional.has_value()]):
            self.input_wait.assign_add(tf.timestamp() - began)
        return optional

    @_plain
    def _run_steps(self, replica_step, iterator, num_steps, timed: bool = False):
        """Runs up to `num_steps` replica steps; stops early when the data ends.

        A `tf.while_loop` written out (as `model.fit`'s), not AutoGraph's conversion of a
        Python loop: the same graph, traced without the conversion's cost.
        """
        # tf.timestamp is refused under op determinism: then the wait goes unmeasured.
        timed = timed and not op_determinism()

        def body(done, _):
            optional = self._next(iterator) if timed else iterator.get_next_as_optional()
            more = optional.has_value()

            def step():
                self.strategy.run(replica_step, args=(optional.get_value(),))
                return done + 1

            return tf.cond(more, step, lambda: done), more

        start = (tf.constant(0, tf.int32), tf.constant(True))
        done, _ = tf.while_loop(lambda done, more: more & (done < num_steps), body, start)
        return done

    @_plain
    def _train_loop(self, iterator, num_steps):
        self.input_wait.assign(0.0)
        done = self._run_steps(self._replica_train, iterator, num_steps, timed=True)
        self.step_counter.assign_add(tf.cast(done, tf.int64))
        self.first_nonfinite.assign(self._first_nonfinite())
        return done

    @_plain
    def _first_nonfinite(self):
        return first_nonfinite(self.model.trainable_variables)

    @_plain
    def _test_step(self, data):
        self._forward(data, training=False)

    @_plain
    def _test_loop(self, iterator, num_steps):
        return self._run_steps(self._test_step, iterator, num_steps)


@_plain
def first_nonfinite(variables: Sequence[tf.Variable]) -> tf.Tensor:
    """Once per loop, in the loop's graph: which of `variables` is not finite (-1: none)."""
    if not variables:
        return tf.constant(-1, tf.int32)
    finite = tf.stack([tf.reduce_all(tf.math.is_finite(v)) for v in variables])
    first = tf.argmin(tf.cast(finite, tf.int32), output_type=tf.int32)
    return tf.where(tf.reduce_all(finite), -1, first)


def _equal_part(tensor, index, parts: int):
    """Part `index` of `parts` equal parts of a tensor with a static leading size."""
    size = tensor.shape[0] // parts
    split = tf.reshape(tensor, tf.concat([[parts, size], tf.shape(tensor)[1:]], axis=0))
    return tf.ensure_shape(split[index], [size, *tensor.shape[1:]])


def _global_batch(per_example):
    """The step's global batch: static when every batch is full, else summed over replicas."""
    context = tf.distribute.get_replica_context()
    if per_example.shape[0] is not None:  # every batch full: no collective needed
        return per_example.shape[0] * context.num_replicas_in_sync
    return context.all_reduce("SUM", tf.shape(per_example)[0])  # a partial batch may be uneven


def op_determinism() -> bool:
    """Whether `tf.config.experimental.enable_op_determinism()` is in force (no public getter)."""
    try:
        from tensorflow.python.framework import config
    except ImportError:
        return False
    return bool(getattr(config, "is_op_determinism_enabled", lambda: False)())


def explain_xla_error(error: Exception, model: keras.Model) -> str:
    """Names the layer(s) and op(s) XLA could not compile, from a TensorFlow error."""
    text = str(error)
    ops = sorted(set(re.findall(r"No registered '(\w+)' OpKernel for XLA", text)))
    parts = set()
    for node in re.findall(r"\{\{node ([^}]+)\}\}", text):
        parts.update(node.split("/"))
    culprits = [
        layer.name
        for layer in model._flatten_layers(include_self=False)
        if any(re.fullmatch(rf"{re.escape(layer.name)}(_\d+)?", p) for p in parts)
    ]
    where = f"layer(s) {culprits}" if culprits else "an op in the model"
    what = f" (unsupported op(s): {ops})" if ops else ""
    return (
        f"jit_compile=True failed: XLA cannot compile {where}{what}. Pass jit_compile=False "
        "(or 'auto'), or replace the layer."
    )


def explain_step_error(error: Exception, loss_name: str) -> str | None:
    """A clear message for a TensorFlow error raised inside a step, or None."""
    text = str(error)
    match = re.search(
        r"Received a label value of (-?\d+) which is outside the valid range of "
        r"\[0, (\d+)\)",
        text,
    )
    if match:
        label, classes = match.groups()
        if int(label) == -(2**63):  # what a NaN or inf label becomes when cast to int64
            return (
                f"A label is NaN or inf (cast to an integer class it reads {label}), so the "
                f"loss {loss_name!r} cannot use it. Fix or drop those rows, or impute the "
                "label; tfaccel.data.pipeline(check_finite=True) names the element."
            )
        return (
            f"A label is outside the classes of the model: label {label}, but the model has "
            f"{classes} classes, so the loss {loss_name!r} accepts labels 0..{int(classes) - 1}. "
            "Check the labels (e.g. 1-based classes need `label - 1`) or give the model's "
            "last layer one unit per class."
        )
    return None


def xla_failed(error: Exception) -> bool:
    """Whether a jitted step's error says XLA cannot run it (not out of memory)."""
    return isinstance(error, tf.errors.OpError) and not is_out_of_memory(error)


def error_line(error: Exception) -> str:
    """The ops XLA named as unsupported, else the first root error's message."""
    found = re.search(r"on XLA_\w+: (.+?) \(No registered", str(error))
    if found:
        return f"unsupported op(s): {found.group(1)}"
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    roots = [line for line in lines if re.match(r"\(\d+\) [A-Z_]+: ", line)]
    line = (roots or lines or [type(error).__name__])[0]
    line = re.sub(r"^\(\d+\) [A-Z_]+: (\{\{[^}]*\}\} )?", "", line)
    return line[:200]
