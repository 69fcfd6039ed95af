import json
import pathlib
import subprocess
import sys

from tfaccel import cli

CALL = subprocess.call  # `doctor` below replaces subprocess.call for the command's child


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "tfaccel", *args], capture_output=True, text=True, timeout=120
    )


def forked(zygote, argv):
    """`subprocess.run(argv)` (a `python ...` command line, output captured) in a process
    forked from the worker zygote (conftest.py: TensorFlow imported once)."""
    command = zygote.command(argv)
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def doctor(zygote, monkeypatch, capfd, *args):
    """`tfaccel doctor ARGS...` run by `cli.main` in this process: (status, stdout, stderr).
    The script it diagnoses runs as the command's own `python -m tfaccel.doctor.script`
    child does, forked from the worker zygote (less the imports' CPU)."""
    monkeypatch.setattr(subprocess, "call", lambda argv: CALL(zygote.command(argv), timeout=120))
    capfd.readouterr()
    status = cli.main(["doctor", *args])
    out, err = capfd.readouterr()
    return status, out, err


def test_help_lists_commands():
    result = run_cli("--help")
    assert result.returncode == 0
    assert "devices" in result.stdout


def test_help_does_not_import_tensorflow(worker_zygote):
    # The console command answers --help at once: no TensorFlow import, no C++ log lines.
    command = pathlib.Path(sys.executable).with_name("tfaccel")
    for argv in (["--help"], ["doctor", "--help"], ["launch", "--help"]):
        result = subprocess.run(
            [sys.executable, "-X", "importtime", str(command), *argv],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert "usage: tfaccel" in result.stdout
        imported = [line.split("|")[-1].strip() for line in result.stderr.splitlines()]
        assert "tfaccel.cli" in imported
        assert not [name for name in imported if name.split(".")[0] in ("tensorflow", "keras")]
    assert "--workers" in result.stdout
    # The same import outside the command registers the Keras layers (TensorFlow loads):
    # forked from a process that did only `import keras, numpy, tensorflow, tfaccel`.
    probe = (
        "import keras, tfaccel\nprint('tfaccel>ResidualBlock' in keras.saving.get_custom_objects())"
    )
    imported = forked(worker_zygote, [sys.executable, "-c", probe])
    assert imported.stdout.strip() == "True", imported.stderr[-2000:]


def test_devices_json_is_the_describe_report(worker_zygote):
    # Forked from a process that imported TensorFlow (conftest.py), which `devices` imports.
    result = forked(worker_zygote, [sys.executable, "-m", "tfaccel", "devices", "--json"])
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["gpus"] == []
    assert report["no_gpu_reasons"]


def test_devices_table_says_why_no_gpu(capsys):
    assert cli.main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "TensorFlow" in out
    assert "No GPU is visible" in out


def test_doctor_diagnoses_a_recipe_instead_of_training(tmp_path, worker_zygote, monkeypatch, capfd):
    out = tmp_path / "digits"
    args = ("--budget", "1", "recipes/digits.py", "--smoke", "--out", str(out), "--verbose", "0")
    status, stdout, stderr = doctor(worker_zygote, monkeypatch, capfd, *args)
    assert status == 0, stderr[-3000:]
    assert "--doctor: diagnosing digits" in stdout
    assert "Verdict: " in stdout and "Fixes, best first" in stdout
    report = json.loads((out / "doctor.json").read_text())
    assert report["verdict"] in ("input", "compute", "communication", "host", "memory")
    assert (out / "doctor.png").stat().st_size > 0
    # Nothing was trained: no checkpoint, no history.
    assert not (out / "checkpoints").exists() and not (out / "history.csv").exists()


def test_doctor_refuses_what_it_cannot_run(tmp_path, capfd, worker_zygote, monkeypatch):
    assert cli.main(["doctor", str(tmp_path / "missing.py")]) == 2
    assert "no recipe file" in capfd.readouterr().err
    plain = tmp_path / "plain.py"
    plain.write_text("print('trains without a doctor')\n")
    status, _, stderr = doctor(worker_zygote, monkeypatch, capfd, str(plain))
    assert status == 3  # it ran: no fit to diagnose
    assert "ended without calling model.fit or Trainer.fit" in stderr
    assert cli.main(["doctor", "--budget", "0", "recipes/digits.py"]) == 2
    assert "--budget must be a finite number > 0" in capfd.readouterr().err
    assert cli.main(["doctor", "--budget", "inf", "recipes/digits.py"]) == 2
    assert "--budget must be a finite number > 0 seconds, got inf" in capfd.readouterr().err


def test_doctor_diagnoses_a_plain_script_at_its_first_fit(
    tmp_path, worker_zygote, monkeypatch, capfd
):
    # TensorFlow's tf.data guide's naive job, unchanged: a generator read one element at
    # a time (sleeping to open and read), a small compiled model, model.fit on the dataset.
    out = tmp_path / "report"
    script = "tests/scripts/guide_naive.py"
    status, stdout, stderr = doctor(
        worker_zygote, monkeypatch, capfd, "--budget", "2", "--out", str(out), script
    )
    assert status == 0, stderr[-3000:]
    assert "intercepted Sequential.fit" in stdout
    assert "AFTER FIT" not in stdout  # the script stops at its fit
    assert "Verdict: input-bound" in stdout, stdout
    report = json.loads((out / "doctor.json").read_text())
    assert "from_generator(fn, shards=" in report["fixes"][0]["action"], stdout
    # Arrays given to model.fit are read as model.fit reads them (batched by batch_size).
    status, stdout, stderr = doctor(
        worker_zygote, monkeypatch, capfd, "--budget", "1", script, "--arrays"
    )
    assert status == 0, stderr[-3000:]
    assert "a step of 16" in stdout and "AFTER FIT" not in stdout
