"""Progressive batch: small batches while the gradient is clear, larger ones as it gets noisy.

Early in training the gradient noise scale (McCandlish et al. 2018) is small: a small
batch makes as much progress per example as a large one, and more per second of a
shared budget of examples. It grows as the loss falls, and a batch below it then wastes
steps. `ProgressiveBatch` starts at the job's batch and doubles it in stages over the
first `until` of the declared epochs (or the first `ramp_epochs` epochs counted from the
start, which a generous declaration does not move), up to `final`: a batch size, or the
noise scale the batch tuner reads (`tuning.gradient_noise_scale`, or a `find_batch_size`
report's `noise_scale`), rounded to a power-of-two multiple of the start. On a CPU or a GPU with
room, each larger stage also runs faster per example (fewer, larger steps).

The data are regrouped, not re-read: each epoch's batches of the start size are unbatched
and batched again at the stage's size (the same examples, in the same shuffled order).
The stage is a function of the epoch (a resumed `model.fit` regroups alike). Schedules
(`OneCycle`, `WarmupCosine`) are sized to the steps the stages make (each stage's partial
last batch counted) and follow the epoch's position: `model.fit` counts one optimizer
step more at the end of each epoch of unknown length (its last call finds no batch, yet
the step counter moves), which the cycle does not see. The learning
rate (constant or scheduled) is multiplied by `growth ** rate_power` in each stage: the
square-root rule adaptive optimizers (Adam) follow when the batch grows (`rate_power=1`
for SGD's linear rule, 0 to leave the rate alone). Each epoch's logs carry `batch_size`, the
stage's global batch (in the History, and in `TensorBoard` as `epoch_batch_size` when it
follows `plan.callbacks`); without the method the key is absent, as in `model.fit`.

In the Trainer (`tfaccel.train.state.batch_stages`) each epoch's batches are regrouped
alike in its input stream (the stage a function of the epoch, the step loop traced once
for all stages) and a resume stays exact: the checkpoint records the stage and the
batches read. It needs one optimizer step a batch (no `accumulate_steps`) and global
batches (a `job.batch_fixed` job refuses it; `"fast"` drops it there, saying so).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
import weakref
from typing import Any, cast

import keras
import tensorflow as tf

from tfaccel.methods.base import Card, Job, Method, MethodPlan, schedule_of, staged

MAX_GROWTH = 64  # the final batch is at most this many times the start


@keras.saving.register_keras_serializable("tfaccel")
class ScaledByGrowth(keras.optimizers.schedules.LearningRateSchedule):
    """A learning rate (a float or a schedule) times `growth ** power`, `growth` the
    progressive batch's current factor (a variable its callback sets; 1 when restored
    from a config, where the batch no longer grows)."""

    def __init__(
        self,
        rate: float | keras.optimizers.schedules.LearningRateSchedule,
        power: float = 0.5,
        growth: tf.Variable | None = None,
    ):
        self.rate, self.power, self.growth = rate, float(power), growth

    def __call__(self, step: Any) -> Any:
        base = self.rate(step) if callable(self.rate) else self.rate
        if self.growth is None:
            return base
        return base * tf.cast(self.growth, tf.float32) ** self.power

    def get_config(self) -> dict:
        rate = self.rate
        if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
            rate = keras.optimizers.schedules.serialize(rate)
        return {"rate": rate, "power": self.power}

    @classmethod
    def from_config(cls, config: dict) -> ScaledByGrowth:
        rate = config["rate"]
        if isinstance(rate, dict):
            rate = keras.optimizers.schedules.deserialize(rate)
        return cls(rate, config["power"])


def _pow2_growth(target: float, start: int) -> int:
    """The power-of-two multiple of `start` nearest `target` (1 .. MAX_GROWTH)."""
    if not math.isfinite(target) or target <= start:
        return 1 if target <= start else MAX_GROWTH
    return int(min(MAX_GROWTH, 2 ** round(math.log2(target / start))))


class SetBatchGrowth(keras.callbacks.Callback):
    """Sets the regrouping factor at each epoch's start: `factors[stage(epoch)]`; each
    epoch's logs get `batch_size`, the stage's global batch (`factor × batch`), so the
    History and a `TensorBoard` after it in the callbacks (`epoch_batch_size`) show it.

    An epoch of larger batches has fewer steps than Keras counted in the first (the data's
    length is unknown to it): `model.fit` ends that epoch at the data's end, as it should,
    and would warn that the input "ran out of data"; that warning is silenced during `fit`.
    """

    batch = 0  # the start batch, set by the method (0: no `batch_size` in the logs)

    def __init__(self, variable: tf.Variable, factors: tuple[int, ...], epochs: int, until: float):
        super().__init__()
        self.variable, self.factors, self.epochs, self.until = variable, factors, epochs, until
        self.seen: list[int] = []
        self._warnings: warnings.catch_warnings | None = None

    def factor_at(self, epoch: int) -> int:
        """The growth of `epoch`: the stages share the first `until` of `epochs`."""
        return staged(self.factors, epoch, self.epochs, self.until)

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.filterwarnings("ignore", message="Your input ran out of data")

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._warnings is not None:
            self._warnings.__exit__(None, None, None)
            self._warnings = None

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        factor = self.factor_at(epoch)
        self.variable.assign(factor)
        self.seen.append(factor)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None and self.batch:  # the Trainer's loop may have set it already
            logs.setdefault("batch_size", self.factor_at(epoch) * self.batch)


# A layer whose momentum a plan changed -> the user's momentum (a later plan of the same
# model, made before the first one's fit gave it back, reads the user's, not m ** growth).
_USERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def batch_norm_layers(model: keras.Model) -> list[keras.layers.BatchNormalization]:
    """The model's `BatchNormalization` layers, nested models included."""
    return [
        layer
        for layer in model._flatten_layers(include_self=False)
        if isinstance(layer, keras.layers.BatchNormalization)
    ]


