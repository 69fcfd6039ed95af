import keras
import numpy as np
import pytest
import tensorflow as tf

from tfaccel.blocks import BottleneckBlock, InceptionBlock, ResidualBlock


def data(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def n_params(layer):
    return sum(int(np.prod(w.shape)) for w in layer.trainable_weights)


@pytest.mark.parametrize(
    "make, in_shape, out_shape",
    [
        (lambda: ResidualBlock(8), (2, 8, 8, 8), (2, 8, 8, 8)),
        (lambda: ResidualBlock(16, strides=2), (2, 8, 8, 8), (2, 4, 4, 16)),
        (lambda: ResidualBlock(4, strides=2), (2, 7, 5, 3), (2, 4, 3, 4)),
        (lambda: BottleneckBlock(4), (2, 8, 8, 3), (2, 8, 8, 16)),
        (lambda: BottleneckBlock(4, strides=2, expansion=2), (2, 8, 8, 8), (2, 4, 4, 8)),
        (lambda: InceptionBlock(4, (2, 6), (1, 3), 5), (2, 6, 6, 3), (2, 6, 6, 18)),
    ],
)
def test_output_shapes(make, in_shape, out_shape):
    block = make()
    assert tuple(block(data(in_shape)).shape) == out_shape
    assert tuple(block.compute_output_shape(in_shape)) == out_shape
    assert block.compute_output_shape((None,) + in_shape[1:]) == (None,) + out_shape[1:]


def test_residual_projection_only_when_shape_changes():
    same = ResidualBlock(8)
    same.build((None, 8, 8, 8))
    assert not same.uses_projection
    # two 3x3 convs without bias + two BNs (gamma, beta)
    assert n_params(same) == 2 * (3 * 3 * 8 * 8) + 2 * 2 * 8

    wider = ResidualBlock(16)
    wider.build((None, 8, 8, 8))
    assert wider.uses_projection
    assert n_params(wider) == 3 * 3 * 8 * 16 + 3 * 3 * 16 * 16 + 2 * 2 * 16 + 8 * 16 + 2 * 16

    strided = ResidualBlock(8, strides=2)
    strided.build((None, 8, 8, 8))
    assert strided.uses_projection

    forced = ResidualBlock(8, projection=True)
    forced.build((None, 8, 8, 8))
    assert forced.uses_projection and n_params(forced) == n_params(same) + 8 * 8 + 2 * 8


def test_identity_shortcut_adds_the_input():
    block = ResidualBlock(4)
    x = data((2, 5, 5, 4))
    block.build(x.shape)
    # With the residual branch switched off (bn2: gamma = beta = 0) the block is relu(x).
    block.bn2.gamma.assign(np.zeros(4))
    block.bn2.beta.assign(np.zeros(4))
    np.testing.assert_allclose(block(x, training=False), np.maximum(x, 0), atol=1e-6)


def test_bottleneck_parameter_count():
    block = BottleneckBlock(4, strides=2)
    block.build((None, 8, 8, 8))
    convs = 8 * 4 + 3 * 3 * 4 * 4 + 4 * 16
    bns = 2 * (4 + 4 + 16)
    projection = 8 * 16 + 2 * 16
    assert n_params(block) == convs + bns + projection


def test_inception_concatenates_the_four_paths():
    block = InceptionBlock(3, (2, 4), (2, 5), 6)
    x = data((2, 4, 4, 3))
    y = np.asarray(block(x))
    assert y.shape == (2, 4, 4, 3 + 4 + 5 + 6)
    kernel, bias = (np.asarray(w) for w in block.path1.weights)
    np.testing.assert_allclose(y[..., :3], np.maximum(x @ kernel[0, 0] + bias, 0), atol=1e-5)
    # the last path is a 3x3 max-pool (stride 1, "same") followed by a 1x1 conv
    pooled = np.asarray(keras.layers.MaxPooling2D(3, 1, padding="same")(x))
    kernel, bias = (np.asarray(w) for w in block.path4.weights)
    np.testing.assert_allclose(y[..., -6:], np.maximum(pooled @ kernel[0, 0] + bias, 0), atol=1e-5)
    assert n_params(block) == (3 * 3 + 3) + (3 * 2 + 2 + 9 * 2 * 4 + 4) + (
        3 * 2 + 2 + 25 * 2 * 5 + 5
    ) + (3 * 6 + 6)


@pytest.mark.parametrize("cls", [ResidualBlock, BottleneckBlock])
def test_training_flag_reaches_batch_norm(cls):
    x = data((4, 6, 6, 8)) * 3 + 1
    inputs = keras.Input((6, 6, 8))
    model = keras.Model(inputs, cls(8, projection=True)(inputs))
    block = model.layers[-1]
    bns = [layer for layer in block._layers if isinstance(layer, keras.layers.BatchNormalization)]
    assert len(bns) == (3 if cls is ResidualBlock else 4)

    def stats():
        return [np.asarray(bn.moving_mean).copy() for bn in bns]

    before = stats()
    inference = np.asarray(model(x, training=False))
    assert all(np.array_equal(a, b) for a, b in zip(before, stats(), strict=True))
    training = np.asarray(model(x, training=True))
    assert all(not np.allclose(a, b) for a, b in zip(before, stats(), strict=True))
    assert not np.allclose(inference, training)
    # training=None inside fit/predict: predict is inference and leaves the stats alone
    after = stats()
    np.testing.assert_allclose(model.predict(x, verbose=0), model(x, training=False), atol=1e-6)
    assert all(np.array_equal(a, b) for a, b in zip(after, stats(), strict=True))


def _pair_of_blocks(cls, kwargs, in_shape):
    plain, remat = cls(remat=False, **kwargs), cls(remat=True, **kwargs)
    plain.build(in_shape)
    remat.build(in_shape)
    remat.set_weights(plain.get_weights())
    return plain, remat


def _train_step(layer, x):
    x = tf.convert_to_tensor(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=True)
        loss = tf.reduce_sum(tf.square(tf.cast(y, "float32")) * tf.range(1.0, y.shape[-1] + 1.0))
    grads = tape.gradient(loss, [x] + layer.trainable_variables)
    return y, grads


@pytest.mark.parametrize(
    "cls, kwargs",
    [
        (ResidualBlock, {"filters": 8}),
        (ResidualBlock, {"filters": 12, "strides": 2}),
        (BottleneckBlock, {"filters": 4, "strides": 2}),
    ],
)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "tf_function"])
def test_remat_equals_plain(cls, kwargs, compiled):
    x = data((4, 8, 8, 8))
    plain, remat = _pair_of_blocks(cls, kwargs, x.shape)
    step = tf.function(_train_step) if compiled else _train_step
    y_plain, g_plain = step(plain, x)
    y_remat, g_remat = step(remat, x)
    np.testing.assert_allclose(y_remat, y_plain, rtol=1e-5, atol=1e-6)
    assert len(g_remat) == len(g_plain) == 1 + len(plain.trainable_variables)
    for a, b in zip(g_remat, g_plain, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    # the recomputation did not update the moving statistics a second time
    for a, b in zip(remat.non_trainable_weights, plain.non_trainable_weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(
        remat(x, training=False), plain(x, training=False), rtol=1e-5, atol=1e-6
    )


def test_remat_recomputes_the_forward_pass(monkeypatch):
    calls = []
    forward = ResidualBlock._forward

    def spy(self, x, training, update_stats):
        calls.append((self.remat, update_stats))
        return forward(self, x, training, update_stats)

    monkeypatch.setattr(ResidualBlock, "_forward", spy)
    x = data((2, 4, 4, 4))
    plain, remat = _pair_of_blocks(ResidualBlock, {"filters": 4}, x.shape)
    _train_step(plain, x)
    assert calls == [(False, True)]
    calls.clear()
    _train_step(remat, x)
    # forward pass (updates BN statistics), then recomputation in the backward pass (does not)
    assert calls == [(True, True), (True, False)]


@pytest.mark.parametrize(
    "block",
    [
        ResidualBlock(8, strides=2, projection=True, remat=True, name="res"),
        BottleneckBlock(4, strides=1, expansion=2, projection="auto", name="bottle"),
        InceptionBlock(2, (3, 4), (1, 2), 5, name="incep"),
    ],
)
def test_config_round_trip_and_registration(block):
    config = block.get_config()
    clone = type(block).from_config(config)
    assert clone.get_config() == config
    serialized = keras.saving.serialize_keras_object(block)
    assert serialized["registered_name"] == f"tfaccel>{type(block).__name__}"
    restored = keras.saving.deserialize_keras_object(serialized)
    assert type(restored) is type(block) and restored.get_config() == config


@pytest.mark.parametrize(
    "make",
    [
        lambda: ResidualBlock(0),
        lambda: ResidualBlock(-8),
        lambda: ResidualBlock(2.5),
        lambda: BottleneckBlock(None),
        lambda: BottleneckBlock(4, expansion=0),
        lambda: InceptionBlock(0, (1, 2), (1, 2), 1),
        lambda: InceptionBlock(1, (1, -2), (1, 2), 1),
        lambda: InceptionBlock(1, (1, 2), (1, 2), 0),
    ],
)
def test_non_positive_filters(make):
    with pytest.raises(ValueError, match="must be a positive integer"):
        make()


@pytest.mark.parametrize("strides", [0, 3, (2, 2), "2", True])
@pytest.mark.parametrize("cls", [ResidualBlock, BottleneckBlock])
def test_strides_not_1_or_2(cls, strides):
    with pytest.raises(ValueError, match="strides must be 1 .* or 2"):
        cls(8, strides=strides)


@pytest.mark.parametrize("c2", [3, (1, 2, 3), (4,), "ab", None])
def test_inception_paths_not_pairs(c2):
    with pytest.raises(ValueError, match="c2 must be a pair"):
        InceptionBlock(1, c2, (1, 2), 1)
    with pytest.raises(ValueError, match="c3 must be a pair"):
        InceptionBlock(1, (1, 2), c2, 1)


@pytest.mark.parametrize(
    "block",
    [ResidualBlock(4), BottleneckBlock(4), InceptionBlock(1, (1, 2), (1, 2), 1)],
)
@pytest.mark.parametrize("shape", [(8, 8), (4, 8, 8, 3)])
def test_conv_block_input_rank_not_4(block, shape):
    with pytest.raises(ValueError, match="expects 4-D inputs"):
        type(block).from_config(block.get_config())(np.zeros((2,) + shape, "float32"))
    with pytest.raises(ValueError, match="expects 4-D inputs"):
        type(block).from_config(block.get_config())(keras.Input(shape))


def test_unknown_projection():
    with pytest.raises(ValueError, match="projection must be 'auto', True or False"):
        ResidualBlock(8, projection="always")


def test_identity_shortcut_impossible_when_shape_changes():
    with pytest.raises(ValueError, match="projection=False cannot add an identity"):
        ResidualBlock(8, strides=2, projection=False).build((None, 8, 8, 8))
    with pytest.raises(ValueError, match="projection=False cannot add an identity"):
        BottleneckBlock(8, projection=False).build((None, 8, 8, 8))


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_remat_equals_plain_under_mixed_precision(policy):
    x = data((4, 6, 6, 8))
    plain, remat = (BottleneckBlock(4, remat=r, dtype=policy) for r in (False, True))
    plain.build(x.shape)
    remat.build(x.shape)
    remat.set_weights(plain.get_weights())
    assert remat.conv1.compute_dtype == remat.compute_dtype == policy.removeprefix("mixed_")
    y_plain, g_plain = _train_step(plain, x)
    y_remat, g_remat = _train_step(remat, x)
    assert y_remat.dtype == y_plain.dtype == remat.compute_dtype
    np.testing.assert_array_equal(y_remat, y_plain)
    for a, b in zip(g_remat, g_plain, strict=True):
        np.testing.assert_allclose(np.asarray(a, "float32"), np.asarray(b, "float32"), rtol=1e-2)
