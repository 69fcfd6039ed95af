"""Pipeline model parallelism on two logical CPU devices: split, PipelineModel, errors."""

import itertools
import json
import logging
import re
import zipfile

import keras
import numpy as np
import pytest
import tensorflow as tf
from closeness import FLOAT64_RTOL, float64, weight_gap
from conftest import CPUS

import tfaccel
from tfaccel.parallel import PipelineModel, SplitError, split
from tfaccel.parallel.split import _analyse


def small_cnn(seed=0):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Conv2D(4, 3, activation="relu", name="conv")(inputs)
    x = keras.layers.MaxPooling2D(name="pool")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(8, activation="relu", name="hidden")(x)
    outputs = keras.layers.Dense(3, name="logits")(x)
    return keras.Model(inputs, outputs, name="cnn")


def small_resnet(seed=0):
    keras.utils.set_random_seed(seed)
    return tfaccel.models.resnet(
        18, input_shape=(8, 8, 3), num_classes=3, stem="cifar", width=4, classifier_activation=None
    )


def copy_of(model):
    twin = keras.models.clone_model(model)
    twin.set_weights(model.get_weights())
    return twin


def pipeline(model, stages=2, micro_batches=4):
    return PipelineModel(split(model, stages), devices=CPUS[:stages], micro_batches=micro_batches)


def compile_sgd(model):
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )


def images(n, channels=1, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, 8, 8, channels), dtype=np.float32), rng.integers(0, 3, n)


def max_weight_gap(a, b):
    pairs = list(zip(a.get_weights(), b.get_weights(), strict=True))
    assert all(x.shape == y.shape for x, y in pairs)
    return max(float(np.abs(x - y).max()) for x, y in pairs)


# --- equality with the unsplit model ---------------------------------------------------


def test_cnn_outputs_equal_unsplit_model():
    model = small_cnn()
    pp = pipeline(model)
    x, _ = images(16)
    np.testing.assert_allclose(pp(x), model(x), atol=1e-6)
    # 10 examples, 4 micro-batches: a remainder the micro-batches share.
    np.testing.assert_allclose(pp.predict(x[:10], verbose=0), model(x[:10]), atol=1e-6)


def test_cnn_fit_weights_equal_unsplit_fit():
    model = small_cnn()
    reference = copy_of(model)
    pp = pipeline(model)
    x, y = images(32)
    for m in (reference, pp):
        compile_sgd(m)
        history = m.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert len(history.history["loss"]) == 2
    assert max_weight_gap(reference, pp) < 1e-5
    assert max_weight_gap(reference, model) > 1e-3  # the pipeline trained its own copies


def test_partial_last_batch_shares_remainder_and_trains_like_fit():
    model = small_cnn()
    reference = copy_of(model)
    pp = pipeline(model)
    sizes = [int(p.shape[0]) for p in pp._split(tf.zeros((10, 8, 8, 1)), training=True)]
    assert sizes == [3, 3, 2, 2]
    x, y = images(14)  # batches of 8 and 6: the last one is cut 2, 2, 1, 1
    for m in (reference, pp):
        compile_sgd(m)
        m.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert max_weight_gap(reference, pp) < 1e-5


@pytest.mark.parametrize("kind", ["default", "one_device"])
def test_trainer_trains_pipeline_like_fit(kind):
    model = small_cnn()
    reference = copy_of(model)
    x, y = images(32)
    compile_sgd(reference)
    reference.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8, drop_remainder=True)
    trainer = tfaccel.Trainer(
        lambda: pipeline(model),
        optimizer=lambda: keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        strategy=tfaccel.devices.strategy(kind, devices=None if kind == "default" else CPUS[:1]),
    )
    trainer.fit(data, epochs=2, verbose=0)
    assert isinstance(trainer.model, PipelineModel)
    assert max_weight_gap(reference, trainer.model) < 1e-5


def test_resnet_outputs_equal_unsplit_model():
    model = small_resnet()
    x, _ = images(16, channels=3)
    np.testing.assert_allclose(pipeline(model)(x), model(x), atol=1e-6)


