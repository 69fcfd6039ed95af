"""What a resumed training run reproduces exactly, in words (`explain` shows it)."""

from __future__ import annotations

from typing import Any

from tfaccel.data.elements import name


def resume_note(config: Any, stateless: bool) -> str:
    """What a resumed training run reproduces exactly (shown by `explain`); `config` is the
    pipeline's `stages.Config`."""
    if config.seed is None:
        return (
            "resume: exact only for the data order (restored from the checkpoint's iterator); "
            "without a seed the shuffle and augmentations of a resumed run differ. Pass seed=N "
            "for an exact resume."
        )
    if config.augment is not None and not stateless:
        return (
            f"resume: exact only for the data order: augment={name(config.augment)} uses "
            "stateful random ops. Give it a seed argument and use tf.random.stateless_* / "
            "tf.image.stateless_random_* ops for bit-exact augmentations on resume."
        )
    if stateless and config.shuffle_buffer is None:
        return (
            "resume: exact when skipped ahead (the Trainer on several replicas); "
            "augmentations from stateless ops seeded by (seed, epoch, element index). "
            "Unshuffled, the epoch key comes from a small reshuffled draw that a restored "
            "iterator checkpoint (the Trainer on one device) may not replay: shuffle, even "
            "with a small buffer, for bit-exact augmentations."
        )
    return (
        "resume: exact (seeded shuffle"
        + (
            "; augmentations from stateless ops seeded by (seed, epoch, element index)"
            if stateless
            else ""
        )
        + ")"
    )
