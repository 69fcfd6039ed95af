"""What every speed-up method is, and the job and plan it is applied to.

A method is a small object with a `name`, a sentence `changes` saying what it changes
(the loss, the labels, the weights used for evaluation, the learning rate, ...), a
`check(job)` that refuses bad input before step 1, and an `apply(plan)` that adds its
part to the plan: a batch map, a loss change, an optimizer change, a callback. The plan
is what `tfaccel.methods.for_fit` returns and what the Trainer applies.

Example:
    >>> job = Job(model, loss="sparse_categorical_crossentropy", optimizer="adam",
    ...           element_spec=ds.element_spec, epochs=5, steps_per_epoch=40)  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import keras
import tensorflow as tf

from tfaccel.data import iterators
from tfaccel.methods import labels
from tfaccel.methods.batch_maps import BatchMap, MapFn, transform

# The settings table's row for `for_fit`'s datasets (see `tfaccel.data.iterators`).
FREED_NOTE = (
    "the iterators model.fit drops each epoch are freed off its thread (no wait on "
    "tf.data's autotuner); data unchanged"
)
# The settings table's row when for_fit made the labels one-hot.
ONE_HOT_NOTE = (
    "class ids made one-hot for the soft targets: pass validation_data="
    "plan.evaluation_data(val) (and plan.evaluation_data(data) to evaluate)"
)


@dataclasses.dataclass
class Job:
    """What a method needs to know of the training job (read, never changed).

    Attributes:
        model: the Keras model trained.
        loss: the loss as the user gives it (a name or a `keras.losses.Loss`).
        optimizer: the optimizer (an object, not yet built).
        element_spec: the batched dataset's element spec, `(x, y[, sample_weight])`.
        epochs: epochs of the job.
        steps_per_epoch: optimizer steps per epoch.
        batch_size: the global batch (None when unknown).
        epoch_steps: each epoch's optimizer steps when they differ (a progressive batch
            makes fewer, larger steps); None: `steps_per_epoch` each.
        batch_fixed: the job keeps one batch throughout: `ProgressiveBatch` is refused
            ("fast" drops it). The Trainer sets it with `accumulate_steps`, several
            input pipelines or a dataset function on several replicas; otherwise it
            grows the batch (`train.setup.methods_setup.regroupable`).
    """

    model: keras.Model
    loss: Any
    optimizer: Any
    element_spec: tuple
    epochs: int
    steps_per_epoch: int
    batch_size: int | None = None
    epoch_steps: tuple[int, ...] | None = None
    batch_fixed: bool = False

    @property
    def total_steps(self) -> int:
        """Optimizer steps of the whole job."""
        return self.steps_before(self.epochs)

    def steps_before(self, epoch: int) -> int:
        """Optimizer steps of the epochs before `epoch` (0-based)."""
        if self.epoch_steps is None:
            return epoch * self.steps_per_epoch
        return sum(self.epoch_steps[:epoch])

    @property
    def feature_spec(self) -> Any:
        """The spec of a batch's features."""
        return self.element_spec[0]

    @property
    def label_spec(self) -> Any:
        """The spec of a batch's labels."""
        return self.element_spec[1]

    @property
    def loss_info(self) -> labels.LossInfo:
        """The loss's kind, `from_logits` and smoothing (`labels.loss_info`)."""
        return labels.loss_info(self.loss)


