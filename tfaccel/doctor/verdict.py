"""From measured seconds to a verdict and ranked fixes (arithmetic; no TensorFlow work).

A training step is split into the parts measured by `diagnose` (seconds per step):

- input: the input pipeline alone, one batch, from a fresh iterator read back to back;
- compute: the step on one cached batch, less the all-reduce and the per-call overhead;
- communication: the gradient all-reduce (with vs without it, ≥ 2 replicas);
- host: the per-call overhead (a call of 1 step vs a long call) over the steps per call;
- and the real step on the real data, with its wait for input timed inside its graph.

Each part's ceiling is the examples/s the job would reach if that part alone limited
it (global batch / its seconds). The verdict:

1. **memory** when the peak reaches `MEMORY_FULL` (90 %) of the capacity;
2. else the largest part of the real step: its wait for input (**input**), or the
   cached step's **compute**, **communication** or **host** part. The real step's
   evidence comes first: when the input alone looks fast but the real step waits, the
   report says the parts disagree and trusts the real step (`disagreement`). Without
   a timed wait, input when its ceiling is below the cached step's rate.

Predicted gains are the step now ÷ the step modelled with the fix (for an input fix,
the real step measured where it is slower than the model): with
prefetch input and step overlap, `max(t_in, t_step)`; without, `t_in + t_step`, where
`t_in` is the input as the real step saw it (`effective_input_s`). Input fixes are
timed on the pipeline with the fix applied where that is cheap (`doctor.variants`).
Fixes are ranked by predicted time to accuracy (`Fix.time_to_accuracy`: the gain × the
paired loss check's verdict), every stage's in one order: the fixes that keep the path
(the numerics, or a lower precision whose check found the loss after the same examples no
worse) by predicted gain, then the numerics changes not checked, then those
that hold only under a condition (a cache needs deterministic maps); a fix whose check
found the loss worse comes last of all ("faster steps, not adopted").
"""

from __future__ import annotations

import dataclasses
import math

from tfaccel.data.assembly.plan import ends_with_prefetch

MEMORY_FULL = 0.9  # peak / capacity from which memory is the verdict
"""Peak memory ÷ capacity from which the verdict is memory."""
NEAR_PEAK = 0.5  # compute at this share of the matmul peak or more: nothing to gain
"""Share of the matmul peak from which a CPU-bound step has nothing to gain in software."""
COMMUNICATION_TARGET = 0.10  # accumulate until the all-reduce is under this share of a step
"""The all-reduce's share of a step that `accumulate_steps=k` is sized to bring it under."""
MAX_ACCUMULATE = 16
MIN_GAIN = 1.05  # fixes predicted (or measured) to gain less are not listed
INPUT_LIMITED = 0.1  # the real step waiting this share of its time is waiting on input
STAGES = ("input", "compute", "communication", "host")


@dataclasses.dataclass
class Measured:
    """What `diagnose` measured (seconds are per step of one global batch)."""

    batch: int
    replicas: int
    workers: int
    device: str  # "CPU" or "GPU"
    trainer: bool  # a Trainer (else a compiled keras.Model)
    steps_per_loop: int  # the steps per call the job uses (or "auto" would choose)
    steps_per_loop_setting: object
    accumulate_steps: int
    step_s: float  # compute alone, per step, without the per-call overhead
    call_overhead_s: float  # per call of the step loop
    input_s: float  # the input pipeline alone, per batch, through the distribution layer
    plain_input_s: float | None  # the same pipeline without the distribution layer
    real_s: float  # the real step on the real data, at steps_per_loop
    real_wait_s: float | None  # of real_s, waiting for the batch (timed in the graph)
    all_reduce_s: float | None  # None: one replica
    gradient_mb: float
    cores: int
    pipeline: list  # [(op, parallelism)] of the input pipeline, source first
    memory: dict  # peak_mb, capacity_mb, what (device or budget), fixed_mb
    flops_per_example: float | None = None
    matmul_peak: float | None = None
    dtype_policy: str = "float32"
    jit_compile: bool = False
    gpu_capability: tuple | None = None
    xla_speedup: float | None = None  # passes without ÷ with jit_compile (deep=True)
    matmul_peak_policy: str = "float32"  # the policy whose matmul peak is `matmul_peak`
    precision_rates: dict | None = None  # examples/s of the passes per candidate policy
    precision_why: str = ""  # the candidates' reason (one candidate: nothing to measure)
    precision_outcome: dict | None = None  # the paired loss check of the fastest other
    # policy (`doctor.paired`): policy, adopted, reason, examples, losses; None: not run
    input_startup_s: float | None = None  # a fresh iterator's first batch (once an epoch)
    startup_spread_s: float = 0.0  # of input_s and real_s: the start-up spread over an epoch
    epoch_steps: int | None = None  # steps an epoch holds (None: endless or unknown)
    input_speedups: dict | None = None  # the input alone with a fix applied, ÷ as it is
    source_shards: int = 4  # the shards `input_speedups["parallel_source"]` was read in
    input_cores: float | None = None  # cores busy while the input alone was read
    trainer_cores: float | None = None  # cores busy while the step ran on cached data
    unmeasured: list = dataclasses.field(default_factory=list)  # named, not guessed

    def precision_speedup(self) -> tuple[str, float] | None:
        """`(policy, its passes' rate ÷ the current policy's)` for the fastest other one."""
        rates = self.precision_rates or {}
        others = {p: r for p, r in rates.items() if p != self.dtype_policy}
        if self.dtype_policy not in rates or not others:
            return None
        best = max(others, key=lambda p: others[p])
        return best, others[best] / rates[self.dtype_policy]


