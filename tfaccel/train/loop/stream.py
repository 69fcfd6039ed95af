"""The training input of one `fit`: epochs over it, iterators positioned after a resume, and
what the loop says when it runs dry.

A finite dataset of known length runs as one repeated stream with `steps_per_epoch` = its
length, so a single iterator spans the whole run. Resuming restores that iterator from the
checkpoint when it is a plain `tf.data` iterator (default / one-device strategy);
distributed iterators cannot be saved, so they are fast-forwarded with `skip` over the
steps already done (exact for a deterministic, seeded pipeline; cheap when the pipeline
caches). Datasets of unknown length get a new iterator each epoch and, on resume, restart
the interrupted epoch. With gradient accumulation an epoch counts applied steps of
`accumulate` batches each. With the progressive batch (`batch_stages.BatchStages`) the
stream is regrouped epoch by epoch, never saved with the checkpoint: a resume skips the
batches read (of the start size) and regroups from there.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import tensorflow as tf

from tfaccel.data import iterators
from tfaccel.data.service.stage import RESUME_NOTE
from tfaccel.train.step import accumulation

if TYPE_CHECKING:
    from tfaccel.data import Feed
    from tfaccel.train.loop.notes import Notes
    from tfaccel.train.state.batch_stages import BatchStages
    from tfaccel.train.step.runner_interface import Batches


class Stream:
    """The training `Feed` as the loop reads it.

    Args:
        train: the training `Feed`.
        steps_per_epoch: `fit`'s (batches; None: the data's length, when known).
        accumulate: batches per applied step (the runner's `batches_per_step`).
        stages: the progressive batch's stages (None: one batch); their `source` feed
            (without the methods' maps, which follow the regrouping) is read.

    Attributes:
        feed: the feed read (repeated when its length made `steps_per_epoch`).
        stream: one iterator spans the run (a length is known); else one per epoch.
        steps_per_epoch: applied steps per epoch (None: until the data ends).
    """

    def __init__(
        self,
        train: Feed,
        steps_per_epoch: int | None,
        accumulate: int = 1,
        stages: BatchStages | None = None,
    ):
        self.stages = stages
        if stages is not None and stages.source is not None:
            train = stages.source
        self.stream = steps_per_epoch is not None or train.steps >= 0
        self.endless = train.steps == tf.data.INFINITE_CARDINALITY
        if steps_per_epoch is None and train.steps >= 0:
            steps_per_epoch = train.steps
            train = train.repeated()
            self.endless = True
        self.feed = train
        self.accumulate = accumulate
        self.steps_per_epoch = accumulation.applied_steps(steps_per_epoch, accumulate)

    def saveable(self) -> bool:
        """Whether an iterator of it can join a checkpoint (asked before making it): one
        stream, read by a plain `tf.data` iterator (a strategy that distributes nothing),
        not regrouped by batch stages (a resume skips to their position)."""
        return self.stream and self.stages is None and self.feed.iterator_saveable()

    def iterator(
        self,
        resumed_steps: int = 0,
        *,
        positions: bool = False,
        notes: Notes | None = None,
        first: int = 0,
    ) -> Batches:
        """A new iterator, positioned after `resumed_steps` applied steps.

        Args:
            resumed_steps: applied steps already done (skipped).
            positions: the iterator will be checkpointed: its state holds positions, not
                buffers, where the feed allows (exact orders after a restore).
            notes: a `notes.Notes` told when a resume cannot be exact (the data service
                restarts the epoch's input).
        """
        feed = self.feed
        if positions and self.stream and self.stages is None and feed.symbolic_supported():
            feed = feed.symbolic()
        if resumed_steps:
            feed = feed.skipped(resumed_steps * self.accumulate)
            if feed.service is not None and notes is not None:
                notes.table["resume"] = RESUME_NOTE
        stages = self.stages
        if stages is not None:
            feed = feed.mapped(lambda dataset: stages.regroup(dataset, first))
        return iterators.adopt(iter(feed.distribute(endless=self.endless)))


def no_batch(epoch: int, trained: bool) -> None:
    """An epoch of data of unknown length yielded nothing: an error, or the end.

    Raises:
        ValueError: nothing at all was trained (the first epoch read no batch).
    """
    if trained:  # e.g. a one-shot generator: as model.fit, stop with a warning
        warnings.warn(
            f"The training data yielded no batch in epoch {epoch + 1}; training stops "
            "here. A dataset of unknown length must yield data on every pass (use a "
            "tf.data source, not a one-shot generator, or set steps_per_epoch and "
            ".repeat()).",
            stacklevel=4,
        )
        return
    raise ValueError(
        f"The training data yielded no batch in epoch {epoch + 1}. Its length is "
        "unknown, so this shows only now: a filter that keeps nothing, or a source with "
        "no records? Check it with next(iter(dataset))."
    )


def warn_exhausted(step: int, epochs: int, steps_per_epoch: int | None) -> None:
    """The data ran out before `epochs` epochs of `steps_per_epoch` steps."""
    warnings.warn(
        f"The training data ran out after {step} steps, before {epochs} epochs of "
        f"{steps_per_epoch} steps; add .repeat() to the dataset or lower steps_per_epoch.",
        stacklevel=4,
    )