def test_resnet_one_micro_batch_trains_like_fit():
    """Compared in float64: a float32 comparison of a deep model is loose or flaky (closeness)."""
    with float64():
        model = small_resnet()
        reference = copy_of(model)
        pp = pipeline(model, micro_batches=1)
        x, y = images(16, channels=3)
        for m in (reference, pp):
            compile_sgd(m)
            m.fit(x.astype("float64"), y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert pp.get_weights()[0].dtype == np.float64
    assert 1e-3 < weight_gap(reference, model) and weight_gap(reference, pp) < FLOAT64_RTOL


class _MicroBatched(keras.Model):
    """The documented BatchNorm semantics: the model applied to each micro-batch in turn."""

    def __init__(self, inner, parts):
        super().__init__(name="micro_batched")
        self.inner, self.parts = inner, parts

    def call(self, x, training=None):
        outputs = [self.inner(part, training=training) for part in tf.split(x, self.parts)]
        return tf.concat(outputs, axis=0)


def test_batchnorm_uses_per_micro_batch_statistics():
    model = small_resnet()
    x, y = images(16, channels=3)
    reference = _MicroBatched(copy_of(model), parts=2)
    pp = pipeline(model, micro_batches=2)
    np.testing.assert_allclose(pp(x, training=True), reference(x, training=True), atol=1e-5)
    # One training call updated BN's moving statistics once per micro-batch.
    assert max_weight_gap(reference.inner, pp) < 1e-6
    whole = copy_of(model)
    whole(x, training=True)  # one update with the whole batch's statistics
    assert max_weight_gap(whole, pp) > 1e-4


def test_micro_batched_batchnorm_trains_like_the_model_on_each_micro_batch():
    with float64():
        model = small_resnet()
        reference = _MicroBatched(copy_of(model), parts=2)
        pp = pipeline(model, micro_batches=2)
        x, y = images(16, channels=3)
        data = tf.data.Dataset.from_tensor_slices((x.astype("float64"), y)).batch(8)
        for m in (reference, pp):
            compile_sgd(m)
            m.fit(data, epochs=2, verbose=0)
    assert weight_gap(reference.inner, pp) < FLOAT64_RTOL


# --- the graph: placement and the pipeline schedule ------------------------------------


@pytest.fixture(scope="module")
def traced():
    """A PipelineModel (3 micro-batches) and the graph of one SGD step on it."""
    pp = pipeline(small_resnet(), micro_batches=3)

    @tf.function
    def train_step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(pp(x, training=True))
        grads = tape.gradient(loss, pp.trainable_variables)
        return [tf.reduce_sum(g) for g in grads]

    return pp, train_step.get_concrete_function(tf.TensorSpec((6, 8, 8, 3))).graph


def _scope(op):
    match = re.search(r"micro_batch(\d+)_stage(\d+)/", op.name)
    return (int(match[1]), int(match[2])) if match else None


def test_each_stage_runs_on_its_device(traced):
    pp, graph = traced
    expected = [tf.DeviceSpec.from_string(d).to_string() for d in pp.devices]
    for i, stage in enumerate(pp.stages):
        assert {tf.DeviceSpec.from_string(v.value.device).device_index for v in stage.weights} == {
            i
        }
    placed = {}
    for op in graph.get_operations():
        where = _scope(op)
        if where is None or op.name.startswith("gradient") or op.type in _RESOURCE_OPS:
            continue  # variable reads run where the variable lives (asserted above)
        placed.setdefault(where[1], set()).add(op.device)
    assert placed == {0: {expected[0]}, 1: {expected[1]}}
    # The backward pass of each stage runs on that stage's device too.
    backward = {op.device for op in graph.get_operations() if op.type == "Conv2DBackpropFilter"}
    assert backward == set(expected)


_RESOURCE_OPS = ("Placeholder", "ReadVariableOp")


def test_stage_of_next_micro_batch_does_not_wait_for_next_stage(traced):
    _, graph = traced
    ops = {}
    for op in graph.get_operations():
        if (where := _scope(op)) is not None and not op.name.startswith("gradient"):
            ops.setdefault(where, []).append(op)
    assert sorted(ops) == [(m, i) for m in range(3) for i in range(2)]
    memo = {}

    def ancestors(op):
        if op.name not in memo:
            found = set()
            for parent in [t.op for t in op.inputs] + list(op.control_inputs):
                found.add(parent.name)
                found |= ancestors(parent)
            memo[op.name] = found
        return memo[op.name]

    for m in range(2):
        later = set().union(*(ancestors(op) for op in ops[(m + 1, 0)]))
        assert not later & {op.name for op in ops[(m, 1)]}, m
        # ...while the data path is there: stage 1 of m needs stage 0 of m.
        earlier = set().union(*(ancestors(op) for op in ops[(m, 1)]))
        assert earlier & {op.name for op in ops[(m, 0)]}


# --- split ------------------------------------------------------------------------------


def test_split_balances_resnet50_parameters():
    model = tfaccel.models.resnet(50, input_shape=(224, 224, 3), num_classes=1000)
    counts = [s.count_params() for s in split(model, 2)]
    assert sum(counts) == model.count_params()
    assert max(counts) <= 1.5 * min(counts)
    counts = [s.count_params() for s in split(model, 4)]
    assert sum(counts) == model.count_params()
    # Residual blocks cannot be cut inside, and stage 4's blocks hold 4.5-6M parameters
    # each: the best any 4-way cut can do is 1.67x, and split finds it.
    graph = _analyse(model)
    seen, per_node = set(), []
    for node in graph.nodes:
        per_node.append(tfaccel.parallel.costs.node_params(node, seen))
    bounds = [-1, *graph.cuts, len(graph.nodes) - 1]
    chunks = [sum(per_node[a + 1 : b + 1]) for a, b in itertools.pairwise(bounds)]
    best = min(
        max(parts) / min(parts)
        for cuts in itertools.combinations(range(1, len(chunks)), 3)
        for parts in [
            [sum(chunks[a:b]) for a, b in zip((0, *cuts), (*cuts, len(chunks)), strict=True)]
        ]
        if min(parts) > 0
    )
    assert max(counts) / min(counts) == pytest.approx(best)
    assert best < 1.7


def test_split_by_flops_moves_the_cut_towards_compute():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(16, 3, padding="same", name="conv1")(inputs)
    x = keras.layers.Conv2D(64, 3, padding="same", name="conv2")(x)  # most FLOPs
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    x = keras.layers.Dense(512, name="wide")(x)  # most parameters, few FLOPs
    model = keras.Model(inputs, keras.layers.Dense(4, name="head")(x))
    by_params = split(model, 2, balance="params")
    by_flops = split(model, 2, balance="flops")
    assert {"conv1", "conv2"} <= {layer.name for layer in by_params[0].layers}
    assert [layer.name for layer in by_flops[0].layers[1:]] == ["conv1"]
    flops = [tfaccel.parallel.costs.model_flops(s) for s in by_flops]
    conv2 = 2 * 16 * 16 * 3 * 3 * 16 * 64  # conv2's multiply-adds, hand-computed
    assert flops[1] >= conv2 > 10 * flops[0]
    x = np.random.default_rng(0).random((2, 16, 16, 3), dtype=np.float32)
    np.testing.assert_allclose(by_flops[1](by_flops[0](x)), model(x), atol=1e-6)


def test_split_sequential_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(5), keras.layers.Dense(4), keras.layers.Dense(2)]
    )
    stages = split(model, 3)
    assert [len(s.layers) - 1 for s in stages] == [1, 1, 1]
    x = np.ones((3, 6), np.float32)
    np.testing.assert_allclose(stages[2](stages[1](stages[0](x))), model(x), atol=1e-6)


