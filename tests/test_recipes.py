"""The recipes run end to end (--smoke, TFDS mocked, Kaggle files generated) and fail clearly."""

import csv
import json
import math
import pathlib
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

ROOT = pathlib.Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "recipes"))

import common  # noqa: E402
import digits  # noqa: E402
import googlenet_fashion_mnist  # noqa: E402
import kaggle_dog_breeds  # noqa: E402
import kaggle_files  # noqa: E402
import kaggle_house_prices  # noqa: E402
import minibatch_sgd  # noqa: E402
import mlp_fashion_mnist  # noqa: E402
import outputs  # noqa: E402
import resnet_cifar10  # noqa: E402
import tfds_or_digits  # noqa: E402

import tfaccel  # noqa: E402

CORE_FLAGS = (
    "--epochs",
    "--batch-size",
    "--learning-rate",
    "--precision",
    "--strategy",
    "--data-dir",
    "--checkpoint-dir",
    "--out",
    "--tune-batch-size",
    "--smoke",
    "--seed",
)


def test_digits_recipe_reaches_95_percent_and_resumes(tmp_path, capsys):
    summary = digits.main(["--logdir", str(tmp_path), "--verbose", "2"])
    out = capsys.readouterr().out
    assert summary["test_accuracy"] >= 0.95
    assert "tfaccel.Trainer settings" in out and "Input pipeline" in out
    assert "examples/s" in out and "mem_host_rss_mb" in out
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["test_accuracy"] == summary["test_accuracy"]
    assert (tmp_path / "history.csv").read_text().count("\n") == 16  # header + 15 epochs
    assert (tmp_path / "checkpoints" / "checkpoint").exists()
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["final"]["test_accuracy"] == summary["test_accuracy"]
    # The saved model predicts the test set as the trained one did.
    model = assert_saved_model(tmp_path, metrics)
    _, _, (x_test, y_test) = digits.load(0)
    accuracy = np.mean(model.predict(x_test, verbose=0).argmax(axis=1) == y_test)
    assert accuracy == pytest.approx(summary["test_accuracy"], abs=1e-6)
    # The same command again resumes from the finished checkpoint: no more training.
    again = digits.main(["--logdir", str(tmp_path), "--verbose", "0"])
    assert again["test_accuracy"] == summary["test_accuracy"]
    assert (tmp_path / "history.csv").read_text().count("\n") == 16  # kept, not truncated
    assert len(outputs.read_history(tmp_path / "history.csv")["loss"]) == 15


