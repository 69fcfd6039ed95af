"""Gradient accumulation settings: `accumulate_steps` and the steps it implies.

One applied (optimizer) step of a Trainer with `accumulate_steps=k` reads k batches,
sums their gradients locally on each replica and all-reduces and applies them once:
the effective global batch is k × the dataset's global batch, at one k-th of the
communication. The replica-side arithmetic lives in `steps.py`.
"""

from __future__ import annotations

from typing import overload


def resolve_accumulate_steps(value: object) -> int:
    """Returns `value` when it is an integer >= 1.

    Raises:
        ValueError: not an integer, a bool, or < 1.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"accumulate_steps must be an integer >= 1 (batches whose gradients are summed "
            f"before one optimizer step; 1 = no accumulation), got {value!r}. "
            "For an effective batch B with batches of b, pass accumulate_steps=B // b."
        )
    return value


@overload
def applied_steps(batches_per_epoch: int, accumulate_steps: int) -> int: ...
@overload
def applied_steps(batches_per_epoch: None, accumulate_steps: int) -> None: ...
@overload
def applied_steps(batches_per_epoch: int | None, accumulate_steps: int) -> int | None: ...
def applied_steps(batches_per_epoch: int | None, accumulate_steps: int) -> int | None:
    """Optimizer steps per epoch for `batches_per_epoch` batches (None: until the data ends).

    Raises:
        ValueError: a batch count that does not divide into groups of `accumulate_steps`.
    """
    if batches_per_epoch is None or accumulate_steps == 1:
        return batches_per_epoch
    if batches_per_epoch % accumulate_steps:
        lower = batches_per_epoch - batches_per_epoch % accumulate_steps
        raise ValueError(
            f"An epoch of {batches_per_epoch} batches does not divide into groups of "
            f"accumulate_steps={accumulate_steps}: every optimizer step needs "
            f"{accumulate_steps} batches, so epochs and checkpoints would fall inside a group. "
            f"Pass steps_per_epoch={lower} (or {lower + accumulate_steps}) batches with a "
            "repeating dataset, choose an accumulate_steps that divides the epoch, or use a "
            "dataset of unknown length (then the last group of the epoch is applied as it is)."
        )
    return batches_per_epoch // accumulate_steps
