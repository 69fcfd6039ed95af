"""The Trainer: a small outer loop (epochs, evaluation, callbacks) over a multi-step inner loop.

`Trainer` resolves the arguments, makes each call's input one `tfaccel.data.Feed` (built
once, checked) and prints the settings table; the inner loop and its state are a
`runner.Runner`, and `fit`'s outer loop a `fit_loop.FitLoop` that sees the runner only
through `runner_interface.RunnerInterface`.

Example:
    >>> strategy = tfaccel.devices.strategy("auto")                 # doctest: +SKIP
    >>> trainer = tfaccel.Trainer(build_model, optimizer=keras.optimizers.Adam,
    ...     loss="sparse_categorical_crossentropy", metrics=["accuracy"], strategy=strategy)
    >>> history = trainer.fit(train_ds, epochs=5, validation_data=val_ds)
"""

from __future__ import annotations

import logging
import os
from typing import Any

import keras
import tensorflow as tf
from keras.callbacks import Callback

from tfaccel import precision, shared_strategy
from tfaccel.choices import copies, loop_size, policy, resolution
from tfaccel.choices.xla import XlaChoice
from tfaccel.data import Feed, iterators
from tfaccel.methods.composition import MethodsArg
from tfaccel.train.loop.fit_loop import FitLoop, Schedule
from tfaccel.train.setup import (
    arguments,
    array_inputs,
    checked,
    compiled,
    inputs,
    methods_setup,
    model_steps,
    remainder,
    runner_made,
    settings,
    startup,
)
from tfaccel.train.state.policies import Checkpointing, FaultPolicy
from tfaccel.train.state.trainer_state import TrainerState
from tfaccel.train.step import accumulation
from tfaccel.train.step.losses import LossSpec, MetricsArg

logger = logging.getLogger("tfaccel")


