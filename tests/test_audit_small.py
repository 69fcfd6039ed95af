"""The audit's smaller cases: each a clear message instead of a raw error."""

from tfaccel import cli


def test_tune_batch_size_refuses_a_file_that_is_not_a_python_script(tmp_path, capsys):
    notes = tmp_path / "NOTES.md"
    notes.write_text("Run with --tune-batch-size to probe.\n")
    assert cli.main(["tune-batch-size", str(notes)]) == 2
    err = capsys.readouterr().err
    assert "NOTES.md" in err and "not a Python script" in err


def test_hidden_folders_of_an_image_folder_are_skipped_and_named(tmp_path):
    import numpy as np
    import pytest
    import tensorflow as tf

    from tfaccel import data

    png = tf.io.encode_png(np.zeros((4, 4, 3), np.uint8)).numpy()
    for folder in ("cat", "dog", ".ipynb_checkpoints", "cat/.ipynb_checkpoints"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "0.png").write_bytes(png)
    with pytest.warns(UserWarning, match=r"skipped hidden folder.*\.ipynb_checkpoints"):
        ds, names = data.from_image_folder(str(tmp_path), image_size=(4, 4))
    assert names == ["cat", "dog"]
    assert sorted(int(y) for _, y in ds) == [0, 1]


def test_the_lr_rule_follows_the_class_hierarchy_and_names_an_unknown_one():
    import keras
    import pytest

    from tfaccel.tuning import scaling

    class MyAdam(keras.optimizers.Adam):
        pass

    assert scaling.rule_for(MyAdam(1e-3)) == "sqrt"
    assert scaling.rule_for(keras.optimizers.ScheduleFreeAdamW) == "sqrt"
    assert scaling.rule_for("adamw") == "sqrt" and scaling.rule_for("sgd") == "linear"
    with pytest.warns(scaling.LRScalingWarning, match="'adamm' is not a Keras optimizer name"):
        assert scaling.rule_for("adamm") == "linear"
    with pytest.warns(scaling.LRScalingWarning, match="Muon is neither SGD.*linear rule"):
        assert scaling.rule_for(keras.optimizers.Muon) == "linear"


def test_a_keras_zip_without_config_json_is_named(tmp_path):
    import zipfile

    import pytest

    from tfaccel import parallel

    path = tmp_path / "model.keras"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("metadata.json", "{}")
    with pytest.raises(ValueError, match="has no config.json"):
        parallel.load_model(path)


def test_splitting_an_in_memory_model_with_a_lambda_layer():
    import keras
    import numpy as np

    from tfaccel import parallel

    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Lambda(lambda x: x * 2), keras.layers.Dense(2)]
        + [keras.layers.Dense(2)]
    )
    piped = parallel.PipelineModel(parallel.split(model, 2), devices=["/cpu:0", "/cpu:1"])
    x = np.ones((4, 3), "float32")
    np.testing.assert_allclose(piped(x).numpy(), model(x).numpy(), rtol=1e-6)