@dataclasses.dataclass
class Fix:
    """One change to try, with the gain predicted from the measurements."""

    stage: str
    action: str
    gain: float | None  # predicted examples/s after ÷ measured real examples/s; None: unknown
    why: str
    software: bool = True  # False: the "nothing to gain here" answer
    condition: str | None = None  # when it applies (ranked after unconditional fixes)
    measured: float | None = None  # the speed-up measured of the part it changes, if any
    numerics: bool = False  # changes what is computed (precision, batch): the path may change
    code: str | None = None  # for a model.fit script: the Keras statement, run on `model`
    outcome: str | None = None  # a numerics fix: the paired loss check's verdict, if run
    adopted: bool | None = None  # that check: False found the loss worse; None: not run

    def time_to_accuracy(self) -> float | None:
        """The predicted time-to-accuracy gain: the gain × the paired loss check's verdict
        (1 for a fix that keeps the numerics or whose check found the loss no worse, 0 for
        one found worse); None where unknown (no gain, or a numerics change unchecked)."""
        if self.gain is None or (self.numerics and self.outcome is None):
            return None
        return 0.0 if self.adopted is False else self.gain

    def line(self) -> str:
        """One line: the action, its predicted gain, why, and when it applies. A fix that
        changes the numerics is not predicted as a time-to-accuracy gain without a paired
        loss check's verdict (`outcome`): its gain is stated in examples/s."""
        gain = "" if self.gain is None else f" (predicted {self.gain:.2f}x)"
        if self.gain is not None and self.numerics and self.time_to_accuracy() is None:
            gain = f" (predicted {self.gain:.2f}x examples/s; time to accuracy unchecked)"
        if self.gain is not None and self.adopted is False:
            gain = f" (predicted {self.gain:.2f}x examples/s)"
        when = f", {self.condition}" if self.condition else ""
        numerics = ""
        if self.numerics and self.adopted is False:
            numerics = f"; changes the numerics: {self.outcome}"
        elif self.numerics and self.outcome:
            numerics = (
                "; changes the numerics (the paired loss check found the loss after the "
                f"same examples no worse: {self.outcome})"
            )
        elif self.numerics:
            numerics = (
                "; changes the numerics: the gain is in examples/s, the epochs to the target "
                "may grow (adopt it once a paired check finds the loss after the same "
                "examples no worse)"
            )
        return f"{self.action}{gain}: {self.why}{when}{numerics}"


def parts(m: Measured) -> dict[str, float]:
    """Seconds per step of each stage (communication 0 on one replica)."""
    all_reduce = max(m.all_reduce_s or 0.0, 0.0)
    return {
        "input": m.input_s,
        "compute": max(m.step_s - all_reduce, 1e-9),
        "communication": all_reduce,
        "host": m.call_overhead_s / m.steps_per_loop,
    }


def ceilings(m: Measured) -> dict[str, float]:
    """Examples/s each stage alone would allow (inf: the stage costs nothing measurable)."""
    return {k: (m.batch / s if s > 0 else math.inf) for k, s in parts(m).items()}


def cached_step_s(m: Measured) -> float:
    """The step on cached data at the job's steps per call: compute + communication + host."""
    p = parts(m)
    return p["compute"] + p["communication"] + p["host"]


def memory_fraction(m: Measured) -> float | None:
    peak, capacity = m.memory.get("peak_mb"), m.memory.get("capacity_mb")
    if not peak or not capacity:
        return None
    return peak / capacity


