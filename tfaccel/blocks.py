"""Inception, residual and bottleneck blocks as serializable Keras 3 layers.

Every block follows the keras-hub layer shape: `__init__` validates and stores the
config, `build` creates (and builds) the sub-layers, `call(inputs, training=None)`,
`get_config` and `compute_output_shape`. Blocks are registered under the package
name `tfaccel`, so `.keras` files that hold them load after `import tfaccel`.

Residual blocks accept `remat=True`: the forward pass is wrapped in gradient
checkpointing (`keras.remat`, which is `tf.recompute_grad` on the TensorFlow
backend), so its activations are recomputed during the backward pass instead of
being kept in memory. The recomputation normalizes with the same batch statistics
but does not update BatchNormalization's moving statistics a second time, so
outputs, gradients and moving statistics equal those of `remat=False`.

Example:
    >>> block = ResidualBlock(64, strides=2, remat=True)
    >>> y = block(keras.random.normal((8, 32, 32, 32)), training=True)
    >>> tuple(y.shape)
    (8, 16, 16, 64)
"""

from __future__ import annotations

import math
import operator
from typing import Any

import keras
from keras import layers, ops

__all__ = ["BottleneckBlock", "InceptionBlock", "ResidualBlock"]

PROJECTIONS = ("auto", True, False)
"""What `ResidualBlock(projection=...)` accepts ("auto": a 1×1 shortcut when the shape changes)."""
_BN_MOMENTUM = 0.9
_BN_EPSILON = 1e-5


def _positive_int(value, name: str) -> int:
    """Returns `value` as an int, or raises ValueError unless it is a positive integer."""
    try:
        number = operator.index(value)
    except TypeError:
        number = None
    if number is None or isinstance(value, bool) or number <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    return number


