"""The result of a learning-rate range test: the curve, the suggestion or why there is none."""

from __future__ import annotations

import dataclasses
import math
import os
import textwrap
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes


@dataclasses.dataclass
class LearningRateReport:
    """What `find_learning_rate` measured and suggests.

    Attributes:
        suggestion: the rate to train at (the base rate of a schedule), or None.
        reason: why that rate, or why none (flat, too noisy, diverged at once, barely
            learned; "too small to pay" when a job sized by `job_examples` ran no test).
        rates: the rate of each recorded point (one per step, or per loop of steps).
        losses: the training loss of each point.
        smoothed: the running-median loss the rule read (finite part of the curve).
        minimum_rate: the rate at the smoothed minimum (None when unread).
        steepest_rate: what the steepest-descent rule (Lightning's kind) reads from the
            same curve, for comparison; None when the curve is too short.
        noise: the robust noise of one loss.
        stopped: why the ramp ended: "end of ramp", "diverged", "non-finite input" (a
            batch with NaN or Inf), "budget", "data",
            "declined" (its first timed steps projected it past `budget_s`), or "not run"
            (too small to pay: the curve is then empty).
        steps: training steps the test ran.
        seconds: its wall time.
        schedule: the optimizer's schedule class when it has one (the rates are then its
            base rate), else None.
        ramp_steps: the ramp's planned steps (`num_steps`, or fewer when sized by
            `job_examples`; 0 when not run).
        batch_size: the global batch the rate is for (the data's static batch, or
            `batch_size` for arrays); None when the data's batch is not static. A rate
            is found for one batch: at another, scale it (`tuning.scaled_learning_rate`)
            or test again (`tune` tests at the batch it recommends).
    """

    suggestion: float | None
    reason: str
    rates: list[float]
    losses: list[float]
    smoothed: list[float]
    minimum_rate: float | None
    steepest_rate: float | None
    noise: float | None
    stopped: str
    steps: int
    seconds: float
    schedule: str | None = None
    ramp_steps: int | None = None
    batch_size: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The report as a dict of JSON-ready values (non-finite losses become None)."""
        out = dataclasses.asdict(self)
        for key in ("losses", "smoothed"):
            out[key] = [v if math.isfinite(v) else None for v in out[key]]
        return out

    def __str__(self) -> str:
        rate = "none" if self.suggestion is None else f"{self.suggestion:.3g}"
        if self.batch_size is not None:
            rate += f" at batch {self.batch_size}"
        base = f" (the base rate of {self.schedule})" if self.schedule else ""
        return (
            f"learning rate: {rate}{base}; {self.reason}. {self.steps} steps over rates "
            f"{self.rates[0]:.3g}..{self.rates[-1]:.3g} ({self.stopped}), {self.seconds:.1f} s."
            if self.rates
            else f"learning rate: {rate}; {self.reason}."
        )

    def plot(self, path: str | os.PathLike | None = None, ax: Axes | None = None) -> Axes:
        """Draws the loss against the rate (log axis), the smoothed curve and the picks.

        Args:
            path: save the figure here (PNG or any format matplotlib knows; its folder is
                created).
            ax: draw on this matplotlib axis instead of a new figure.

        Returns:
            The matplotlib axis.
        """
        if ax is None:  # its own Agg canvas: no global backend changed, no display needed
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure

            figure = Figure(figsize=(6, 4))
            FigureCanvasAgg(figure)
            ax = figure.subplots()
        if not self.rates:  # no test ran (too small to pay): the figure says why
            ax.text(0.5, 0.5, textwrap.fill(self.reason, 60), ha="center", va="center")
            ax.set_axis_off()
            ax.set_title("no range test: " + self.reason.split(":")[0])
        else:
            self._draw(ax)
        if path is not None:
            folder = os.path.dirname(os.fspath(path))
            if folder:
                os.makedirs(folder, exist_ok=True)
            # a Figure's axis (ours, or the caller's); a SubFigure has no savefig
            ax.figure.savefig(os.fspath(path), dpi=100, bbox_inches="tight")  # type: ignore[union-attr]
        return ax

    def _draw(self, ax: Axes) -> None:
        ax.plot(self.rates, self.losses, ".", color="0.6", label="loss per step")
        n = len(self.smoothed)
        if n:
            ax.plot(self.rates[:n], self.smoothed, "-", color="C0", label="running median")
        if self.steepest_rate is not None:
            ax.axvline(self.steepest_rate, color="C1", ls=":", label="steepest descent")
        if self.suggestion is not None:
            ax.axvline(self.suggestion, color="C3", label=f"suggested {self.suggestion:.3g}")
        ax.set_xscale("log")
        ax.set_xlabel("learning rate" + (f" (base of {self.schedule})" if self.schedule else ""))
        ax.set_ylabel("training loss")
        finite = [v for v in self.smoothed if math.isfinite(v)]
        if finite:  # the divergence's tail would hide the descent
            low, high = min(finite), max(finite)
            ax.set_ylim(low - 0.1 * (high - low + 1e-12), high + 0.5 * (high - low + 1e-12))
        title = "no suggestion: " + self.reason.split(":")[0] if self.suggestion is None else ""
        ax.set_title(title)
        ax.legend(fontsize="small")
