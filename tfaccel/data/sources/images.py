"""`from_image_folder`: images on disk (one folder per class, or a CSV of labels)."""

from __future__ import annotations

import csv
import os
import warnings
from typing import Any

import numpy as np
import tensorflow as tf

from tfaccel.data import fingerprint
from tfaccel.data.elements import AUTOTUNE
from tfaccel.data.sources.image_checks import find_corrupt
from tfaccel.data.sources.info import SourceInfo, attach_source

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")


SUBSETS = ("training", "validation", "both")


def from_image_folder(
    path: str,
    *,
    labels: str = "inferred",
    image_size: tuple[int, int],
    channels: int = 3,
    validation_split: float | None = None,
    subset: str | None = None,
    seed: int | None = None,
    skip_corrupt: bool = False,
) -> tuple[tf.data.Dataset | tuple[tf.data.Dataset, tf.data.Dataset], list[str]]:
    """Lists images and decodes + resizes them in a parallel `tf.data` map.

    Two layouts:

    * `labels="inferred"`: `path/<class>/<image>`, one sub-folder per class
      (sorted names are the classes). A class folder without images keeps its
      index and is reported in one warning.
    * `labels="<file>.csv"`: a CSV with a header whose first two columns are the
      image file (relative to `path`, extension optional) and its class name,
      e.g. Kaggle's dog-breed `labels.csv` (`id,breed`) next to `train/`.

    Files are listed in Python; reading, decoding (JPEG/PNG/BMP/GIF) and resizing
    run inside the dataset's parallel map (`num_parallel_calls=AUTOTUNE`), and a
    multi-worker pipeline shards the file list before decoding. Every file is
    screened up front (its first and last bytes; suspects are decoded once), so a
    corrupt image is reported by name instead of failing inside the pipeline.

    `validation_split`, `subset` and `seed` mean what they mean in
    `keras.utils.image_dataset_from_directory`: the file list is shuffled with
    `seed`, the last `int(validation_split * n)` files are the validation subset
    and the rest the training subset (the same files Keras picks for the same
    seed). Call it twice with the same seed, or once with `subset="both"`.

    Args:
        path: the image folder.
        labels: "inferred" or the path of a `file,label` CSV.
        image_size: `(height, width)` to resize every image to (bilinear).
        channels: 1 (grey), 3 (RGB) or 4 (RGBA).
        validation_split: fraction of the images held out for validation,
            0 < validation_split < 1; None uses every image.
        subset: "training", "validation" or "both"; only with `validation_split`.
        seed: shuffle seed of the split; required with `validation_split`.
        skip_corrupt: leave out images TensorFlow cannot decode, with one warning
            listing them (default: such an image is an error naming it).

    Returns:
        `(dataset, class_names)`: unbatched `(float32 image in [0, 255] of shape
        (height, width, channels), int32 class index)` elements, and the class
        names in index order. Without a split the elements are in file-name order.
        With `subset="both"`, `dataset` is the pair `(training, validation)`.
        Each dataset also carries `dataset.class_names` and `dataset.file_paths`,
        as Keras' datasets do.

    Raises:
        FileNotFoundError: `path` is not a folder, it holds no images, or the CSV
            names files that do not exist.
        ValueError: bad `image_size` / `channels` / `validation_split` / `subset`,
            a split without `seed`, a split leaving a subset empty, a CSV without
            two columns, or a corrupt image without `skip_corrupt=True`.
    """
    _check_shape(image_size, channels)
    _check_split(validation_split, subset, seed)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"from_image_folder: {path!r} is not a folder.")
    if labels == "inferred":
        files, targets, class_names = _list_class_folders(path)
    else:
        files, targets, class_names = _list_from_csv(path, labels)
    files, targets, skipped = _drop_corrupt(path, files, targets, skip_corrupt)
    height, width = image_size

    def load(file, target):
        image = tf.io.decode_image(
            tf.io.read_file(file), channels=channels, expand_animations=False
        )
        image = tf.image.resize(image, (height, width))
        image.set_shape((height, width, channels))
        return image, target

    def finish(pairs: tf.data.Dataset) -> tf.data.Dataset:
        return pairs.map(load, num_parallel_calls=AUTOTUNE)

    def make(chosen: list[int], name: str | None) -> tf.data.Dataset:
        subset_files = [files[i] for i in chosen]
        subset_targets = [targets[i] for i in chosen]
        raw = tf.data.Dataset.from_tensor_slices(
            (tf.constant(subset_files, tf.string), tf.constant(subset_targets, tf.int32))
        )
        details: dict[str, Any] = {"path": path}
        if name is not None:
            details.update(subset=name, validation_split=validation_split, seed=seed)
        details.update(
            images=len(subset_files),
            classes=len(class_names),
            **{"decode+resize": f"{height}x{width}x{channels}, parallel=AUTOTUNE"},
        )
        if skipped:
            details["skipped_corrupt"] = len(skipped)
        info = SourceInfo(
            "image_folder",
            details,
            raw=raw,
            finish=finish,
            units="files",
            count=len(subset_files),
            identity=fingerprint.files_identity(
                subset_files,
                fingerprint.digest_arrays(np.asarray(subset_targets, np.int64)),
                class_names,
                (height, width, channels),
            ),
        )
        dataset = attach_source(finish(raw), info)
        dataset.class_names = list(class_names)
        dataset.file_paths = subset_files
        return dataset

    if validation_split is None:
        return make(list(range(len(files))), None), class_names
    assert seed is not None  # _check_split: a split needs a seed
    training, validation = _split(len(files), validation_split, seed, path)
    if subset == "training":
        return make(training, "training"), class_names
    if subset == "validation":
        return make(validation, "validation"), class_names
    return (make(training, "training"), make(validation, "validation")), class_names


