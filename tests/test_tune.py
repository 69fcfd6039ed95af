"""tuning.tune: the batch, then the rate at that batch; `tfaccel tune RECIPE` (issue 41)."""

import subprocess
import sys
import types

import keras
import numpy as np
import pytest

from tfaccel import cli, tuning

SCE = "sparse_categorical_crossentropy"
X = np.random.default_rng(0).normal(size=(1024, 8)).astype("float32")
Y = (X[:, :4].sum(axis=1) > 0).astype("int32")


def build():
    return keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2)]
    )


def loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def test_tune_chooses_a_batch_then_a_rate_at_it(capsys):
    # A bound no host reaches (the search takes seconds): the bounded path runs, and the
    # range test is never skipped for a slow host's sake.
    tuned = tuning.tune(
        build, (X, Y), loss=loss(), batch_size=16, learning_rate=1e-3, budget_s=1e6, lr_steps=40
    )
    assert tuned.batch_size >= 16 and tuned.batch_size % 8 == 0
    assert tuned.batch_report is not None  # searched, not decided by the data alone
    assert tuned.rate_report is not None
    if tuned.rate_report.suggestion is not None:
        assert tuned.learning_rate == tuned.rate_report.suggestion
    else:
        assert tuned.learning_rate == tuned.batch.learning_rate and tuned.note
    # The batch step's methods (a grown batch's one-cycle) go with its scaled rate only.
    kept = tuned.learning_rate == tuned.batch.learning_rate
    assert tuned.methods == (tuned.batch.methods if kept else ())
    assert "\nmethods: " in str(tuned)
    args = tuned.arguments()
    assert args == f"--batch-size {tuned.batch_size} --learning-rate {tuned.learning_rate:.3g}"
    assert args in capsys.readouterr().out


def test_a_spent_bound_skips_the_range_test():
    tuned = tuning.tune(
        build,
        (X, Y),
        loss=loss(),
        batch_size=16,
        learning_rate=1e-3,
        job_examples=64,
        verbose=0,
    )
    assert tuned.rate_report is None and "skipped" in tuned.note
    assert tuned.learning_rate == tuned.batch.learning_rate


def test_cli_tune_runs_the_recipe_with_tune(tmp_path):
    recipe = tmp_path / "r.py"
    recipe.write_text("import sys\nprint('--tune', sys.argv[1:])\n")
    out = subprocess.run(
        [sys.executable, "-m", "tfaccel", "tune", str(recipe), "--epochs", "2"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "['--tune', '--epochs', '2']" in out
    plain = tmp_path / "plain.py"
    plain.write_text("print('hi')\n")
    assert cli.main(["tune", str(plain)]) == 2


def test_recipe_tune_flag_tunes_the_batch_then_the_rate(tmp_path, capsys):
    import json
    import pathlib

    sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "recipes"))
    import digits

    digits.main(["--smoke", "--tune", "--out", str(tmp_path), "--verbose", "0"])
    out = capsys.readouterr().out
    assert "--tune: batch " in out and "--tune: learning rate " in out
    line = next(li for li in out.splitlines() if "pass --batch-size" in li)
    batch = int(line.split("--batch-size ")[1].split()[0])
    rate = float(line.split("--learning-rate ")[1].split()[0])
    settings = json.loads((tmp_path / "metrics.json").read_text())["settings"]
    assert settings["batch_size"] == batch
    assert settings["learning_rate"] == pytest.approx(rate, rel=5e-3)
    assert (tmp_path / "learning_rate.png").exists()


@pytest.mark.parametrize("suggestion", [None, 5e-3])
def test_the_grown_batchs_one_cycle_goes_with_its_scaled_rate_only(monkeypatch, suggestion):
    from tfaccel import methods
    from tfaccel.tuning import joint

    cycle = methods.OneCycle(peak=6e-3)
    choice = tuning.Recommendation(64, 2e-3, "sqrt", False, "batch 64", (cycle,))
    monkeypatch.setattr(joint, "_batch_step", lambda *args: (choice, None))
    found = types.SimpleNamespace(suggestion=suggestion, reason="the range test's reason")
    monkeypatch.setattr(joint, "_range_test", lambda *args: found)
    tuned = tuning.tune(build, (X, Y), loss=loss(), batch_size=16, learning_rate=1e-3, verbose=0)
    if suggestion is None:  # the scaled rate is kept: so is its cycle
        assert tuned.learning_rate == 2e-3 and tuned.methods == (cycle,)
        assert "methods: one-cycle\n" in str(tuned)
        # the recipes' flag for it (recipes/common.py --one-cycle)
        assert tuned.arguments() == "--batch-size 64 --learning-rate 0.002 --one-cycle 0.006"
    else:
        assert tuned.learning_rate == 5e-3 and tuned.methods == ()
        assert tuned.arguments() == "--batch-size 64 --learning-rate 0.005"
        assert "methods: none (the batch step's one-cycle is for its scaled rate" in str(tuned)
