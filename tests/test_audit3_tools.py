"""The third audit's tools cases (issue 69, items 5-8): `tfaccel tune` on a script that
does not take its flag, NaN inputs in the range test, and a precision-rate cache file
that is not this user's own regular file."""

import os
import subprocess
import sys
import textwrap
import threading
import warnings

import numpy as np
import pytest
import tensorflow as tf
import test_precision_cache
from test_lr_sizing import X, Y
from test_lr_sizing import _model as _compiled_model

import tfaccel
from tfaccel import cli, precision, tuning
from tfaccel.choices import operations
from tfaccel.files.script_flags import declares_flag
from tfaccel.tuning.lr import inputs as lr_inputs

probe = test_precision_cache.probe  # the counting measurement (a fixture)

# -- 5: tfaccel tune / tune-batch-size decide by the script's code ------------------------


def _script(folder, body: str, name="train.py"):
    """A plain script that, if it ran, would write `ran.txt` beside itself."""
    path = folder / name
    marker = folder / "ran.txt"
    path.write_text(textwrap.dedent(body) + f"\nopen({str(marker)!r}, 'w').write('ran')\n")
    return path, marker


@pytest.mark.parametrize("command", ["tune", "tune-batch-size"])
def test_a_flag_only_in_a_comment_or_docstring_is_refused_and_never_run(tmp_path, capsys, command):
    script, marker = _script(
        tmp_path,
        '''\
        """Train a model. Try --tune-batch-size or --tune someday."""
        # tfaccel tune train.py passes --tune; tfaccel tune-batch-size passes --tune-batch-size
        print("training")
        ''',
    )
    assert cli.main([command, str(script)]) == 2
    err = capsys.readouterr().err
    flag = f"--{command}"
    assert f"has no {flag} option: its code declares no '{flag}' argument" in err
    assert "a mention in a comment or a docstring" in err and "so it was not run" in err
    assert not marker.exists()