class BatchNormFollowsBatch(keras.callbacks.Callback):
    """Each `BatchNormalization` layer's momentum `m` as `m ** growth` while the batch grows.

    A batch `growth` times larger makes `growth` times fewer steps an epoch, and each
    step's statistics average `growth` times more examples: at `m ** growth` the moving
    mean and variance forget at the same rate per example in the last stage as the
    user's momentum did at the start batch (at `m` they would lag the weights by `growth`
    times as many epochs, and validation reads stale statistics). Earlier stages follow
    the weights sooner, when they move fastest. Set when the method applies, before any
    step is traced, and again at each epoch's start; the user's momentum is back at each
    epoch's end (the traced step keeps `m ** growth`), so a `ModelCheckpoint` after this
    callback saves the user's config, and at the `fit`'s end, where `model.fit`'s training
    function is made anew for a later `fit` (the Trainer applies this callback at each of
    its fits, so its step loops keep `m ** growth` and are not traced again).
    """

    def __init__(self, layers: list[keras.layers.BatchNormalization], growth: int):
        super().__init__()
        self.layers, self.growth = layers, int(growth)
        users = [float(_USERS.get(layer, layer.momentum)) for layer in layers]
        self.momenta = {id(layer): m for layer, m in zip(layers, users, strict=True)}
        self.named = {layer.name: m for layer, m in zip(layers, users, strict=True)}  # copies

    def _known(self) -> list[tuple[keras.layers.BatchNormalization, float]]:
        """(layer, the user's momentum) for the layers given and, where the Trainer trains
        a copy of the model, the copy's layers of the same names (others left alone)."""
        model = getattr(self, "_model", None)
        copies = batch_norm_layers(model) if isinstance(model, keras.Model) else []
        found = [(layer, self.momenta[id(layer)]) for layer in self.layers]
        for layer in copies:
            if id(layer) not in self.momenta and layer.name in self.named:
                found.append((layer, self.named[layer.name]))
        return found

    def follow(self) -> None:
        """Sets `m ** growth` on every layer (its `m` the user's)."""
        for layer, momentum in self._known():
            _USERS[layer] = momentum
            layer.momentum = momentum**self.growth

    def describe(self) -> str:
        """The settings table's words: the momenta before and while the batch grows."""
        pairs = sorted({(m, m**self.growth) for m in self.momenta.values()})
        said = ", ".join(f"{m:g} -> {grown:.3g}" for m, grown in pairs)
        count = f"{len(self.layers)} layer{'s' if len(self.layers) != 1 else ''}"
        return f"BatchNorm momentum {said} on {count} (^{self.growth})"

    def restore(self) -> None:
        """Sets the user's momentum back on every layer (the traced step keeps its own)."""
        for layer, momentum in self._known():
            layer.momentum = momentum
            _USERS.pop(layer, None)

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.follow()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.follow()  # for a step traced again this epoch (freezing)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.restore()  # a `ModelCheckpoint` after it saves the user's config

    def on_train_end(self, logs: dict | None = None) -> None:
        self.restore()
        if hasattr(self.model, "make_train_function"):  # made lazily: traced at its first call
            self.model.make_train_function(force=True)


