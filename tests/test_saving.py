"""The trained model comes out: `trainer.save("model.keras")` and `trainer.export(dir)`."""

import pathlib
import sys
import types

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import CPUS

import tfaccel
from tfaccel.train.state import saving

ROOT = pathlib.Path(__file__).parents[1]


def arrays(n=96, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8, 8, 1)).astype("float32")
    y = (x.mean(axis=(1, 2, 3)) > 0).astype("int32") + (x[:, 0, 0, 0] > 0).astype("int32")
    return x, y


def build():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = tfaccel.ResidualBlock(8)(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(3, activation="softmax", dtype="float32")(x)
    return keras.Model(inputs, outputs)


def trained(strategy, model=build):
    x, y = arrays()
    trainer = tfaccel.Trainer(
        model, loss="sparse_categorical_crossentropy", metrics=["accuracy"], strategy=strategy
    )
    data = tfaccel.data.pipeline(
        tfaccel.data.from_arrays(x, y), batch_size=16, training=True, seed=0, strategy=strategy
    )
    # Replicas keep their own BatchNormalization statistics; averaged, every replica
    # predicts as the saved model does.
    trainer.fit(data, epochs=2, verbose=0, callbacks=[tfaccel.callbacks.SyncMovingStatistics()])
    return trainer, x


@pytest.fixture(params=[1, 2], ids=["1-replica", "2-replicas"])
def strategy(request, mirrored):
    return mirrored if request.param == 2 else tfaccel.devices.strategy("default")


def test_saved_model_predicts_as_the_trained_one(strategy, tmp_path):
    trainer, x = trained(strategy)
    before = trainer.model.predict(x, verbose=0)
    path = trainer.save(tmp_path / "model.keras")
    assert path == str(tmp_path / "model.keras")
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), before, atol=1e-6)
    assert [p.name for p in tmp_path.iterdir()] == ["model.keras"], "no partial file left"


def test_exported_saved_model_serves_the_same_predictions(strategy, tmp_path):
    trainer, x = trained(strategy)
    before = trainer.model.predict(x, verbose=0)
    trainer.export(tmp_path / "served")
    served = tf.saved_model.load(str(tmp_path / "served"))
    np.testing.assert_allclose(served.serve(x).numpy(), before, atol=1e-5)


def test_a_fresh_process_loads_it_after_import_tfaccel(mirrored, tmp_path, jobs):
    trainer, x = trained(mirrored)
    trainer.save(tmp_path / "model.keras")
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "before.npy", trainer.model.predict(x, verbose=0))
    code = (
        "import sys, keras, numpy as np, tfaccel\n"
        "folder = sys.argv[1]\n"
        "model = keras.saving.load_model(folder + '/model.keras')\n"
        "after = model.predict(np.load(folder + '/x.npy'), verbose=0)\n"
        "np.testing.assert_allclose(after, np.load(folder + '/before.npy'), atol=1e-6)\n"
        "print('LOADED', type(model.layers[3]).__name__)\n"
    )
    # a process of its own, forked from one that imported TensorFlow (conftest's jobs)
    result = jobs.run([sys.executable, "-c", code, str(tmp_path)], timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "LOADED ResidualBlock" in result.stdout


def test_a_pipeline_model_is_saved_loaded_on_other_devices_and_exported(tmp_path):
    def pipeline():
        return tfaccel.parallel.PipelineModel(
            tfaccel.parallel.split(build(), num_stages=2), devices=CPUS, micro_batches=2
        )

    trainer, x = trained(tfaccel.devices.strategy("default"), pipeline)
    before = trainer.model.predict(x, verbose=0)
    path = trainer.save(tmp_path / "pp.keras")
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, tfaccel.parallel.PipelineModel)
    assert [d[-5:] for d in loaded.devices] == ["CPU:0", "CPU:1"]  # the saved devices
    np.testing.assert_allclose(loaded.predict(x, verbose=0), before, atol=1e-6)
    swapped = tfaccel.parallel.load_model(path, devices=CPUS[::-1])
    assert [d[-5:] for d in swapped.devices] == ["CPU:1", "CPU:0"]
    np.testing.assert_allclose(swapped.predict(x, verbose=0), before, atol=1e-6)
    trainer.export(tmp_path / "served")  # Keras infers no signature for it: ours
    served = tf.saved_model.load(str(tmp_path / "served"))
    np.testing.assert_allclose(served.serve(x).numpy(), before, atol=1e-6)


def test_only_the_chief_writes(tmp_path):
    trainer = tfaccel.Trainer(build, loss="mse", strategy=tfaccel.devices.strategy("default"))
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": ["a:1", "b:2"]}), task_type="worker", task_id=1
    )
    other_worker = types.SimpleNamespace(cluster_resolver=resolver)
    assert saving.save(trainer.model, tmp_path / "model.keras", other_worker)
    assert saving.export(trainer.model, tmp_path / "served", other_worker)
    assert not list(tmp_path.iterdir())


def test_bad_paths_and_an_unbuilt_model_are_named(tmp_path):
    trainer = tfaccel.Trainer(build, loss="mse", strategy=tfaccel.devices.strategy("default"))
    with pytest.raises(ValueError, match=r"ending in \.keras \(e\.g\. '.*model\.keras'\).*export"):
        trainer.save(tmp_path / "model.h5")
    with pytest.raises(ValueError, match="is a directory.*model.keras"):
        trainer.save(tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is a file"):
        trainer.export(tmp_path / "file")
    fresh = tfaccel.Trainer(
        keras.Sequential([keras.layers.Dense(2)]), loss="mse", strategy=trainer.strategy
    )
    with pytest.raises(ValueError, match="no weights yet.*fit"):
        fresh.save(tmp_path / "m.keras")
    # A missing folder is made.
    assert pathlib.Path(trainer.save(tmp_path / "new" / "deep" / "m.keras")).is_file()
