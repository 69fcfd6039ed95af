"""`tfaccel doctor SCRIPT.py`: what makes a recipe, and the end at the first fit."""

import subprocess
import sys

from tfaccel.doctor.script import declares_doctor

CAUGHT = """
import numpy as np, keras
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
try:
    model.fit({data}, epochs=1, verbose=0)
except BaseException as error:
    print("CAUGHT", type(error).__name__)
open({marker!r}, "w").write("untrained model saved")
print("AFTER FIT")
"""


def doctor(*args):
    command = [sys.executable, "-m", "tfaccel", "doctor", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=180)


def test_a_comment_or_a_string_does_not_make_a_recipe(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("# run with --doctor\nHELP = 'parser(doctor=True) --doctor'\n")
    assert not declares_doctor(script)
    assert declares_doctor("recipes/digits.py")
    script.write_text("import common\np = common.parser('x', epochs=1, doctor=True)\n")
    assert declares_doctor(script)


def test_a_script_mentioning_doctor_stops_at_its_fit(tmp_path):
    marker = tmp_path / "saved.txt"
    script = tmp_path / "train.py"
    script.write_text("# try --doctor on me\n" + CAUGHT.format(data="None", marker=str(marker)))
    result = doctor(str(script))
    assert result.returncode == 2, result.stdout + result.stderr[-2000:]
    assert "model.fit was called with NoneType" in result.stderr
    assert "Ended " in result.stderr and "its code after fit did not run" in result.stderr
    assert "AFTER FIT" not in result.stdout and "CAUGHT" not in result.stdout
    assert not marker.exists()


def test_catching_base_exception_does_not_carry_on_past_fit(tmp_path):
    marker = tmp_path / "saved.txt"
    script = tmp_path / "train.py"
    data = "np.ones((64, 4), 'float32'), np.ones((64, 1), 'float32')"
    script.write_text(CAUGHT.format(data=data, marker=str(marker)))
    result = doctor("--budget", "2", str(script))
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert "Verdict: " in result.stdout
    assert "ended " in result.stdout and "whatever it catches" in result.stdout
    assert "AFTER FIT" not in result.stdout and "CAUGHT" not in result.stdout
    assert not marker.exists()


def test_a_budget_must_be_finite():
    import pytest

    from tfaccel import doctor as doctor_module

    for budget in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match="budget_s must be a finite number of seconds > 0"):
            doctor_module.diagnose(object(), None, budget_s=budget)
