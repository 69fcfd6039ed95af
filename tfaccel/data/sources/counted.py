"""`from_generator(..., count=N)`: the generators counted, a wrong `count=` named.

tf.data's own cardinality assertion fails with a FailedPreconditionError that names no
argument. Here each shard's generator is counted as it is read; a round in which every
shard ended with a total other than `count` (or any read past it) raises a ValueError that
names `count=` and the shards that yielded nothing. A round that reads a subset of the
shards (one input pipeline of several) is checked only for going past `count`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Counted:
    """Wraps `fn` (`fn()` or `fn(shard, shards)`) so that its generators are counted."""

    def __init__(self, fn: Callable, count: int, shards: int | None):
        self.fn, self.count, self.shards = fn, count, shards or 1
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self._lock = threading.Lock()
        self._yielded: dict[int, int] = {}
        self._ended: set[int] = set()

    def __getstate__(self):  # shipped to data-service workers: no lock, no counts
        return {"fn": self.fn, "count": self.count, "shards": self.shards}

    def __setstate__(self, state):
        self.__init__(state["fn"], state["count"], state["shards"])

    def __call__(self, *args):
        shard = int(args[0]) if args else 0
        with self._lock:
            if shard in self._yielded:  # the shard starts again: a new round (epoch)
                self._yielded, self._ended = {}, set()
            self._yielded[shard] = 0
        for element in self.fn(*args):
            with self._lock:
                self._yielded[shard] = self._yielded.get(shard, 0) + 1
                total = sum(self._yielded.values())
            if total > self.count:
                raise ValueError(self._message(f"more than {self.count}"))
            yield element
        with self._lock:
            self._ended.add(shard)
            whole = len(self._ended) == self.shards
            total = sum(self._yielded.values())
        if whole and total != self.count:
            raise ValueError(self._message(str(total)))

    def _message(self, yielded: str) -> str:
        empty = sorted(s for s, n in self._yielded.items() if n == 0)
        what = "generator" if self.shards == 1 else f"{self.shards} shards"
        said = f"; shard(s) {', '.join(map(str, empty))} yielded nothing" if empty else ""
        return (
            f"from_generator: count={self.count}, but the {what} of {self.__name__!r} "
            f"yielded {yielded} elements{said}. Pass the true number of elements as count= "
            "(all shards together), or count=None if it is not known."
        )
