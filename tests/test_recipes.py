"""The main job (`make run`) reaches its accuracy and writes its logs."""

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "recipes"))

import digits  # noqa: E402


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
    # The same command again resumes from the finished checkpoint: no more training.
    again = digits.main(["--logdir", str(tmp_path), "--verbose", "0"])
    assert again["test_accuracy"] == summary["test_accuracy"]
