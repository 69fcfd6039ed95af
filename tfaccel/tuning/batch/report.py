"""The result of a batch-size search: one row per candidate, the largest fit and the knee."""

from __future__ import annotations

import dataclasses
import math
import os

from tfaccel.tuning.batch.noise import error_text, upper_limit

REASONS = ("ok", "oom", "budget", "limit", "data", "steps per epoch", "time", "estimated")
# reasons of candidates never run (an "estimated" row counts as fitting, for the report)
UNTRIED = ("limit", "data", "steps per epoch", "time", "estimated")


@dataclasses.dataclass(frozen=True)
class ProbeRow:
    """One candidate batch size of a search.

    Readable as attributes (`row.batch_size`) or like a dict (`row["batch_size"]`).

    Attributes:
        batch_size: the global batch tried (or, with reason "limit", not tried).
        fits: True when its steps ran within the memory budget.
        examples_per_second: the batch over its fastest timed step (None unless it fits).
        peak_memory_mb: measured peak memory of the probe (None when it did not run to the end).
        reason: "ok"; "oom" (ran out of memory); "budget" (its predicted or measured memory
            exceeds the budget); "limit" (above `limit`, not tried); "data" (more than the
            data's examples, not tried); "steps per epoch" (it would leave fewer than
            `min_steps_per_epoch` steps an epoch, not tried); "time" (the search's time
            budget was spent before it, not tried); "estimated" (the first candidate, not
            run: the search declined at its forward pass, `early.project`; its examples/s
            is projected from that pass and it counts as fitting: the batch is kept).
        predicted_memory_mb: the memory predicted before running it, when there was a prediction.
        error: the out-of-memory message, shortened ("" otherwise).
        seconds: the candidate's wall time, its model's build and compile included when it
            built one (None when it did not run).
    """

    batch_size: int
    fits: bool
    examples_per_second: float | None
    peak_memory_mb: float | None
    reason: str
    predicted_memory_mb: float | None = None
    error: str = ""
    seconds: float | None = None

    def __getitem__(self, key: str):
        if key not in self.to_dict():
            raise KeyError(f"{key!r}; a row has {list(self.to_dict())}")
        return getattr(self, key)

    def to_dict(self) -> dict:
        """The row as a dict."""
        return dataclasses.asdict(self)

    @property
    def tried(self) -> bool:
        """False for a candidate the search never ran (above a limit, the data, the time)."""
        return self.reason not in UNTRIED

    def fits_text(self) -> str:
        """The table's "fits" cell: "yes", "no", or "untried" for a candidate never run."""
        if not self.tried:
            return "untried"
        return "yes" if self.fits else "no"


def knee_batch_size(rows: list[ProbeRow], knee: float) -> int | None:
    """The smallest fitting batch whose examples/s is within `knee` of the highest."""
    timed = [
        (r.batch_size, r.examples_per_second)
        for r in rows
        if r.fits and r.examples_per_second is not None
    ]
    if not timed:
        return None
    peak = max(rate for _, rate in timed)
    return min(size for size, rate in timed if rate >= (1.0 - knee) * peak)