class Trainer(TrainerState):
    """Trains a Keras model with custom `tf.function` steps under a `tf.distribute` strategy.

    Args:
        model: a `keras.Model`, or a zero-argument callable building one (called in
            the strategy scope). A model compiled with `model.compile(...)` gives its
            optimizer, loss, loss weights and metrics (an argument given here wins). A
            model built outside the scope is copied into it (`keras.models.clone_model`,
            same weights) and the trained weights are copied back to it when `fit` ends.
            A model overriding `train_step`, `test_step`, `compute_loss` or `compute_metrics`
            (a GAN, a custom loss) runs its own steps, as `model.fit` (`setup.model_steps`).
        optimizer: a Keras optimizer, its name, or a callable building one; wrapped in
            a `LossScaleOptimizer` when the dtype policy computes in float16. Default:
            the compiled model's, else "adam".
        loss: a `keras.losses.Loss`, a loss name, or `fn(y_true, y_pred)` returning one
            loss per example (also the one entry of a dict or list, as `model.fit`).
            Default: the compiled model's (one is required). A Loss's reduction is kept:
            "sum_over_batch_size" (mean over the global batch) or "sum"; others are refused.
            A model compiled with `run_eagerly=True` is refused (the steps are tf.functions).
        metrics: Keras metrics (objects or names such as "accuracy"; one alone, a list,
            or None); as in `model.compile` they ignore sample and class weights.
        loss_weights: a number multiplying the loss (a single-output model's
            `loss_weights`; also one in a list or a dict keyed by the output's name).
        weighted_metrics: metrics that use the sample and class weights.
        strategy: a `tf.distribute.Strategy`; None → `tfaccel.devices.strategy("auto")`.
        steps_per_loop: steps per `tf.function` call, or "auto": measured on the first
            loops, the fewest steps that keep the host overhead of a call under 2 % of
            it, at most 2 s a call (the settings table shows n and the overhead). Always
            clipped to the epoch and to checkpoint boundaries. Callbacks' batch hooks
            fire once per loop; the numbers do not depend on n.
        jit_compile: True, False or "auto": at the first `fit`, the model's passes are
            timed with and without XLA (together with the policies when precision is "auto"
            too); XLA only when 5 % faster and equal in loss, on a job long enough for the
            probe, compilation included, to stay within 5 % of it (`tfaccel.choices.xla`);
            else un-jitted. The settings table shows both rates and why (`jit_choice`).
        accumulate_steps: sum the gradients of this many consecutive batches on each replica, then
            all-reduce and apply them once (effective global batch = k × the dataset's global
            batch). Epochs, `steps_per_epoch` and `validation_steps` count batches; the global step,
            checkpoints, preemption and callbacks count applied steps.
        on_oom: "raise" (default), or "accumulate": when the first training step of a `fit` runs out
            of memory (`ResourceExhaustedError` or XLA's RESOURCE_EXHAUSTED) at global batch B, the
            same batch is retried as k = 2, 4, 8, ... micro-batches accumulated inside one step
            until it fits, and the run goes on with k. The update equals batch B's (same loss
            contract; BatchNormalization normalises each micro-batch with its own statistics).
            Logged once, shown in the settings table, stored in the checkpoint's run shape.
        precision: None (default) keeps the model's dtype policy; a policy name (e.g.
            "mixed_bfloat16") trains a copy of the model under it (same weights, the
            output layers in float32; from `model` when it is a building function, called
            under the policy); "auto" times the model's own forward and backward passes
            under each policy this hardware offers (`precision.candidates`) at the first
            `fit`, within 5 % of an epoch (at least 1 s), and keeps float32 unless another
            is 5 % faster. The settings table shows the rates and the choice. Weights,
            random states and the data's position are as if nothing had been timed. A
            model object trained as a copy gets the trained weights back when fit ends.
        methods: `tfaccel.methods` to apply: a list, "fast" (the stack measured best for the
            job's kind), "auto" (stacks probed on this model and data) or None; at first fit.

    Raises:
        TypeError: `model` is not a model or a function building one; `optimizer`
            is not an optimizer, its name or a function building one.
        ValueError: bad `steps_per_loop` / `jit_compile` / `accumulate_steps` / `on_oom` /
            `precision` (an unknown policy name lists the valid ones), an unknown
            optimizer name, no loss (neither given nor compiled), loss weights or
            metrics for several outputs, or a model built outside `strategy`'s scope that
            cannot be cloned into it (the message says how to build it there).
    """

    def __init__(
        self,
        model: arguments.ModelSpec,
        *,
        optimizer: arguments.OptimizerSpec | None = None,
        loss: LossSpec | dict[str, LossSpec] | list[LossSpec] | None = None,
        metrics: MetricsArg = None,
        loss_weights: compiled.LossWeights = None,
        weighted_metrics: MetricsArg = None,
        strategy: tf.distribute.Strategy | None = None,
        steps_per_loop: int | str = "auto",
        jit_compile: bool | str = "auto",
        accumulate_steps: int = 1,
        on_oom: str = "raise",
        precision: str | None = None,
        methods: MethodsArg = None,
    ) -> None:
        self._precision = None if precision in (None, "auto") else _policy_name(precision)
        self._builder = None if isinstance(model, keras.Model) else model
        self.precision_choice: policy.PolicyChoice | None = None
        self.strategy = strategy or arguments.default_strategy()
        shared_strategy.check_alone(self.strategy)  # one collective strategy per device
        self.steps_per_loop = loop_size.resolve_steps_per_loop(steps_per_loop)
        self._loop_sizer = loop_size.LoopSizer(self.steps_per_loop)  # kept across fit calls
        self.accumulate_steps = accumulation.resolve_accumulate_steps(accumulate_steps)
        with self.strategy.scope():
            self.model_steps, setup, self.loss, self.metrics = model_steps.resolve_model(
                arguments.build_model(model),
                self.strategy,
                optimizer=optimizer,
                loss=loss,
                loss_weights=loss_weights,
                metrics=metrics,
                weighted_metrics=weighted_metrics,
                accumulate_steps=accumulate_steps,
                on_oom=on_oom,
                precision=precision,
                methods=methods,
            )
            self.model, self.source_model = setup.model, setup.source_model
            self._given_optimizer = setup.optimizer
        self.jit_compile = settings.resolve_jit_compile(jit_compile, self.model, self.strategy)
        own = self.model_steps is not None  # the model's train_step runs
        self.jit_choice: XlaChoice | None = None
        self._asked = resolution.Asked(precision == "auto", jit_compile == "auto" and not own)
        self._runner_maker = runner_made.RunnerMaker(
            self.strategy, self.accumulate_steps, on_oom, self.steps_per_loop, own
        )
        self.startup, self._clock, self._checked = None, startup.IDLE, checked.Checked()
        self._make_runner()
        if self._precision is not None and self._precision != self.model.dtype_policy.name:
            self.precision_choice = policy.PolicyChoice(self._precision, "given")
            self._train_under(self._precision)
        self.preempted = False
        self.settings: dict[str, Any] = {}
        self.methods = methods_setup.Methods(methods)  # its plan is made at the first fit

    def _make_runner(self, policy: str | None = None) -> None:
        """The inner loop and the state it owns (`runner_made`), the optimizer wrapped for
        `policy` (default: the global one); fit's outer loop sees only its interface."""
        parts = self.model, self._given_optimizer, self.loss, self.metrics, self.jit_compile
        self.optimizer, self.runner = self._runner_maker.make(*parts, policy)

    def _train_under(self, policy: str) -> None:
        """From now on (before any step) the Trainer trains a copy of the model under `policy`."""
        if self.runner.loops is not None:
            raise RuntimeError("the dtype policy can change only before the first step")
        copy = copies.under(self.model, policy, self._builder, self.strategy)
        if self._builder is None and self.source_model is None:
            self.source_model = self.model  # the user's model object gets the weights back
        self.model = copy
        self._make_runner(policy)

    def _apply_methods(
        self, train: Feed, callbacks: list[Callback], schedule: Schedule
    ) -> tuple[Feed, list[Callback]]:
        """`methods=`, planned at the first fit (the runner made anew around the plan's loss,
        metrics and optimizer when a method applies); (train, callbacks) with its own."""
        parts = self.model, self.loss, self.metrics, self._given_optimizer, self.strategy
        given = methods_setup.Ingredients(*parts, self.accumulate_steps, self.feed)
        made = self.methods.plan_once(given, train, schedule.steps_per_epoch, schedule.epochs)
        if made is not None:
            self.loss, self.metrics, self._given_optimizer = made.loss, made.metrics, made.optimizer
            self._make_runner(self.model.dtype_policy.name)
        return self.methods.apply(train, callbacks, lambda: self.runner.retrace(), schedule)

    def _prepare(self, train: Feed, validation, schedule: Schedule, callbacks: list):
        """Before step 1: input checked, "auto" resolved once and applied, loops built."""
        self.feed(train, steps=schedule.steps_per_epoch, build=False)
        parts = self.model, self.loss, self.strategy, self._builder, self.jit_compile
        step = resolution.Step(*parts, self.runner.loops is not None, self._given_optimizer)
        asked = self._asked.left(self.precision_choice, self.jit_choice)
        epochs = schedule.epochs - schedule.initial_epoch
        job = resolution.Job(train, schedule.steps_per_epoch, epochs, callbacks)
        made = resolution.resolve_fit(step, asked, job, self._loop_sizer)
        xla, chosen = made.jit_compile, made.precision  # each also in the settings table
        remake = xla is not None and xla.jit_compile != self.jit_compile
        if xla is not None:
            self.jit_choice, self.jit_compile = xla, xla.jit_compile
        self.precision_choice = chosen or self.precision_choice
        if chosen is not None and chosen.policy != self.model.dtype_policy.name:
            self._train_under(chosen.policy)  # the runner made anew
        elif remake:
            self._make_runner(self.model.dtype_policy.name)
        self._clock.lap("precision and XLA choice")
        if validation is not None:
            steps = schedule.validation_steps
            validation = self.feed(validation, steps=steps, what="validation", build=False)
        self.runner.build(train.dataset)
        self._clock.lap("variables and step loops")
        return validation

    def feed(
        self, data: Any, *, steps: int | None = None, what: str = "training", build: bool = True
    ) -> Feed:
        """The input of one call as a `Feed` (built once), checked as `fit` checks it; the
        model's and optimizer's variables and the step loops are built for it.

        Args:
            data: a batched dataset, a dataset function, `tfaccel.data.pipeline`'s result,
                or a `Feed` already made.
            steps: the steps that will be read (None: until the data ends).
            what: "training", "validation" or "evaluation" (for messages).
            build: False checks only (`fit` builds the step loops after its choices).

        Raises:
            ValueError, TypeError: the input checks `fit` documents.
        """
        feed = self.methods.feed(data, self.strategy, what)  # a Feed of data, mapped by methods
        inputs.check_feed(feed, self.model, steps, what, self.strategy.num_replicas_in_sync)
        self._clock.lap("input checks")
        with self.strategy.scope():  # a model the label check calls is built in the scope
            self._checked.labels(feed, self.model, self.loss and self.loss.fn, self._clock)
        if build:
            self.runner.build(feed.dataset)
            self._clock.lap("variables and step loops")
        return feed

    def fit(
        self,
        x: array_inputs.Data | array_inputs.Arrays | None = None,
        y: array_inputs.Arrays | None = None,
        batch_size: int | None = None,
        epochs: int = 1,
        *,
        verbose: int | str = "auto",
        callbacks: arguments.CallbacksArg = (),
        validation_split: float = 0.0,
        validation_data: array_inputs.Data | tuple[array_inputs.Arrays | None, ...] | None = None,
        shuffle: bool = True,
        class_weight: dict[int, float] | None = None,
        sample_weight: array_inputs.Arrays | None = None,
        initial_epoch: int = 0,
        steps_per_epoch: int | None = None,
        validation_steps: int | None = None,
        validation_batch_size: int | None = None,
        validation_freq: int = 1,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_every: int | str = "epoch",
        keep: int = 3,
        divergence_loops: int = 3,
        restore_on_divergence: bool = False,
        exit_on_preemption: bool = True,
        resume: str = "auto",
    ) -> keras.callbacks.History:
        """Trains for `epochs`; returns the Keras `History` (`.startup`: `trainer.startup`).

        The arguments up to `validation_freq` are `model.fit`'s, with its meaning (see
        `tfaccel.train.setup.array_inputs`); arrays become a `tfaccel.data.pipeline`.

        Args:
            x: a batched `tf.data.Dataset` (global batch) of `(x, y[, sample_weight])`, a
                dataset function for `distribute_datasets_from_function`,
                `tfaccel.data.pipeline(...)`'s result, a `Feed` of `trainer.feed(...)`, or the
                features as NumPy arrays (a dict or tuple of arrays for several inputs) with `y`.
            y: labels for array features (None with a dataset).
            batch_size: the global batch for arrays (default 32, as Keras).
            epochs: the epoch to stop at (train epochs `initial_epoch`..`epochs - 1`).
            verbose: 0 silent, 1 progress bar, 2 one line per epoch, "auto" → 1.
            callbacks: `keras.callbacks.Callback` objects (a list, one, or None).
            validation_split: for arrays, the fraction of examples to validate on: the
                last ones, taken before shuffling, as Keras does.
            validation_data: evaluated at each epoch end; results logged as `val_*`. A
                dataset, or a tuple `(x_val, y_val)` / `(x_val, y_val, sample_weight_val)`.
            shuffle: for arrays, reshuffle the training examples every epoch (seeded from
                NumPy's global generator: `keras.utils.set_random_seed` fixes it).
            class_weight: for arrays, `{class: weight}` weighting the training loss.
            sample_weight: for arrays, one weight per training example.
            initial_epoch: the epoch to start at (a resumed checkpoint's epoch wins).
            steps_per_epoch: steps per epoch; required for infinite datasets. Default: the
                dataset's length.
            validation_steps: steps of validation (None: until exhausted).
            validation_batch_size: batch of array validation data (default `batch_size`).
            validation_freq: only 1 is supported (refused otherwise).
            checkpoint_dir: save and resume here. A run started again with the same
                directory continues at the saved step with the same next batch. The run
                owns the directory while it trains (a lock file, `tfaccel.lock`, removed
                when fit ends).
            checkpoint_every: "epoch" or a number of steps. A save that lands on an epoch's
                last step is written after the epoch's validation, as that epoch's.
            keep: how many checkpoints to keep.
            divergence_loops: raise `TrainingDivergedError` after this many consecutive
                step loops with a non-finite loss (no checkpoint is written meanwhile).
            restore_on_divergence: restore the last good checkpoint before raising.
            exit_on_preemption: after SIGTERM/SIGINT, finish the step loop, save, say so on
                stderr and exit with status 0 (run the same command to resume). Without
                `checkpoint_dir` nothing is saved and the run must not look finished:
                SIGINT raises `KeyboardInterrupt`, SIGTERM exits with status 143 (128 + 15).
                False: return, with `trainer.preempted` set. Either way a model the
                Trainer trained a copy of gets the weights trained so far.
            resume: "auto" resumes from the newest readable checkpoint in `checkpoint_dir`
                and refuses one saved with another global batch, steps per epoch,
                optimizer type or training data (its content fingerprint: "the training
                data changed"); "force" accepts those (with new batching the data
                continues after the examples already trained on and the interrupted
                epoch counts from 0; new data continues from the saved step, its input
                position skipped to, not restored; a new optimizer type starts with
                fresh slots); "never" restores nothing and starts from step 0, as
                `model.fit` does: the checkpoints already there are named in a warning
                and deleted at this run's first save (until then they stay intact).

        Warns:
            DroppedExamplesWarning: the training data is batched with
                `drop_remainder=True` and drops examples every epoch (their count).

        Raises:
            ValueError: a `model.fit` argument the Trainer does not support
                (`validation_freq` other than 1, `shuffle="batch"`), array arguments
                (`y`, `batch_size`, `sample_weight`, `class_weight`, `validation_split`)
                with a dataset, an unbatched or empty dataset, elements not
                `(x, y[, sample_weight])`, features whose shape does not fit the model's
                input, labels whose dtype or shape do not fit the model's output and the
                loss (see `tfaccel.data.check`), fractional labels or labels outside the
                classes for a sparse loss, an infinite dataset without `steps_per_epoch`,
                a global batch that does not divide among the replicas, `validation_steps`
                < 1, `checkpoint_every` < 1, or `checkpoint_dir=""`.
            TypeError: string features for a numeric model, or a callback that is not
                a `keras.callbacks.Callback`.
            NotADirectoryError, PermissionError: `checkpoint_dir` is a file or not
                writable (checked before any training).
            CheckpointMismatchError: `checkpoint_dir` holds another model's checkpoint, or
                one of a run with another global batch / steps per epoch / optimizer.
            CheckpointCorruptError: `checkpoint_dir` holds checkpoints, none readable, or
                only a state file naming checkpoints whose files are gone (nothing is
                changed; `resume="never"` starts from step 0).
            CheckpointLockedError: another live run holds `checkpoint_dir` (its host, pid
                and times are named). A lock whose process is gone (same host), or not
                refreshed for `tfaccel.train.state.lock.STALE_AFTER` seconds (another host), is
                taken over with a warning.
            TrainingDivergedError: the loss stayed non-finite, or a weight became
                non-finite (checked once per step loop, before any save).
        """
        self._clock = clock = self.startup = startup.Startup(verbose)
        if validation_freq != 1:
            array_inputs.refuse("validation_freq", validation_freq)
        steps = epochs, steps_per_epoch, initial_epoch, None, validation_steps  # checked first
        schedule = Schedule(*steps, self._loop_sizer, verbose)
        train_data, validation_data = array_inputs.training_data(
            x,
            y,
            batch_size=batch_size,
            validation_split=validation_split,
            validation_data=validation_data,
            validation_batch_size=validation_batch_size,
            shuffle=shuffle,
            class_weight=class_weight,
            sample_weight=sample_weight,
            strategy=self.strategy,
            jit_compile=self.jit_compile,
        )
        callbacks = arguments.callback_list(callbacks)
        checkpointing = Checkpointing(checkpoint_dir, checkpoint_every, keep, resume)
        faults = FaultPolicy(divergence_loops, restore_on_divergence, exit_on_preemption)
        clock.lap("arguments and array inputs")
        train = Feed.of(train_data, self.strategy, what="training")  # a Feed is reused
        train, callbacks = self._apply_methods(train, callbacks, schedule)
        clock.lap("feed build")
        schedule.validation = self._prepare(train, validation_data, schedule, callbacks)
        remainder.warn_if_dropped(train, self.jit_compile)
        callbacks = startup.before_loop(clock, train, checkpointing, callbacks)
        loop = FitLoop(self.runner, train, schedule, callbacks, checkpointing, faults)
        try:  # the checkpoint directory is this run's until fit ends, however it ends
            rows = self.precision_choice, self.jit_choice, self.model_steps, self.methods
            self.settings = settings.resolve(
                self.runner, train, loop.steps_per_epoch, self._loop_sizer, *rows
            )
            (print if verbose else logger.info)(settings.format_table(self.settings))
            clock.lap("fit loop set-up and settings table")
            history = loop.run()
            compiled.copy_weights_back(self.model, self.source_model)
            return history
        except (SystemExit, KeyboardInterrupt):
            if loop.preempted:  # what trained before the signal is the user's model's too
                compiled.copy_weights_back(self.model, self.source_model)
            raise
        finally:
            loop.close()
            self.jit_choice, self.jit_compile = settings.xla_after(self.runner, self.jit_choice)
            self.settings.update(loop.notes)
            self.preempted = loop.preempted

    def evaluate(
        self,
        x: array_inputs.Data | array_inputs.Arrays | None = None,
        y: array_inputs.Arrays | None = None,
        batch_size: int | None = None,
        *,
        sample_weight: array_inputs.Arrays | None = None,
        steps: int | None = None,
    ) -> dict[str, Any]:
        """Evaluates the model; returns `{"loss": ..., <metric>: ...}` over all examples.

        Args:
            x: a batched dataset (or `tfaccel.data.pipeline`'s result), or arrays (a dict
                of arrays for named inputs) with `y`, batched by `batch_size` (default 32).
            sample_weight: per-example weights of arrays.
            steps: batches to evaluate (None: all).

        Raises:
            ValueError: the same input checks as `fit`, or `steps` < 1.
        """
        arguments.check_steps("steps", steps)
        data = array_inputs.evaluate_data(x, y, batch_size, sample_weight, self.strategy)
        feed = self.feed(data, steps=steps, what="evaluation")
        iterator = iterators.adopt(iter(feed.distribute()))
        return self.runner.evaluate(iterator, steps)

    @property
    def loop_sizer(self) -> loop_size.LoopSizer:
        """For tools (the doctor, the tuner): the steps per `tf.function` call (read-only;
        kept across `fit` calls): `.chosen` is the n in use (None while "auto" is still
        measuring), `.choice()` the measured `Choice`, `.describe()` says why."""
        return self._loop_sizer


_policy_name = precision.resolve  # for __init__, whose `precision` argument hides the module
