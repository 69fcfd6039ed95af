"""`Trainer(..., methods=...)`: the speed-up methods applied to the Trainer's job.

At the first `fit`, before any step, the methods (`tfaccel.methods`) are checked against
the job (the model, the loss, the optimizer, the training feed's batches, `epochs` x the
steps per epoch) and applied: the optimizer the runner is made with (schedule, EMA), the
loss (categorical when labels become one-hot), the training feed's batch maps (also on
the probe the label checks read), validation data with one-hot labels when training's
are, and callbacks (EMA's swap, freezing, resizing). Later `fit` calls keep the plan and
map their data the same way; a schedule gets a new cycle sized to each later `fit`'s
epochs x steps (`methods.schedules.FitClock`), never the end of the first one's.

State on resume: EMA's averages are optimizer state, saved with it; the schedule's
position is the fit's epoch and step (read on the optimizer's restored step count);
freezing and resizing stages are functions of the epoch; stochastic depth's seeds are
block variables, saved with the model.
"""

from __future__ import annotations

import keras

from tfaccel import methods as methods_lib
from tfaccel.data.assembly.feed import Feed
from tfaccel.methods.batch_maps import transform
from tfaccel.methods.freezing import FreezeEarlyLayers
from tfaccel.train.step import accumulation
from tfaccel.train.step.losses import PerExampleLoss

_TO_CATEGORICAL = {
    keras.metrics.SparseCategoricalAccuracy: keras.metrics.CategoricalAccuracy,
    keras.metrics.SparseTopKCategoricalAccuracy: keras.metrics.TopKCategoricalAccuracy,
}


def check_argument(methods):
    """Returns `methods` (None when there are none), or raises as `tfaccel.methods.resolve`
    does for an unknown name or an entry that is not a method."""
    if methods is None or methods == "none":
        return None
    methods_lib.resolve(methods, kind="image")  # the kind is read at fit; names now
    return methods


def plan(trainer, methods, optimizer, train: Feed, steps_per_epoch, epochs: int):
    """Checks and applies `methods` to the job of `trainer`'s first `fit`: sets its loss
    and metrics; returns the `tfaccel.methods.Plan` (whose `.optimizer` the runner is to
    be made with).

    Raises:
        ValueError, TypeError: a method that cannot apply (its `check`), before step 1.
    """
    steps = steps_per_epoch if steps_per_epoch is not None else train.steps
    if steps is None or steps < 1:
        raise ValueError(
            "methods= sizes schedules to the job: pass steps_per_epoch= for data of "
            "unknown or infinite length."
        )
    job = methods_lib.Job(
        trainer.model,
        trainer.loss.fn,
        optimizer,
        train.element_spec,
        epochs,
        accumulation.applied_steps(int(steps), trainer.accumulate_steps),  # optimizer steps
        train.global_batch,
        batch_fixed=True,
    )
    with trainer.strategy.scope():
        made = methods_lib.plan_for(methods, job)
        if made.loss is not trainer.loss.fn:
            given = trainer.loss
            trainer.loss = PerExampleLoss(made.loss, weight=given.weight)
            trainer.loss.sums = given.sums  # the user's reduction (its per-example copy has none)
        if made.one_hot:
            trainer.metrics = [_categorical(m) for m in trainer.metrics]
    return made


def _categorical(metric):
    """A sparse accuracy metric as its categorical twin (labels are one-hot now)."""
    twin = _TO_CATEGORICAL.get(type(metric))
    if twin is None:
        return metric
    copy = twin(name=metric.name)
    copy.tfaccel_weighted = getattr(metric, "tfaccel_weighted", False)
    return copy


class Methods:
    """The Trainer's `methods=`: the argument, and the plan its first `fit` made.

    Attributes:
        argument: what `methods=` was (None when no method).
        plan: the applied `tfaccel.methods.Plan` (None before the first `fit`).
    """

    def __init__(self, argument):
        self.argument = check_argument(argument)
        self.plan = None

    def apply(self, trainer, train: Feed, callbacks: list, steps_per_epoch, epochs: int):
        """At the first fit: plans, and makes the runner anew around the plan's optimizer
        and loss (before any step; kept when no method applies). Every fit: the training
        feed with the plan's batch maps, and the callbacks with the plan's. Returns (feed,
        callbacks)."""
        if self.argument is None:
            return train, callbacks
        if self.plan is None:
            optimizer = trainer._given_optimizer
            self.plan = plan(trainer, self.argument, optimizer, train, steps_per_epoch, epochs)
            if self.plan.methods:  # none applied ("fast" on a short table): the runner stands
                trainer._given_optimizer = self.plan.optimizer
                trainer._make_runner(trainer.model.dtype_policy.name)
        made = self.plan
        for callback in made.callbacks:
            if isinstance(callback, FreezeEarlyLayers):
                callback.retrace = trainer.runner.retrace
        if made.maps:
            train = train.mapped(lambda dataset: transform(dataset, made.maps, made.seed))
        return train, [*callbacks, *made.callbacks]

    def feed(self, data, strategy, what: str) -> Feed:
        """`data` as a `Feed` (a Feed stays itself); validation and evaluation data get
        their labels in the training form (one-hot when the plan made training's one-hot);
        training data given as such (the doctor's), the plan's batch maps, as `fit` maps
        its feed (a Feed `fit` made and mapped is not mapped again)."""
        feed = Feed.of(data, strategy, what=what)
        made = self.plan
        if made is None:
            return feed
        if what == "training":
            if isinstance(data, Feed) or not made.maps:
                return feed
            return feed.mapped(lambda dataset: transform(dataset, made.maps, made.seed))
        return feed.mapped(made.evaluation_data) if made.one_hot else feed

    def rows(self) -> dict:
        """Settings-table rows: each method applied and what it changes; each dropped."""
        if self.plan is None:
            return {}
        return {f"method: {name}": text for name, text in self.plan.table()}
