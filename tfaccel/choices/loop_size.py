"""How many steps one call of the step loop runs: `steps_per_loop`, fixed or measured.

Each call of the inner loop costs a fixed host overhead (the `tf.function` dispatch,
the one collective that reads the logs, the batch callbacks) on top of its steps. With
`steps_per_loop="auto"` the first loops of a run measure it: after one warm-up call
(tracing), calls of 1 step and of `n2` steps alternate (`REPEATS` each; `n2` sized so
that its call lasts about `PROBE_CALL_S`); the fastest call at each size gives
`T(n) = overhead + n × step`, two equations for the two unknowns. The promise is an
overhead under `OVERHEAD_TARGET` (2 %) of a call; the chosen n is the smallest whose
*measured* overhead is under `AIM` (0.5 %), a margin for the estimate (where the overhead
is below the one-step calls' jitter, as with long steps, the jitter counts). The margin is
measured: on the MLP of `benchmarks/trainer_vs_fit.py` the probe read 3.0 ms per call,
while calls of 10–100 steps paid 4–5 ms, so aiming at 2 % landed at 0.96 of the best n.
The cap: a call lasts at most `CALLBACK_INTERVAL_S` (batch callbacks stay timely).
`FitLoop` then clips every call to the epoch's end and to checkpoint boundaries. Which steps run in
which call never changes the numbers: a loop runs the same steps one after another.

Per-batch callbacks. Batch hooks fire once per call, so under "auto" a callback written
for one step per batch hook (a rate changed each batch, `stop_training` set at a batch)
would silently see one hook per loop. `LoopSizer.honour_callbacks` caps a fit's loops at
one step when a user's callback overrides a batch hook (`on_train_batch_begin/end`,
`on_batch_begin/end`), unless it says it handles loops (`loop_batches_ok = True`, as
tfaccel's own callbacks do) or is a Keras callback that only acts per epoch as
configured (`History`, `ProgbarLogger`; `ModelCheckpoint`, `BackupAndRestore` saving per
epoch; `TensorBoard` logging per epoch). A fixed `steps_per_loop` is the user's choice
and is kept.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any

import keras

from tfaccel.choices.choice import Choice

OVERHEAD_TARGET = 0.02  # host overhead as a fraction of a call's time: the promise
AIM = OVERHEAD_TARGET / 4  # what the measured overhead is held to: a margin for its error
CALLBACK_INTERVAL_S = 2.0  # a call (and so a batch callback) at least this often
PROBE_CALL_S = 0.1  # the larger probe's call lasts about this long
REPEATS = 5  # timed calls at each probe size (the fastest counts: noise only slows down)
PROBE_MIN, PROBE_MAX = 2, 256
BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")


def resolve_steps_per_loop(value: object) -> int | str:
    """Returns `value`: "auto" or an integer >= 1.

    Raises:
        ValueError: anything else.
    """
    if value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"steps_per_loop must be an integer >= 1 or 'auto' (measured: the fewest steps "
            f"per call that keep the host overhead under {OVERHEAD_TARGET:.0%}), got {value!r}."
        )
    return value


def _per_epoch_as_configured(callback: keras.callbacks.Callback) -> bool:
    """A Keras callback with batch hooks that, as configured, acts only at epoch ends."""
    cbs = keras.callbacks
    if isinstance(callback, cbs.History | cbs.ProgbarLogger):
        return True
    if isinstance(callback, cbs.ModelCheckpoint | cbs.BackupAndRestore):
        return getattr(callback, "save_freq", None) == "epoch"
    if isinstance(callback, cbs.TensorBoard):
        return getattr(callback, "update_freq", None) == "epoch"
    return False


def needs_batches(callback: keras.callbacks.Callback) -> bool:
    """True when `callback` relies on one batch hook per step (see the module's note)."""
    if getattr(callback, "loop_batches_ok", False) or _per_epoch_as_configured(callback):
        return False
    base = keras.callbacks.Callback
    for name in BATCH_HOOKS:
        if name in vars(callback):  # a hook given to the instance (LambdaCallback)
            return True
        if getattr(type(callback), name, None) is not getattr(base, name):
            return True
    return False


def choose(overhead_s: float, step_s: float) -> int:
    """The smallest n with `overhead < AIM` of `overhead + n × step`, timely."""
    overhead_s, step_s = max(overhead_s, 0.0), max(step_s, 1e-9)
    ratio = (1.0 - AIM) / AIM  # overhead < 0.5 %  <=>  n > 199 × o / s
    n = math.floor(ratio * overhead_s / step_s) + 1
    timely = max(1, math.floor((CALLBACK_INTERVAL_S - overhead_s) / step_s))
    return max(1, min(n, timely))


class LoopSizer:
    """Says how many steps the next call should run, and learns it for "auto".

    Args:
        steps_per_loop: an integer, or "auto".
    """

    def __init__(self, steps_per_loop: int | str) -> None:
        self.setting = resolve_steps_per_loop(steps_per_loop)
        self.auto = self.setting == "auto"
        # resolve_steps_per_loop gives "auto" or an int: not auto, the int is the choice
        self.chosen: int | None = self.setting if isinstance(self.setting, int) else None
        self.overhead_s: float | None = None
        self.step_s: float | None = None
        self.jitter_s = 0.0  # of the one-step calls: the overhead's resolution
        self._plan: list[int] = [1, 1]  # the warm-up call, then the first timed one
        self._samples: dict[int, list[float]] = {}
        self._calls = 0
        self.capped: str | None = None  # this fit's one-step cap, as the table shows it
        self._cap: Choice | None = None

    @property
    def measuring(self) -> bool:
        return self.chosen is None and self.capped is None

    def honour_callbacks(
        self, callbacks: Iterable[keras.callbacks.Callback] | Any | None
    ) -> str | None:
        """Caps this fit's loops at one step when a callback needs per-batch hooks.

        Call once per fit, before its first loop, with the user's callbacks (a list or
        a `keras.callbacks.CallbackList`). Only "auto" is capped; while capped nothing
        is measured (the measurement resumes at a later fit without such callbacks).

        Returns:
            The settings table's text, e.g. "1 (per-batch callbacks: LRRangeTest)", or
            None when no cap applies.
        """
        callbacks = getattr(callbacks, "callbacks", callbacks) or []
        names = list(dict.fromkeys(type(c).__name__ for c in callbacks if needs_batches(c)))
        self.capped, self._cap = None, None
        if self.auto and names:
            self._cap = Choice(1, f"per-batch callbacks: {', '.join(names)}")
            self.capped = self._cap.describe()
        return self.capped

    def next(self) -> int:
        """Steps for the next call, before the outer loop's clipping."""
        if self.capped is not None:
            return 1
        if self.chosen is not None:
            return self.chosen
        return self._plan[0] if self._plan else 1

    def record(self, asked: int, ran: int, seconds: float) -> bool:
        """Notes a call (`asked` steps after clipping; `ran` done) of `seconds` in all.

        Returns True when this call completed the measurement (`chosen` is now set).
        """
        if self.chosen is not None or self.capped is not None:
            return False
        self._calls += 1
        if self._plan:
            self._plan.pop(0)
        if self._calls == 1 or ran < asked or ran < 1:
            return False  # the warm-up call traces; a call cut short by the data is not T(n)
        self._samples.setdefault(ran, []).append(seconds)
        if self._calls == 2:  # the first timed call of one step sizes the larger probe
            probe = round(PROBE_CALL_S / max(seconds, 1e-6))
            probe = min(max(probe, PROBE_MIN), PROBE_MAX)
            probe = min(probe, max(PROBE_MIN, math.floor(CALLBACK_INTERVAL_S / seconds)))
            self._plan = [probe, 1] * (REPEATS - 1) + [probe]
        if self._plan:
            return False
        sizes = sorted(self._samples)
        if len(sizes) < 2:  # every call was clipped to one size: keep measuring
            self._plan = [sizes[-1] * 2, 1]
            return False
        small, large = sizes[0], sizes[-1]
        t_small, t_large = min(self._samples[small]), min(self._samples[large])
        self.step_s = max((t_large - t_small) / (large - small), 1e-9)
        self.overhead_s = max(t_small - small * self.step_s, 0.0)
        # The overhead is a small difference of two timings. Where it is below their
        # jitter (long steps), size the loop for the jitter: an overhead it could hide.
        self.jitter_s = statistics.median(self._samples[small]) - t_small
        self.chosen = choose(max(self.overhead_s, self.jitter_s), self.step_s)
        return True

    def choice(self, steps_per_epoch: int | None = None) -> Choice:
        """The steps per loop in use as a `Choice`: the n, why, and for "auto" what was
        measured (`figures`: the host overhead, the step and the one-step calls' jitter,
        in seconds; `cost_s`: the measuring calls' host overheads — their steps train)."""
        if not self.auto:
            return Choice(min(self.setting, steps_per_epoch or self.setting), "given")
        if self._cap is not None:
            return self._cap
        if self.chosen is None or self.overhead_s is None or self.step_s is None:
            return Choice("auto", "measured over the first loops")
        loop = self.overhead_s + self.chosen * self.step_s
        share = self.overhead_s / loop if loop > 0 else 0.0
        clipped = (
            f", clipped to the epoch's {steps_per_epoch}"
            if steps_per_epoch and steps_per_epoch < self.chosen
            else ""
        )
        jitter = (
            f"; sized for the timing jitter, {self.jitter_s * 1e3:.2f} ms"
            if self.jitter_s > self.overhead_s
            else ""
        )
        return Choice(
            self.chosen,
            f"auto: host overhead {self.overhead_s * 1e3:.2f} ms per call, step "
            f"{self.step_s * 1e3:.2f} ms: {share:.2%} of a call, aimed under {AIM:.1%} for a "
            f"{OVERHEAD_TARGET:.0%} promise{jitter}{clipped}",
            {"overhead_s": self.overhead_s, "step_s": self.step_s, "jitter_s": self.jitter_s},
            cost_s=self._calls * self.overhead_s,
        )

    def describe(self, steps_per_epoch: int | None = None) -> str | int:
        """The settings table's entry: the n in use and, for "auto", what was measured."""
        choice = self.choice(steps_per_epoch)
        return choice.describe() if self.auto else choice.value
