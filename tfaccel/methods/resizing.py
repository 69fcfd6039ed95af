"""Progressive resizing: small images early (cheap steps), full size for the last part.

The batches are resized (`tf.image.resize`, bilinear, antialiased) to the size of the
current stage, which a callback sets at each epoch's start from the epoch alone (so a
resumed run is at the same stage). The stages are a fixed, short list of sizes, the last
the full size: the step sees at most that many distinct shapes. The model must take any
height and width (`keras.Input((None, None, channels))` with a global pooling), so its
step is traced for an unknown size, not once per size.

With `model.fit` (a fresh iterator each epoch, made after `on_epoch_begin`) each epoch's
batches all have its size. The Trainer's input stream reads a batch or two ahead, so at a
stage change those may still have the previous size: a resumed run is at the same stage,
but not bit-exact across a change (known limitation).
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from tfaccel.methods.base import Card, Job, Method, MethodPlan, staged


class SetImageSize(keras.callbacks.Callback):
    """Sets the pipeline's image size at each epoch's start: `sizes[stage(epoch)]`."""

    def __init__(self, variable: tf.Variable, sizes: tuple[int, ...], epochs: int, until: float):
        super().__init__()
        self.variable, self.sizes, self.epochs, self.until = variable, sizes, epochs, until
        self.seen: list[int] = []

    def size_at(self, epoch: int) -> int:
        """The size of `epoch`: the stages share the first `until` of the epochs."""
        return staged(self.sizes, epoch, self.epochs, self.until)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        size = self.size_at(epoch)
        self.variable.assign(size)
        self.seen.append(size)


class ProgressiveResizing(Method):
    """Trains on smaller images first, in `stages` sizes from `start` x full to full size.

    Args:
        start: the first stage's size as a share of the full size, in (0, 1).
        stages: the number of distinct sizes (>= 2), the last the full size.
        until: the share of the epochs after which images are full size, in (0, 1].
        multiple: sizes are rounded to a multiple of this (>= 1).

    Raises:
        ValueError: bad arguments; at `check`, features that are not images of a known
            size, or a model whose input fixes the height and width.
    """

    name = "progressive resizing"
    kinds = ("image",)
    stateful = "the size is a function of the epoch"
    card = Card(
        changes=(
            "the inputs: smaller images for the first part of training, resized in the "
            "pipeline (at most `stages` distinct sizes; the model must take any size)"
        ),
        helps="large images, where a small step is much cheaper (not measured here)",
        hurts=(
            "small images: 8×8 digits have no pixels to spare; a model whose input fixes the "
            'image size (refused); not in `"fast"`'
        ),
        measured="On the digits CNN: never reached the target (final 0.793).",
        defaults=(
            "start=0.5, stages=3, until=0.75 (not set by a measurement here; the benchmark "
            "ran 2 stages over half the epochs)"
        ),
        measured_as="ProgressiveResizing(0.5, 2, 0.5)",
        contender="progressive_resizing",
        results=("time_to_accuracy.json",),
    )

    def __init__(self, start: float = 0.5, stages: int = 3, until: float = 0.75, multiple: int = 2):
        if not 0 < start < 1:
            raise ValueError(f"ProgressiveResizing start must be in (0, 1), got {start}.")
        if isinstance(stages, bool) or int(stages) != stages or stages < 2:
            raise ValueError(f"ProgressiveResizing stages must be an integer >= 2, got {stages}.")
        if not 0 < until <= 1:
            raise ValueError(f"ProgressiveResizing until must be in (0, 1], got {until}.")
        if int(multiple) != multiple or multiple < 1:
            raise ValueError(f"ProgressiveResizing multiple must be >= 1, got {multiple}.")
        self.start, self.stages, self.until = float(start), int(stages), float(until)
        self.multiple = int(multiple)
        self.callback: SetImageSize | None = None

    @property
    def changes(self) -> str:
        """One sentence: what this method changes (the settings table shows it)."""
        return (
            f"the inputs: images from {self.start:.0%} of full size in {self.stages} sizes, "
            f"full size after {self.until:.0%} of the epochs"
        )

    def sizes(self, full: int) -> tuple[int, ...]:
        """The distinct stage sizes for a full size, smallest first, the last `full`."""
        found = []
        for i in range(self.stages):
            share = self.start + (1 - self.start) * i / (self.stages - 1)
            size = max(self.multiple, int(round(full * share / self.multiple)) * self.multiple)
            found.append(min(size, full))
        return tuple(sorted(set(found)))

    def check(self, job: Job) -> None:
        spec = job.feature_spec
        shape = getattr(spec, "shape", None)
        if shape is None or shape.rank != 4 or None in (shape[1], shape[2]):
            raise ValueError(
                "ProgressiveResizing resizes images (batch, height, width, channels) of a "
                f"known size, got features {getattr(spec, 'shape', spec)}."
            )
        if shape[1] != shape[2]:
            raise ValueError(f"ProgressiveResizing needs square images, got {tuple(shape)}.")
        model_shape = tuple(job.model.inputs[0].shape) if job.model.inputs else ()
        if len(model_shape) == 4 and (model_shape[1] is not None or model_shape[2] is not None):
            raise ValueError(
                f"ProgressiveResizing needs a model that takes any image size; its input is "
                f"{model_shape}. Build it on keras.Input((None, None, {shape[3]})) with a "
                "global pooling before the classifier."
            )

    def apply(self, plan: MethodPlan) -> None:
        job = plan.job
        full = int(job.feature_spec.shape[1])
        sizes = self.sizes(full)
        with tf.init_scope():
            variable = tf.Variable(full, dtype=tf.int32, trainable=False, name="image_size")
        self.callback = SetImageSize(variable, sizes, job.epochs, self.until)
        plan.callbacks.append(self.callback)

        @tf.autograph.experimental.do_not_convert  # plain ops (tf.cond): nothing to convert
        def resize(x: Any, y: Any, seed: Any) -> tuple[Any, Any]:
            del seed
            size = variable.read_value()
            same = tf.equal(size, tf.shape(x)[1])
            x = tf.cond(
                same,
                lambda: tf.cast(x, tf.float32),
                lambda: tf.image.resize(x, [size, size], antialias=True),
            )
            return x, y

        plan.add_map(self.name, resize, 0, reads_state=True)
