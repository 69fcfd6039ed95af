"""Kaggle "Dog Breed Identification": ResNet-50 on the competition folder, submission.csv.

Needs Kaggle's layout in `--data-dir`: `labels.csv` (`id,breed`), `train/<id>.jpg` and
`test/<id>.jpg`:

    kaggle competitions download -c dog-breed-identification
    python recipes/kaggle_dog_breeds.py --data-dir <unzipped folder> --pretrained

The model is `tfaccel.models.resnet(50)` (`--depth` picks another); with `--pretrained`,
Keras' ImageNet ResNet-50 (`keras.applications`) with a new classifier when its weights
can be loaded. Every JPEG
is checked once before training (a parallel, reduced-size decode): corrupt or
truncated files are skipped with a warning naming each one, so no epoch can stop
half-way. 10 % of the labelled images validate. `submission.csv` has an `id` column
and one probability column per breed (alphabetical), a row per test image.

Takes the core recipe flags (`--help`), e.g. `--tune-batch-size` to probe the batch size first,
or `--doctor` (`tfaccel doctor RECIPE.py`) to diagnose what limits training.
"""

from __future__ import annotations

import csv
import os
import warnings

import batch_tuning  # recipes/batch_tuning.py: --tune-batch-size
import common  # recipes/common.py: the shared command line and set-up
import keras
import numpy as np
import outputs  # recipes/outputs.py: history.csv, metrics.json, curves.png, model.keras
import tensorflow as tf

import tfaccel

NAME = "kaggle_dog_breeds"
COMPETITION = "dog-breed-identification"
VALIDATION_FRACTION = 0.1


class CorruptImageWarning(UserWarning):
    """An image that cannot be decoded was left out."""


def _missing_input(path: str) -> FileNotFoundError:
    return FileNotFoundError(
        f"{path} is missing: this recipe needs Kaggle's dog-breed folder (labels.csv, "
        f"train/, test/) in --data-dir. Download it with `kaggle competitions download -c "
        f"{COMPETITION}`, unzip, and pass that folder as --data-dir."
    )


def read_labels(data_dir: str) -> tuple[list[str], list[str]]:
    """Returns (train image paths, breed names) from labels.csv, checking every file exists.

    Raises:
        FileNotFoundError: labels.csv or train/ is missing, or labels.csv names images
            that train/ does not have (counted, the first few listed).
        ValueError: labels.csv is empty, has no `id` / `breed` column, no rows, or a
            row with a missing id or breed (line named).
    """
    labels_path = os.path.join(data_dir, "labels.csv")
    train_dir = os.path.join(data_dir, "train")
    for path in (labels_path, train_dir):
        if not os.path.exists(path):
            raise _missing_input(path)
    if os.path.isfile(labels_path) and os.path.getsize(labels_path) == 0:
        raise ValueError(f"{labels_path} is empty (0 bytes); expected Kaggle's header 'id,breed'.")
    with open(labels_path, newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in ("id", "breed") if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(
                f"{labels_path} has no {' or '.join(missing)} column; expected Kaggle's header "
                f"'id,breed', got {reader.fieldnames}."
            )
        rows = list(reader)
    if not rows:
        raise ValueError(f"{labels_path} has a header but no rows; expected one row per image.")
    for line, row in enumerate(rows, start=2):
        empty = [c for c in ("id", "breed") if not (row[c] or "").strip()]
        if empty:
            raise ValueError(
                f"{labels_path} line {line} has no (missing) {' or '.join(empty)}: {row}. Fill "
                "it in or remove the row."
            )
    paths = [os.path.join(train_dir, f"{row['id']}.jpg") for row in rows]
    absent = [p for p in paths if not os.path.isfile(p)]
    if absent:
        raise FileNotFoundError(
            f"labels.csv names {len(absent)} image(s) that do not exist in {train_dir}, e.g. "
            f"{[os.path.basename(p) for p in absent[:5]]}. Re-download or unzip train.zip "
            "completely, or remove those rows from labels.csv."
        )
    return paths, [row["breed"] for row in rows]


def readable(paths: list[str]) -> list[bool]:
    """Whether each JPEG decodes, checked in parallel; warns once per corrupt file."""
    if not paths:
        return []

    def check(path):  # ratio=8 decodes at 1/8 size: fast, yet it reads every byte
        return path, tf.shape(tf.io.decode_jpeg(tf.io.read_file(path), ratio=8))[0]

    scan = tf.data.Dataset.from_tensor_slices(paths).map(
        check, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False
    )
    good = {p.decode() for p, _ in scan.ignore_errors().as_numpy_iterator()}
    for path in paths:
        if path not in good:
            warnings.warn(
                f"Skipping corrupt image {path}: it cannot be decoded as a JPEG "
                "(truncated or damaged file).",
                CorruptImageWarning,
                stacklevel=2,
            )
    return [p in good for p in paths]


def decoder(size: int):
    def decode(path, label):
        image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
        image = tf.image.resize(image, (size, size))
        return tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8), label

    return decode


def flip(image, label):
    return tf.image.random_flip_left_right(image), label


def scaler(pretrained: bool):
    """uint8 batches → the model's input scale (Caffe-style for Keras' ImageNet ResNet-50)."""

    def scale(images, labels):
        images = tf.cast(images, tf.float32)
        if pretrained:
            return keras.applications.resnet50.preprocess_input(images), labels
        return images / 255.0, labels

    return scale


