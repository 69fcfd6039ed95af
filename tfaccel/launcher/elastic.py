"""Growing a shrunken job back: `tfaccel launch --max-workers N`.

A job that lost workers (`--min-workers`) runs on fewer. With `max_workers`, once the
smaller job has saved a checkpoint past the one it resumed from (it trains, so the
machine can run workers again), the launcher asks its workers to stop (SIGTERM: the
Trainer ends its step loop, saves and exits) and re-forms the job on `max_workers`
from that checkpoint, exactly as it shrinks (a `tfaccel.data` pipeline over rows in
memory reads one global order). A grown job that fails again shrinks again; growth
is tried `MAX_GROWS` times at most.
"""

from __future__ import annotations

import os
import time

MAX_GROWS = 3
"""How many times one launch grows a job back."""
_POLL_S = 0.5


def last_step(checkpoint_dir: str | None) -> int | None:
    """The step of the newest checkpoint in `checkpoint_dir` (files `ckpt-N.index`)."""
    steps = []
    if checkpoint_dir and os.path.isdir(checkpoint_dir):
        for name in os.listdir(checkpoint_dir):
            stem = name[len("ckpt-") : -len(".index")]
            if name.startswith("ckpt-") and name.endswith(".index") and stem.isdigit():
                steps.append(int(stem))
    return max(steps) if steps else None


class GrowWatch:
    """Says when a job running on fewer than `max_workers` should grow back."""

    def __init__(self, checkpoint_dir: str, workers: int, max_workers: int):
        self.checkpoint_dir = checkpoint_dir
        self.active = workers < max_workers
        self.since = last_step(checkpoint_dir)
        self.step: int | None = None
        self.next_poll = 0.0

    def due(self) -> bool:
        """Whether a checkpoint newer than the one this job started from exists."""
        now = time.monotonic()
        if not self.active or now < self.next_poll:
            return False
        self.next_poll = now + _POLL_S
        step = last_step(self.checkpoint_dir)
        if step is not None and (self.since is None or step > self.since):
            self.step = step
            return True
        return False
