"""A worker failing at once on every start: a script error, not a lost worker.

Elastic launching (`--min-workers`) re-forms the job without a worker that still fails
after its restarts. A worker whose script exits by itself with a non-zero status within
`AT_ONCE_S` of each start of the job's current shape fails the same way on any number of
workers: the launcher says so and stops instead of shrinking the job.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TextIO

AT_ONCE_S = 10.0  # a failure this soon after a start is the script's, not a machine's


class Starts:
    """The starts of the job's current shape (worker count), timed."""

    def __init__(self) -> None:
        self.at_once: list[bool] = []

    def reset(self) -> int:
        """A new shape: forget the starts; returns 0 (the restarts of the new shape)."""
        self.at_once = []
        return 0

    def timed(self, run: Callable[..., Any], *args: Any) -> Any:
        """`run(*args)`, noting whether it ended in a worker's own non-zero exit at once."""
        began = time.monotonic()
        result = run(*args)
        own_exit = result.worker is not None and "died" not in result.what
        self.at_once.append(own_exit and time.monotonic() - began < AT_ONCE_S)
        return result

    def script_error(self, result: Any, err: TextIO) -> bool:
        """True (and says so on `err`) when every start of this shape failed at once."""
        if not self.at_once or not all(self.at_once):
            return False
        starts = len(self.at_once)
        err.write(
            f"[launch] {result.what} within {AT_ONCE_S:g} s of each of its {starts} start(s): "
            "a script error, not a lost worker (the same script fails on any number of "
            f"workers); stopping with exit status {result.status} instead of continuing on "
            "fewer workers. Its output is above.\n"
        )
        err.flush()
        return True