def model_builder(size: int, classes: int, pretrained: bool, depth: int = 50):
    """Returns (build_model, whether it uses ImageNet weights)."""
    if pretrained:
        try:  # the weights come from the network the first time
            keras.applications.ResNet50(
                include_top=False, weights="imagenet", input_shape=(size, size, 3)
            )
        except Exception as error:
            print(
                f"--pretrained: ImageNet weights could not be loaded ({type(error).__name__}); "
                "training tfaccel.models.resnet(50) from scratch instead."
            )
            pretrained = False
    if not pretrained:
        return lambda: tfaccel.models.resnet(
            depth, input_shape=(size, size, 3), num_classes=classes
        ), False

    def build():
        base = keras.applications.ResNet50(
            include_top=False, weights="imagenet", input_shape=(size, size, 3), pooling="avg"
        )
        outputs = keras.layers.Dense(classes, activation="softmax", dtype="float32")(base.output)
        return keras.Model(base.input, outputs, name="resnet50_imagenet")

    return build, True


def main(argv=None) -> dict:
    p = common.parser(
        __doc__, epochs=10, batch_size=64, learning_rate=0.01, fallback=False, doctor=True
    )
    common.default_is(p, "--data-dir", "the current folder")
    p.add_argument("--image-size", type=int, default=224, help="images are resized to this")
    p.add_argument(
        "--depth", type=int, default=50, help="ResNet depth when not --pretrained (18-152)"
    )
    p.add_argument(
        "--pretrained", action="store_true", help="start from Keras' ImageNet ResNet-50 weights"
    )
    args = p.parse_args(argv)
    data_dir = args.data_dir or "."
    paths, breeds = read_labels(data_dir)
    test_dir = os.path.join(data_dir, "test")
    if not os.path.isdir(test_dir):
        raise _missing_input(test_dir)
    run = common.setup(args, NAME)
    run.dataset = "kaggle dog breeds"
    size = min(args.image_size, 64) if args.smoke else args.image_size

    ok = readable(paths)
    paths = [p for p, good in zip(paths, ok, strict=True) if good]
    breeds = [b for b, good in zip(breeds, ok, strict=True) if good]
    names = sorted(set(breeds))
    labels = np.array([names.index(b) for b in breeds], "int32")
    order = np.random.default_rng(args.seed).permutation(len(paths))
    held = max(1, int(len(paths) * VALIDATION_FRACTION))
    val_idx, train_idx = order[:held], order[held:]
    paths_arr = np.array(paths)
    print(
        f"{len(paths)} readable training images of {len(names)} breeds "
        f"({len(train_idx)} train, {held} validation), {sum(not g for g in ok)} skipped"
    )

    build_model, pretrained = model_builder(size, len(names), args.pretrained, args.depth)
    decode, scale = decoder(size), scaler(pretrained)
    if args.tune_batch_size:
        sample = tfaccel.data.from_arrays(paths_arr[train_idx], labels[train_idx])
        batch_tuning.tune_batch_size(
            run,
            build_model,
            sample.map(decode).map(scale),
            loss="sparse_categorical_crossentropy",
            optimizer="sgd",
        )

    def pipeline(idx, training, strategy=run.strategy):
        return tfaccel.data.pipeline(
            tfaccel.data.from_arrays(paths_arr[idx], labels[idx]),
            batch_size=args.batch_size,
            training=training,
            preprocess=decode,
            augment=flip if training else None,
            batch_map=scale,
            seed=args.seed,
            strategy=strategy,
        )

    train, val = pipeline(train_idx, True), pipeline(val_idx, False)
    print(f"Data plan:\n{tfaccel.data.explain(train)}")
    trainer = tfaccel.Trainer(
        build_model,
        optimizer=lambda: keras.optimizers.SGD(args.learning_rate, momentum=0.9),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        strategy=run.strategy,
        precision=common.trainer_precision(run),
    )
    if args.doctor:  # diagnose instead of training (tfaccel doctor recipes/kaggle_dog_breeds.py)
        return common.doctor(run, trainer, train)
    chosen, throughput = outputs.callbacks(run)
    history = trainer.fit(
        train,
        epochs=args.epochs,
        validation_data=val,
        callbacks=chosen,
        checkpoint_dir=args.checkpoint_dir,
        verbose=args.verbose,
    ).history
    results = trainer.evaluate(val)

    test_paths = sorted(
        os.path.join(test_dir, f) for f in os.listdir(test_dir) if f.lower().endswith(".jpg")
    )
    good = np.array(readable(test_paths), bool)
    probabilities = np.full((len(test_paths), len(names)), 1.0 / len(names))
    if good.any():
        readable_idx = np.flatnonzero(good)
        test_data = tfaccel.data.pipeline(
            tfaccel.data.from_arrays(
                np.array(test_paths)[readable_idx], np.zeros(len(readable_idx), "int32")
            ),
            batch_size=args.batch_size,
            training=False,
            preprocess=decode,
            batch_map=scale,
        )
        predicted = trainer.model.predict(test_data, verbose=0).astype("float64")
        probabilities[readable_idx] = predicted / predicted.sum(axis=1, keepdims=True)
    if run.is_chief:
        with open(run.out / "submission.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["id", *names])
            for path, row in zip(test_paths, probabilities, strict=True):
                image_id = os.path.splitext(os.path.basename(path))[0]
                writer.writerow([image_id, *(f"{v:.6g}" for v in row)])
        print(f"Wrote {len(test_paths)} rows to {run.out / 'submission.csv'}")
    return outputs.finish(
        run,
        history,
        metric="accuracy",
        final={"val_loss": results["loss"], "val_accuracy": results["accuracy"]},
        examples_per_sec=outputs.examples_per_second(throughput),
        settings=trainer.settings,
        trainer=trainer,
        extra={
            "breeds": len(names),
            "pretrained": pretrained,
            "image_size": size,
            "skipped_train_images": int(len(ok) - sum(ok)),
            "skipped_test_images": int((~good).sum()),
        },
    )


if __name__ == "__main__":
    common.main_guard(main)
