"""The doctor's report: the verdict, the measured rates, ranked fixes; text, plot, dict."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from tfaccel.doctor import fix_rules
from tfaccel.doctor import verdict as rules

if TYPE_CHECKING:
    from tfaccel.doctor.mfu import Utilisation

_WORDS = {
    "input": "input-bound: the input pipeline cannot keep up with the step",
    "compute": "compute-bound: the step's own arithmetic limits training",
    "communication": "communication-bound: the gradient all-reduce limits training",
    "host": "host-bound: the per-call work on the host limits training",
    "memory": "memory-bound: the batch leaves no room on the device",
}


@dataclasses.dataclass
class Report:
    """What `tfaccel.doctor.diagnose` found.

    Attributes:
        verdict: "input", "compute", "communication", "host" or "memory".
        measured: the measurements (`verdict.Measured`; seconds per step).
        fixes: ranked `verdict.Fix` list, by predicted time to accuracy.
        notes: lines explaining what was measured and how (multi-worker, CPU, ...).
        cost_s: the diagnosis's wall time (tracing included).
        budget_s: the time it aimed to stay under.
        mfu: the real step's model FLOPs utilisation (`mfu.Utilisation`; None when the
            FLOPs could not be counted).
    """

    verdict: str
    measured: rules.Measured
    fixes: list[rules.Fix]
    notes: list[str]
    cost_s: float
    budget_s: float
    mfu: Utilisation | None = None

    @property
    def no_software_fix(self) -> bool:
        """True when the first fix says nothing in software would help."""
        return bool(self.fixes) and not self.fixes[0].software

    def rates(self) -> dict[str, float]:
        """Examples/s: the real job, the cached step, and each stage's ceiling."""
        m = self.measured
        return {
            "real": m.batch / m.real_s,
            "cached_step": m.batch / rules.cached_step_s(m),
            **{f"ceiling_{k}": v for k, v in rules.ceilings(m).items()},
        }

    def shares(self) -> dict[str, float]:
        """Each serial part's share of the cached step; input: its time ÷ the real step."""
        m = self.measured
        p = rules.parts(m)
        step = rules.cached_step_s(m)
        out = {k: p[k] / step for k in ("compute", "communication", "host")}
        out["input"] = min(p["input"] / m.real_s, 1.0)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-ready dict: verdict, measured parts, fixes and notes."""
        m = self.measured
        return {
            "verdict": self.verdict,
            "no_software_fix": self.no_software_fix,
            "rates": {k: _finite(v) for k, v in self.rates().items()},
            "seconds_per_step": rules.parts(m),
            "shares": self.shares(),
            "measured": {
                k: (list(v) if isinstance(v, tuple) else v)
                for k, v in dataclasses.asdict(m).items()
            },
            "compute_fraction_of_peak": rules.compute_fraction_of_peak(m),
            "largest_batch": fix_rules.largest_batch(m),
            "fixes": [dataclasses.asdict(f) for f in self.fixes],
            "disagreement": rules.disagreement(m),
            "notes": list(self.notes),
            "cost_s": self.cost_s,
            "budget_s": self.budget_s,
            "mfu": None if self.mfu is None else dataclasses.asdict(self.mfu),
        }

    def __str__(self) -> str:
        m = self.measured
        rates = self.rates()
        p = rules.parts(m)
        lines = [
            f"Verdict: {_WORDS[self.verdict]}.",
            f"  real step:      {rates['real']:>12,.0f} examples/s  "
            f"({m.real_s * 1e3:.2f} ms a step of {m.batch}, {m.steps_per_loop} steps per call)",
            f"  cached step:    {rates['cached_step']:>12,.0f} examples/s  "
            "(one batch repeated: no input work)",
            "Ceilings (examples/s if this stage alone limited; ms per step):",
        ]
        for stage in rules.STAGES:
            if stage == "communication" and m.replicas < 2:
                continue
            mark = "  <- the limit" if stage == self.verdict else ""
            lines.append(
                f"  {stage:<14}{_rate(rates['ceiling_' + stage]):>12} "
                f"({p[stage] * 1e3:.3f} ms){mark}"
            )
        if m.real_wait_s is not None:
            lines.append(
                f"  in the real step, waiting for input: {m.real_wait_s / m.real_s:.0%} of its time"
            )
        if m.input_startup_s is not None:
            lines.append(
                f"  a fresh input iterator's first batch: {m.input_startup_s * 1e3:,.1f} ms "
                "(paid again each epoch a pipeline is re-iterated)"
            )
        if m.startup_spread_s and m.epoch_steps:
            lines.append(
                f"  that start-up spread over an epoch's {m.epoch_steps:,} steps: "
                f"+{m.startup_spread_s * 1e3:,.2f} ms a step (in the input and real figures)"
            )
        disagreement = rules.disagreement(m)
        if disagreement:
            lines.append(f"  {disagreement[0].upper()}{disagreement[1:]}.")
        lines.append(self._memory_line())
        lines.append(self._compute_line())
        lines.append(self.mfu.line() if self.mfu else "MFU: not measured (FLOPs not countable).")
        lines.append(
            "Fixes, best first by predicted time to accuracy (examples/s after ÷ now for "
            "those that keep the path; numerics changes unchecked after them, their gain in "
            "examples/s; those a paired loss check found worse last):"
        )
        if not self.fixes:
            lines.append("  none found")
        for i, fix in enumerate(self.fixes, 1):
            lines.append(f"  {i}. [{fix.stage}] {fix.line()}")
        lines += [f"Note: {n}" for n in self.notes]
        if m.unmeasured:
            lines.append(f"Not measured within the budget: {'; '.join(m.unmeasured)}.")
        lines.append(
            f"Diagnosis took {self.cost_s:.1f} s (budget {self.budget_s:.0f} s); timings on a "
            "shared machine are noisy: re-run to compare."
        )
        return "\n".join(lines)

    def _memory_line(self) -> str:
        mem = self.measured.memory
        if not mem.get("peak_mb"):
            return f"Memory: {mem.get('what', 'not measured')}"
        fraction = rules.memory_fraction(self.measured)
        largest = fix_rules.largest_batch(self.measured)
        text = (
            f"Memory: peak {mem['peak_mb']:,.0f} MiB of {mem['capacity_mb']:,.0f} MiB "
            f"({fraction:.0%}, {mem.get('what')})"
        )
        if largest is not None:
            text += f"; largest batch predicted to fit: {largest}"
        elif self.measured.device == "CPU":
            text += (
                "; a CPU has no catchable out-of-memory, so the largest batch is not "
                "predicted (tuning.find_batch_size probes it)"
            )
        return text

    def _compute_line(self) -> str:
        m = self.measured
        if m.xla_speedup is None:
            return self._precision_line()
        listed = [i for i, f in enumerate(self.fixes, 1) if "jit_compile" in f.action]
        where = (
            f"fix {listed[0]}"
            if listed
            else "already on"
            if m.jit_compile
            else f"under the {rules.MIN_GAIN:.2f}x threshold: not listed"
        )
        return (
            f"{self._precision_line()} XLA (deep=True): the forward and backward passes ran "
            f"{m.xla_speedup:.2f}x as fast with jit_compile=True ({where})."
        )

    def _precision_line(self) -> str:
        m = self.measured
        fraction = rules.compute_fraction_of_peak(m)
        peak = ""
        if fraction is not None:
            assert m.matmul_peak is not None  # the fraction is read only against a peak
            peak = (
                f"the step computes at {fraction:.0%} of this machine's {m.matmul_peak_policy} "
                f"matmul peak ({m.matmul_peak / 1e9:.0f} GFLOP/s). "
            )
        if m.precision_rates is None:
            return (
                f"Precision: {peak}{m.dtype_policy}, the only candidate here "
                f"({m.precision_why or 'not measured'})."
            )
        rates = ", ".join(f"{p} {r:,.0f}" for p, r in m.precision_rates.items())
        listed = [i for i, f in enumerate(self.fixes, 1) if "precision" in f.action]
        found = m.precision_speedup()
        where = (
            f"fix {listed[0]}"
            if listed
            else f"under the {rules.MIN_GAIN:.2f}x threshold: {m.dtype_policy} stays"
        )
        best = f"; {found[0]} {found[1]:.2f}x ({where})" if found else ""
        return f"Precision: {peak}the passes measured under each policy, examples/s: {rates}{best}."

    def plot(self, path: str) -> str:
        """Saves a bar chart of the stages' ceilings against the real rate; returns `path`."""
        from matplotlib.figure import Figure  # no pyplot: the caller's backend is left as it is

        m = self.measured
        rates = self.rates()
        stages = [s for s in rules.STAGES if not (s == "communication" and m.replicas < 2)]
        values = [rates["ceiling_" + s] for s in stages]
        top = max([v for v in values if math.isfinite(v)] + [rates["real"]]) * 1.3
        shown = [min(v, top) for v in values]
        colors = ["tab:red" if s == self.verdict else "tab:gray" for s in stages]
        fig = Figure(figsize=(6.5, 3.6))
        ax = fig.add_subplot(1, 1, 1)
        ax.barh(stages, shown, color=colors)
        ax.axvline(rates["real"], color="black", linestyle="--", label="real step")
        ax.axvline(rates["cached_step"], color="tab:blue", linestyle=":", label="cached step")
        ax.set_xscale("log")  # ceilings span orders of magnitude
        ax.set_xlabel("examples/s (ceiling if this stage alone limited; log scale)")
        ax.set_title(f"tfaccel.doctor: {self.verdict}-bound")
        ax.invert_yaxis()
        ax.legend(loc="lower right", fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        return path


def _rate(value: float) -> str:
    return "unlimited" if not math.isfinite(value) else f"{value:,.0f}"


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
