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
block variables, saved with the model; the progressive batch's stage is a function of the
epoch, and its data position is counted in start batches (`state.batch_stages`, which
regroups the fit loop's stream: each epoch's batches grown by its stage's factor).

`methods="auto"` probes its candidate stacks on the Trainer's own model (cloned) and
training data (`methods.adaptive.auto`, the rules `for_fit` follows, seed 0): on a job long
enough to pay, once the data passed `Trainer.feed`'s checks (elements, length, batch,
labels); a shorter job declines at once, reading nothing. The probes run inside the first
`fit` (their seconds count in its time) and leave the model and the optimizer untouched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import keras
import tensorflow as tf

from tfaccel import methods as methods_lib
from tfaccel.data.assembly.feed import Feed
from tfaccel.methods.adaptive import auto
from tfaccel.methods.base import MethodPlan
from tfaccel.methods.batch_growth import BatchNormFollowsBatch, ProgressiveBatch
from tfaccel.methods.batch_maps import transform
from tfaccel.methods.composition import MethodsArg
from tfaccel.methods.fitting import categorical_metric
from tfaccel.methods.freezing import FreezeEarlyLayers
from tfaccel.train.state.batch_stages import BatchStages
from tfaccel.train.step import accumulation
from tfaccel.train.step.losses import PerExampleLoss


def no_methods(methods: object) -> bool:
    """Whether `methods=` asks for none: None, "none" or an empty list or tuple."""
    empty = isinstance(methods, list | tuple) and not methods
    return methods is None or methods == "none" or empty


def check_argument(methods: MethodsArg) -> MethodsArg:
    """Returns `methods` (None when there are none: None, "none" or an empty list), or
    raises as `tfaccel.methods.resolve` does for an unknown name or an entry that is not a
    method."""
    if no_methods(methods):
        return None
    methods_lib.resolve(methods, kind="image")  # the kind is read at fit; names now
    return methods


@dataclasses.dataclass(frozen=True)
class Ingredients:
    """What the methods read of the Trainer's job, and what they may replace before step 1
    (the loss, the metrics, the optimizer as given, before loss scaling wraps it).

    Attributes:
        model: the model trained.
        loss: the per-example loss (`losses.PerExampleLoss`; None: the model's own steps).
        metrics: the metric objects.
        optimizer: the optimizer the runner is made with (unwrapped).
        strategy: the strategy the metrics are made under.
        accumulate_steps: batches per optimizer step (schedules count optimizer steps).
        check: the Trainer's input checks (`Trainer.feed`: `check(feed, steps=...,
            build=False)`), run before "auto" probes the training data.
    """

    model: keras.Model
    loss: PerExampleLoss | None
    metrics: list[keras.metrics.Metric]
    optimizer: keras.optimizers.Optimizer
    strategy: tf.distribute.Strategy
    accumulate_steps: int = 1
    check: Callable[..., Any] | None = None


def plan(
    methods: MethodsArg,
    given: Ingredients,
    train: Feed,
    steps_per_epoch: int | None,
    epochs: int,
) -> tuple[MethodPlan, Ingredients]:
    """Checks and applies `methods` to the job of a Trainer's first `fit`; returns the
    `tfaccel.methods.Plan` and the ingredients it made (its loss, metrics, optimizer).

    Raises:
        ValueError, TypeError: a method that cannot apply (its `check`), before step 1.
    """
    steps = steps_per_epoch if steps_per_epoch is not None else train.steps
    if steps is None or steps < 1:
        raise ValueError(
            "methods= sizes schedules to the job: pass steps_per_epoch= for data of "
            "unknown or infinite length."
        )
    # Methods change the Trainer's own step, which has a loss (`model_steps` refuses them).
    assert given.loss is not None, "methods= needs the Trainer's own step and its loss"
    job = methods_lib.Job(
        given.model,
        given.loss.fn,
        given.optimizer,
        train.element_spec,
        epochs,
        accumulation.applied_steps(int(steps), given.accumulate_steps),  # optimizer steps
        train.global_batch,
        batch_fixed=not regroupable(train, given),
    )
    loss, metrics = given.loss, given.metrics
    data = probed(job, train, given, steps_per_epoch) if methods == "auto" else None
    with given.strategy.scope():
        made = methods_lib.plan_for(methods, job, data=data)
        if made.loss is not given.loss.fn:
            loss = PerExampleLoss(made.loss, weight=given.loss.weight)
            loss.sums = given.loss.sums  # the user's reduction (its per-example copy has none)
        if made.one_hot:
            metrics = [categorical(m) for m in metrics]
    return made, dataclasses.replace(given, loss=loss, metrics=metrics, optimizer=made.optimizer)


def probed(job: methods_lib.Job, train: Feed, given: Ingredients, steps: int | None) -> Any:
    """What `methods="auto"` probes on: the training data as given (a batched dataset; a
    dataset function, which the probes decline), checked first as `Trainer.feed` checks it
    when the job is long enough to probe (a shorter one declines at once, nothing read).

    Raises:
        ValueError, TypeError: the input checks `Trainer.fit` documents.
    """
    data = train.data if train.is_function else train.dataset
    if auto.probe_steps(job) >= auto.MIN_PROBE_STEPS and given.check is not None:
        given.check(train, steps=steps, build=False)  # the labels' check is then remembered
    return data