class MethodPlan:
    """What to pass to `model.compile` / `model.fit` after the methods are applied.

    Attributes:
        job: the job the plan was made for.
        loss: the loss to compile with (categorical when labels were made one-hot).
        optimizer: the optimizer to compile with (schedule, EMA).
        callbacks: callbacks to add to `fit`.
        maps: the batch maps the dataset gets (`transform` applies them).
        methods: the methods applied, in order.
        dropped: `(name, why)` for what was left out: a method by the composition rules
            or its check (with "fast"), the optimizer's own schedule replaced by one of
            the methods; each is warned (`plan_for`).
        chosen: why these methods, for `methods="fast"` or `"auto"` (None when the user
            listed them).
        chooser: which of the two chose them: "fast" or "auto" (the table's row).
        one_hot: whether sparse labels are turned into one-hot targets.
        smoothing: the label smoothing of the categorical loss.
    """

    def __init__(self, job: Job):
        self.job = job
        self.loss = job.loss
        self.optimizer = job.optimizer
        self.callbacks: list[keras.callbacks.Callback] = []
        self.maps: list[BatchMap] = []
        # dataset -> dataset, before the maps (progressive batch)
        self.regroups: list[Callable[[tf.data.Dataset], tf.data.Dataset]] = []
        self.finishers: list[Callable[[MethodPlan], None]] = []  # once every method is applied
        self.methods: list[Method] = []
        self.dropped: list[tuple[str, str]] = []
        self.chosen: str | None = None
        self.chooser = "fast"
        self.one_hot = False
        self.smoothing = 0.0
        self.seed = 0  # the batch maps' seed (`plan_for` sets it)
        self.dataset: Any = None  # the transformed training data (for_fit's)
        self.freed = False  # for_fit's: the datasets' iterators are freed in the background

    def add_map(self, name: str, fn: MapFn, order: int, reads_state: bool = False) -> None:
        """Adds a batch map `fn(x, y, seed) -> (x, y)` (`reads_state`: it reads a variable
        a callback sets, so it runs when the batch is asked for)."""
        self.maps.append(BatchMap(name, fn, order, reads_state))

    def evaluation_data(self, data: Any) -> Any:
        """Validation or evaluation data with its labels in the training form (one-hot
        when the plan made the training labels one-hot); for `for_fit`'s plan a dataset
        also frees its iterators in the background. Its elements change no further."""
        maps = [m for m in self.maps if m.order == 1]
        data = transform(data, maps, 0) if maps else data
        freed = self.freed and isinstance(data, tf.data.Dataset)
        return iterators.freed_in_background(data) if freed else data

    def rebuild_optimizer(self, **changes: Any) -> None:
        """Replaces the optimizer by a copy of it with `changes` to its config."""
        self.optimizer = rebuilt(self.optimizer, **changes)

    def table(self) -> list[tuple[str, str]]:
        """`("fast" or "auto", why)` when either chose, `(method, what it changes)` rows, then
        `(method, "dropped: why")` rows; for `for_fit`'s plan, a "labels" row when they
        were made one-hot (validate on `evaluation_data`) and the "input" row."""
        rows = [(self.chooser, self.chosen)] if self.chosen else []
        rows += [(m.name, m.changes) for m in self.methods]
        rows += [(name, f"dropped: {why}") for name, why in self.dropped]
        if self.one_hot and self.dataset is not None:  # for_fit's: model.fit takes val as is
            rows.append(("labels", ONE_HOT_NOTE))
        return rows + [("input", FREED_NOTE)] if self.freed else rows

    def describe(self) -> str:
        """The table as text, one method a line."""
        width = max((len(name) for name, _ in self.table()), default=0)
        return "\n".join(f"{name:<{width}}  {text}" for name, text in self.table())


Plan = MethodPlan
"""The old name of `MethodPlan` (the same class), kept so that code naming it still works."""


@dataclasses.dataclass(frozen=True)
class Card:
    """A method's card: what it changes, when it helps, what it measured, where it hurts.

    Each method class carries one (`Method.card`); the docs' card table (the how-to
    "Train to accuracy sooner") is generated from them by `python -m
    tfaccel.methods.cards`, and a test fails when the page and the cards differ. The
    figures are those of the benchmark results the card names; a method without a
    measurement says "not measured here".

    Attributes:
        changes: what of the training it changes.
        helps: when it helps.
        hurts: where it hurts, and what it costs.
        measured: what it measured here, with the figures.
        defaults: what set its defaults (a benchmark result, a paper, a convention).
        measured_as: the setting measured (e.g. "EMA(0.9)"); None: not measured.
        contender: its name among the contenders of `results`' first file, if it is one.
        results: the files in `benchmarks/results/` the figures come from.
    """

    changes: str
    helps: str
    hurts: str
    measured: str
    defaults: str
    measured_as: str | None = None
    contender: str | None = None
    results: tuple[str, ...] = ()


