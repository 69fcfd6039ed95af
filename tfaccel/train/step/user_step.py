"""The model's own `train_step` and `test_step` in the Trainer's multi-step loops.

A model that overrides `train_step`, `test_step`, `compute_loss` or `compute_metrics` (a
GAN, a custom loss) is trained as `model.fit` trains it: each step is the model's
`train_step(data)` (Keras's own when only `compute_loss` / `compute_metrics` are
overridden) run per replica by `strategy.run`, its logs averaged over the replicas
(Keras's `reduce_per_replica(..., "auto")`), N steps in one `tf.function`. The step
applies its own gradients with its own optimizer(s) (`self.optimizer`, or attributes such
as a GAN's `d_optimizer`) and updates the model's metrics (`model.metrics`).

The logs are `model.fit`'s: the model's metrics when the last step's logs name exactly
those (`model.get_metrics_result()`), else the last step's logs. `evaluate` resets the
model's metrics and runs `test_step` as `model.evaluate` does.

`ModelStepRunner` implements `runner_interface.RunnerInterface` with these loops: the
outer loop's epochs, callbacks, steps per loop, checkpoints (the model, with the
optimizers it holds, and its metrics' state) and faults are the Trainer's.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable
from typing import Any

import keras
import tensorflow as tf
from keras.src.backend.tensorflow.trainer import reduce_per_replica
from keras.src.utils.python_utils import pythonify_logs

from tfaccel.train.step import traces
from tfaccel.train.step.loop_stats import LoopStats
from tfaccel.train.step.losses import PerExampleLoss
from tfaccel.train.step.runner import EVALUATION_STEPS_PER_LOOP, Runner
from tfaccel.train.step.runner_interface import Batches, LoopResult
from tfaccel.train.step.steps import explain_xla_error, first_nonfinite

_plain = tf.autograph.experimental.do_not_convert  # as model.fit: the step is not converted


class ModelStepLoops:
    """The model's `train_step` / `test_step`, N steps per `tf.function` call.

    Each loop returns `(steps run, examples read, the last step's logs as a
    tf.experimental.Optional)`; the data ending stops it early, as `steps.StepLoops`.
    The step is a `tf.function` of its own that every loop calls, as `model.fit`'s:
    variables it creates lazily (a GAN's optimizers) are made in its first trace.
    """

    def __init__(
        self,
        model: keras.Model,
        strategy: tf.distribute.Strategy,
        step_counter: tf.Variable,
        jit_compile: bool,
    ) -> None:
        self.model = model
        self.strategy = strategy
        self.step_counter = step_counter
        self.first_nonfinite = tf.Variable(-1, dtype=tf.int32, trainable=False)
        self.traces: collections.Counter[str] = collections.Counter()
        self._one = {
            "train": tf.function(self._one_step(model.train_step, jit_compile)),
            "test": tf.function(self._one_step(model.test_step, jit_compile)),
        }
        self.train_loop = tf.function(traces.counted(self._train_loop, "train loop", self.traces))
        self.test_loop = tf.function(traces.counted(self._test_loop, "test loop", self.traces))

    def _one_step(self, step: Callable[..., Any], jit_compile: bool) -> Callable[..., Any]:
        replica_step = tf.function(step, jit_compile=True) if jit_compile else step

        @_plain
        def one_step(data):
            logs = self.strategy.run(replica_step, args=(data,))
            logs = reduce_per_replica(logs, self.strategy, reduction="auto")
            return logs, _examples(data, self.strategy)

        return one_step

    @_plain
    def _run(self, which: str, iterator, num_steps):
        """Up to `num_steps` (>= 1) steps; the first one outside the `tf.while_loop`, so its
        logs give the structure the loop carries (model.fit's loop does the same: a
        `tf.cond` traces its true branch first)."""
        one_step, spec = self._one[which], {}
        first = iterator.get_next_as_optional()

        def ran_first():
            logs, read = one_step(first.get_value())
            logs = tf.experimental.Optional.from_value(logs)
            spec["logs"] = logs.element_spec
            return tf.constant(1, tf.int32), read, logs

        def no_data():
            empty = tf.experimental.Optional.empty(spec["logs"])
            return tf.constant(0, tf.int32), tf.constant(0.0, tf.float64), empty

        done, examples, logs = tf.cond(first.has_value(), ran_first, no_data)

        def body(done, examples, logs, _):
            optional = iterator.get_next_as_optional()
            more = optional.has_value()

            def step():
                new_logs, read = one_step(optional.get_value())
                return done + 1, examples + read, tf.experimental.Optional.from_value(new_logs)

            done, examples, logs = tf.cond(more, step, lambda: (done, examples, logs))
            return done, examples, logs, more

        start = (done, examples, logs, first.has_value())
        done, examples, logs, _ = tf.while_loop(
            lambda done, _e, _l, more: more & (done < num_steps), body, start
        )
        return done, examples, logs

    @_plain
    def _train_loop(self, iterator, num_steps):
        done, examples, logs = self._run("train", iterator, num_steps)
        self.step_counter.assign_add(tf.cast(done, tf.int64))
        self.first_nonfinite.assign(first_nonfinite(self.model.trainable_variables))
        return done, examples, logs

    @_plain
    def _test_loop(self, iterator, num_steps):
        return self._run("test", iterator, num_steps)


def _examples(data, strategy):
    """The examples of one (distributed) batch, from this worker's replicas' batch sizes."""
    first = tf.nest.flatten(data)[0]
    local = strategy.experimental_local_results(first)
    count = tf.add_n([tf.cast(tf.shape(t)[0], tf.float64) for t in local])
    return count * int(getattr(strategy.extended, "_num_workers", 1) or 1)


class ModelStepRunner(Runner):
    """A `Runner` whose steps are the model's own `train_step` / `test_step`.

    Takes `Runner`'s arguments; those of the Trainer's own step must be left as they are
    (`setup.model_steps` refuses them first).

    Args:
        model: a compiled `keras.Model` whose variables live under `strategy`.
        optimizer: the optimizer `self.optimizer` in the model's step applies.
        strategy: the `tf.distribute.Strategy`.
        jit_compile: compile the model's step (per replica) with XLA.
        evaluation_steps_per_loop: test steps per `tf.function` call in `evaluate`.
        loss, metrics, accumulate_steps, on_oom: None, none, 1 and "raise".

    Raises:
        ValueError: a loss, metrics, accumulation or `on_oom="accumulate"`.
    """

    def __init__(
        self,
        model: keras.Model,
        *,
        optimizer: keras.optimizers.Optimizer,
        strategy: tf.distribute.Strategy,
        jit_compile: bool = False,
        evaluation_steps_per_loop: int = EVALUATION_STEPS_PER_LOOP,
        loss: PerExampleLoss | None = None,
        metrics: Iterable[keras.metrics.Metric] = (),
        accumulate_steps: int = 1,
        on_oom: str = "raise",
    ) -> None:
        if loss is not None or list(metrics) or accumulate_steps != 1 or on_oom != "raise":
            raise ValueError(
                "The model's own steps compute their loss and metrics and apply their "
                "gradients: a loss, metrics, accumulate_steps or on_oom='accumulate' need "
                "the Trainer's own step (runner.Runner)."
            )
        super().__init__(
            model,
            optimizer=optimizer,
            loss=None,
            metrics=[],
            strategy=strategy,
            jit_compile=jit_compile,
            evaluation_steps_per_loop=evaluation_steps_per_loop,
        )
        self._last_logs = None  # the last train step's logs (model.fit's batch logs)
        self._votes = LoopStats(strategy, [])  # the workers' stop vote alone

    def build(self, sample: tf.data.Dataset) -> None:
        """Builds the model, its compiled loss and metrics and its optimizer, as `model.fit`
        does before its first step (only for a model made under a strategy's scope:
        otherwise Keras builds them in the first step's trace, and so does this runner)."""
        if self.loops is not None:
            return
        self.model._maybe_symbolic_build(data_batch=sample.element_spec)
        self.loops = self._step_loops(1)

    def _step_loops(self, micro_batches: int) -> ModelStepLoops:
        return ModelStepLoops(self.model, self.strategy, self.step, self.jit_compile)

    def train(self, iterator: Batches, num_steps: int, *, stop_flag: bool = False) -> LoopResult:
        """Up to `num_steps` of the model's `train_step` in one call."""
        if num_steps < 1:
            return LoopResult(0, {})
        start = time.perf_counter()
        done, examples, logs = self._run_loop(self._built().train_loop, iterator, num_steps)
        ran = int(done)
        seconds = time.perf_counter() - start
        if ran == 0:
            return LoopResult(0, {}, seconds=seconds)
        self._last_logs = logs.get_value()
        epoch_logs = self.epoch_logs()
        _, _, votes = self._votes.read(int(stop_flag))
        return LoopResult(
            ran,
            epoch_logs,
            loop_loss=_loss_of(epoch_logs),
            examples=float(examples),
            seconds=seconds,
            stop_vote=None if votes is None else votes > 0,
            nonfinite=self._first_nonfinite(),
        )

    def evaluate(self, iterator: Batches, num_steps: int | None) -> dict[str, Any]:
        """Resets the model's metrics and runs its `test_step`, as `model.evaluate`."""
        self.reset_metrics()
        done, per_call, last = 0, self.evaluation_steps_per_loop, None
        while num_steps is None or done < num_steps:
            want = per_call if num_steps is None else min(per_call, num_steps - done)
            ran, _, logs = self._run_loop(self._built().test_loop, iterator, want)
            ran = int(ran)
            if ran:
                last = logs.get_value()
            done += ran
            if ran < want:
                break
        return _metrics_or_logs(self.model, last)

    def _run_loop(
        self, loop: Callable[..., Any], iterator: Batches, num_steps: int
    ) -> tuple[tf.Tensor, tf.Tensor, tf.experimental.Optional]:
        """`(steps run, examples read, the last step's logs)` of one call of a loop."""
        try:
            return loop(iterator, tf.constant(num_steps, tf.int32))
        except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as error:
            text = str(error)
            if self.jit_compile and ("XLA" in text or "jit" in text.lower()):
                raise ValueError(explain_xla_error(error, self.model)) from error
            raise

    def epoch_logs(self) -> dict[str, Any]:
        """`model.fit`'s epoch logs: the model's metrics, or the last step's other logs."""
        return _metrics_or_logs(self.model, self._last_logs)

    def reset_metrics(self) -> None:
        self.model.reset_metrics()
        self._last_logs = None
        self._count_before = 0.0

    def checkpoint_items(self) -> dict[str, Any]:
        """The step counters, the model (with the optimizers it holds), its optimizer, its
        metrics' running state and every variable of the model by itself (random seed
        generators' states are not reached through the model object)."""
        items = super().checkpoint_items()
        items["metrics"] = _metric_variables(self.model)
        items["model_variables"] = list(self.model.variables)
        return items

    def state_variables(self) -> list[tf.Variable]:
        """Every variable a step may change: the model's, its optimizers', the counters,
        its metrics'."""
        optimizers = [self.optimizer, *_held_optimizers(self.model)]
        return [
            *self.model.variables,
            *{id(v): v for o in optimizers for v in o.variables}.values(),
            self.step,
            self.epoch,
            self.epoch_step,
            *[v for variables in _metric_variables(self.model).values() for v in variables],
        ]


def _metrics_or_logs(model: keras.Model, logs: Any) -> dict[str, Any]:
    """As `model.fit`: the model's metrics when `logs` names exactly those, else `logs`
    (also when a compiled metric the steps never updated cannot give a result yet)."""
    try:
        metrics = model.get_metrics_result()
    except ValueError:  # "Cannot get result() since the metric has not yet been built"
        if logs is None:
            raise
        metrics = {}
    if logs is None or (isinstance(logs, dict) and set(logs) == set(metrics)):
        return pythonify_logs(metrics)
    return pythonify_logs(logs if isinstance(logs, dict) else {"output": logs})


def _loss_of(logs: dict[str, Any]) -> float:
    """What the divergence check watches: the sum of the logs named "*loss" (0.0: none)."""
    values = [v for k, v in logs.items() if k.endswith("loss") and isinstance(v, float)]
    return float(sum(values)) if values else 0.0


def _metric_variables(model: keras.Model) -> dict[str, list[tf.Variable]]:
    """`{name: variables}` of the model's metrics (Keras 3 metrics are not trackable)."""
    return {f"{i}_{m.name}": list(m.variables) for i, m in enumerate(model.metrics)}


def _held_optimizers(model: keras.Model) -> list[keras.optimizers.Optimizer]:
    """Optimizers the model holds as attributes (a GAN's `d_optimizer`, `g_optimizer`)."""
    return [v for v in vars(model).values() if isinstance(v, keras.optimizers.Optimizer)]