def regroupable(train: Feed, given: Ingredients) -> bool:
    """Whether the Trainer can grow this job's batch (`methods.ProgressiveBatch`): one
    optimizer step a batch (no `accumulate_steps`), and batches of the global batch (a
    dataset, or a dataset function whose pipelines each feed one replica)."""
    one_replica = given.strategy.num_replicas_in_sync == 1
    whole = train.pipelines == 1 and (one_replica or not train.is_function)
    return given.accumulate_steps == 1 and whole


class Scheduled(Protocol):
    """What `Methods.apply` sets of the fit's schedule (`fit_loop.Schedule`)."""

    epochs: int
    steps_per_epoch: int | None
    stages: BatchStages | None


def categorical(metric: keras.metrics.Metric) -> keras.metrics.Metric:
    """A sparse metric as its categorical twin (labels are one-hot now), `for_fit`'s
    mapping (`fitting.categorical_metric`: its name and settings kept), weighted or not
    as it was; any other metric itself. A Keras sparse function the Trainer wrapped
    (`metrics=[keras.metrics.sparse_categorical_accuracy]`) is mapped as `for_fit` maps it."""
    source = metric  # a function `losses.resolve_metrics` wrapped, without arguments:
    if type(metric) is keras.metrics.MeanMetricWrapper and getattr(metric, "_fn_kwargs", 0) == {}:
        source = getattr(metric, "_fn", metric)
    made = categorical_metric(source)
    if made is source:
        return metric
    if made.name != metric.name:
        made = type(made)(**{**made.get_config(), "name": metric.name})
    made.tfaccel_weighted = getattr(metric, "tfaccel_weighted", False)
    return made


class Methods:
    """The Trainer's `methods=`: the argument, and the plan its first `fit` made.

    Attributes:
        argument: what `methods=` was (None when no method).
        plan: the applied `tfaccel.methods.Plan` (None before the first `fit`).
    """

    def __init__(self, argument: MethodsArg) -> None:
        self.argument = check_argument(argument)
        self.plan: MethodPlan | None = None
        self.stages: BatchStages | None = None  # the last fit's progressive batch

    def plan_once(
        self, given: Ingredients, train: Feed, steps_per_epoch: int | None, epochs: int
    ) -> Ingredients | None:
        """At the first fit: plans; returns the plan's loss, metrics and optimizer, with
        which the Trainer makes its runner anew (before any step). None at later fits,
        without methods, and when none applied ("fast" on a short table: the runner stands,
        its loss and metrics unchanged)."""
        if self.argument is None or self.plan is not None:
            return None
        self.plan, made = plan(self.argument, given, train, steps_per_epoch, epochs)
        return made if self.plan.methods else None

    def apply(
        self,
        train: Feed,
        callbacks: list[keras.callbacks.Callback],
        retrace: Callable[[], None],
        schedule: Scheduled | None = None,
    ) -> tuple[Feed, list[keras.callbacks.Callback]]:
        """Every fit: the training feed with the plan's batch maps, and the callbacks with
        the plan's (a freezing callback retraces the step loops with `retrace`; BatchNorm's
        momentum callback comes first, so a user's `ModelCheckpoint` saves the user's
        momentum at an epoch's end); with the
        progressive batch, `schedule.stages` (the loop regroups its stream, then maps it).
        Returns (feed, callbacks)."""
        made = self.plan
        if self.argument is None or made is None:
            return train, callbacks
        for callback in made.callbacks:
            if isinstance(callback, FreezeEarlyLayers):
                callback.retrace = retrace
        source = train
        if made.maps:
            train = train.mapped(lambda dataset: transform(dataset, made.maps, made.seed))
        if schedule is not None:
            schedule.stages = self.stages = _stages(made, source, schedule)
        first = [c for c in made.callbacks if isinstance(c, BatchNormFollowsBatch)]
        rest = [c for c in made.callbacks if c not in first]
        return train, [*first, *callbacks, *rest]

    def feed(self, data: Any, strategy: tf.distribute.Strategy, what: str) -> Feed:
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

    def rows(self) -> dict[str, str]:
        """Settings-table rows: each method applied and what it changes; each dropped; the
        batch stages (each stage's batch, epochs and steps, and the step loop's traces)."""
        if self.plan is None:
            return {}
        rows = {f"method: {name}": text for name, text in self.plan.table()}
        if self.stages is not None:
            rows["batch_stages"] = self.stages.describe()
        return rows


def _stages(made: MethodPlan, source: Feed, schedule: Scheduled) -> BatchStages | None:
    """The fit's batch stages when the plan grows the batch (`ProgressiveBatch`): each
    epoch's factor as the method's callback sets it, over `source` (the feed before the
    plan's maps, which follow the regrouping as in `methods.for_fit`)."""
    grown = [m for m in made.methods if isinstance(m, ProgressiveBatch)]
    if not grown or grown[0].callback is None:
        return None
    steps = schedule.steps_per_epoch or source.steps
    batch = source.global_batch
    assert steps > 0 and batch, "the plan checked a known batch and length"
    stage = grown[0].callback.factor_at
    factors = tuple(stage(epoch) for epoch in range(max(schedule.epochs, 1)))
    then = None
    if made.maps:
        then = lambda dataset: transform(dataset, made.maps, made.seed)  # noqa: E731
    return BatchStages(factors, steps, batch, then=then, source=source)
