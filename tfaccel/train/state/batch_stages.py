"""`methods.ProgressiveBatch` in the Trainer: the batch of each epoch, and the data's position.

The Trainer reads its training data as one stream of the job's batches (the start batch
`b`, `steps_per_epoch` = S of them an epoch). With the progressive batch, epoch e's S
batches are regrouped in the stream into batches of `g(e) * b` examples — the same
examples in the same order as `methods.for_fit` regroups each epoch for `model.fit` — so
epoch e makes `ceil(S / g(e))` optimizer steps (the count the method sizes schedules to).
Batches never cross an epoch's end: its last one holds what is left.

One stream serves every stage (a second iterator of the data would draw a reshuffling
`shuffle`'s next seeds), so its batch dimension is dynamic: the step loop is traced once
for all stages (with XLA, compiled once per batch size).

The position is counted in batches of the start size (examples / b; an epoch's partial
last batch counts as one): a resumed run skips that many and regroups from there. Each
checkpoint records it with the stage (`record`), so a resume knows where the data is even
when the stages moved (other epochs); a checkpoint without the record (saved before, or
without the method) is read as a run of the start batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import tensorflow as tf

if TYPE_CHECKING:
    from tfaccel.data import Feed

RECORD_KEY = "batch_stage"  # the run shape's entry (not compared on resume)


class BatchStages:
    """The stages of one `fit`: each epoch's growth, its steps, and the regrouping.

    Args:
        factors: the growth of epochs 0, 1, ... (the last holds after them).
        steps_per_epoch: S, batches of the start size an epoch.
        batch: b, the start (global) batch.
        then: dataset -> dataset applied after the regrouping (the methods' batch maps,
            which read the grown batches as `model.fit`'s do).
        source: the training feed without those maps (None: the loop's feed is read).

    Raises:
        ValueError: no factor, a factor < 1, or `steps_per_epoch` / `batch` < 1.
    """

    def __init__(
        self,
        factors: tuple[int, ...],
        steps_per_epoch: int,
        batch: int,
        then: Callable[[tf.data.Dataset], tf.data.Dataset] | None = None,
        source: Feed | None = None,
    ) -> None:
        if not factors or min(factors) < 1 or steps_per_epoch < 1 or batch < 1:
            raise ValueError(
                f"batch stages need factors >= 1, steps_per_epoch >= 1 and batch >= 1, got "
                f"{factors}, {steps_per_epoch}, {batch}."
            )
        self.factors = tuple(int(f) for f in factors)
        self.steps_per_epoch = int(steps_per_epoch)
        self.batch = int(batch)
        self.then, self.source = then, source

    def factor(self, epoch: int) -> int:
        """The growth of `epoch` (0-based; the last factor after the table)."""
        return self.factors[min(max(epoch, 0), len(self.factors) - 1)]

    def steps_in(self, epoch: int) -> int:
        """Optimizer steps of `epoch`: `ceil(S / g)`."""
        return math.ceil(self.steps_per_epoch / self.factor(epoch))

    def batches_before(self, epoch: int, epoch_step: int) -> int:
        """Batches of the start size read before step `epoch_step` of `epoch`."""
        inside = min(epoch_step * self.factor(epoch), self.steps_per_epoch)
        return epoch * self.steps_per_epoch + inside

    def record(self, epoch: int, epoch_step: int) -> dict[str, int]:
        """What a checkpoint holds at this position: the stage and the data's position."""
        batches = self.batches_before(epoch, epoch_step)
        return {
            "epoch": epoch,
            "epoch_step": epoch_step,
            "factor": self.factor(epoch),
            "batch": self.factor(epoch) * self.batch,
            "start_batch": self.batch,
            "batches_read": batches,
            "examples_read": batches * self.batch,
        }

    def resumed(self, epoch: int, epoch_step: int, saved: dict | None) -> tuple[int, int]:
        """(batches read, this run's step within `epoch`) at a restored position.

        `saved` is the checkpoint's `record` (None: a checkpoint without one, whose steps
        read one start batch each). A position the stages of this run put elsewhere (the
        epochs or the method changed) continues after the batches read, the step being
        the stage batches they fill.
        """
        if saved is None:
            batches = epoch * self.steps_per_epoch + min(epoch_step, self.steps_per_epoch)
        elif saved.get("factor") == self.factor(epoch) and saved.get("epoch") == epoch:
            return self.batches_before(epoch, epoch_step), epoch_step
        else:
            batches = int(saved["batches_read"])
        epoch, inside = divmod(batches, self.steps_per_epoch)
        return batches, inside // self.factor(epoch)

    def regroup(self, dataset: tf.data.Dataset, first: int) -> tf.data.Dataset:
        """`dataset` (the start batches from batch `first` of the run on) regrouped by
        epoch: g consecutive batches of an epoch make one (its last ones what is left),
        the first group short when `first` is inside one. Then `then`."""
        steps = self.steps_per_epoch
        table = tf.constant(self.factors, tf.int64)
        last = len(self.factors) - 1

        def growth(epoch: tf.Tensor) -> tf.Tensor:
            return tf.gather(table, tf.minimum(epoch, last))

        def key(index: tf.Tensor, _: Any) -> tf.Tensor:
            epoch = index // steps
            return epoch * steps + (index % steps) // growth(epoch)

        epoch0, inside0 = divmod(first, steps)
        key0 = epoch0 * steps + inside0 // self.factor(epoch0)
        read0 = inside0 % self.factor(epoch0)  # batches of the first group read already

        def size(group: tf.Tensor) -> tf.Tensor:
            g = growth(group // steps)
            full = tf.minimum(g, steps - (group % steps) * g)
            return full - tf.where(group == key0, tf.constant(read0, tf.int64), 0)

        most = max(self.factors) * self.batch

        def merged(_: tf.Tensor, window: tf.data.Dataset) -> tf.data.Dataset:
            return window.map(lambda _, element: element).unbatch().batch(most)

        grouped = dataset.enumerate(first).group_by_window(key, merged, window_size_func=size)
        return self.then(grouped) if self.then is not None else grouped

    def describe(self) -> str:
        """The settings-table row: each stage's batch, epochs and steps; the traces."""
        epochs = len(self.factors)
        parts, start = [], 0
        for end in range(1, epochs + 1):
            if end == epochs or self.factors[end] != self.factors[start]:
                span = f"epoch {start + 1}" if end == start + 1 else f"epochs {start + 1}-{end}"
                steps = self.steps_in(start)
                each = f"{steps} step{'s' if steps > 1 else ''} each"
                parts.append(f"{self.factors[start] * self.batch} ({span}, {each})")
                start = end
        return (
            f"{' -> '.join(parts)}: {len(parts)} stage(s), each epoch's batches regrouped (the "
            "same examples, the same order); one input stream, its batch dimension dynamic: "
            "the step loop traced once for all stages (at most one trace a stage)"
        )