def test_split_names_the_largest_possible_number_of_stages():
    model = small_cnn()  # 5 layers in a chain: 4 cut points
    assert len(split(model, 5)) == 5
    with pytest.raises(SplitError, match=r"largest possible number of stages is 5"):
        split(model, 6)


def test_split_refuses_a_layer_shared_across_the_cut():
    inputs = keras.Input((4,))
    shared = keras.layers.Dense(4, name="shared_dense")
    x = shared(inputs)
    x = keras.layers.Dense(4, name="middle")(x)
    model = keras.Model(inputs, shared(x))
    with pytest.raises(SplitError, match=r"shared_dense.*shared") as info:
        split(model, 2)
    assert "largest possible number of stages is 1" in str(info.value)


def test_split_refuses_subclassed_and_bad_arguments():
    with pytest.raises(SplitError, match="subclassed"):
        split(_MicroBatched(small_cnn(), 2), 2)
    with pytest.raises(SplitError, match="no input shape"):
        split(keras.Sequential([keras.layers.Dense(2)]), 1)
    with pytest.raises(ValueError, match="num_stages must be an integer >= 1"):
        split(small_cnn(), 0)
    with pytest.raises(ValueError, match="balance must be one of"):
        split(small_cnn(), 2, balance="memory")


# --- PipelineModel errors ---------------------------------------------------------------


def test_bad_micro_batches():
    stages = split(small_cnn(), 2)
    for bad in (0, -1, 2.5, "4", True):
        with pytest.raises(ValueError, match="micro_batches must be an integer >= 1"):
            PipelineModel(stages, devices=CPUS, micro_batches=bad)


def test_micro_batches_must_divide_a_static_training_batch():
    pp = pipeline(small_cnn(), micro_batches=4)
    compile_sgd(pp)
    x, y = images(12)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(6, drop_remainder=True)
    with pytest.raises(
        ValueError, match=r"micro_batches=4 does not divide the training batch of 6"
    ):
        pp.fit(data, epochs=1, verbose=0)


def test_training_batch_smaller_than_micro_batches():
    pp = pipeline(small_cnn(), micro_batches=4)
    with pytest.raises(
        ValueError, match=r"batch of 2 example\(s\) is smaller than micro_batches=4"
    ):
        pp(images(2)[0], training=True)


