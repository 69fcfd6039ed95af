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

import dataclasses
import os
import re
import time

MAX_GROWS = 3
"""How many times one launch grows a job back."""
_POLL_S = 0.5


_LATEST = re.compile(r'^\s*model_checkpoint_path:\s*"([^"]*)"', re.MULTILINE)
_NAME = re.compile(r"^ckpt-(\d+)$")


@dataclasses.dataclass(frozen=True)
class Elastic:
    """How a launched job changes size (`tfaccel launch --min-workers/--max-workers`).

    Attributes:
        min_workers: once a worker has failed after the last restart, re-form the job
            without it while at least this many remain; None: give up instead.
        max_workers: while on fewer workers, once the job has saved a new checkpoint,
            stop it (SIGTERM) and re-form it on this many; needs `checkpoint_dir`. None:
            never grow.
        checkpoint_dir: the job's checkpoint directory (names the step a re-formed job
            resumes from).
    """

    min_workers: int | None = None
    max_workers: int | None = None
    checkpoint_dir: str | None = None


def last_step(checkpoint_dir: str | None) -> int | None:
    """The step of the latest checkpoint in `checkpoint_dir`: the one its state file (the
    `checkpoint` file the Trainer rewrites once a save is complete, what
    `tf.train.latest_checkpoint` reads) names as `ckpt-N`, if its index file is there.

    Other `ckpt-N` files (a save still being written, a stray copy) are not checkpoints.
    """
    if not checkpoint_dir:
        return None
    try:
        with open(os.path.join(checkpoint_dir, "checkpoint"), encoding="utf-8") as file:
            found = _LATEST.search(file.read())
    except (OSError, UnicodeDecodeError):
        return None
    name = os.path.basename(found.group(1)) if found else ""
    match = _NAME.match(name)
    if match is None or not os.path.isfile(os.path.join(checkpoint_dir, f"{name}.index")):
        return None
    return int(match.group(1))


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