class Method:
    """Base of the speed-up methods: override `check` and `apply`.

    Attributes:
        name: the method's name in the settings table.
        changes: one sentence: what of the training it changes.
        kinds: job kinds it applies to ("image", "sequence", "tabular").
        stateful: how its state survives a resume (None: it has none).
        card: the method's `Card` (the docs' card table is made from it).
    """

    name = "method"
    kinds: tuple[str, ...] = ("image", "sequence", "tabular")
    stateful: str | None = None
    card: ClassVar[Card | None] = None

    @property
    def changes(self) -> str:
        """One sentence: what this method changes (the settings table shows it)."""
        return ""

    def check(self, job: Job) -> None:
        """Raises ValueError or TypeError when the method cannot apply to `job`."""

    def apply(self, plan: MethodPlan) -> None:
        """Adds this method's part (maps, loss, optimizer, callbacks) to `plan`."""
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


def staged(values: tuple[int, ...], epoch: int, epochs: int, until: float) -> int:
    """The value of `epoch` when `values` are stages sharing the first `until` of
    `epochs` equally, the last held after them (progressive resizing and batch)."""
    last = len(values) - 1
    if not last:
        return values[-1]
    return values[min(int(epoch / (until * epochs) * last), last)]


def optimizer_object(optimizer: Any) -> keras.optimizers.Optimizer:
    """The optimizer as an object: a name or config gets `keras.optimizers.get`."""
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return optimizer
    if isinstance(optimizer, (str, dict)):
        return keras.optimizers.get(optimizer)
    raise TypeError(
        f"The methods need a Keras optimizer object or name, got {type(optimizer).__name__}. "
        "Pass e.g. keras.optimizers.Adam(1e-3)."
    )


def rebuilt(optimizer: Any, **changes: Any) -> keras.optimizers.Optimizer:
    """A copy of `optimizer` (not yet built) with `changes` to its config.

    An optimizer built but never stepped (`iterations` 0: e.g. the doctor or a tuner
    probed the Trainer before its first `fit` and restored its state) holds nothing the
    copy loses.

    Raises:
        ValueError: the optimizer has taken steps (its state would be lost).
    """
    optimizer = optimizer_object(optimizer)
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None:
        raise TypeError(
            "The methods change the optimizer before loss scaling wraps it: pass the inner "
            "optimizer (the Trainer wraps it for float16 itself)."
        )
    if optimizer.built and int(optimizer.iterations) > 0:  # 0: built by a probe, restored
        raise ValueError(
            f"{type(optimizer).__name__} is built already (it has trained, or "
            "model.compile/fit built it): the methods change the learning rate and the "
            "averaging before the first step. Pass a fresh optimizer."
        )
    config = optimizer.get_config()
    schedule = schedule_of(optimizer)
    if schedule is not None:  # itself, not a copy: its variables are the ones its callback sets
        config["learning_rate"] = schedule
    config.update(changes)
    # `__class__`: the optimizer's own class while a fit lets callbacks set its rate
    # (`schedules.ComposedRate`).
    return optimizer.__class__.from_config(config)


def schedule_of(optimizer: Any) -> keras.optimizers.schedules.LearningRateSchedule | None:
    """The learning-rate schedule object `optimizer` holds (through loss scaling), or None."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    rate = getattr(inner, "_learning_rate", None)  # where Keras keeps it
    return rate if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule) else None


def learning_rate_of(optimizer: Any) -> float:
    """The optimizer's base learning rate as a float (a schedule's rate at step 0)."""
    rate = optimizer_object(optimizer).get_config()["learning_rate"]
    if isinstance(rate, dict):  # a serialized schedule
        schedule = keras.optimizers.schedules.deserialize(rate)
        return float(keras.ops.convert_to_numpy(schedule(0)))
    return float(rate)