def test_more_stages_than_devices_and_missing_devices():
    stages = split(small_cnn(), 3)
    with pytest.raises(ValueError, match=r"More stages than devices: 3 stage\(s\) and 2"):
        PipelineModel(stages, devices=CPUS)
    with pytest.raises(ValueError, match="More devices than stages"):
        PipelineModel(stages[:1], devices=CPUS)
    with pytest.raises(tfaccel.DeviceConfigError, match=r"do not exist.*virtual_gpus"):
        PipelineModel(stages, devices=["/cpu:0", "/cpu:1", "/gpu:7"])
    with pytest.raises(TypeError, match="one device name per stage"):
        PipelineModel(stages, devices="/cpu:0")
    with pytest.raises(ValueError, match="Pass the stages in order"):
        PipelineModel([stages[1], stages[0]], devices=CPUS)


def test_mirrored_strategy_is_refused(mirrored):
    stages = split(small_cnn(), 2)
    with mirrored.scope():
        with pytest.raises(ValueError, match=r"default or a one-device strategy.*MirroredStrategy"):
            PipelineModel(stages, devices=CPUS)
    with pytest.raises(ValueError, match="default or a one-device strategy"):
        tfaccel.Trainer(lambda: PipelineModel(stages, devices=CPUS), loss="mse", strategy=mirrored)


def test_one_device_strategy_is_accepted():
    strategy = tfaccel.devices.strategy("one_device", devices=["/cpu:0"])
    stages = split(small_cnn(), 2)
    with strategy.scope():
        pp = PipelineModel(stages, devices=CPUS)
    for i, stage in enumerate(pp.stages):  # not all on the strategy's device
        assert {tf.DeviceSpec.from_string(v.value.device).device_index for v in stage.weights} == {
            i
        }
    x, _ = images(4)
    np.testing.assert_allclose(pp(x), stages[1](stages[0](x)), atol=1e-6)


# --- serialization and plan -------------------------------------------------------------


def test_save_and_load_with_the_same_or_overridden_devices(tmp_path):
    pp = pipeline(small_cnn())
    x, _ = images(8)
    path = tmp_path / "pp.keras"
    pp.save(path)
    same = keras.saving.load_model(path)
    assert same.devices == pp.devices and same.micro_batches == 4
    np.testing.assert_allclose(same(x), pp(x), atol=1e-6)
    swapped = tfaccel.parallel.load_model(path, devices=["/cpu:1", "/cpu:0"])
    assert swapped.devices == pp.devices[::-1]
    device = tf.DeviceSpec.from_string(swapped.stages[0].weights[0].value.device)
    assert device.device_index == 1
    np.testing.assert_allclose(swapped(x), pp(x), atol=1e-6)
    with pytest.raises(ValueError, match="More stages than devices"):
        tfaccel.parallel.load_model(path, devices=["/cpu:0"])


def test_load_on_a_machine_without_the_saved_devices_uses_one_device(tmp_path, caplog):
    pp = pipeline(small_cnn())
    x, _ = images(8)
    path, moved = tmp_path / "pp.keras", tmp_path / "from_gpus.keras"
    pp.save(path)
    # The same file as written on a two-GPU machine.
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(moved, "w") as target:
        for item in source.infolist():
            data = source.read(item.filename)
            if item.filename == "config.json":
                config = json.loads(data)
                config["config"]["devices"] = ["/device:GPU:0", "/device:GPU:1"]
                data = json.dumps(config).encode()
            target.writestr(item, data)
    with caplog.at_level(logging.WARNING, logger="tfaccel"):
        loaded = keras.saving.load_model(moved)
    assert "do not all exist here" in caplog.text
    assert loaded.devices == [loaded.devices[0]] * 2 and "CPU:0" in loaded.devices[0]
    np.testing.assert_allclose(loaded(x), pp(x), atol=1e-6)


def test_plan_lists_layers_parameters_flops_and_devices():
    model = small_cnn()
    pp = pipeline(model)
    text = pp.plan()
    assert "2 stages, micro_batches=4" in text
    for stage, device in zip(pp.stages, pp.devices, strict=True):
        assert f"{stage.count_params():,}" in text and device in text
    assert f"total parameters: {model.count_params():,}" in text
    conv_flops = 2 * 6 * 6 * 3 * 3 * 1 * 4  # the first stage's convolution, hand-computed
    first_row = text.splitlines()[2].split()
    assert int(first_row[-1].replace(",", "")) >= conv_flops
    weights_mb = pp.stages[0].count_params() * 4 / 2**20  # float32 weights
    assert float(first_row[-2]) == pytest.approx(weights_mb, abs=0.01)


def test_never_xla_compiled():
    from tfaccel.train.setup import settings

    pp = pipeline(small_cnn())
    strategy = tf.distribute.get_strategy()
    assert settings.resolve_jit_compile("auto", pp, strategy) is False
    with pytest.raises(ValueError, match=r"\['pipeline_model.*do not support XLA"):
        settings.resolve_jit_compile(True, pp, strategy)