def _pair(value, name: str) -> tuple[int, int]:
    """Returns `value` as a pair of positive ints, or raises ValueError."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2:
        raise ValueError(
            f"{name} must be a pair (1x1 reduction filters, output filters), got {value!r}. "
            f"Pass e.g. {name}=(96, 128)."
        )
    return (_positive_int(value[0], f"{name}[0]"), _positive_int(value[1], f"{name}[1]"))


def _check_strides(strides) -> int:
    if isinstance(strides, bool) or strides not in (1, 2):
        raise ValueError(
            f"strides must be 1 (keep the spatial size) or 2 (halve it), got {strides!r}."
        )
    return int(strides)


def _check_projection(projection):
    if isinstance(projection, bool) or (isinstance(projection, str) and projection == "auto"):
        return projection
    raise ValueError(
        f"projection must be 'auto', True or False, got {projection!r}. 'auto' adds a "
        "1x1 projection shortcut only when the block changes the shape."
    )


def _check_rank4(layer: layers.Layer, input_shape) -> tuple:
    shape = tuple(input_shape)
    if len(shape) != 4:
        raise ValueError(
            f"{type(layer).__name__} expects 4-D inputs (batch, height, width, channels), "
            f"got shape {shape}. Add a channel axis (e.g. x[..., None]) for grayscale images."
        )
    if shape[-1] is None:
        raise ValueError(
            f"{type(layer).__name__} needs a known number of channels, got shape {shape}."
        )
    return shape


def _spatial(size, strides: int):
    return None if size is None else math.ceil(size / strides)


def _conv(filters: int, kernel_size: int, strides: int = 1, name: str | None = None, **kwargs):
    """A ResNet convolution: "same" padding, no bias (a BN follows), He initialization."""
    return layers.Conv2D(
        filters,
        kernel_size,
        strides=strides,
        padding="same",
        use_bias=False,
        kernel_initializer="he_normal",
        name=name,
        **kwargs,
    )


def _batch_norm(name: str, **kwargs):
    return layers.BatchNormalization(
        momentum=_BN_MOMENTUM, epsilon=_BN_EPSILON, name=name, **kwargs
    )


def _normalize(bn: layers.BatchNormalization, x, training, update_stats: bool):
    """Applies `bn`; with `update_stats=False` uses batch statistics without updating.

    The second form is the recomputation inside a rematerialized block: it gives the
    same outputs as `bn(x, training=True)` but leaves the moving statistics alone, as
    they were already updated once by the forward pass.
    """
    if update_stats or not (training and bn.trainable):
        return bn(x, training=training)
    dtype = keras.backend.result_type(x.dtype, "float32")
    x = ops.cast(x, dtype)
    axis = bn.axis % len(x.shape)
    axes = [i for i in range(len(x.shape)) if i != axis]
    mean, variance = ops.moments(x, axes=axes, synchronized=bn.synchronized)
    outputs = ops.batch_normalization(
        x,
        mean,
        variance,
        axis=axis,
        offset=ops.cast(bn.beta, dtype) if bn.center else None,
        scale=ops.cast(bn.gamma, dtype) if bn.scale else None,
        epsilon=bn.epsilon,
    )
    return ops.cast(outputs, bn.compute_dtype)


class _ResNetBlock(layers.Layer):
    """Shared machinery of the residual blocks: validation, shortcut, remat."""

    def __init__(self, filters, strides=1, projection="auto", remat=False, drop_rate=0.0, **kwargs):
        super().__init__(**kwargs)
        self.filters = _positive_int(filters, "filters")
        self.strides = _check_strides(strides)
        self.projection = _check_projection(projection)
        self.remat = bool(remat)
        self._drop_seed = None
        self.set_drop_rate(drop_rate)

    def set_drop_rate(self, rate: float) -> None:
        """Stochastic depth: in training, the residual branch of each example is dropped
        with probability `rate` (and scaled by `1 / (1 - rate)` when kept); inference
        is unchanged. Set before the first training step (the step reads it when traced).

        Raises:
            ValueError: a rate outside [0, 1), or a positive rate with `remat=True` (the
                recomputation would draw another mask).
        """
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
            raise ValueError(f"drop_rate must be in [0, 1), got {rate!r}.")
        if rate and self.remat:
            raise ValueError(
                "drop_rate > 0 with remat=True: the recomputed branch would draw another "
                "drop mask. Use one or the other."
            )
        self.drop_rate = float(rate)
        if self.drop_rate and self._drop_seed is None:
            # A built layer locks its state; Keras' own quantize() unlocks it the same way
            # to add state later. The seed's variable joins the layer (and checkpoints).
            locked = getattr(self, "_tracker", None) is not None and self._tracker.locked
            if locked:
                self._tracker.unlock()
            self._drop_seed = keras.random.SeedGenerator(name="drop_seed")
            if locked:
                self._tracker.lock()

    def _drop(self, y, training):
        """The residual branch, dropped per example with `drop_rate` in training."""
        if not (training and self.drop_rate):
            return y
        keep = 1.0 - self.drop_rate
        noise = keras.random.uniform((ops.shape(y)[0], 1, 1, 1), seed=self._drop_seed)
        mask = ops.cast(noise < keep, y.dtype)
        return y * mask / ops.cast(keep, y.dtype)

    @property
    def output_filters(self) -> int:
        """Channels of the block's output: `filters`."""
        return self.filters

    def _build_shortcut(self, input_shape) -> None:
        shape_changes = self.strides != 1 or input_shape[-1] != self.output_filters
        if self.projection is False and shape_changes:
            raise ValueError(
                f"{type(self).__name__} with projection=False cannot add an identity "
                f"shortcut: input {tuple(input_shape)} → {self.output_filters} channels with "
                f"strides={self.strides} changes the shape. Use projection='auto'."
            )
        self.uses_projection = self.projection is True or shape_changes
        if self.uses_projection:
            self.shortcut_conv = _conv(
                self.output_filters, 1, self.strides, "shortcut_conv", dtype=self.dtype_policy
            )
            self.shortcut_conv.build(input_shape)
            self.shortcut_bn = _batch_norm("shortcut_bn", dtype=self.dtype_policy)
            self.shortcut_bn.build(self.compute_output_shape(input_shape))

    def _shortcut(self, x, training, update_stats):
        if not self.uses_projection:
            return x
        return _normalize(self.shortcut_bn, self.shortcut_conv(x), training, update_stats)

    def _forward(self, x, training, update_stats):
        raise NotImplementedError

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        if not self.remat:
            return self._forward(inputs, training, update_stats=True)
        calls = []

        def forward(x):
            # First call: the forward pass. Later calls: recomputation for gradients.
            calls.append(None)
            return self._forward(x, training, update_stats=len(calls) == 1)

        return keras.remat(forward)(inputs)

    def compute_output_shape(self, input_shape: tuple) -> tuple:
        batch, height, width, _ = input_shape
        return (
            batch,
            _spatial(height, self.strides),
            _spatial(width, self.strides),
            self.output_filters,
        )

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            filters=self.filters,
            strides=self.strides,
            projection=self.projection,
            remat=self.remat,
        )
        if self.drop_rate:
            config["drop_rate"] = self.drop_rate
        return config