@dataclasses.dataclass
class BatchSizeReport:
    """What `find_batch_size` found.

    Attributes:
        max_batch_size: the largest global batch that ran.
        best_batch_size: the smallest of `limits`: the throughput knee (the smallest batch
            within `knee` of the highest examples/s), the noise scale, the steps per
            epoch, the time to accuracy.
        rows: one `ProbeRow` per candidate, in the order they were tried.
        mode: "power" or "binsearch".
        knee: the tolerance used for `best_batch_size`.
        memory_budget_mb: the budget the probes were held to.
        memory_kind: "device" (GPU allocator peak) or "host" (RSS growth on CPU).
        probe_seconds: wall time of the whole search.
        effective_batch_size: the effective batch asked for (None if none was).
        capped_by: what ended the search: "memory" (a candidate ran out of memory or
            over the budget), "data" (the next candidate exceeded the data's examples),
            "steps per epoch" (it would leave fewer than `min_steps_per_epoch` steps),
            "limit" (it exceeded `limit`) or "time" (`budget_s` or the share of the job
            was spent); None for reports from older versions.
        examples: the data's examples, when known or counted.
        noise_scale: the gradient noise scale B_simple after the warm-up (inf: the
            gradient is lost in the noise, no bound; None: not measured, see
            `noise_scale_note`).
        noise_scale_note: how it was measured (the warm-up), or why it was not.
        noise_scale_error: the noise scale's relative standard error: the bound is the
            largest B_simple it supports (`noise.upper_limit`); from `noise.MAX_ERROR` on
            it is too noisy to bound the batch and was not applied.
        limits: the largest batch each limit allows: "memory" (the largest that ran),
            "throughput knee", "noise scale" (B_simple), "steps per epoch" (the
            examples over `min_steps_per_epoch`) and "time to accuracy" (within the
            others, the batch predicted to reach a loss soonest from B_simple and the
            examples/s), those that were measured.
        decided_by: which of them set `best_batch_size` (the smallest): "throughput
            knee", "memory" (examples/s still grew at the largest batch that fits),
            "noise scale", "steps per epoch" or "time to accuracy".
        accumulate_steps: for it, the fewest batches to accumulate per applied step so
            that each one fits: pass `Trainer(accumulate_steps=...)` with a global batch of
            `effective_batch_size // accumulate_steps` (None without an effective batch).
        declined: when the time limit stopped the search at its first reading: what it
            spent, and from what job size (or `budget_s`) the next probe fits; else None.
        compared: when the knee's interleaved readings (the first candidate, the
            single readings' knee, the fastest others) did not decide within a 95 %
            interval and the knee's tolerance: their verdict ("no measurable difference
            ...: kept the simpler ..."), the smaller batch kept; else None.
    """

    max_batch_size: int
    best_batch_size: int
    rows: list[ProbeRow]
    mode: str
    knee: float
    memory_budget_mb: float | None
    memory_kind: str
    probe_seconds: float
    effective_batch_size: int | None = None
    accumulate_steps: int | None = None
    capped_by: str | None = None
    examples: int | None = None
    noise_scale: float | None = None
    decided_by: str = "throughput knee"
    noise_scale_note: str = ""
    limits: dict = dataclasses.field(default_factory=dict)
    noise_scale_error: float | None = None
    declined: str | None = None
    compared: str | None = None

    @property
    def accumulation_batch_size(self) -> int | None:
        """The global batch of each accumulated step (None without an effective batch)."""
        if self.effective_batch_size is None or self.accumulate_steps is None:
            return None
        return self.effective_batch_size // self.accumulate_steps

    @property
    def best_examples_per_second(self) -> float | None:
        """Examples/s measured at `best_batch_size`."""
        rates = [r.examples_per_second for r in self.rows if r.batch_size == self.best_batch_size]
        return max((r for r in rates if r is not None), default=None)

    def to_dict(self) -> dict:
        """A JSON-ready dict (no NaN: missing values are None)."""
        data = dataclasses.asdict(self)
        data["rows"] = [row.to_dict() for row in self.rows]
        data["noise_scale"] = _json_number(self.noise_scale)
        data["noise_scale_error"] = _json_number(self.noise_scale_error)
        data["limits"] = {name: _json_number(value) for name, value in self.limits.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict) -> BatchSizeReport:
        """Rebuilds a report from `to_dict()`'s output (e.g. read back from JSON)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        values["rows"] = [ProbeRow(**row) for row in data["rows"]]
        values["noise_scale"] = _number(values.get("noise_scale"))
        values["noise_scale_error"] = _number(values.get("noise_scale_error"))
        values["limits"] = {k: _number(v) for k, v in values.get("limits", {}).items()}
        return cls(**values)

    def table(self) -> str:
        """A readable table of the candidates, marking the largest fit and the knee."""
        header = ("batch", "fits", "examples/s", "peak MiB", "predicted MiB", "reason", "")
        lines = [header]
        for row in sorted(self.rows, key=lambda r: r.batch_size):
            marks = []
            if row.fits and row.batch_size == self.best_batch_size:
                why = "knee" if self.decided_by == "throughput knee" else self.decided_by
                marks.append(f"best ({why})")
            if row.fits and row.batch_size == self.max_batch_size:
                marks.append("largest")
            lines.append(
                (
                    str(row.batch_size),
                    row.fits_text(),
                    _num(row.examples_per_second, 1),
                    _num(row.peak_memory_mb, 1),
                    _num(row.predicted_memory_mb, 1),
                    row.reason,
                    ", ".join(marks),
                )
            )
        widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
        text = [
            "  ".join(
                cell.rjust(w) if i < 5 else cell.ljust(w)
                for i, (cell, w) in enumerate(zip(line, widths, strict=True))
            ).rstrip()
            for line in lines
        ]
        budget = _num(self.memory_budget_mb, 0)
        text.append(
            f"largest batch that ran: {self.max_batch_size}; throughput knee (within "
            f"{self.knee:.0%} of the highest examples/s): "
            f"{self.limits.get('throughput knee', self.best_batch_size)}; "
            f"{self.memory_kind} memory budget {budget} MiB; {self.mode} search in "
            f"{self.probe_seconds:.1f} s"
        )
        if self.limits:
            text.append(f"limits: {self.limits_line()}")
            why = "knee" if self.decided_by == "throughput knee" else self.decided_by
            text.append(f"best batch {self.best_batch_size}, decided by the {why}")
        if self.noise_scale_note and self.noise_scale_note != "not asked for":
            text.append(f"noise scale {self.noise_scale_note}")
        if self.capped_by is not None:
            text.append(f"search capped by {_CAPS[self.capped_by].format(self.examples)}")
        if self.declined:
            text.append(self.declined)
        if self.compared:
            text.append(self.compared)
        if self.accumulate_steps is not None:
            text.append(
                f"effective batch {self.effective_batch_size} = {self.accumulate_steps} x "
                f"{self.accumulation_batch_size}: batch the data to "
                f"{self.accumulation_batch_size} and pass "
                f"Trainer(accumulate_steps={self.accumulate_steps})"
            )
        return "\n".join(text)

    def __str__(self) -> str:
        return self.table()

    def limits_line(self) -> str:
        """The limits on one line, e.g. `memory <= 1024, throughput knee 256, ...`."""
        parts = []
        for name, value in self.limits.items():
            if name == "noise scale":
                shown = "not measured" if value is None else f"B_simple ≈ {_batch(value)}"
                error = self.noise_scale_error
                if value is not None and error is not None:
                    shown += f" ± {error_text(error)}"
                    bound = upper_limit(value, error)
                    shown += (
                        " (too noisy: not applied)"
                        if math.isinf(bound)
                        else f" (allows ≤ {_batch(bound)})"
                    )
                parts.append(f"noise scale {shown}")
            elif name == "memory":
                parts.append(f"memory ≤ {value} (largest that ran)")
            else:
                parts.append(f"{name} ≤ {_batch(value)}")
        return "; ".join(parts)

    def plot(self, path: str | os.PathLike) -> str:
        """Writes a PNG: examples/s and peak memory against the batch size; returns the path.

        Needs matplotlib (`pip install matplotlib`); uses its Agg canvas, so it changes
        no global backend and needs no display.
        """
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure
        except ImportError as error:  # pragma: no cover - depends on the environment
            raise ImportError(
                "BatchSizeReport.plot needs matplotlib. Install it with "
                "`pip install matplotlib` (or tfaccel's `recipes` extra)."
            ) from error
        timed = sorted(
            (
                (r.batch_size, r.examples_per_second)
                for r in self.rows
                if r.fits and r.examples_per_second is not None
            ),
            key=lambda pair: pair[0],
        )
        measured = sorted(
            ((r.batch_size, r.peak_memory_mb) for r in self.rows if r.peak_memory_mb is not None),
            key=lambda pair: pair[0],
        )
        figure = Figure(figsize=(7, 4), dpi=100)
        FigureCanvasAgg(figure)
        speed = figure.add_subplot(1, 1, 1)
        speed.plot(
            [size for size, _ in timed],
            [rate for _, rate in timed],
            "o-",
            color="tab:blue",
            label="examples/s",
        )
        speed.set_xscale("log", base=2)
        speed.set_xlabel("global batch size")
        speed.set_ylabel("examples/s", color="tab:blue")
        why = "knee" if self.decided_by == "throughput knee" else self.decided_by
        speed.axvline(
            self.best_batch_size, color="tab:green", linestyle="--", label=f"best ({why})"
        )
        if (
            self.noise_scale is not None
            and math.isfinite(self.noise_scale)
            and self.noise_scale > 0
        ):
            speed.axvline(self.noise_scale, color="tab:purple", linestyle="-.", label="B_simple")
        speed.axvline(self.max_batch_size, color="tab:red", linestyle=":", label="largest fit")
        memory = speed.twinx()
        memory.plot(
            [size for size, _ in measured],
            [peak for _, peak in measured],
            "s-",
            color="tab:orange",
            label=f"peak {self.memory_kind} MiB",
        )
        if self.memory_budget_mb:
            memory.axhline(self.memory_budget_mb, color="tab:orange", linestyle="--", alpha=0.5)
        memory.set_ylabel(f"peak {self.memory_kind} memory (MiB)", color="tab:orange")
        handles = speed.get_legend_handles_labels()[0] + memory.get_legend_handles_labels()[0]
        speed.legend(handles=handles, loc="upper left", fontsize="small")
        speed.set_title(f"batch-size search ({self.mode})")
        figure.tight_layout()
        path = os.fspath(path)
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        figure.savefig(path, format="png")
        return path


_CAPS = {
    "memory": "memory: a larger batch did not fit",
    "data": "the data: it holds {} examples, so no larger batch was tried",
    "steps per epoch": "steps per epoch: a larger batch leaves too few on {} examples",
    "limit": "limit: no larger batch was tried",
    "time": "time: the search's time budget was spent, no larger batch was tried",
}


def _batch(value: float) -> str:
    return "unbounded" if math.isinf(value) else f"{value:,.0f}"


def _json_number(value):
    """inf as the string "inf" (JSON has no infinity; None means not measured)."""
    return "inf" if isinstance(value, float) and math.isinf(value) else value


def _number(value):
    return math.inf if value == "inf" else value


def _num(value: float | None, digits: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"