class ProgressiveBatch(Method):
    """Grows the batch in `stages` doublings from the job's batch to `final`.

    Args:
        final: the last batch: an int (a power-of-two multiple of the job's batch is
            used, the nearest), a gradient noise scale (`tuning.gradient_noise_scale(...)`
            or a float B_simple such as a `find_batch_size` report's `noise_scale`; inf:
            the most growth, `MAX_GROWTH`), or None: `growth` x the job's batch.
        stages: the number of batch sizes (>= 2), the last `final`.
        until: the share of the declared epochs after which the batch is `final`, in (0, 1].
        ramp_epochs: the epochs counted from the start after which the batch is `final`
            (> 0), in place of `until`: the stages do not move with the declared epochs.
        rate_power: the learning rate is multiplied by growth ** rate_power (0.5: Adam's
            square-root rule; 1: SGD's linear rule; 0: unchanged).
        growth: the final batch over the job's when `final` is None: a power of two, 2 to
            `MAX_GROWTH` (default 4).
        batch_norm: "follow": the model's `BatchNormalization` layers train at momentum
            `m ** growth` (`BatchNormFollowsBatch`); "keep": at the user's `m`.

    Raises:
        ValueError: bad `stages` / `until` / `final` / `batch_norm`; at `check`, a job
            without a static batch, a final batch below the start, or a Trainer job that
            cannot regroup its batches (`accumulate_steps`, a dataset function on several
            replicas).
    """

    name = "progressive batch"
    stateful = "the batch is a function of the epoch"
    card = Card(
        changes=(
            "the batch: the job's batch doubled in stages up to `final` (`growth`× the "
            "job's, or the gradient noise scale `tuning.gradient_noise_scale` reads, rounded "
            "to a power of two), the stages before the last sharing the first `until` of the "
            "epochs; each epoch's batches regrouped (the same examples, the same order), the "
            "rate by the square-root rule, schedules sized to the fewer steps, BatchNorm "
            "momentum m as m ** growth during the fit"
        ),
        helps=(
            "with one-cycle sized to its fewer steps, on jobs of 200 steps an epoch or more "
            "(`methods.LONG_EPOCH_STEPS`): the cycle peaks after about one epoch of ten and is "
            "decaying by the second. Each larger stage is cheaper per example; on these small "
            "models the step's fixed cost is small, so most of the gain is the shorter cycle"
        ),
        hurts=(
            "alone at Adam's rate (fewer steps lengthen the path); short jobs, which leave "
            "too few steps to grow in; in the Trainer, `accumulate_steps` or a dataset "
            'function on several replicas, which it refuses (`"fast"` drops it there, saying so)'
        ),
        measured=(
            "Alone (4×): epochs 1.14× (CNN, 3 of 5 seeds), 1.00× (ResNet, table), 1.29× "
            '(GRU, 3 of 5). Inside `"fast"` for images, as `ProgressiveBatch(growth=8, '
            "stages=4, until=0.4)`: on the CIFAR-shaped CNN (5 seeds, stopped at the target) "
            "0.36× the baseline in two epochs on every seed, against 0.53× and three epochs "
            "with the earlier 4× over half the epochs; digits CNN 0.67× against 0.82×, ResNet "
            "0.90× against 1.00× (their final accuracy 0.930 and 0.974 against 0.956 and "
            "0.981: still above the baseline's). For sequences and tables, with the cycle at "
            "3×: the GRU of minutes 0.40× grown 4× over the first fifth of the epochs (0.68× "
            "with 8× over 40 %; three-seed screen: 0.49× grown against 0.82× one-cycle at 3× "
            "with label smoothing and never at 10×), the generated table 0.41× (screen: 0.34× "
            "grown against 0.57× one-cycle at 3×). Grown (the cycle at 3×), the digits' GRU never "
            "reached its target (1,257 examples make 5 steps an epoch at batch 256). On the "
            "batch-size how-to's CIFAR-shaped CNN (three seeds), 32 → 128 in three stages at "
            "the square-root rate took 1.23× batch 32's time to its target (one seed never "
            "reached it); 64 → 256 at a held rate missed it in one of two seeds."
        ),
        defaults=(
            "growth=4, stages=3, until=0.5 at the square-root rate (not set by a "
            "measurement: batch_size_seeds.growth.json found this growth slower than batch "
            '32); `"fast"`\'s 8× in 4 stages over the first 4 epochs (images) or 8 (tables), '
            "4× in 3 stages over the first 2 (sequences): the 40 % and 20 % of the choice jobs' "
            "declared epochs time_to_accuracy.json measured, as `ramp_epochs` (length-free)"
        ),
        measured_as="ProgressiveBatch()",
        contender="progressive_batch",
        results=("time_to_accuracy.json", "batch_size_seeds.growth.json"),
    )

    def __init__(
        self,
        final: Any = None,
        stages: int = 3,
        until: float = 0.5,
        rate_power: float = 0.5,
        growth: int = 4,
        ramp_epochs: float | None = None,
        batch_norm: str = "follow",
    ):
        if batch_norm not in ("follow", "keep"):
            raise ValueError(
                f"ProgressiveBatch batch_norm must be 'follow' or 'keep', got {batch_norm!r}."
            )
        powers = [2**k for k in range(1, int(math.log2(MAX_GROWTH)) + 1)]
        if isinstance(growth, bool) or growth not in powers:
            raise ValueError(
                f"ProgressiveBatch growth must be a power of two from 2 to {MAX_GROWTH}, "
                f"got {growth!r}."
            )
        if isinstance(stages, bool) or int(stages) != stages or stages < 2:
            raise ValueError(f"ProgressiveBatch stages must be an integer >= 2, got {stages!r}.")
        if not 0 < until <= 1:
            raise ValueError(f"ProgressiveBatch until must be in (0, 1], got {until!r}.")
        if final is not None and not hasattr(final, "b_simple"):
            number = isinstance(final, (int, float)) and not isinstance(final, bool)
            if not number or not final >= 1:
                raise ValueError(
                    "ProgressiveBatch final must be a batch size (int >= 1), a gradient noise "
                    "scale (tuning.gradient_noise_scale(...), or a find_batch_size report's "
                    f"noise_scale, a float) or None, got {final!r}."
                )
        if ramp_epochs is not None and (
            isinstance(ramp_epochs, bool)
            or not isinstance(ramp_epochs, (int, float))
            or not 0 < ramp_epochs < math.inf
        ):
            raise ValueError(
                f"ProgressiveBatch ramp_epochs must be a number of epochs > 0, got {ramp_epochs!r}."
            )
        if isinstance(rate_power, bool) or not 0 <= rate_power <= 1:
            raise ValueError(f"ProgressiveBatch rate_power must be in [0, 1], got {rate_power!r}.")
        self.final, self.stages, self.until = final, int(stages), float(until)
        self.rate_power, self.default_growth = float(rate_power), int(growth)
        self.ramp_epochs = None if ramp_epochs is None else float(ramp_epochs)
        self.batch_norm = batch_norm
        self.factors: tuple[int, ...] = ()
        self.callback: SetBatchGrowth | None = None
        self.statistics: BatchNormFollowsBatch | None = None

    @property
    def changes(self) -> str:
        """One sentence: what this method changes (the settings table shows it)."""
        grown = f"x{self.factors[-1]}" if self.factors else "up to the final batch"
        over = f"{self.until:.0%} of the epochs"
        if self.ramp_epochs is not None:
            over = f"{self.ramp_epochs:g} epochs, whatever the epochs declared"
        said = f"; {self.statistics.describe()}" if self.statistics is not None else ""
        return (
            f"the batch: regrouped {grown} in {self.stages} stages over the first "
            f"{over} ({self._source()}){said}"
        )

    def _noise(self) -> float | None:
        """The noise scale `final` gives, if it is one (an object or a float)."""
        if hasattr(self.final, "b_simple"):
            return float(self.final.b_simple)
        return float(self.final) if isinstance(self.final, float) else None

    def _source(self) -> str:
        if self.final is None:
            return f"final: {self.default_growth}x the start"
        if self._noise() is not None:
            return f"final from the gradient noise scale B_simple ≈ {self._noise():.0f}"
        return f"final batch {self.final}"

    def growth(self, start: int) -> int:
        """The final batch over the start, a power of two."""
        if self.final is None:
            return self.default_growth
        noise = self._noise()
        return _pow2_growth(float(self.final) if noise is None else noise, start)

    def stage_factors(self, start: int) -> tuple[int, ...]:
        """The growth of each stage, 1 first, the last `growth(start)` (distinct)."""
        top = int(math.log2(self.growth(start)))
        found = {2 ** round(top * i / (self.stages - 1)) for i in range(self.stages)}
        return tuple(sorted(found))

    def check(self, job: Job) -> None:
        if job.batch_fixed:
            raise ValueError(
                "ProgressiveBatch regroups the Trainer's global batches between epochs: it "
                "needs accumulate_steps=1 and global batches (a batched tf.data.Dataset, or a "
                "dataset function on one replica and one worker). Drop accumulate_steps or "
                "pass the dataset itself, or give the Trainer the final batch."
            )
        if not job.batch_size:
            raise ValueError(
                "ProgressiveBatch grows a known batch: batch the data with a fixed size "
                "(dataset.batch(32)) or pass batch_size= to for_fit."
            )
        if self.final is not None and self._noise() is None:
            if self.final < job.batch_size:
                raise ValueError(
                    f"ProgressiveBatch final={self.final} is below the job's batch "
                    f"{job.batch_size}: it only grows the batch."
                )

    def epoch_steps(self, job: Job, callback: SetBatchGrowth) -> tuple[int, ...]:
        """Each epoch's optimizer steps with its stage's batch: `ceil(steps / growth)`.

        Exact with a partial last batch too: n examples make `s = ceil(n / b)` batches of
        b, and `ceil(n / (g b)) = ceil(s / g)` for any n in ((s - 1) b, s b].
        """
        return tuple(
            math.ceil(job.steps_per_epoch / callback.factor_at(e)) for e in range(job.epochs)
        )

    def apply(self, plan: MethodPlan) -> None:
        job = plan.job
        self.factors = self.stage_factors(cast(int, job.batch_size))  # `check` refused None
        with tf.init_scope():
            variable = tf.Variable(1, dtype=tf.int64, trainable=False, name="batch_growth")
        # `until` of the declared epochs, or `ramp_epochs` as `until` of one epoch
        epochs, until = (
            (job.epochs, self.until) if self.ramp_epochs is None else (1, self.ramp_epochs)
        )
        self.callback = SetBatchGrowth(variable, self.factors, epochs, until)
        self.callback.batch = cast(int, job.batch_size)
        plan.callbacks.append(self.callback)
        normalized = batch_norm_layers(job.model)
        if normalized and self.factors[-1] > 1 and self.batch_norm == "follow":
            self.statistics = BatchNormFollowsBatch(normalized, self.factors[-1])
            self.statistics.follow()
            plan.callbacks.append(self.statistics)
        plan.job = dataclasses.replace(job, epoch_steps=self.epoch_steps(job, self.callback))
        size = tf.constant(job.batch_size, tf.int64)

        def regroup(dataset: tf.data.Dataset) -> tf.data.Dataset:
            @tf.autograph.experimental.do_not_convert
            def epoch(_: Any) -> tf.data.Dataset:
                return dataset.unbatch().batch(size * variable.read_value())

            options = tf.data.Options()  # the factor is set by a callback, not checkpointed
            policy = tf.data.experimental.ExternalStatePolicy.IGNORE
            options.experimental_external_state_policy = policy
            return tf.data.Dataset.from_tensors(0).flat_map(epoch).with_options(options)

        plan.regroups.append(regroup)
        if self.rate_power:
            plan.finishers.append(lambda made: self._scale_rate(made, variable))

    def _scale_rate(self, plan: MethodPlan, variable: tf.Variable) -> None:
        """After every method: the optimizer's rate times growth ** rate_power."""
        rate = schedule_of(plan.optimizer) or plan.optimizer.get_config()["learning_rate"]
        plan.rebuild_optimizer(learning_rate=ScaledByGrowth(rate, self.rate_power, variable))