@keras.saving.register_keras_serializable(package="tfaccel")
class ResidualBlock(_ResNetBlock):
    """The basic block of ResNet-18/34: 3x3 conv-BN-ReLU, 3x3 conv-BN, shortcut, ReLU.

    Args:
        filters: output channels (positive int).
        strides: 1, or 2 to halve height and width (in the first convolution).
        projection: "auto" adds a 1x1 conv-BN shortcut when the shape changes;
            True always adds one; False never (an error if the shape changes).
        remat: recompute the block's activations in the backward pass to save memory.
        drop_rate: stochastic depth, the probability of dropping the residual branch
            of an example in training (`set_drop_rate`); 0 (default) never.
        **kwargs: `keras.layers.Layer` arguments (`name`, `dtype`, `trainable`).

    Raises:
        ValueError: non-positive filters, strides not 1 or 2, an unknown projection,
            or (when built) inputs that are not 4-D.
    """

    def build(self, input_shape: tuple) -> None:
        input_shape = _check_rank4(self, input_shape)
        out_shape = self.compute_output_shape(input_shape)
        policy = self.dtype_policy
        self.conv1 = _conv(self.filters, 3, self.strides, "conv1", dtype=policy)
        self.conv1.build(input_shape)
        self.bn1 = _batch_norm("bn1", dtype=policy)
        self.bn1.build(out_shape)
        self.conv2 = _conv(self.filters, 3, 1, "conv2", dtype=policy)
        self.conv2.build(out_shape)
        self.bn2 = _batch_norm("bn2", dtype=policy)
        self.bn2.build(out_shape)
        self._build_shortcut(input_shape)

    def _forward(self, x, training, update_stats):
        y = ops.relu(_normalize(self.bn1, self.conv1(x), training, update_stats))
        y = self._drop(_normalize(self.bn2, self.conv2(y), training, update_stats), training)
        return ops.relu(y + self._shortcut(x, training, update_stats))


@keras.saving.register_keras_serializable(package="tfaccel")
class BottleneckBlock(_ResNetBlock):
    """The ResNet-50/101/152 block: 1x1 reduce, 3x3 (with the stride), 1x1 expand.

    Each convolution is followed by BN (and ReLU, except the last, which is added to
    the shortcut before the final ReLU). The stride sits on the 3x3 convolution.

    Args:
        filters: channels of the 1x1 and 3x3 convolutions; the output has
            `filters * expansion` channels.
        strides: 1, or 2 to halve height and width.
        expansion: output channel multiplier (positive int, 4 in ResNet-50).
        projection: "auto", True or False, as in `ResidualBlock`.
        remat: recompute the block's activations in the backward pass to save memory.
        drop_rate: stochastic depth, as in `ResidualBlock`.
        **kwargs: `keras.layers.Layer` arguments.

    Raises:
        ValueError: non-positive filters or expansion, strides not 1 or 2, an unknown
            projection, or (when built) inputs that are not 4-D.
    """

    def __init__(
        self,
        filters,
        strides=1,
        expansion=4,
        projection="auto",
        remat=False,
        drop_rate=0.0,
        **kwargs,
    ):
        super().__init__(filters, strides, projection, remat, drop_rate, **kwargs)
        self.expansion = _positive_int(expansion, "expansion")

    @property
    def output_filters(self) -> int:
        """Channels of the block's output: `filters * expansion`."""
        return self.filters * self.expansion

    def build(self, input_shape: tuple) -> None:
        input_shape = _check_rank4(self, input_shape)
        batch, height, width, _ = input_shape
        reduced = (batch, height, width, self.filters)
        out_shape = self.compute_output_shape(input_shape)
        strided = out_shape[:3] + (self.filters,)
        policy = self.dtype_policy
        self.conv1 = _conv(self.filters, 1, 1, "conv1", dtype=policy)
        self.conv1.build(input_shape)
        self.bn1 = _batch_norm("bn1", dtype=policy)
        self.bn1.build(reduced)
        self.conv2 = _conv(self.filters, 3, self.strides, "conv2", dtype=policy)
        self.conv2.build(reduced)
        self.bn2 = _batch_norm("bn2", dtype=policy)
        self.bn2.build(strided)
        self.conv3 = _conv(self.output_filters, 1, 1, "conv3", dtype=policy)
        self.conv3.build(strided)
        self.bn3 = _batch_norm("bn3", dtype=policy)
        self.bn3.build(out_shape)
        self._build_shortcut(input_shape)

    def _forward(self, x, training, update_stats):
        y = ops.relu(_normalize(self.bn1, self.conv1(x), training, update_stats))
        y = ops.relu(_normalize(self.bn2, self.conv2(y), training, update_stats))
        y = self._drop(_normalize(self.bn3, self.conv3(y), training, update_stats), training)
        return ops.relu(y + self._shortcut(x, training, update_stats))

    def get_config(self) -> dict:
        config = super().get_config()
        config["expansion"] = self.expansion
        return config


