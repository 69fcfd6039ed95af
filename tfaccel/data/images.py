"""`from_image_folder`: images on disk (one folder per class, or a CSV of labels)."""

from __future__ import annotations

import csv
import os

import tensorflow as tf

from tfaccel.data.sources import AUTOTUNE, SourceInfo, attach_source

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")


def from_image_folder(
    path: str,
    *,
    labels: str = "inferred",
    image_size: tuple[int, int],
    channels: int = 3,
) -> tuple[tf.data.Dataset, list[str]]:
    """Lists images and decodes + resizes them in a parallel `tf.data` map.

    Two layouts:

    * `labels="inferred"`: `path/<class>/<image>`, one sub-folder per class
      (sorted names are the classes).
    * `labels="<file>.csv"`: a CSV with a header whose first two columns are the
      image file (relative to `path`, extension optional) and its class name,
      e.g. Kaggle's dog-breed `labels.csv` (`id,breed`) next to `train/`.

    Files are listed in Python; reading, decoding (JPEG/PNG/BMP/GIF) and resizing
    run inside the dataset's parallel map (`num_parallel_calls=AUTOTUNE`), and a
    multi-worker pipeline shards the file list before decoding.

    Args:
        path: the image folder.
        labels: "inferred" or the path of a `file,label` CSV.
        image_size: `(height, width)` to resize every image to (bilinear).
        channels: 1 (grey), 3 (RGB) or 4 (RGBA).

    Returns:
        `(dataset, class_names)`: unbatched `(float32 image in [0, 255] of shape
        (height, width, channels), int32 class index)` elements in file-name
        order, and the class names in index order.

    Raises:
        FileNotFoundError: `path` is not a folder, it holds no images, or the CSV
            names files that do not exist.
        ValueError: bad `image_size` / `channels`, or a CSV without two columns.
    """
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
    if not os.path.isdir(path):
        raise FileNotFoundError(f"from_image_folder: {path!r} is not a folder.")
    if labels == "inferred":
        files, targets, class_names = _list_class_folders(path)
    else:
        files, targets, class_names = _list_from_csv(path, labels)
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

    raw = tf.data.Dataset.from_tensor_slices((files, tf.constant(targets, tf.int32)))
    info = SourceInfo(
        "image_folder",
        {
            "path": path,
            "images": len(files),
            "classes": len(class_names),
            "decode+resize": f"{height}x{width}x{channels}, parallel=AUTOTUNE",
        },
        raw=raw,
        finish=finish,
        units="files",
        count=len(files),
    )
    return attach_source(finish(raw), info), class_names


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


def _list_class_folders(path: str) -> tuple[list[str], list[int], list[str]]:
    class_names = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))
    files, targets = [], []
    for index, name in enumerate(class_names):
        folder = os.path.join(path, name)
        for root, _, names in sorted(os.walk(folder)):
            for file in sorted(names):
                if _is_image(file):
                    files.append(os.path.join(root, file))
                    targets.append(index)
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
    files, missing = [], []
    for name, _ in entries:
        found = _resolve(path, name)
        files.append(found)
        if found is None:
            missing.append(name)
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
