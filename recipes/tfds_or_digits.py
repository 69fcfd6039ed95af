"""A recipe's images: a TFDS dataset, or scikit-learn's digits when it cannot be had offline.

`load(run, "fashion_mnist", ("train", "test"), (28, 28, 1))` returns unbatched
`(uint8 image, int64 label)` datasets, smaller with `--smoke`; when TFDS has the dataset
neither on disk nor online it says so and returns the bundled digits resized to the
dataset's image shape (`--no-fallback` makes that an error).
"""

from __future__ import annotations

from collections.abc import Sequence

import common  # recipes/common.py: the command line and the run
import numpy as np
import tensorflow as tf

import tfaccel

FALLBACK_NAME = "digits (offline fallback)"


def load(
    run: common.Run, name: str, splits: Sequence[str], image_shape: tuple[int, int, int]
) -> dict[str, tf.data.Dataset]:
    """Loads TFDS `splits` (smaller with --smoke), or the digits fallback when offline.

    Args:
        run: the run (uses --data-dir, --smoke, --seed, --no-fallback).
        name: the TFDS dataset, e.g. "fashion_mnist".
        splits: split names, e.g. ("train", "test").
        image_shape: the dataset's (height, width, channels), for the fallback.

    Returns:
        `{split: unbatched (uint8 image, int64 label) dataset}`; sets `run.dataset`.

    Raises:
        DatasetUnavailableError: the dataset cannot be loaded and --no-fallback is set.
    """
    args = run.args
    sizes = {s: common.SMOKE_TRAIN if s.startswith("train") else common.SMOKE_TEST for s in splits}
    try:
        data = {
            s: tfaccel.data.from_tfds(
                name, f"{s}[:{sizes[s]}]" if args.smoke else s, data_dir=args.data_dir
            )
            for s in splits
        }
    except Exception as error:  # TFDS raises many kinds: not found, network, checksum...
        where = args.data_dir or "TFDS's default data directory"
        reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        if getattr(args, "no_fallback", False):
            raise common.DatasetUnavailableError(
                f"TFDS dataset {name!r} is not in {where} and could not be downloaded "
                f"({reason}). Download it where there is network (tfds.load({name!r}, "
                f"data_dir=...)) and pass that folder as --data-dir, or drop --no-fallback to "
                "train on scikit-learn's bundled digits instead."
            ) from error
        print(
            f"TFDS dataset {name!r} is not in {where} and could not be downloaded ({reason}); "
            f"training on scikit-learn's digits resized to {image_shape} instead "
            "(offline fallback)."
        )
        run.dataset = FALLBACK_NAME
        return digits_fallback(splits, image_shape, seed=args.seed, smoke=args.smoke)
    run.dataset = name
    return data


def digits_fallback(
    splits: Sequence[str], image_shape: tuple[int, int, int], *, seed: int, smoke: bool = False
) -> dict[str, tf.data.Dataset]:
    """scikit-learn's 1,797 digits as uint8 images of `image_shape`, split 80 / 20.

    Splits whose names start with "train" get the 80 %, the others the 20 %.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images[..., None] * (255.0 / 16.0)).astype("float32")
    height, width, channels = image_shape
    images = tf.image.resize(images, (height, width)).numpy()
    images = np.repeat(images, channels, axis=-1) if channels != 1 else images
    images = np.clip(np.round(images), 0, 255).astype("uint8")
    labels = digits.target.astype("int64")
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=0.2, random_state=seed, stratify=labels
    )
    result = {}
    for split in splits:
        x, y = (x_train, y_train) if split.startswith("train") else (x_test, y_test)
        if smoke:
            n = common.SMOKE_TRAIN if split.startswith("train") else common.SMOKE_TEST
            x, y = x[:n], y[:n]
        result[split] = tfaccel.data.from_arrays(x, y)
    return result