@keras.saving.register_keras_serializable(package="tfaccel")
class InceptionBlock(layers.Layer):
    """GoogLeNet's Inception block: four parallel paths concatenated on channels.

    Paths: 1x1 conv (`c1`); 1x1 (`c2[0]`) → 3x3 (`c2[1]`); 1x1 (`c3[0]`) → 5x5
    (`c3[1]`); 3x3 max-pool (stride 1) → 1x1 (`c4`). Every convolution uses "same"
    padding, a bias and ReLU. The output has `c1 + c2[1] + c3[1] + c4` channels.

    Args:
        c1: filters of the 1x1 path.
        c2: (1x1 reduction, 3x3 output) filters.
        c3: (1x1 reduction, 5x5 output) filters.
        c4: filters of the 1x1 convolution after the max-pool.
        **kwargs: `keras.layers.Layer` arguments.

    Raises:
        ValueError: non-positive filters, `c2` / `c3` not pairs, or (when built)
            inputs that are not 4-D.
    """

    def __init__(self, c1, c2, c3, c4, **kwargs):
        super().__init__(**kwargs)
        self.c1 = _positive_int(c1, "c1")
        self.c2 = _pair(c2, "c2")
        self.c3 = _pair(c3, "c3")
        self.c4 = _positive_int(c4, "c4")

    def _conv(self, filters, kernel_size, name):
        return layers.Conv2D(
            filters,
            kernel_size,
            padding="same",
            activation="relu",
            name=name,
            dtype=self.dtype_policy,
        )

    def build(self, input_shape: tuple) -> None:
        input_shape = _check_rank4(self, input_shape)
        batch, height, width, _ = input_shape
        self.path1 = self._conv(self.c1, 1, "path1_1x1")
        self.path1.build(input_shape)
        self.path2_reduce = self._conv(self.c2[0], 1, "path2_1x1")
        self.path2_reduce.build(input_shape)
        self.path2 = self._conv(self.c2[1], 3, "path2_3x3")
        self.path2.build((batch, height, width, self.c2[0]))
        self.path3_reduce = self._conv(self.c3[0], 1, "path3_1x1")
        self.path3_reduce.build(input_shape)
        self.path3 = self._conv(self.c3[1], 5, "path3_5x5")
        self.path3.build((batch, height, width, self.c3[0]))
        self.path4_pool = layers.MaxPooling2D(
            3, strides=1, padding="same", name="path4_pool", dtype=self.dtype_policy
        )
        self.path4 = self._conv(self.c4, 1, "path4_1x1")
        self.path4.build(input_shape)

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        paths = [
            self.path1(inputs),
            self.path2(self.path2_reduce(inputs)),
            self.path3(self.path3_reduce(inputs)),
            self.path4(self.path4_pool(inputs)),
        ]
        return ops.concatenate(paths, axis=-1)

    def compute_output_shape(self, input_shape: tuple) -> tuple:
        channels = self.c1 + self.c2[1] + self.c3[1] + self.c4
        return tuple(input_shape[:-1]) + (channels,)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(c1=self.c1, c2=list(self.c2), c3=list(self.c3), c4=self.c4)
        return config
