"""`tfaccel check`: the real self-test once, and the failure path."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

from tfaccel import check, cli
from tfaccel.check import suite as checks


def test_tfaccel_check_passes_or_skips_every_check_with_a_reason(tmp_path, jobs):
    out = tmp_path / "check.json"
    # a process of its own, forked from one that imported TensorFlow (conftest's jobs)
    done = jobs.run([sys.executable, "-m", "tfaccel", "check", "--json", str(out)], 600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    table = done.stdout
    header = [cell.strip() for cell in table.splitlines()[0].split(" | ")]
    assert header == ["check", "ran or skipped, and why", "result", "figure"]
    for name in check.CHECKS:
        assert f"\n{name} " in table
    assert " 0 failed" in table
    document = json.loads(out.read_text())
    assert document["passed"] is True
    assert document["devices"]["logical_devices"]  # the device report travels with it
    results = {r["name"]: r for r in document["checks"]}
    assert list(results) == list(check.CHECKS)
    for result in results.values():
        assert result["status"] in ("passed", "skipped"), result
        if result["status"] == "skipped":
            assert len(result["ran"]) > len("skipped: ") + 10, result
    # On this CPU-only machine: no GPU, so no memory growth; everything else runs.
    assert results["memory growth"]["status"] == "skipped"
    assert "no GPU" in results["memory growth"]["ran"]
    for name in ("precision step", "float16 loss scaling", "xla", "mirrored", "all-reduce"):
        assert results[name]["status"] == "passed", results[name]
    assert results["mirrored"]["value"] < 1e-5  # the weights' gap, relative
    assert results["float16 loss scaling"]["value"] == 32768 / 2**checks.STEPS
    assert "'input'" in results["doctor"]["result"]


def _ok(ctx):
    return check.Found("here", "fine", "1.0", 1.0)


def _broken(ctx):
    raise RuntimeError("planted breakage\nsecond line")


def _wrong(ctx):
    raise check.CheckFailed("sum was 2, expected 3", "2 != 3", 2.0)


def _not_here(ctx):
    raise check.Skip("no GPU: nothing to check")


def test_a_failing_check_fails_the_command_and_shows_its_error(monkeypatch, tmp_path, capsys):
    planted = {"fine": _ok, "broken": _broken, "wrong": _wrong, "absent": _not_here}
    monkeypatch.setattr(check, "CHECKS", planted)
    out = tmp_path / "check.json"
    status = cli.main(["check", "--json", str(out)])
    assert status == 1
    table = capsys.readouterr().out
    lines = {line.split(" | ")[0].strip(): line for line in table.splitlines()}
    assert "FAILED: RuntimeError: planted breakage" in lines["broken"]
    assert "second line" not in table
    assert "FAILED: sum was 2, expected 3" in lines["wrong"] and "2 != 3" in lines["wrong"]
    assert "skipped: no GPU: nothing to check" in lines["absent"]
    assert "ok: fine" in lines["fine"]
    assert "1 passed, 1 skipped, 2 failed" in table
    document = json.loads(out.read_text())
    assert document["passed"] is False
    statuses = {r["name"]: r["status"] for r in document["checks"]}
    assert statuses == {
        "fine": "passed",
        "broken": "failed",
        "wrong": "failed",
        "absent": "skipped",
    }


def test_every_check_passing_exits_zero(monkeypatch, capsys):
    monkeypatch.setattr(check, "CHECKS", {"fine": _ok, "absent": _not_here})
    assert cli.main(["check"]) == 0
    assert "1 passed, 1 skipped, 0 failed" in capsys.readouterr().out


def test_a_json_path_in_no_folder_is_refused_before_checking(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(check, "CHECKS", {"broken": _broken})  # never reached
    assert cli.main(["check", "--json", str(tmp_path / "missing" / "check.json")]) == 2
    assert cli.main(["check", "--json", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is in no folder" in err and "is a folder" in err and "--json check.json" in err


def test_check_help_does_not_import_tensorflow():
    command = pathlib.Path(sys.executable).with_name("tfaccel")
    result = subprocess.run(
        [sys.executable, "-X", "importtime", str(command), "check", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "--json FILE" in result.stdout
    imported = [line.split("|")[-1].strip() for line in result.stderr.splitlines()]
    assert not [name for name in imported if name.split(".")[0] in ("tensorflow", "keras")]