def assert_outputs(out: pathlib.Path, metric: str, epochs: int = 1) -> dict:
    """metrics.json has finite values, curves.png opens, history.csv and logs exist."""
    metrics = json.loads((out / "metrics.json").read_text())
    for key, value in metrics["final"].items():
        assert math.isfinite(value), key
    assert math.isfinite(metrics["examples_per_second"]) and metrics["examples_per_second"] > 0
    with Image.open(out / "curves.png") as image:
        assert image.size[0] > 500
    with open(out / "history.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == epochs and math.isfinite(float(rows[-1][metric]))
    assert list((out / "logs").rglob("events.out.tfevents.*")), "no TensorBoard logs"
    assert_saved_model(out, metrics)
    return metrics


def assert_saved_model(out: pathlib.Path, metrics: dict) -> keras.Model:
    """model.keras beside metrics.json loads and predicts on inputs of the recorded shape."""
    assert metrics["model"]["file"] == "model.keras"
    model = keras.saving.load_model(out / "model.keras")
    (spec,) = metrics["model"]["inputs"]
    x = np.zeros([2, *spec["shape"][1:]], spec["dtype"])
    assert np.isfinite(model.predict(x, verbose=0)).all()
    return model


@pytest.mark.parametrize(
    "recipe", [mlp_fashion_mnist, googlenet_fashion_mnist, resnet_cifar10], ids=lambda m: m.NAME
)
def test_image_recipe_smoke(recipe, tmp_path, capsys):
    narrow = ["--width", "8"] if recipe is resnet_cifar10 else []  # less compute, same graph
    with tfds.testing.mock_data(num_examples=64):
        summary = recipe.main(["--smoke", "--out", str(tmp_path), "--verbose", "0", *narrow])
    out = capsys.readouterr().out
    assert "tfaccel.data pipeline: training" in out and "Final: test_loss" in out
    assert "examples/s" in out
    metrics = assert_outputs(tmp_path, "accuracy")
    assert metrics == json.loads(json.dumps(summary))
    assert metrics["dataset"] in ("fashion_mnist", "cifar10")
    assert metrics["settings"]["global_batch"] == common.SMOKE_BATCH
    assert 0.0 <= metrics["final"]["test_accuracy"] <= 1.0


def test_minibatch_sgd_compares_batch_sizes(tmp_path):
    with tfds.testing.mock_data(num_examples=64):
        minibatch_sgd.main(["--smoke", "--out", str(tmp_path), "--verbose", "0"])
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    by_batch = metrics["by_batch_size"]
    assert sorted(by_batch, key=int) == ["8", "16"]
    # Linear scaling from --batch-size 16 (smoke) at rate 0.1.
    assert by_batch["8"]["learning_rate"] == pytest.approx(0.05)
    assert by_batch["16"]["learning_rate"] == pytest.approx(0.1)
    with open(tmp_path / "history.csv") as handle:
        assert [row["batch_size"] for row in csv.DictReader(handle)] == ["8", "16"]
    for name in ("loss_curves.png", "curves.png"):
        with Image.open(tmp_path / name) as image:
            assert image.size[0] > 500
    assert minibatch_sgd.scaled_rate(0.1, 1024, 256, "sqrt") == pytest.approx(0.2)
    assert_saved_model(tmp_path, metrics)  # the best batch size's model


def fail_tfds(*args, **kwargs):
    raise ConnectionError("no network here")


def test_offline_fallback_trains_on_digits(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tfds, "load", fail_tfds)
    mlp_fashion_mnist.main(["--smoke", "--out", str(tmp_path), "--verbose", "0"])
    out = capsys.readouterr().out
    assert "could not be downloaded (ConnectionError: no network here)" in out
    assert "offline fallback" in out
    metrics = assert_outputs(tmp_path, "accuracy")
    assert metrics["dataset"] == "digits (offline fallback)"
    splits = tfds_or_digits.digits_fallback(("train", "test"), (32, 32, 3), seed=0)
    image, label = next(iter(splits["train"]))
    assert image.shape == (32, 32, 3) and image.dtype == "uint8" and 0 <= int(label) < 10
    assert int(splits["train"].cardinality()) + int(splits["test"].cardinality()) == 1797


def test_no_fallback_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(tfds, "load", fail_tfds)
    argv = ["--smoke", "--no-fallback", "--out", str(tmp_path), "--data-dir", str(tmp_path)]
    with pytest.raises(common.DatasetUnavailableError, match="'fashion_mnist' is not in") as info:
        mlp_fashion_mnist.main(argv)
    assert "--data-dir" in str(info.value) and "drop --no-fallback" in str(info.value)


def test_batch_size_must_divide_over_replicas(tmp_path, mirrored, monkeypatch):
    monkeypatch.setattr(tfaccel.devices, "strategy", lambda kind: mirrored)
    with pytest.raises(ValueError, match="--batch-size 7 .* 2 replicas .* --batch-size 8"):
        mlp_fashion_mnist.main(["--batch-size", "7", "--strategy", "mirrored", "--out", "x"])


@pytest.mark.parametrize(
    "recipe",
    [
        digits,
        mlp_fashion_mnist,
        googlenet_fashion_mnist,
        resnet_cifar10,
        minibatch_sgd,
        kaggle_house_prices,
        kaggle_dog_breeds,
    ],
    ids=lambda m: m.__name__,
)
def test_help_explains_the_core_flags(recipe, capsys):
    with pytest.raises(SystemExit) as info:
        recipe.main(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for flag in CORE_FLAGS:
        assert flag in text, flag
    assert_every_default_shown(text)


def assert_every_default_shown(text: str) -> None:
    """Each option's entry in `--help` (but -h itself) ends with its default."""
    options = text.split("options:", 1)[1]
    entries = re.split(r"\n(?=  -)", options.strip("\n"))
    assert len(entries) > 5
    for entry in entries:
        if not entry.lstrip().startswith("-h"):
            assert "(default: " in " ".join(entry.split()), entry  # lines wrap anywhere


def test_ray_recipe_help_shows_every_default(capsys):
    import ray_train  # the Ray import is inside main: --help needs no Ray

    with pytest.raises(SystemExit):
        ray_train.parse(["--help"])
    assert_every_default_shown(capsys.readouterr().out)


def test_tune_batch_size_flag(tmp_path, capsys):
    argv = ["--smoke", "--tune-batch-size", "--out", str(tmp_path), "--verbose", "0"]
    if not hasattr(tfaccel, "tuning"):
        with pytest.raises(RuntimeError, match="needs tfaccel.tuning.find_batch_size"):
            digits.main(argv)
        return
    digits.main(argv)
    out = capsys.readouterr().out
    with Image.open(tmp_path / "batch_size.png"):
        pass
    settings = json.loads((tmp_path / "metrics.json").read_text())["settings"]
    if "as given" in out:  # no larger batch paid (or left 20 steps an epoch): kept as is
        assert "--tune-batch-size:" in out and "; training at batch" in out
        assert (settings["batch_size"], settings["learning_rate"]) == (common.SMOKE_BATCH, 2e-3)
    else:  # digits trains with Adam: the square-root rule from the recipe's own rate
        assert "--tune-batch-size: training with batch" in out and "sqrt rule for adam" in out
        assert settings["batch_size"] > common.SMOKE_BATCH  # only a larger batch is chosen
        assert settings["learning_rate"] == pytest.approx(
            2e-3 * (settings["batch_size"] / common.SMOKE_BATCH) ** 0.5
        )


def test_tune_batch_size_probes_nothing_when_the_data_decides(tmp_path, capsys):
    # digits: 1,212 training examples at batch 64 leave 18 steps an epoch; no larger batch
    # can be chosen, so nothing is probed (no plot) and the batch and rate are kept.
    argv = ["--tune-batch-size", "--epochs", "1", "--out", str(tmp_path), "--verbose", "0"]
    digits.main(argv)
    out = capsys.readouterr().out
    assert "no probe: 1,212 examples leave no batch above 64" in out
    assert not (tmp_path / "batch_size.png").exists()
    settings = json.loads((tmp_path / "metrics.json").read_text())["settings"]
    assert "as given" in out
    assert (settings["batch_size"], settings["learning_rate"]) == (64, 2e-3)


# -- Kaggle House Prices -----------------------------------------------------------------------


def test_house_prices_cross_validates_and_submits(tmp_path, capsys):
    data = tmp_path / "data"
    test_ids = kaggle_files.house_prices(data)
    out = tmp_path / "out"
    argv = ["--smoke", "--folds", "3", "--data-dir", str(data), "--out", str(out)]
    summary = kaggle_house_prices.main([*argv, "--verbose", "0"])
    printed = capsys.readouterr().out
    scores = summary["fold_log_rmse"]
    assert len(scores) == 3 and all(math.isfinite(s) and s > 0 for s in scores)
    assert summary["cv_log_rmse_mean"] == pytest.approx(np.mean(scores))
    for k in (1, 2, 3):
        assert f"fold {k}/3:" in printed
    assert f"mean validation log-RMSE {np.mean(scores):.4f}" in printed
    with open(out / "submission.csv") as handle:
        reader = csv.reader(handle)
        assert next(reader) == ["Id", "SalePrice"]
        rows = list(reader)
    assert [int(r[0]) for r in rows] == test_ids
    assert all(float(r[1]) > 0 and math.isfinite(float(r[1])) for r in rows)
    assert_outputs(out, "log_rmse")


def test_house_prices_encoder_handles_missing_and_unseen_levels(tmp_path):
    import pandas as pd

    kaggle_files.house_prices(tmp_path)
    train, test = kaggle_house_prices.read_competition(str(tmp_path))
    features = [c for c in train.columns if c not in ("Id", "SalePrice")]
    encoder = kaggle_house_prices.TabularEncoder(train, features)
    assert "LotFrontage" in encoder.numeric and "MSZoning" in encoder.text
    assert len(encoder.numeric) == 36 and len(encoder.text) == 43
    x_train, x_test = encoder(train), encoder(test)
    assert np.isfinite(x_train).all() and np.isfinite(x_test).all()
    numbers = x_train[:, : len(encoder.numeric)]
    np.testing.assert_allclose(numbers.mean(axis=0), 0.0, atol=1e-4)  # standardised
    one_hot = x_test[:, len(encoder.numeric) :]
    # Every text column contributes exactly one 1: a known level or the shared OOV bin.
    np.testing.assert_array_equal(one_hot.sum(axis=1), 43)
    unseen = (test["MSZoning"] == kaggle_files.TEST_ONLY_ZONE).to_numpy()
    assert unseen.any() and (one_hot[unseen, 0] >= 1).all()  # index 0: out of vocabulary
    assert pd.isna(train["LotFrontage"]).any()


@pytest.mark.parametrize("column", ["SalePrice", "Id"])
def test_house_prices_csv_missing_a_column(tmp_path, column):
    kaggle_files.house_prices(tmp_path)
    path = tmp_path / "train.csv"
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    keep = [i for i, name in enumerate(header) if name != column]
    path.write_text("\n".join(",".join(line.split(",")[i] for i in keep) for line in lines))
    with pytest.raises(ValueError, match=f"train.csv has no '{column}' column"):
        kaggle_house_prices.main(["--data-dir", str(tmp_path), "--out", str(tmp_path)])


def test_house_prices_errors(tmp_path):
    with pytest.raises(ValueError, match="--folds must be >= 2"):
        kaggle_house_prices.main(["--folds", "1", "--data-dir", str(tmp_path)])
    with pytest.raises(FileNotFoundError, match="train.csv is missing") as info:
        kaggle_house_prices.main(["--data-dir", str(tmp_path)])
    assert "kaggle competitions download -c house-prices-advanced-regression" in str(info.value)


def _edit_house_csv(file, edit):
    def provoke(folder):
        kaggle_files.house_prices(folder)
        path = folder / file
        path.write_text(edit(path.read_text()))

    return provoke


def _price_cell(value):
    """Replaces the third data row's SalePrice (the last column) with `value`."""

    def edit(text):
        lines = text.splitlines()
        cells = lines[3].split(",")
        lines[3] = ",".join([*cells[:-1], value])
        return "\n".join(lines) + "\n"

    return edit


@pytest.mark.parametrize(
    "provoke, words",
    [
        pytest.param(_edit_house_csv("test.csv", lambda t: ""), ["test.csv is empty (0 bytes)"],
                     id="empty_test_csv"),
        pytest.param(_edit_house_csv("train.csv", lambda t: t.splitlines()[0] + "\n"),
                     ["train.csv has a header but no rows"], id="header_only"),
        pytest.param(_edit_house_csv("train.csv", _price_cell("")),
                     ["1 row(s) with no (missing) SalePrice", "line 4", "Id=3"], id="no_price"),
        pytest.param(_edit_house_csv("train.csv", _price_cell("cheap")),
                     ["non-numeric SalePrice", "'cheap'", "line 4"], id="text_price"),
        pytest.param(_edit_house_csv("train.csv", _price_cell("-5")),
                     ["zero or negative SalePrice", "line 4"], id="negative_price"),
    ],
)  # fmt: skip
def test_house_prices_bad_files_are_named(provoke, words, tmp_path):
    provoke(tmp_path)
    with pytest.raises(ValueError) as info:
        kaggle_house_prices.main(["--data-dir", str(tmp_path), "--out", str(tmp_path / "o")])
    missing = [w for w in words if w not in str(info.value)]
    assert not missing, f"{missing} not in: {info.value}"


def test_out_that_is_a_file_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "out").write_text("")
    monkeypatch.setattr(sys, "argv", ["digits.py", "--smoke", "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as info:
        common.main_guard(digits.main)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1
    assert "--out" in err and "is a file" in err and "pass a folder" in err


# -- Kaggle Dog Breed Identification -----------------------------------------------------------


def test_dog_breeds_skips_corrupt_images_and_submits(tmp_path, capsys):
    data = tmp_path / "data"
    train_ids, test_ids = kaggle_files.dog_breeds(data)
    corrupt = data / "train" / f"{train_ids[5]}.jpg"
    kaggle_files.truncate(corrupt)
    out = tmp_path / "out"
    argv = ["--smoke", "--depth", "18", "--image-size", "32", "--data-dir", str(data)]
    with pytest.warns(kaggle_dog_breeds.CorruptImageWarning, match=corrupt.name):
        summary = kaggle_dog_breeds.main([*argv, "--out", str(out), "--verbose", "0"])
    assert summary["skipped_train_images"] == 1 and summary["breeds"] == 3
    assert f"{len(train_ids) - 1} readable training images of 3 breeds" in capsys.readouterr().out
    with open(out / "submission.csv") as handle:
        reader = csv.reader(handle)
        assert next(reader) == ["id", "beagle", "boxer", "pug"]
        rows = list(reader)
    assert sorted(r[0] for r in rows) == sorted(test_ids)
    probabilities = np.array([[float(v) for v in r[1:]] for r in rows])
    assert (probabilities >= 0).all()
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-4)
    assert_outputs(out, "accuracy")


def test_dog_breeds_labels_naming_missing_images(tmp_path):
    train_ids, _ = kaggle_files.dog_breeds(tmp_path, per_breed=3)
    for image_id in train_ids[:7]:
        (tmp_path / "train" / f"{image_id}.jpg").unlink()
    with pytest.raises(FileNotFoundError, match="labels.csv names 7 image") as info:
        kaggle_dog_breeds.main(["--data-dir", str(tmp_path)])
    assert f"{train_ids[0]}.jpg" in str(info.value)
    assert f"{train_ids[6]}.jpg" not in str(info.value)  # only the first few are listed


def test_dog_breeds_without_the_competition_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="labels.csv is missing") as info:
        kaggle_dog_breeds.main(["--data-dir", str(tmp_path)])
    assert "kaggle competitions download -c dog-breed-identification" in str(info.value)


@pytest.mark.parametrize(
    "text, words",
    [
        pytest.param("", ["labels.csv is empty (0 bytes)", "'id,breed'"], id="empty"),
        pytest.param("id,breed\nabc,beagle\ndef,\n", ["line 3 has no (missing) breed"],
                     id="missing_breed"),
    ],
)  # fmt: skip
def test_dog_breeds_bad_labels_file(text, words, tmp_path):
    kaggle_files.dog_breeds(tmp_path, per_breed=1, test_images=1)
    (tmp_path / "labels.csv").write_text(text)
    with pytest.raises(ValueError) as info:
        kaggle_dog_breeds.main(["--data-dir", str(tmp_path)])
    assert all(w in str(info.value) for w in words), info.value


# -- multi-worker ------------------------------------------------------------------------------


def test_multi_worker_recipe_under_launch_ends_with_identical_weights(tmp_path, worker_zygote):
    out = tmp_path / "out"
    mock_tfds = str(ROOT / "tests" / "scripts" / "with_mock_tfds.py")
    recipe = [str(ROOT / "recipes" / "multi_worker.py"), "--smoke", "--width", "8"]
    recipe += ["--export-weights", "--out", str(out), "--verbose", "0"]
    launch = [sys.executable, "-m", "tfaccel", "launch", "--workers", "2", "--timeout", "400"]
    # each worker a process forked from one that imported TensorFlow (conftest.py)
    command = [*launch, "--", *worker_zygote.command([sys.executable, mock_tfds, *recipe])]
    result = subprocess.run(command, capture_output=True, text=True, timeout=450)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    chief, other = (dict(np.load(out / f"weights.worker{i}.npz")) for i in (0, 1))
    assert chief.keys() == other.keys() and len(chief) > 10
    for key in chief:
        np.testing.assert_array_equal(chief[key], other[key])
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["workers"] == 2
    # MultiWorkerMirroredStrategy's class is CollectiveAllReduceStrategy in TF 2.
    assert metrics["settings"]["strategy"] == "CollectiveAllReduceStrategy"
    assert metrics["settings"]["replicas"] == 2
    assert math.isfinite(metrics["final"]["test_loss"])
    assert_saved_model(out, metrics)  # written by the chief only
    assert not list(out.glob("*.partial.keras"))


def test_doctor_budget_must_be_positive(tmp_path):
    argv = ["--smoke", "--doctor", "--doctor-budget", "0", "--out", str(tmp_path)]
    with pytest.raises(ValueError, match="--doctor-budget must be a number of seconds > 0"):
        digits.main(argv)


@pytest.mark.parametrize("peak", ["0", "-1e-3", "inf"])
def test_one_cycle_must_be_a_positive_rate(tmp_path, peak):
    with pytest.raises(ValueError, match="--one-cycle must be a peak learning rate > 0"):
        digits.main(["--smoke", f"--one-cycle={peak}", "--out", str(tmp_path)])


def test_a_tuned_rate_replaces_a_given_cycle_saying_so(capsys):
    import argparse

    import batch_tuning

    from tfaccel import methods, tuning

    given = methods.OneCycle(peak=0.006)
    args = argparse.Namespace(batch_size=32, learning_rate=2e-3, one_cycle=0.006, methods=[given])
    grown = (methods.OneCycle(peak=8.5e-3),)
    batch_tuning._apply_choice(
        args, tuning.Recommendation(64, 2.8e-3, "sqrt", False, "batch 64", grown), "adam"
    )
    assert args.methods == list(grown) and args.batch_size == 64
    said = capsys.readouterr().out
    assert "--one-cycle 0.006 was for the rate replaced; methods: one-cycle" in said
    args = argparse.Namespace(batch_size=32, learning_rate=2e-3, one_cycle=0.006, methods=[given])
    batch_tuning._apply_choice(args, tuning.Recommendation(32, 2e-3, "sqrt", True, "kept"), "adam")
    assert args.methods == [given] and args.batch_size == 32  # kept: the cycle as given


def test_one_cycle_flag_trains_with_the_cycle_it_names(tmp_path, monkeypatch):
    # What `tfaccel tune` prints for a grown batch (--one-cycle PEAK) reaches the Trainer,
    # which sizes the cycle to the job at that peak.
    from tfaccel import methods

    peaks = []

    class Recorded(methods.OneCycle):
        def peak_for(self, job):
            peaks.append(super().peak_for(job))
            return peaks[-1]

    monkeypatch.setattr(methods, "OneCycle", Recorded)
    argv = ["--smoke", "--one-cycle", "0.006", "--out", str(tmp_path), "--verbose", "0"]
    digits.main(argv)
    settings = json.loads((tmp_path / "metrics.json").read_text())["settings"]
    assert "method: one-cycle" in settings, settings
    assert peaks and all(peak == pytest.approx(0.006) for peak in peaks)


@pytest.mark.parametrize(
    "recipe", ["mlp_fashion_mnist", "googlenet_fashion_mnist", "resnet_cifar10", "multi_worker"]
)
def test_recipes_show_the_api_in_their_own_file(recipe):
    # Issue 42: a reader learns the pipeline, the Trainer, fit and evaluate from the recipe
    # itself, not from a helper in common.py (which keeps the command line and set-up).
    import ast

    tree = ast.parse((ROOT / "recipes" / f"{recipe}.py").read_text())
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    called = {ast.unparse(n.func) for n in ast.walk(main) if isinstance(n, ast.Call)}
    assert {"tfaccel.data.pipeline", "tfaccel.Trainer", "trainer.fit", "trainer.evaluate"} <= called
    assert (ROOT / "recipes" / "common.py").read_text().count("\n") <= 300