def _check_shape(image_size, channels) -> None:
    """Raises ValueError unless `image_size` is (height, width) and `channels` 1, 3 or 4."""
    if (
        not isinstance(image_size, (tuple, list))
        or len(image_size) != 2
        or not all(isinstance(s, int) and s > 0 for s in image_size)
    ):
        raise ValueError(
            f"image_size must be (height, width) with positive ints, got {image_size!r}."
        )
    if channels not in (1, 3, 4):
        raise ValueError(f"channels must be 1, 3 or 4, got {channels!r}.")


def _check_split(validation_split, subset, seed) -> None:
    if validation_split is not None and (
        isinstance(validation_split, bool)
        or not isinstance(validation_split, (int, float))
        or not 0 < validation_split < 1
    ):
        raise ValueError(
            f"validation_split must be a fraction between 0 and 1 (exclusive), got "
            f"{validation_split!r}; e.g. validation_split=0.2 holds out 20% of the images."
        )
    if subset is not None and subset not in SUBSETS:
        raise ValueError(f"subset must be one of {SUBSETS} or None, got {subset!r}.")
    if (validation_split is None) != (subset is None):
        given = "validation_split" if subset is None else "subset"
        raise ValueError(
            f"{given} was given without {'subset' if subset is None else 'validation_split'}: "
            "they go together, e.g. validation_split=0.2, subset='training' (or 'validation', "
            "or 'both' for the pair)."
        )
    if validation_split is not None and (
        seed is None or isinstance(seed, bool) or not isinstance(seed, int)
    ):
        raise ValueError(
            f"validation_split needs an integer seed (got seed={seed!r}): the training and "
            "validation calls must shuffle the files the same way, or they would overlap. "
            "Pass e.g. seed=1337 to both calls (or use subset='both')."
        )


def _split(count: int, validation_split: float, seed: int, path: str):
    """Keras' split: shuffle the indices with `seed`; the last part is validation."""
    order = list(range(count))
    np.random.RandomState(seed).shuffle(order)
    held_out = int(validation_split * count)
    if held_out == 0 or held_out == count:
        empty = "validation" if held_out == 0 else "training"
        raise ValueError(
            f"validation_split={validation_split} of the {count} image(s) under {path!r} "
            f"leaves the {empty} subset empty; use a {'larger' if held_out == 0 else 'smaller'} "
            "fraction or add images."
        )
    return order[:-held_out], order[-held_out:]


