"""What a `fit`'s outer loop says while it runs: lines for the user and settings-table rows.

A line is printed at `verbose` > 0 and logged otherwise; a row joins the settings table
(`Trainer.settings`) when `fit` ends. The events said: an out-of-memory split of the
inner loop (`LoopResult.note`), the steps per loop once measured, and what a resume
changed or could not reproduce.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("tfaccel")


class Notes:
    """The loop's announcements.

    Args:
        verbose: `fit`'s verbosity (0: log, do not print).

    Attributes:
        table: additions to the settings table, by row name.
    """

    def __init__(self, verbose: int | str = 0):
        self.verbose = verbose
        self.table: dict[str, Any] = {}

    def say(self, message: str) -> None:
        """Prints `message` at `verbose` > 0, else logs it (INFO)."""
        if self.verbose:
            print(message)
        else:
            logger.info(message)

    def out_of_memory(self, note: str) -> None:
        """`on_oom="accumulate"` split the batch (`LoopResult.note`): a warning, always shown."""
        self.table["on_oom"] = f"accumulate: {note}"
        logger.warning(note)
        if self.verbose:
            print(note)

    def loop_size(self, text: Any) -> None:
        """The steps per loop were measured: `text` says n and why."""
        self.table["steps_per_loop"] = text
        self.say(f"steps_per_loop: {text}")