def test_tune_batch_size_alone_is_not_taken_for_tune(tmp_path, capsys):
    script, marker = _script(
        tmp_path,
        """\
        import argparse, sys
        p = argparse.ArgumentParser()
        p.add_argument("--tune-batch-size", action="store_true")
        args = p.parse_args()
        print("args", sys.argv[1:])
        """,
    )
    assert not declares_flag(script, "--tune") and declares_flag(script, "--tune-batch-size")
    assert cli.main(["tune", str(script)]) == 2
    err = capsys.readouterr().err
    assert "has no --tune option" in err and "or a longer flag, does not count" in err
    assert f"It takes --tune-batch-size: tfaccel tune-batch-size {script}." in err
    assert not marker.exists()
    ran = subprocess.run(
        [sys.executable, "-m", "tfaccel", "tune-batch-size", str(script), "--", "x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 2 and not marker.exists()  # argparse refused the extra "x"
    assert "unrecognized arguments: x" in ran.stderr


def test_a_flag_taken_through_a_module_beside_the_script_is_followed(tmp_path):
    (tmp_path / "shared.py").write_text(
        textwrap.dedent(
            """\
            import argparse
            def parser():
                p = argparse.ArgumentParser()
                p.add_argument("--tune", action="store_true")
                return p
            class Formatter(argparse.HelpFormatter):
                pass
            """
        )
    )
    uses = tmp_path / "uses.py"
    uses.write_text("import shared\nargs = shared.parser().parse_args()\n")
    named = tmp_path / "named.py"
    named.write_text("from shared import parser as make\nargs = make().parse_args()\n")
    other = tmp_path / "other.py"  # imports the module, not its flag-taking code
    other.write_text("from shared import Formatter\nimport argparse\nprint(Formatter)\n")
    assert declares_flag(uses, "--tune") and declares_flag(named, "--tune")
    assert not declares_flag(other, "--tune")
    assert not declares_flag(uses, "--tune-batch-size")
    recipes = os.path.join(os.path.dirname(__file__), "..", "recipes")
    for recipe in ("digits.py", "multi_worker.py"):  # common.parser, through resnet_cifar10
        path = os.path.join(recipes, recipe)
        assert declares_flag(path, "--tune") and declares_flag(path, "--tune-batch-size")
    assert not declares_flag(os.path.join(recipes, "ray_train.py"), "--tune")


# -- 6: the range test names NaN inputs ----------------------------------------------------


def _model():
    model = _compiled_model()  # test_lr_sizing's, its optimizer built
    model.optimizer.build(model.trainable_variables)
    return model


def _variables(model):
    return [v.numpy().copy() for v in model.variables + model.optimizer.variables]


@pytest.mark.parametrize("target", ["model", "trainer"])
def test_nan_rows_of_a_dataset_are_named_not_suggested_from(target):
    x = X.copy()
    x[[163, 170, 301], 2] = np.nan  # batch 10 (16 a batch) and later
    model = _model()
    before = _variables(model)
    fit = model
    if target == "trainer":
        strategy = tfaccel.devices.strategy("one_device")
        fit = tfaccel.Trainer(model, strategy=strategy, steps_per_loop=1)
    data = tf.data.Dataset.from_tensor_slices((x, Y)).batch(16)
    with pytest.raises(ValueError, match=r"batch 10 of the data \(counted from 0\) holds a "):
        tuning.find_learning_rate(fit, data, num_steps=20)
    for got, want in zip(_variables(model), before, strict=True):
        np.testing.assert_array_equal(got, want)


def test_nan_in_every_row_of_arrays_is_named_before_anything_runs():
    x = X.copy()
    x[:, 5] = np.nan
    model = _model()
    with pytest.raises(ValueError) as raised:
        tuning.find_learning_rate(model, x, Y, batch_size=16, num_steps=20)
    message = str(raised.value)
    assert "512 of 512 rows of the features (x) hold NaN or inf (the first: row 0)" in message
    assert "can pass a ReLU as a finite output" in message and "no rate is suggested" in message
    assert int(model.optimizer.iterations.numpy()) == 0  # not one step ran


def test_nan_labels_and_features_of_a_dict_are_named():
    y = Y.astype("float32")
    y[7] = np.inf
    with pytest.raises(ValueError, match=r"1 of 512 rows of the labels \(y\) .*row 7\)"):
        tuning.find_learning_rate(_model(), X, y, batch_size=16, num_steps=20)
    with pytest.raises(ValueError, match=r"rows of the features \(x\['b'\]\)"):
        lr_inputs.check_arrays({"a": X, "b": np.where(X > 2, np.nan, X)}, Y)


def test_finite_data_still_gets_a_curve():
    data = tf.data.Dataset.from_tensor_slices((X, Y)).batch(16)
    report = tuning.find_learning_rate(_model(), data, num_steps=20, max_lr=10.0)
    assert len(report.losses) >= 10 and np.isfinite(report.losses[0])


# -- 7, 8: the precision-rate cache reads only this user's regular files -------------------

POLICIES = ("float32", "mixed_bfloat16")


def _forged(probe_cache):
    """The cache file of this key, rewritten with forged rates that favour float32."""
    precision.choose()
    operations._rates_for.cache_clear()
    (path,) = probe_cache.glob("op_rates-*.json")
    stored = operations.json.loads(path.read_text())
    stored["rates"] = {"float32": 1e15, "mixed_bfloat16": 1e9}  # "1000000.00x float32"
    path.write_text(operations.json.dumps(stored))
    os.chmod(path, 0o600)
    return path


def test_a_cache_file_of_this_user_is_read(probe, probe_cache):
    _forged(probe_cache)
    choice = precision.choose()
    assert choice.policy == "float32" and "read from the cache" in choice.reason
    assert len(probe) == 1


def test_a_cache_file_of_bytes_that_are_not_text_is_measured_again(probe, probe_cache):
    path = _forged(probe_cache)
    path.write_bytes(b"\xff\xfe\x00 not text")
    assert precision.choose().policy == "mixed_bfloat16" and len(probe) == 2


def test_a_cache_file_others_can_write_is_ignored_with_a_warning(probe, probe_cache):
    path = _forged(probe_cache)
    os.chmod(path, 0o666)
    with pytest.warns(UserWarning, match=r"ignored the operations' rates cache .*mode 0666: "):
        choice = precision.choose()
    assert choice.policy == "mixed_bfloat16" and "cache" not in choice.reason
    assert len(probe) == 2  # measured afresh


def test_a_cache_file_of_another_user_is_ignored_with_a_warning(probe, probe_cache, monkeypatch):
    path = _forged(probe_cache)
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)  # nobody's
        owner = 65534
    else:  # this process is another user than the file's
        owner = path.stat().st_uid
        monkeypatch.setattr(os, "geteuid", lambda: owner + 1)
    with pytest.warns(UserWarning, match=rf"owned by uid {owner}, not this process's uid"):
        choice = precision.choose()
    assert choice.policy == "mixed_bfloat16" and len(probe) == 2


def test_a_root_owned_cache_file_is_trusted(probe, probe_cache, monkeypatch):
    path = _forged(probe_cache)
    if os.geteuid() != 0:
        pytest.skip("needs root to give the file to root")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # a user reading root's file
    assert path.stat().st_uid == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert precision.choose().policy == "float32"


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory"])
def test_a_fifo_link_or_folder_at_the_cache_path_is_refused_at_once(probe, probe_cache, kind):
    path = _forged(probe_cache)
    target = probe_cache / "elsewhere.json"
    path.rename(target)
    {"fifo": os.mkfifo, "directory": os.mkdir}.get(kind, lambda p: p.symlink_to(target))(path)
    outcome = {}

    def choose():
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            outcome["choice"] = precision.choose()
        outcome["said"] = [str(w.message) for w in said]

    thread = threading.Thread(target=choose, daemon=True)
    thread.start()
    thread.join(timeout=30)
    if thread.is_alive():  # a regression: unblock the reader so the suite goes on
        with open(path, "w"):
            pass
        pytest.fail("precision.choose() blocked on the FIFO at the cache path")
    said = " ".join(outcome["said"])
    why = {
        "fifo": "not a regular file (a FIFO)",
        "directory": "not a regular file (a directory)",
        "symlink": "cannot open it safely",
    }[kind]
    assert why in said and "measuring afresh" in said
    assert outcome["choice"].policy == "mixed_bfloat16" and len(probe) == 2
