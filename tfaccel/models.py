"""ResNet, GoogLeNet and MLP builders made of `tfaccel.blocks` layers.

Each builder returns a functional `keras.Model` whose classifier head computes in
float32 (`dtype="float32"`), so that under `mixed_float16` / `mixed_bfloat16` the
outputs, and hence the loss, are float32. Building a model runs no forward pass.

Example:
    >>> model = resnet(18, input_shape=(32, 32, 3), num_classes=10, stem="cifar", width=16)
    >>> model.output_shape
    (None, 10)
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
from keras import layers

from tfaccel.blocks import BottleneckBlock, InceptionBlock, ResidualBlock, _positive_int

__all__ = ["googlenet", "mlp", "resnet"]

# depth → (block kind, blocks per stage), as in He et al. 2015, table 1.
RESNET_STAGES = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
}
"""ResNet depth → (block kind, blocks per stage), as in He et al. 2015, table 1."""
STEMS = ("imagenet", "cifar")
"""The stems `resnet(stem=...)` accepts: 7×7/2 + max-pool ("imagenet"), or one 3×3/1 ("cifar")."""

# GoogLeNet's Inception stages (c1, c2, c3, c4), as in Dive into Deep Learning §8.4.
_GOOGLENET_STAGES = (
    ((64, (96, 128), (16, 32), 32), (128, (128, 192), (32, 96), 64)),
    (
        (192, (96, 208), (16, 48), 64),
        (160, (112, 224), (24, 64), 64),
        (128, (128, 256), (24, 64), 64),
        (112, (144, 288), (32, 64), 64),
        (256, (160, 320), (32, 128), 128),
    ),
    ((256, (160, 320), (32, 128), 128), (384, (192, 384), (48, 128), 128)),
)


def _image_input(input_shape, builder: str) -> keras.KerasTensor:
    shape = tuple(input_shape) if isinstance(input_shape, Sequence) else None
    if shape is None or len(shape) != 3:
        raise ValueError(
            f"{builder} needs input_shape=(height, width, channels) without the batch axis, "
            f"got {input_shape!r}. For grayscale images use e.g. (28, 28, 1)."
        )
    return keras.Input(shape)


def _classifier(x, num_classes: int, activation):
    """The head: a Dense layer computing in float32 whatever the global policy."""
    return layers.Dense(num_classes, activation=activation, dtype="float32", name="classifier")(x)


def resnet(
    depth: int,
    *,
    input_shape: Sequence[int | None],
    num_classes: int,
    stem: str = "imagenet",
    width: int = 64,
    remat: bool = False,
    classifier_activation: str | None = "softmax",
    name: str | None = None,
) -> keras.Model:
    """Builds a ResNet (v1.5: the bottleneck's stride sits on its 3x3 convolution).

    Convolutions have no bias and are followed by BatchNormalization; stage `i`
    (0-based) has `width * 2**i` filters and halves the resolution from stage 1 on.
    With the ImageNet stem, 224x224x3 inputs, 1,000 classes and `width=64`, the
    trainable parameter counts are the canonical ones (ResNet-18 11,689,512;
    ResNet-34 21,797,672; ResNet-50 25,557,032).

    Args:
        depth: 18, 34 (basic blocks), 50, 101 or 152 (bottleneck blocks).
        input_shape: (height, width, channels).
        num_classes: size of the classifier output.
        stem: "imagenet" (7x7 stride-2 conv, BN, ReLU, 3x3 stride-2 max-pool) or
            "cifar" (3x3 stride-1 conv, BN, ReLU; no pooling) for small images such
            as 32x32 or 8x8.
        width: filters of the stem and first stage.
        remat: gradient checkpointing in every residual block.
        classifier_activation: activation of the head ("softmax"; None for logits).
        name: model name (default `resnet{depth}`).

    Returns:
        A functional `keras.Model` from images to class scores.

    Raises:
        ValueError: an unsupported depth or stem, a bad input shape, or a
            non-positive width / num_classes.
    """
    if isinstance(depth, bool) or depth not in RESNET_STAGES:
        raise ValueError(
            f"Unsupported ResNet depth {depth!r}; expected one of {sorted(RESNET_STAGES)}."
        )
    if stem not in STEMS:
        raise ValueError(f"Unknown stem {stem!r}; expected one of {STEMS}.")
    width = _positive_int(width, "width")
    _positive_int(num_classes, "num_classes")
    kind, stages = RESNET_STAGES[depth]
    inputs = _image_input(input_shape, "resnet")

    kernel_size, strides = (7, 2) if stem == "imagenet" else (3, 1)
    x = layers.Conv2D(
        width,
        kernel_size,
        strides=strides,
        padding="same",
        use_bias=False,
        kernel_initializer="he_normal",
        name="stem_conv",
    )(inputs)
    x = layers.BatchNormalization(momentum=0.9, epsilon=1e-5, name="stem_bn")(x)
    x = layers.ReLU(name="stem_relu")(x)
    if stem == "imagenet":
        x = layers.MaxPooling2D(3, strides=2, padding="same", name="stem_pool")(x)

    block = ResidualBlock if kind == "basic" else BottleneckBlock
    for stage, blocks in enumerate(stages):
        for index in range(blocks):
            strides = 2 if stage > 0 and index == 0 else 1
            x = block(
                width * 2**stage,
                strides=strides,
                remat=remat,
                name=f"stage{stage + 1}_block{index + 1}",
            )(x)
    x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
    outputs = _classifier(x, num_classes, classifier_activation)
    return keras.Model(inputs, outputs, name=name or f"resnet{depth}")


def googlenet(
    *,
    input_shape: Sequence[int | None],
    num_classes: int,
    classifier_activation: str | None = "softmax",
    name: str = "googlenet",
) -> keras.Model:
    """Builds GoogLeNet from `InceptionBlock`s (the Dive into Deep Learning layout).

    Stem: 7x7/2 conv (64), 3x3/2 max-pool, 1x1 conv (64), 3x3 conv (192), 3x3/2
    max-pool; then 2, 5 and 2 Inception blocks with 3x3/2 max-pools between the
    stages; global average pooling and the float32 classifier. Works for 96x96
    (Fashion-MNIST resized) and 224x224 inputs, and down to 32x32.

    Args:
        input_shape: (height, width, channels).
        num_classes: size of the classifier output.
        classifier_activation: activation of the head ("softmax"; None for logits).
        name: model name.

    Returns:
        A functional `keras.Model`.

    Raises:
        ValueError: a bad input shape or a non-positive num_classes.
    """
    _positive_int(num_classes, "num_classes")
    inputs = _image_input(input_shape, "googlenet")
    x = layers.Conv2D(64, 7, strides=2, padding="same", activation="relu", name="stem_conv1")(
        inputs
    )
    x = layers.MaxPooling2D(3, strides=2, padding="same", name="stem_pool1")(x)
    x = layers.Conv2D(64, 1, activation="relu", name="stem_conv2")(x)
    x = layers.Conv2D(192, 3, padding="same", activation="relu", name="stem_conv3")(x)
    x = layers.MaxPooling2D(3, strides=2, padding="same", name="stem_pool2")(x)
    for stage, blocks in enumerate(_GOOGLENET_STAGES, start=3):
        for index, (c1, c2, c3, c4) in enumerate(blocks, start=1):
            x = InceptionBlock(c1, c2, c3, c4, name=f"inception{stage}_{index}")(x)
        if stage < 5:
            x = layers.MaxPooling2D(3, strides=2, padding="same", name=f"pool{stage}")(x)
    x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
    outputs = _classifier(x, num_classes, classifier_activation)
    return keras.Model(inputs, outputs, name=name)


def mlp(
    *,
    input_shape: Sequence[int | None],
    hidden: Sequence[int] = (256,),
    num_classes: int,
    dropout: float = 0.0,
    classifier_activation: str | None = "softmax",
    name: str = "mlp",
) -> keras.Model:
    """Builds a multilayer perceptron: flatten, Dense-ReLU(-Dropout) per hidden size.

    Args:
        input_shape: shape of one example (flattened first when not 1-D).
        hidden: sizes of the hidden layers (positive ints; empty for a linear model).
        num_classes: size of the classifier output.
        dropout: dropout rate after each hidden layer, in [0, 1).
        classifier_activation: activation of the head ("softmax"; None for logits).
        name: model name.

    Returns:
        A functional `keras.Model`.

    Raises:
        ValueError: a bad input shape, hidden size, dropout or num_classes.
    """
    if not isinstance(input_shape, Sequence) or not input_shape:
        raise ValueError(
            f"mlp needs input_shape as a non-empty tuple without the batch axis, "
            f"got {input_shape!r}. E.g. input_shape=(784,) or (28, 28)."
        )
    if isinstance(hidden, (str, bytes)) or not isinstance(hidden, Sequence):
        raise ValueError(f"hidden must be a sequence of layer sizes, got {hidden!r}.")
    sizes = [_positive_int(h, "hidden size") for h in hidden]
    _positive_int(num_classes, "num_classes")
    if isinstance(dropout, bool) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be a rate in [0, 1), got {dropout!r}.")
    inputs = keras.Input(tuple(input_shape))
    x = layers.Flatten(name="flatten")(inputs) if len(input_shape) > 1 else inputs
    for index, size in enumerate(sizes, start=1):
        x = layers.Dense(size, activation="relu", name=f"dense{index}")(x)
        if dropout:
            x = layers.Dropout(dropout, name=f"dropout{index}")(x)
    outputs = _classifier(x, num_classes, classifier_activation)
    return keras.Model(inputs, outputs, name=name)
