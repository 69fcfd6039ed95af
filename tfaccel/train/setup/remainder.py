"""Examples a `drop_remainder=True` batch leaves out of every epoch, said once per `fit`.

The Trainer trains a partial last batch exactly (its loss averaged over the examples it
holds, on 1 or many replicas), so `tfaccel.data.pipeline` keeps it by default and drops it
only for XLA (`jit_compile`: static shapes). A dataset batched with `drop_remainder=True`
loses `examples % global_batch` examples every epoch: `fit` warns with that count.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from tfaccel.errors import DroppedExamplesWarning

if TYPE_CHECKING:
    from tfaccel.data import Feed


def warn_if_dropped(feed: Feed, jit_compile: bool) -> tuple[int, int] | None:
    """Warns once when the `Feed` drops examples every epoch; returns `(dropped, examples)`."""
    counted = feed.dropped
    if counted is None:
        return None
    dropped, examples = counted
    why = (
        "XLA (jit_compile=True) needs one static batch shape, so tfaccel.data.pipeline drops "
        "the partial last batch"
        if jit_compile
        else "the dataset was batched with drop_remainder=True; the Trainer trains a partial "
        "last batch exactly, so batch with drop_remainder=False (tfaccel.data.pipeline's "
        "default without XLA) to keep them"
    )
    warnings.warn(
        f"{dropped} of {examples} training examples ({dropped / examples:.1%}) are dropped "
        f"every epoch: {why}.",
        DroppedExamplesWarning,
        stacklevel=3,
    )
    return counted