def verdict(m: Measured) -> str:
    """The limiting stage (see the module docstring for the rule)."""
    fraction = memory_fraction(m)
    if fraction is not None and fraction >= MEMORY_FULL:
        return "memory"
    p = parts(m)
    if m.real_wait_s is not None:  # the real step's own evidence comes first
        p["input"] = m.real_wait_s
        return max(("input", "compute", "communication", "host"), key=lambda k: p[k])
    if m.input_s > cached_step_s(m):
        return "input"
    return max(("compute", "communication", "host"), key=lambda k: p[k])


def input_limited(m: Measured) -> bool:
    """Whether the real step waited for input `INPUT_LIMITED` of its time or more."""
    return m.real_wait_s is not None and m.real_wait_s >= INPUT_LIMITED * m.real_s


def effective_input_s(m: Measured) -> float:
    """The input's seconds per batch as the real step saw them: where it waited for
    input, the wait plus (with prefetch, which overlaps them) the step; else the input
    alone. The two disagree when the input alone runs with the cores to itself, or its
    reading missed what the real step pays (see `disagreement`)."""
    if not input_limited(m):
        return m.input_s
    assert m.real_wait_s is not None  # input_limited(m) holds only on a timed wait
    seen = m.real_wait_s + (cached_step_s(m) if prefetched(m) else 0.0)
    return max(seen, m.input_s)


def disagreement(m: Measured) -> str | None:
    """A sentence when the input alone and the real step tell different stories."""
    if m.real_wait_s is None:
        return None
    alone_limits = m.input_s > cached_step_s(m)
    if input_limited(m) and not alone_limits:
        return (
            f"the parts disagree: the input alone delivered {m.batch / m.input_s:,.0f} "
            f"examples/s, faster than the cached step, yet the real step waited for input "
            f"{m.real_wait_s / m.real_s:.0%} of its time; the verdict trusts the real step "
            "(on a CPU the pipeline and the step share the cores)"
        )
    if alone_limits and m.real_wait_s < INPUT_LIMITED * m.real_s:
        return (
            f"the parts disagree: the input alone was slower than the cached step, yet the "
            f"real step waited for input only {m.real_wait_s / m.real_s:.0%} of its time; "
            "the verdict trusts the real step"
        )
    return None


def compute_fraction_of_peak(m: Measured) -> float | None:
    """Achieved training FLOP/s (compute part only) ÷ this machine's matmul peak in the
    fastest precision it offers (`matmul_peak_policy`)."""
    if not m.flops_per_example or not m.matmul_peak:
        return None
    return m.flops_per_example * m.batch / parts(m)["compute"] / m.matmul_peak


def worth_listing(fix: Fix) -> bool:
    """The one rule for listing a fix outside the verdict's stage: its measured speed-up
    where it has one, else its predicted gain, at least `MIN_GAIN`.

    A measured speed-up of `MIN_GAIN` or more therefore always yields its fix, whatever
    share of the step the part has (the predicted gain says how much of it reaches the step).
    """
    gain = fix.measured if fix.measured is not None else fix.gain
    return gain is not None and gain >= MIN_GAIN


def prefetched(m: Measured) -> bool:
    """Whether the input pipeline ends with a prefetch (input overlaps the step)."""
    return ends_with_prefetch(m.pipeline)


def modelled_step_s(
    m: Measured,
    t_in: float | None = None,
    t_step: float | None = None,
    prefetch: bool | None = None,
) -> float:
    """The step the parts predict: max(t_in, t_step) with prefetch, t_in + t_step without."""
    t_in = effective_input_s(m) if t_in is None else t_in
    t_step = cached_step_s(m) if t_step is None else t_step
    prefetch = prefetched(m) if prefetch is None else prefetch
    return max(t_in, t_step) if prefetch else t_in + t_step


def _gain(m: Measured, **after) -> float:
    """The step modelled now ÷ the step modelled with a fix of the step (`after`). Where
    the real step's largest part is its wait for input, the input paces it (modelled at the
    pace the real step saw); elsewhere, by the real step's own evidence, it does not, and
    the gain is the cached step's (a wait the step's own work causes on shared cores
    shrinks with the step)."""
    if verdict(m) == "input":
        return modelled_step_s(m) / max(modelled_step_s(m, **after), 1e-12)
    after = {**after, "t_in": 0.0}
    return modelled_step_s(m, t_in=0.0) / max(modelled_step_s(m, **after), 1e-12)


def _input_gain(m: Measured, **after) -> float:
    """The real step measured ÷ the step modelled with an input fix (`after`): where the
    input limits, the real step is the truth the model of the parts may miss."""
    return max(m.real_s, modelled_step_s(m)) / max(modelled_step_s(m, **after), 1e-12)
