"""`BatchSizeHyperModel`: keras-tuner searches the batch size, the learning rate follows it.

Example:
    >>> hypermodel = tfaccel.tuning.BatchSizeHyperModel(                # doctest: +SKIP
    ...     build_model, batch_sizes=[32, 64, 128],
    ...     scaling=tfaccel.tuning.LRScaling(base_batch_size=32, base_learning_rate=1e-3))
    >>> tuner = keras_tuner.GridSearch(hypermodel, objective="val_accuracy", ...)
    >>> tuner.search(train_unbatched, validation_data=val_unbatched, epochs=3)
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import keras
import keras_tuner
import tensorflow as tf

from tfaccel.callbacks import Throughput
from tfaccel.callbacks._steps import StepClock, wait_for
from tfaccel.tuning.batch import inputs
from tfaccel.tuning.batch.report import BatchSizeReport
from tfaccel.tuning.batch.search import find_batch_size
from tfaccel.tuning.job import TuningJob, field_names
from tfaccel.tuning.oom import describe_out_of_memory, is_out_of_memory, release_memory
from tfaccel.tuning.scaling import LRScaling

_TRAINER_FIT_ARGS = ("epochs", "callbacks", "verbose", "steps_per_epoch", "validation_steps")


class _TuningLogs(keras.callbacks.Callback):
    """Adds `examples_per_second` and `learning_rate` to the epoch logs.

    `examples_per_second` is Throughput's; in an epoch where Throughput logged none it
    is the whole epoch's rate instead, so an objective never sees a missing value.
    """

    def __init__(self, batch_size: int) -> None:
        super().__init__()
        self.batch_size = batch_size

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._clock = StepClock()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._clock.start_epoch()
        self._steps = 0
        self._start = time.perf_counter()
        self._end: float | None = None

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        wait_for(logs)
        self._end = time.perf_counter()
        self._steps += self._clock.advance(batch, logs, self.params)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is None:
            return
        rate = logs.get("examples_per_second")
        if (rate is None or not math.isfinite(rate)) and self._end and self._end > self._start:
            rate = self.batch_size * self._steps / (self._end - self._start)
        if rate is not None:
            logs["examples_per_second"] = float(rate)
        learning_rate = getattr(self.model.optimizer, "learning_rate", None)
        if learning_rate is not None and not callable(learning_rate):
            logs["learning_rate"] = float(keras.ops.convert_to_numpy(learning_rate))


class BatchSizeHyperModel(keras_tuner.HyperModel):
    """A keras-tuner HyperModel that tunes the batch size and scales the learning rate to it.

    `fit` picks `hp.Choice("batch_size", batch_sizes)`, batches the (unbatched) data
    itself, sets the learning rate to the user's own rate scaled to the batch (times
    `hp.Float("lr_factor", 0.25, 4, sampling="log")` with `tune_learning_rate`), adds
    `tfaccel.callbacks.Throughput` and returns the History, whose epochs carry
    `examples_per_second` and `learning_rate` — so
    `keras_tuner.Objective("examples_per_second", "max")` is a valid objective. A trial
    that runs out of memory raises `keras_tuner.errors.FailedTrialError` naming the batch
    size (the search goes on); memory is released before each model is built.

    The learning rate's rule is an `LRScaling` (`scaling=`), or its fields as keywords
    (`base_batch_size=64, lr_scaling="sqrt"`), each replacing the one in `scaling`.

    Args:
        build_model: `fn(hp)` returning a compiled or uncompiled `keras.Model`; it may
            define its own hyperparameters.
        batch_sizes: a list of global batch sizes, or "auto": powers of two from 16 up to
            `find_batch_size(...).max_batch_size` (probed once, in "power" mode and up to
            the number of training examples, on the first trial's data).
        scaling: the learning rate's rule (`LRScaling`: `base_batch_size`, default 32;
            `base_learning_rate`, default the rate of the optimizer `build_model(hp)`
            compiled with, or of `optimizer`; `lr_scaling`, default "auto": "sqrt" for
            adaptive optimizers, "linear" for SGD); None: the defaults.
        tune_learning_rate: also search a factor in [0.25, 4] on the scaled rate.
        trainer: train each trial with `tfaccel.Trainer` instead of `model.fit`.
        loss: loss for models that `build_model` returns uncompiled.
        optimizer: optimizer (name, instance, or class) for uncompiled models.
        metrics: metrics for uncompiled models.
        probe_kwargs: extra arguments for `find_batch_size` with `batch_sizes="auto"` (a
            `TuningJob`'s fields, e.g. `strategy`, or a `BatchSearch`'s, e.g. `start`).
        **kwargs: an `LRScaling`'s fields (`base_batch_size`, `base_learning_rate`,
            `lr_scaling`), and `keras_tuner.HyperModel`'s arguments (`name`, `tunable`).

    Raises:
        ValueError: an empty or non-positive `batch_sizes`, an unknown `lr_scaling`,
            or bad base values.
        TypeError: `scaling` is not an `LRScaling`, or a keyword that is neither an
            `LRScaling` field nor a `keras_tuner.HyperModel` argument.
    """

    def __init__(
        self,
        build_model: Callable,
        batch_sizes: Sequence[int] | str = "auto",
        *,
        scaling: LRScaling | None = None,
        tune_learning_rate: bool = False,
        trainer: bool = False,
        loss: Any = None,
        optimizer: Any = "adam",
        metrics: Sequence = (),
        probe_kwargs: dict | None = None,
        **kwargs: Any,
    ) -> None:
        if scaling is not None and not isinstance(scaling, LRScaling):
            raise TypeError(
                f"scaling must be a tfaccel.tuning.LRScaling, got {type(scaling).__name__}: "
                "e.g. scaling=LRScaling(base_batch_size=64, lr_scaling='sqrt'), or those "
                "fields as keywords."
            )
        fields = {name: kwargs.pop(name) for name in field_names(LRScaling) if name in kwargs}
        if scaling is None or fields:
            scaling = dataclasses.replace(scaling or LRScaling(), **fields)
        super().__init__(**kwargs)  # an unknown keyword is keras-tuner's TypeError
        if not callable(build_model):
            raise TypeError(
                f"build_model must be a function fn(hp) returning a keras.Model, got "
                f"{type(build_model).__name__}."
            )
        if batch_sizes != "auto":
            if isinstance(batch_sizes, (str, int)) or not list(batch_sizes):
                raise ValueError(
                    f"batch_sizes must be 'auto' or a non-empty list of integers, got "
                    f"{batch_sizes!r}."
                )
            batch_sizes = list(batch_sizes)
            bad = [b for b in batch_sizes if isinstance(b, bool) or not isinstance(b, int) or b < 1]
            if bad:
                raise ValueError(f"batch_sizes must be integers >= 1; bad values: {bad}.")
        self.build_model = build_model
        self.batch_sizes = batch_sizes
        self.scaling = scaling
        self.tune_learning_rate = bool(tune_learning_rate)
        self.trainer = bool(trainer)
        self.loss = loss
        self.optimizer = optimizer
        self.metrics = list(metrics or [])
        self.probe_kwargs = dict(probe_kwargs or {})
        self.probe_report: BatchSizeReport | None = None

    def learning_rate(self, batch_size: int, optimizer: Any = None) -> float:
        """The scaled learning rate for `batch_size` (before any tuned factor).

        `optimizer` (the trial model's) gives the base rate when the scaling's
        `base_learning_rate` is None, and the rule when its `lr_scaling` is "auto"; by
        default `self.optimizer`.
        """
        return self.scaling.learning_rate(
            batch_size, self.optimizer if optimizer is None else optimizer
        )

    def build(self, hp: keras_tuner.HyperParameters) -> keras.Model:
        # keras-tuner clears the session and collects garbage before each build.
        model = self.build_model(hp)
        if not isinstance(model, keras.Model):
            raise TypeError(
                f"build_model(hp) must return a keras.Model, got {type(model).__name__}."
            )
        return model

    def _compiled(self, model: keras.Model) -> keras.Model:
        if model.compiled:
            return model
        if self.loss is None:
            raise ValueError(
                "build_model(hp) returned an uncompiled model and BatchSizeHyperModel has no "
                "loss. Compile the model in build_model, or pass "
                "BatchSizeHyperModel(..., loss=..., optimizer=..., metrics=[...])."
            )
        optimizer = self.optimizer
        if isinstance(optimizer, type):
            optimizer = optimizer()
        elif isinstance(optimizer, keras.optimizers.Optimizer):
            optimizer = type(optimizer).from_config(optimizer.get_config())
        model.compile(optimizer=optimizer, loss=self.loss, metrics=self.metrics)
        return model

    def _auto_batch_sizes(self, hp, dataset: tf.data.Dataset, model: keras.Model) -> list[int]:
        if self.probe_report is None:
            defaults = keras_tuner.HyperParameters()
            defaults.values.update(hp.values)
            job = TuningJob(
                lambda: self.build_model(defaults),
                dataset,
                loss=model.loss,
                optimizer=model.optimizer,
            )
            # Only powers of two become choices, so "power" mode is enough.
            settings = {
                "limit": inputs.count_examples(dataset),
                "mode": "power",
                "noise_scale": False,  # only the largest fit is used here
                **self.probe_kwargs,  # a job's fields or a BatchSearch's
            }
            self.probe_report = find_batch_size(job, **settings)
        largest = self.probe_report.max_batch_size
        sizes = [2**k for k in range(4, int(math.log2(largest)) + 1)]
        return sizes or [2 ** int(math.log2(largest))]

    def fit(
        self,
        hp: keras_tuner.HyperParameters,
        model: keras.Model,
        x: Any = None,
        *args: Any,
        y: Any = None,
        validation_data: Any = None,
        **kwargs: Any,
    ) -> keras.callbacks.History:
        """Trains one trial at the chosen batch size; returns its `keras.callbacks.History`.

        Args:
            hp: the trial's `keras_tuner.HyperParameters`.
            model: the model `build` returned.
            x: an unbatched `tf.data.Dataset` of `(x, y)`, or input arrays (with `y`).
            y: labels when `x` holds arrays (keras-tuner passes them positionally too).
            validation_data: an unbatched dataset or an `(x_val, y_val)` tuple.
            **kwargs: `model.fit` arguments (`epochs`, `callbacks`, `verbose`, ...);
                `batch_size` is chosen here and may not be given.

        Raises:
            ValueError: a batched dataset, a `batch_size` argument, or a learning-rate
                schedule with `lr_scaling` set.
            keras_tuner.errors.FailedTrialError: the trial ran out of memory.
        """
        if args:
            if y is not None or len(args) > 1:
                raise TypeError("fit takes (x, y) positionally at most.")
            y = args[0]
        if "batch_size" in kwargs:
            raise ValueError(
                "BatchSizeHyperModel chooses the batch size itself; do not pass batch_size to "
                "tuner.search (list the candidates in BatchSizeHyperModel(batch_sizes=...))."
            )
        train = inputs.to_unbatched_dataset(x, y, what="the training data")
        val = None
        if validation_data is not None:
            val = inputs.to_unbatched_dataset(validation_data, what="validation_data")
        model = self._compiled(model)
        choices = self.batch_sizes
        if choices == "auto":
            choices = self._auto_batch_sizes(hp, train, model)
        batch_size = hp.Choice("batch_size", choices)
        if self.scaling.lr_scaling is not None or self.tune_learning_rate:
            self._check_settable(model)
            learning_rate = self.learning_rate(batch_size, model.optimizer)
            if self.tune_learning_rate:
                learning_rate *= hp.Float("lr_factor", 0.25, 4.0, sampling="log")
            model.optimizer.learning_rate = learning_rate

        examples = inputs.count_examples(train)
        throughput = Throughput(batch_size=batch_size, warmup_steps=1, verbose=0)
        extra = list(kwargs.pop("callbacks", None) or [])
        callbacks = [throughput, _TuningLogs(batch_size), *extra]
        shuffle = kwargs.pop("shuffle", True)
        train = train.shuffle(min(examples or 10_000, 10_000)) if shuffle else train
        train = train.batch(batch_size).prefetch(tf.data.AUTOTUNE)
        if val is not None:
            val = val.batch(batch_size).prefetch(tf.data.AUTOTUNE)

        failure = None
        try:
            if self.trainer:
                return self._trainer_fit(model, train, val, callbacks, kwargs)
            # Shuffled above: model.fit's default shuffle=True would only warn it is ignored.
            return model.fit(
                train, validation_data=val, callbacks=callbacks, shuffle=False, **kwargs
            )
        except Exception as error:  # noqa: BLE001 - only out-of-memory is caught
            if not is_out_of_memory(error):
                raise
            failure = describe_out_of_memory(error)
        del model, train, val, callbacks, throughput  # the trial's memory, released below
        release_memory()
        raise keras_tuner.errors.FailedTrialError(
            f"batch_size={batch_size} ran out of memory ({failure}); trial skipped, the "
            "search goes on. Use smaller batch_sizes to avoid it."
        )

    @staticmethod
    def _check_settable(model: keras.Model) -> None:
        optimizer = model.optimizer
        if isinstance(optimizer.learning_rate, keras.optimizers.schedules.LearningRateSchedule) or (
            callable(getattr(optimizer, "_learning_rate", None))
        ):
            raise ValueError(
                "The model's optimizer uses a learning-rate schedule, which BatchSizeHyperModel "
                "cannot scale to the batch size. Compile with a float learning rate, or pass "
                "lr_scaling=None and tune_learning_rate=False."
            )

    def _trainer_fit(self, model, train, val, callbacks, kwargs):
        from tfaccel.train import Trainer

        unknown = sorted(set(kwargs) - set(_TRAINER_FIT_ARGS))
        if unknown:
            raise ValueError(
                f"With trainer=True, fit takes {list(_TRAINER_FIT_ARGS)} and validation_data; "
                f"got {unknown}. Drop them from tuner.search(...), or use trainer=False."
            )
        config = model.get_compile_config() or {}
        loss = self.loss or keras.losses.get(config.get("loss"))
        metrics = self.metrics or [
            m if isinstance(m, str) else keras.metrics.get(m) for m in config.get("metrics") or []
        ]
        trainer = Trainer(
            model,
            optimizer=model.optimizer,
            loss=loss,
            metrics=metrics,
            strategy=tf.distribute.get_strategy(),
        )
        return trainer.fit(train, validation_data=val, callbacks=callbacks, **kwargs)
