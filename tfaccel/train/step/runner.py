"""The inner loop and the state it owns: `Runner`.

A `Runner` holds the model, the optimizer, the loss and metrics (with the loss tracker),
the step counters (global step, epoch, step within the epoch), the compiled step loops
(`steps.StepLoops`) and the per-loop statistics (`loop_stats.LoopStats`). It implements
`runner_interface.RunnerInterface`: the outer loop asks it for `n` steps and gets a
`LoopResult` back; it never reads a metric, a variable or a step function itself.

Example (no `fit`, no callbacks):
    >>> runner = Runner(model, optimizer=opt, loss=PerExampleLoss("mse"), metrics=[],
    ...                 strategy=tf.distribute.get_strategy())          # doctest: +SKIP
    >>> runner.build(dataset)
    >>> result = runner.train(iter(dataset), 10)
    >>> result.steps, result.logs["loss"]
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import keras
import tensorflow as tf

from tfaccel.choices.copies import build_symbolically
from tfaccel.choices.online import XLA
from tfaccel.train.state import hyperparameters
from tfaccel.train.step.alternating import Alternating
from tfaccel.train.step.loop_stats import LoopStats
from tfaccel.train.step.losses import PerExampleLoss, loss_scale_of
from tfaccel.train.step.out_of_memory import (
    describe_out_of_memory,
    is_out_of_memory,
    split_until_fits,
)
from tfaccel.train.step.runner_interface import Batches, LoopResult, Position
from tfaccel.train.step.steps import (
    StepLoops,
    Tracking,
    error_line,
    explain_step_error,
    explain_xla_error,
    op_determinism,
    xla_failed,
)

EVALUATION_STEPS_PER_LOOP = 100  # test steps per call; they fire no callback
ON_OOM = ("raise", "accumulate")


class Loops(Protocol):
    """What a `Runner` reads of its step loops whichever step they run: `steps.StepLoops`
    (the Trainer's step) or `user_step.ModelStepLoops` (the model's own)."""

    train_loop: Callable[..., Any]  # (iterator, num_steps) -> what the loop ran
    test_loop: Callable[..., Any]
    first_nonfinite: tf.Variable  # the first non-finite trainable variable's index, or -1


class Runner(Alternating):
    """Runs training and test steps of one model under one strategy.

    Args:
        model: a built or unbuilt `keras.Model` whose variables live under `strategy`.
        optimizer: a Keras optimizer (already wrapped for loss scaling if needed).
        loss: the per-example loss (None only for `user_step.ModelStepRunner`, whose
            steps are the model's own).
        metrics: Keras metric objects.
        strategy: the `tf.distribute.Strategy`.
        jit_compile: compile the replica step with XLA.
        accumulate_steps: batches whose gradients make one optimizer step.
        evaluation_steps_per_loop: test steps per `tf.function` call in `evaluate`.
        on_oom: "raise", or "accumulate": the first step of a run holds its batches, and
            when it runs out of memory they are retried as 2, 4, 8, ... micro-batches
            accumulated into one step (`out_of_memory.split_until_fits`); the split is
            kept for the rest of the run (`micro_batches`).

    Raises:
        ValueError: a model whose variables were not created under `strategy`, or an
            unknown `on_oom`.
    """

    def __init__(
        self,
        model: keras.Model,
        *,
        optimizer: keras.optimizers.Optimizer,
        loss: PerExampleLoss | None,
        metrics: Iterable[keras.metrics.Metric],
        strategy: tf.distribute.Strategy,
        jit_compile: bool = False,
        accumulate_steps: int = 1,
        evaluation_steps_per_loop: int = EVALUATION_STEPS_PER_LOOP,
        on_oom: str = "raise",
    ) -> None:
        if on_oom not in ON_OOM:
            raise ValueError(
                f"on_oom must be one of {ON_OOM}, got {on_oom!r}: 'raise' lets an out-of-memory "
                "error end training; 'accumulate' retries the batch as 2, 4, 8, ... "
                "micro-batches accumulated into one step."
            )
        self.on_oom = on_oom
        self.micro_batches = 1
        self._held = on_oom == "accumulate"  # the next step holds its batches (retryable)
        self.strategy = strategy
        self.model = model
        self.optimizer = optimizer
        self.loss = loss
        self.metrics = list(metrics)
        self.jit_compile = jit_compile
        self.batches_per_step = accumulate_steps
        self.evaluation_steps_per_loop = evaluation_steps_per_loop
        _check_model_scope(model, strategy)
        with strategy.scope():
            self.loss_tracker = keras.metrics.Mean(name="loss")
            self.loop_loss = keras.metrics.Mean(name="loop_loss")  # divergence check
            self.step = tf.Variable(
                0,
                dtype=tf.int64,
                trainable=False,
                name="global_step",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )
            self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
            self.epoch_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch_step")
        self.model.optimizer = optimizer
        self.loops: Loops | None = None
        self.alternation = None  # the online XLA A/B (`Alternating.alternate_xla`)
        self._candidates = {}  # the A/B's step loops by jit_compile
        self._table = None  # the settings table the A/B's row goes to
        self._stats: LoopStats | None = None
        self._skipped_offset: int | None = None
        self._count_before: float | None = None  # the loss tracker's count before a loop

    # -- building ----------------------------------------------------------------------

    def build(self, sample: tf.data.Dataset) -> None:
        """Creates the model's and the optimizer's variables and the step loops (once)."""
        if self.loops is not None:
            return
        with self.strategy.scope():
            if not self.model.built or not self.model.weights:
                build_symbolically(self.model, sample.element_spec[0])
            self.optimizer.build(self.model.trainable_variables)
        self.loops = self._step_loops(self.micro_batches)
        self._skipped_offset = int(self.step.numpy()) - int(self.optimizer.iterations.numpy())

    def _step_loops(self, micro_batches: int) -> Loops:
        # A runner without a loss runs the model's own step, and overrides this.
        assert self.loss is not None, "the Trainer's own step needs a loss"
        return StepLoops(
            model=self.model,
            optimizer=self.optimizer,
            loss=self.loss,
            metrics=self.metrics,
            tracking=Tracking(self.loss_tracker, self.loop_loss, self.step),
            strategy=self.strategy,
            jit_compile=self.jit_compile,
            accumulate_steps=self.batches_per_step,
            micro_batches=micro_batches,
        )

    def _built(self) -> Loops:
        """The step loops `build` made: the outer loop builds the runner before it trains
        or evaluates, so they are there whenever a step runs."""
        if self.loops is None:
            raise RuntimeError("Runner.build(sample) makes the step loops; call it first.")
        return self.loops

    def _trainer_loops(self) -> StepLoops:
        """`_built()`, where they are the Trainer's own step's (`_step_loops` makes them; a
        subclass that runs other loops overrides every method that calls this)."""
        loops = self._built()
        assert isinstance(loops, StepLoops), type(loops)
        return loops

    def retrace(self) -> None:
        """New step loops, traced anew: after the trainable variables changed (freezing)."""
        self._candidates = {}
        if self.loops is not None:
            self.loops = self._step_loops(self.micro_batches)

    # -- running -----------------------------------------------------------------------

    def train(self, iterator: Batches, num_steps: int, *, stop_flag: bool = False) -> LoopResult:
        """Up to `num_steps` optimizer steps in one call; then one collective for the logs.

        Args:
            iterator: a (distributed) iterator over the training batches.
            num_steps: optimizer steps to apply (each reads `batches_per_step` batches).
            stop_flag: this worker's vote to stop, summed over workers with the logs.
        """
        self.loop_loss.reset_state()
        if self._count_before is None:
            self._count_before = float(self.loss_tracker.count.numpy())
        ab = self._alternating()
        candidate = ab.next() if ab is not None else None
        if ab is not None:
            self._use(candidate == XLA)
        start = time.perf_counter()
        ran, note, looped = 0, None, False
        trial = ab is not None and candidate == XLA and XLA not in ab.warmed
        held = self._held or trial
        if held:  # the XLA step's first: held, so that a step XLA cannot compile is redone
            ran, note = self._held_step(iterator)
        if ran < num_steps and (ran or not held):
            ran += self._call(self._built().train_loop, iterator, num_steps - ran)
            looped = True
        seconds = time.perf_counter() - start
        if ran == 0:
            return LoopResult(0, {}, seconds=seconds)
        nonfinite = self._first_nonfinite()
        logs, loop_loss, count, stop = self._loop_logs(stop_flag)
        examples, self._count_before = count - self._count_before, count
        if ab is not None and candidate is not None:
            self._read_alternation(ab, candidate, ran, examples, seconds)
        # Not measured for a held step (fetched in Python) or under op determinism.
        unmeasured = not looped or op_determinism()
        wait = None if unmeasured else self._input_wait()
        return LoopResult(ran, logs, loop_loss, examples, seconds, stop, nonfinite, note, wait)

    def _input_wait(self) -> float:
        """Seconds the last step loop waited for its batches (measured inside its graph)."""
        return float(self._trainer_loops().input_wait.numpy())

    def _held_step(self, iterator: Batches, batches: list | None = None) -> tuple[int, str | None]:
        """One step whose batches are held (read now, or `batches`), so that running out of
        memory retries them and a step XLA cannot compile runs them un-jitted.

        Returns (steps applied: 0 when the data ended, the out-of-memory note or None).
        """
        if batches is None:
            batches = []
            for _ in range(self.batches_per_step):
                optional = iterator.get_next_as_optional()
                if not bool(optional.has_value()):
                    break
                batches.append(optional.get_value())
        if not batches:
            return 0, None
        saved = [(v, v.numpy()) for v in self._retry_state()]
        step = int(self.step.numpy())
        try:
            self._trainer_loops().held_step(batches)
            self._held = False
            return 1, None
        except Exception as error:  # noqa: BLE001 - only out-of-memory is retried
            if self.alternation is not None and self.jit_compile and xla_failed(error):
                for variable, value in saved:  # XLA did not compile: the plain step runs
                    variable.assign(value)
                self._trainer_loops().clear_accumulators()
                self.alternation.drop(f"XLA cannot compile the model's step ({error_line(error)})")
                self._use(False)
                return self._held_step(iterator, batches)
            if not is_out_of_memory(error):
                raise
            failure = error
        batch = self._global_batch(batches[0])

        def attempt(k: int) -> None:
            for variable, value in saved:  # undo what the failed try updated (BN, metrics)
                variable.assign(value)
            self._trainer_loops().clear_accumulators()
            loops = self._step_loops(k)
            assert isinstance(loops, StepLoops), type(loops)  # as `_trainer_loops`
            loops.held_step(batches)
            self.loops = loops

        k = split_until_fits(attempt, batch, replicas=self.strategy.num_replicas_in_sync)
        if k is None:
            raise RuntimeError(
                f"on_oom='accumulate': batch {batch} runs out of memory even as micro-batches "
                f"of one example per replica ({describe_out_of_memory(failure)}). Use a "
                "smaller model or input, mixed precision or remat."
            ) from failure
        self.micro_batches, self._held = k, False
        return 1, (
            f"out of memory at batch {batch}: {k} micro-batches of {batch // k} from step {step}"
        )

    def _retry_state(self) -> list[tf.Variable]:
        """What a failed step may have changed before running out of memory."""
        metrics = [self.loss_tracker, self.loop_loss, *self.metrics]
        counters = [self.step, self.optimizer.iterations]
        variables = [v for m in metrics for v in m.variables]
        return counters + list(self.model.non_trainable_variables) + variables

    def _global_batch(self, batch: Any) -> int:
        first = tf.nest.flatten(batch)[0]
        local = sum(int(t.shape[0]) for t in self.strategy.experimental_local_results(first))
        return local * getattr(self.strategy.extended, "_num_workers", 1)

    def evaluate(self, iterator: Batches, num_steps: int | None) -> dict[str, float]:
        """Resets the metrics and runs test steps (None: until the data ends); returns logs."""
        self.reset_metrics()
        done, per_call = 0, self.evaluation_steps_per_loop
        while num_steps is None or done < num_steps:
            want = per_call if num_steps is None else min(per_call, num_steps - done)
            ran = self._call(self._built().test_loop, iterator, want)
            done += ran
            if ran < want:
                break
        self._count_before = None  # the test steps counted too: read it again before training
        return {
            "loss": float(self.loss_tracker.result()),
            **{m.name: float(m.result()) for m in self.metrics},
        }

    def _call(self, loop: Callable[..., Any], iterator: Batches, num_steps: int) -> int:
        try:
            return int(loop(iterator, tf.constant(num_steps, tf.int32)))
        except tf.errors.ResourceExhaustedError as error:
            if self.on_oom != "accumulate":
                raise
            raise RuntimeError(
                f"on_oom='accumulate': a step after the first ran out of memory "
                f"({describe_out_of_memory(error)}) with {self.micro_batches} micro-batch(es). "
                "Only the first step of a run holds its batch for a retry; a batch that needs "
                "more memory later (e.g. longer sequences) cannot be retried. Resume from the "
                "last checkpoint with a smaller batch or accumulate_steps."
            ) from error
        except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as error:
            text = str(error)
            if self.jit_compile and ("XLA" in text or "jit" in text.lower()):
                raise ValueError(explain_xla_error(error, self.model)) from error
            clear = None if self.loss is None else explain_step_error(error, self.loss.name)
            if clear:
                raise ValueError(clear) from error
            raise

    def _first_nonfinite(self) -> str | None:
        index = int(self._built().first_nonfinite.numpy())
        if index < 0:
            return None
        variable = self.model.trainable_variables[index]
        return getattr(variable, "path", None) or variable.name

    # -- metrics -------------------------------------------------------------------------

    def _loop_logs(self, stop_flag: bool) -> tuple[dict, float, float, bool | None]:
        """(logs, the loop's mean loss, examples counted, any worker stopping): one collective.

        The stop vote is None when the metrics could not be packed (`loop_stats.py`).
        """
        if self._stats is None:
            self._stats = LoopStats(
                self.strategy, [self.loss_tracker, self.loop_loss, *self.metrics]
            )
        results, values, votes = self._stats.read(int(stop_flag))
        logs = {"loss": results["loss"]}
        for metric in self.metrics:
            logs[metric.name] = results[metric.name]
        self._add_loss_scale(logs)
        count = float(values[id(self.loss_tracker.count)])
        return logs, results["loop_loss"], count, None if votes is None else votes > 0

    def epoch_logs(self) -> dict[str, float]:
        """The running loss and metrics (and loss scale) of the epoch so far."""
        logs = {"loss": float(self.loss_tracker.result())}
        for metric in self.metrics:
            logs[metric.name] = float(metric.result())
        self._add_loss_scale(logs)
        return logs

    def _add_loss_scale(self, logs: dict[str, float]) -> None:
        scale = loss_scale_of(self.optimizer)
        if scale is not None:
            logs["loss_scale"] = scale
            logs["skipped_steps"] = self.skipped_steps

    @property
    def skipped_steps(self) -> int:
        """Steps whose gradients were not finite and were skipped by loss scaling."""
        if self._skipped_offset is None:
            return 0
        done = int(self.step.numpy()) - int(self.optimizer.iterations.numpy())
        return done - self._skipped_offset

    def reset_metrics(self) -> None:
        for metric in [self.loss_tracker, *self.metrics]:
            metric.reset_state()
        self._count_before = 0.0

    # -- position and checkpoints ----------------------------------------------------------

    @property
    def position(self) -> Position:
        return Position(
            int(self.step.numpy()), int(self.epoch.numpy()), int(self.epoch_step.numpy())
        )

    def set_position(self, *, epoch: int | None = None, epoch_step: int | None = None) -> None:
        """Sets the epoch and/or the applied steps within it (the global step is the loops')."""
        if epoch is not None:
            self.epoch.assign(epoch)
        if epoch_step is not None:
            self.epoch_step.assign(epoch_step)

    def checkpoint_items(self) -> dict[str, Any]:
        """The state a checkpoint holds: step counters, model, optimizer, metrics' running state."""
        return {
            "step": self.step,
            "epoch": self.epoch,
            "epoch_step": self.epoch_step,
            "model": self.model,
            "optimizer": self.optimizer,
            # Keras 3 metrics are not trackable themselves; their variables are.
            "metrics": {m.name: list(m.variables) for m in [self.loss_tracker, *self.metrics]},
        }

    def optimizer_type(self) -> str:
        """The optimizer's class name, looking through loss scaling (saved in checkpoints)."""
        inner = getattr(self.optimizer, "inner_optimizer", self.optimizer)
        return type(inner).__name__

    def run_shape(self) -> dict[str, Any]:
        """The runner's part of a checkpoint's run shape (what a resume compares)."""
        return {
            "optimizer": self.optimizer_type(),
            "accumulate_steps": self.batches_per_step,
            "hyperparameters": hyperparameters.of(self.optimizer),
            "micro_batches": self.micro_batches,  # on_oom's split (not compared)
        }

    @contextlib.contextmanager
    def restoring(self) -> Iterator[None]:
        """Around a restore: state comes from the checkpoint, optimizer settings stay this run's."""
        try:
            with hyperparameters.kept(self.optimizer):
                yield
        finally:
            self._count_before = None

    def restart_optimizer(self) -> None:
        """A fresh optimizer (of another type than saved) counts its steps from the global step."""
        self.optimizer.iterations.assign(self.step)

    def state_variables(self) -> list[tf.Variable]:
        """Every variable a step changes: the model's, the optimizer's, the step counters
        and the metrics' (what the doctor saves before it measures and restores after)."""
        metrics = [self.loss_tracker, self.loop_loss, *self.metrics]
        return [
            *self.model.variables,
            *self.optimizer.variables,
            self.step,
            self.epoch,
            self.epoch_step,
            *[v for m in metrics for v in m.variables],
        ]


def _check_model_scope(model: keras.Model, strategy: tf.distribute.Strategy) -> None:
    foreign = [
        v.path
        for v in model.variables
        if not strategy.extended.variable_created_in_scope(getattr(v, "value", v))
    ]
    if foreign:
        raise ValueError(
            f"The model's variables (e.g. {foreign[:3]}) were not created under the "
            f"Trainer's strategy ({type(strategy).__name__}). Build the model inside "
            "`with strategy.scope():`, or pass a function that builds it: "
            "Trainer(build_model, ...)."
        )
