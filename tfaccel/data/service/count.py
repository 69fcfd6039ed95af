"""The examples a service epoch delivered, counted here and said when it ends short.

With dynamic sharding a killed worker's splits are lost for its epoch (see
`tfaccel.data.service.watch`). `counted` wraps the dataset read from the service: each
batch adds its size to a count in this process (one `numpy_function` a batch), and when
an epoch ends (the iterator is exhausted) the count is compared with the examples the
source holds; a short epoch is said on stderr with the number lost.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["Counter", "counted"]


class Counter:
    """Examples delivered by the epoch in progress, and each finished epoch's total."""

    def __init__(self, expected: int, address: str, err: TextIO | None = None) -> None:
        self.expected, self.address, self.err = expected, address, err
        self.now = 0
        self.epochs: list[int] = []
        self._lock = threading.Lock()

    def add(self, n: Any) -> int:
        with self._lock:
            self.now += int(n)
        return 0

    def end(self) -> int:
        """Closes the epoch; says it when it ended short."""
        with self._lock:
            got, self.now = self.now, 0
            self.epochs.append(got)
        if got < self.expected:
            print(
                f"tfaccel data service: this epoch delivered {got:,} of {self.expected:,} "
                f"examples from {self.address}; {self.expected - got:,} lost (a worker died "
                "mid-epoch: dynamic sharding reads each example at most once an epoch)",
                file=self.err or sys.stderr,
                flush=True,
            )
        return 0


def counted(
    dataset: tf.data.Dataset, expected: int, address: str
) -> tuple[tf.data.Dataset, Counter]:
    """`dataset` (batches from the service) with its examples counted; `(dataset, Counter)`."""
    import tensorflow as tf

    counter = Counter(expected, address)

    def count(*element):
        size = tf.shape(tf.nest.flatten(element)[0], out_type=tf.int64)[0]
        tick = tf.numpy_function(counter.add, [size], tf.int64, stateful=True)
        with tf.control_dependencies([tick]):
            out = tf.nest.map_structure(tf.identity, element)
        return out if len(element) > 1 else out[0]

    def end(_):
        return tf.numpy_function(counter.end, [], tf.int64, stateful=True)

    nothing = dataset.take(0)  # the structure of `dataset`, never iterated
    ender = tf.data.Dataset.range(1).map(end).filter(lambda _: False)
    ender = ender.flat_map(lambda _: nothing)
    return dataset.map(count).concatenate(ender), counter
