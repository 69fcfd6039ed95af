import json
import os
import pathlib
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfaccel import precision
from tfaccel.blocks import BottleneckBlock, InceptionBlock, ResidualBlock
from tfaccel.models import googlenet, mlp, resnet

ROOT = pathlib.Path(__file__).resolve().parents[1]


def data(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def labels(n, classes, seed=1):
    return np.random.default_rng(seed).integers(0, classes, n).astype("int32")


def trainable_count(model):
    return sum(int(np.prod(w.shape)) for w in model.trainable_weights)


def tiny_resnet(depth=18, **kwargs):
    kwargs = {"input_shape": (8, 8, 1), "num_classes": 3, "stem": "cifar", "width": 4, **kwargs}
    return resnet(depth, **kwargs)


@pytest.mark.parametrize("depth, expected", [(18, 11_689_512), (34, 21_797_672), (50, 25_557_032)])
def test_resnet_canonical_trainable_parameters(depth, expected):
    model = resnet(depth, input_shape=(224, 224, 3), num_classes=1000)
    assert trainable_count(model) == expected
    assert model.output_shape == (None, 1000)


@pytest.mark.parametrize(
    "depth, kind, blocks",
    [
        (18, ResidualBlock, 8),
        (50, BottleneckBlock, 16),
        (101, BottleneckBlock, 33),
        (152, BottleneckBlock, 50),
    ],
)
def test_resnet_depths_stack_the_right_blocks(depth, kind, blocks):
    model = resnet(depth, input_shape=(32, 32, 3), num_classes=10, stem="cifar", width=2)
    found = [layer for layer in model.layers if isinstance(layer, (ResidualBlock, BottleneckBlock))]
    assert len(found) == blocks and all(type(layer) is kind for layer in found)
    assert model.output_shape == (None, 10)


def test_resnet_stems_and_width():
    model = resnet(18, input_shape=(32, 32, 3), num_classes=10, stem="cifar", width=16)
    names = [layer.name for layer in model.layers]
    assert "stem_pool" not in names
    assert model.get_layer("stem_conv").kernel.shape == (3, 3, 3, 16)
    shapes = [model.get_layer(f"stage{i}_block2").output.shape for i in (1, 2, 3, 4)]
    assert shapes == [(None, 32, 32, 16), (None, 16, 16, 32), (None, 8, 8, 64), (None, 4, 4, 128)]

    model = resnet(50, input_shape=(64, 64, 3), num_classes=10, width=8)
    assert model.get_layer("stem_conv").kernel.shape == (7, 7, 3, 8)
    assert model.get_layer("stem_pool").output.shape == (None, 16, 16, 8)
    assert model.get_layer("stage4_block3").output.shape == (None, 2, 2, 8 * 8 * 4)


def test_resnet_on_digit_sized_images():
    model = resnet(18, input_shape=(8, 8, 1), num_classes=10, stem="cifar", width=16)
    y = np.asarray(model(data((3, 8, 8, 1)), training=False))
    assert y.shape == (3, 10)
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)


def test_googlenet_shapes():
    model = googlenet(input_shape=(96, 96, 1), num_classes=10)
    assert sum(isinstance(layer, InceptionBlock) for layer in model.layers) == 9
    assert model.get_layer("inception5_2").output.shape == (None, 3, 3, 1024)
    y = np.asarray(model(data((2, 96, 96, 1)), training=False))
    assert y.shape == (2, 10)
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)

    model = googlenet(input_shape=(224, 224, 3), num_classes=1000, classifier_activation=None)
    assert model.get_layer("inception5_2").output.shape == (None, 7, 7, 1024)
    assert model.output_shape == (None, 1000)


