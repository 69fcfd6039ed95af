"""`fit(divergence_loops=..., restore_on_divergence=...)`: a run whose loss or weights stop
being finite ends with `TrainingDivergedError`, checked once per step loop.

A weight that became NaN/inf (`LoopResult.nonfinite`) ends the run at once; a non-finite
loop loss ends it after `divergence_loops` consecutive loops (loss scaling skips a few
non-finite steps on its own). While a loop's loss is not finite no checkpoint is written
(`healthy`), so the last checkpoint stays a good one to restore.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from tfaccel.errors import TrainingDivergedError
from tfaccel.train.step.runner_interface import LoopResult


class Divergence:
    """Counts consecutive step loops with a non-finite loss.

    Args:
        loops: `divergence_loops`, the loops tolerated in a row.
        restore: called before raising (`restore_on_divergence`: back to the last good
            checkpoint), or None.
    """

    def __init__(self, loops: int, restore: Callable[[], None] | None = None):
        self.loops = loops
        self.restore = restore
        self.bad_loops = 0

    @property
    def healthy(self) -> bool:
        """Whether the last loop's loss was finite (a save may be written)."""
        return self.bad_loops == 0

    def check(self, result: LoopResult, step: int) -> None:
        """After a loop ending at global `step`.

        Raises:
            TrainingDivergedError: a weight is not finite, or the loss was not finite in
                `loops` consecutive loops.
        """
        if result.nonfinite is not None:
            self._restore()
            raise TrainingDivergedError(step, variable=result.nonfinite)
        if math.isfinite(result.loop_loss):
            self.bad_loops = 0
            return
        self.bad_loops += 1
        if self.bad_loops >= self.loops:
            self._restore()
            raise TrainingDivergedError(step, self.bad_loops, result.loop_loss)

    def _restore(self) -> None:
        if self.restore is not None:
            self.restore()