def _drop_corrupt(path: str, files: list[str], targets: list[int], skip: bool):
    corrupt = find_corrupt(files)
    if not corrupt:
        return files, targets, []
    listing = "; ".join(f"{f} ({reason})" for f, reason in list(corrupt.items())[:20])
    more = f"; and {len(corrupt) - 20} more" if len(corrupt) > 20 else ""
    if not skip:
        raise ValueError(
            f"from_image_folder: {len(corrupt)} of {len(files)} image(s) under {path!r} "
            f"cannot be decoded: {listing}{more}. Replace or delete them, or pass "
            "skip_corrupt=True to leave them out."
        )
    kept = [(f, t) for f, t in zip(files, targets, strict=True) if f not in corrupt]
    if not kept:
        raise ValueError(f"from_image_folder: every image under {path!r} is corrupt: {listing}.")
    warnings.warn(
        f"from_image_folder skipped {len(corrupt)} corrupt image(s) under {path!r} "
        f"(skip_corrupt=True): {listing}{more}.",
        stacklevel=3,
    )
    return [f for f, _ in kept], [t for _, t in kept], sorted(corrupt)


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


def _list_class_folders(path: str) -> tuple[list[str], list[int], list[str]]:
    folders = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))
    hidden = [d for d in folders if d.startswith(".")]
    class_names = [d for d in folders if not d.startswith(".")]
    files: list[str] = []
    targets: list[int] = []
    empty: list[str] = []
    for index, name in enumerate(class_names):
        folder = os.path.join(path, name)
        before = len(files)
        for root, dirs, names in os.walk(folder):
            hidden += [
                os.path.join(name, os.path.relpath(root, folder), d) for d in dirs if d[0] == "."
            ]
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for file in sorted(names):
                if _is_image(file) and not file.startswith("."):
                    files.append(os.path.join(root, file))
                    targets.append(index)
        if len(files) == before:
            empty.append(name)
    if hidden:
        warnings.warn(
            f"from_image_folder: skipped hidden folder(s) under {path!r}: "
            f"{[os.path.normpath(h) for h in hidden]} (e.g. .ipynb_checkpoints); they are "
            "neither classes nor examples.",
            stacklevel=3,
        )
    if files and empty:
        warnings.warn(
            f"from_image_folder: class folder(s) {empty} under {path!r} have no images "
            f"({', '.join(IMAGE_EXTENSIONS)}); those classes keep their index in "
            "class_names but have no examples. Add images or remove the folder(s).",
            stacklevel=3,
        )
    if not files:
        raise FileNotFoundError(
            f"from_image_folder: no images ({', '.join(IMAGE_EXTENSIONS)}) under {path!r} "
            f"(class sub-folders found: {class_names or 'none'}). Expected "
            "path/<class_name>/<image>, or pass labels='labels.csv'."
        )
    return files, targets, class_names


def _list_from_csv(path: str, csv_path: str) -> tuple[list[str], list[int], list[str]]:
    if not os.path.isfile(csv_path):
        raise FileNotFoundError(
            f"from_image_folder: labels={csv_path!r} is neither 'inferred' nor a CSV file."
        )
    with open(csv_path, newline="") as handle:
        rows = list(csv.reader(handle))
    if not rows or len(rows[0]) < 2 or len(rows) < 2:
        raise ValueError(
            f"from_image_folder: {csv_path!r} needs a header and rows of `file,label` "
            "(two columns at least)."
        )
    entries = [(row[0], row[1]) for row in rows[1:] if row]
    files: list[str] = []
    missing: list[str] = []
    for name, _ in entries:
        found = _resolve(path, name)
        if found is None:
            missing.append(name)
        else:
            files.append(found)
    if missing:
        raise FileNotFoundError(
            f"from_image_folder: {len(missing)} of {len(entries)} file(s) named in "
            f"{csv_path!r} do not exist under {path!r} (tried the name and with "
            f"{', '.join(IMAGE_EXTENSIONS)}), e.g. {missing[:5]}."
        )
    class_names = sorted({label for _, label in entries})
    index = {name: i for i, name in enumerate(class_names)}
    return files, [index[label] for _, label in entries], class_names


def _resolve(path: str, name: str) -> str | None:
    for candidate in [name] + [name + ext for ext in IMAGE_EXTENSIONS]:
        full = os.path.join(path, candidate)
        if os.path.isfile(full) and _is_image(full):
            return full
    return None