def test_mlp_layers_and_parameters():
    model = mlp(input_shape=(28, 28), hidden=(32, 16), num_classes=10, dropout=0.5)
    assert model.output_shape == (None, 10)
    assert trainable_count(model) == (784 * 32 + 32) + (32 * 16 + 16) + (16 * 10 + 10)
    assert [type(layer).__name__ for layer in model.layers[1:]] == [
        "Flatten",
        "Dense",
        "Dropout",
        "Dense",
        "Dropout",
        "Dense",
    ]
    linear = mlp(input_shape=(5,), hidden=(), num_classes=2, classifier_activation=None)
    x = data((4, 5))
    kernel, bias = (np.asarray(w) for w in linear.weights)
    np.testing.assert_allclose(linear(x), x @ kernel + bias, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("depth", [20, 0, "18", True, None])
def test_resnet_unsupported_depth(depth):
    with pytest.raises(ValueError, match="Unsupported ResNet depth"):
        resnet(depth, input_shape=(32, 32, 3), num_classes=10)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: tiny_resnet(stem="tiny"), "Unknown stem"),
        (lambda: tiny_resnet(width=0), "width must be a positive integer"),
        (lambda: tiny_resnet(num_classes=0), "num_classes must be a positive integer"),
        (lambda: tiny_resnet(input_shape=(8, 8)), r"input_shape=\(height, width, channels\)"),
        (lambda: googlenet(input_shape=(96, 96), num_classes=10), "input_shape="),
        (lambda: googlenet(input_shape=(96, 96, 1), num_classes=-1), "num_classes"),
        (lambda: mlp(input_shape=(4,), hidden=(8, 0), num_classes=2), "hidden size must be"),
        (lambda: mlp(input_shape=(4,), hidden=8, num_classes=2), "hidden must be a sequence"),
        (lambda: mlp(input_shape=(4,), num_classes=2, dropout=1.0), r"dropout must be .*\[0, 1\)"),
        (lambda: mlp(input_shape=4, num_classes=2), "non-empty tuple"),
    ],
)
def test_builder_bad_arguments(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_save_and_load_in_a_fresh_process(tmp_path, jobs):
    keras.utils.set_random_seed(0)
    models = {
        "resnet18_remat": tiny_resnet(remat=True),
        "resnet50": tiny_resnet(50, input_shape=(16, 16, 3), width=2, stem="imagenet"),
        "googlenet": googlenet(input_shape=(32, 32, 3), num_classes=4),
        "mlp": mlp(input_shape=(8, 8, 1), hidden=(16,), num_classes=3, dropout=0.2),
    }
    expected = {}
    rng = np.random.default_rng(0)
    for name, model in models.items():
        # move BN moving statistics away from their initial values, so that they count
        for weight in model.non_trainable_weights:
            weight.assign(rng.uniform(0.5, 1.5, weight.shape).astype("float32"))
        x = data((4,) + model.input_shape[1:])
        model.save(tmp_path / f"{name}.keras")
        np.save(tmp_path / f"{name}_x.npy", x)
        expected[name] = keras.ops.convert_to_numpy(model(x, training=False))

    code = f"""
        import json, pathlib
        import numpy as np
        import keras
        import tfaccel  # registers the tfaccel blocks
        root = pathlib.Path({str(tmp_path)!r})
        out = {{}}
        for name in {list(models)!r}:
            model = keras.saving.load_model(root / f"{{name}}.keras")
            y = model(np.load(root / f"{{name}}_x.npy"), training=False)
            np.save(root / f"{{name}}_y.npy", keras.ops.convert_to_numpy(y))
            out[name] = sorted({{type(l).__name__ for l in model.layers}})
        print(json.dumps(out))
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    # a process of its own, forked from one that imported TensorFlow (conftest's jobs)
    result = jobs.run([sys.executable, "-c", textwrap.dedent(code)], 300, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    layer_types = json.loads(result.stdout.strip().splitlines()[-1])
    assert "ResidualBlock" in layer_types["resnet18_remat"]
    assert "BottleneckBlock" in layer_types["resnet50"]
    assert "InceptionBlock" in layer_types["googlenet"]
    for name, y in expected.items():
        np.testing.assert_array_equal(np.load(tmp_path / f"{name}_y.npy"), y, err_msg=name)


# float16 on a CPU is slow (precision warns once), which does not matter here
@pytest.mark.filterwarnings("ignore:mixed_float16 was requested")
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("build", ["resnet", "mlp"])
def test_mixed_precision_outputs_float32_and_training_reduces_loss(policy, build):
    keras.utils.set_random_seed(0)
    x, y = data((32, 8, 8, 1)), labels(32, 3)
    compute = policy.removeprefix("mixed_")
    with precision.scope(policy):
        if build == "resnet":
            model = tiny_resnet(remat=True)
            assert model.get_layer("stage2_block1").conv1.compute_dtype == compute
        else:
            model = mlp(input_shape=(8, 8, 1), hidden=(32,), num_classes=3)
            assert model.get_layer("dense1").compute_dtype == compute
        assert model.get_layer("classifier").compute_dtype == "float32"
        optimizer = precision.wrap_optimizer(keras.optimizers.Adam(1e-2))
        assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer) == (
            policy == "mixed_float16"
        )
        model.compile(optimizer, "sparse_categorical_crossentropy")
        assert model(x[:2], training=False).dtype == "float32"
        history = model.fit(x, y, batch_size=32, epochs=8, verbose=0).history["loss"]
    assert keras.config.dtype_policy().name == "float32"
    assert all(np.isfinite(history))
    assert history[-1] < 0.8 * history[0]


def test_resnet_trains_under_mirrored_strategy(mirrored):
    keras.utils.set_random_seed(0)
    x, y = data((32, 8, 8, 1)), labels(32, 3)
    with mirrored.scope():
        model = tiny_resnet(remat=True)
        model.compile(keras.optimizers.Adam(1e-2), "sparse_categorical_crossentropy")
    assert model.distribute_strategy is mirrored
    history = model.fit(x, y, batch_size=16, epochs=6, verbose=0).history["loss"]
    assert all(np.isfinite(history)) and history[-1] < 0.8 * history[0]
    kernel = model.get_layer("stage1_block1").conv1.kernel.value
    replicas = mirrored.experimental_local_results(kernel)
    assert len(replicas) == 2
    np.testing.assert_array_equal(replicas[0], replicas[1])


def test_mlp_under_mirrored_matches_one_device(mirrored):
    x, y = data((32, 6)), labels(32, 3)

    def train(strategy):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            model = mlp(input_shape=(6,), hidden=(8,), num_classes=3)
            model.compile(keras.optimizers.SGD(0.5), "sparse_categorical_crossentropy")
        model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
        return [np.asarray(w) for w in model.weights]

    one = train(tf.distribute.get_strategy())
    two = train(mirrored)
    for a, b in zip(one, two, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
