"""`tfaccel launch --max-workers N`: a job that shrank grows back once it has saved a
checkpoint on fewer workers (the exact 2 -> 1 -> 2 run is in test_launch.py)."""

import io
import subprocess
import sys

import pytest

from tfaccel.launcher import elastic, launch
from tfaccel.launcher.elastic import Elastic

# worker 1 is lost on the first start (killed by a signal: a script that exits 1 at once is
# a script error); worker 0 saves "ckpt-N" every 0.2 s (its files, then the state file
# naming it) and stops on SIGTERM (as the Trainer does); grown back, both finish at once.
_FAKE_JOB = """
import json, os, pathlib, signal, sys, time
config = json.loads(os.environ["TF_CONFIG"])
workers, index = len(config["cluster"]["worker"]), config["task"]["index"]
ckpt = pathlib.Path(sys.argv[1])
ckpt.mkdir(exist_ok=True)
state = ckpt / "checkpoint"
last = int(state.read_text().split('"')[1][5:]) if state.exists() else 0
with open(sys.argv[2], "a") as log:
    print(f"{workers} {index} {last}", file=log)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
if workers == 2 and last == 0:
    os.kill(os.getpid(), signal.SIGKILL) if index == 1 else time.sleep(600)
if workers == 2 or index:
    sys.exit(0)
for step in range(last + 4, 400, 4):
    time.sleep(0.2)
    (ckpt / f"ckpt-{step}.index").touch()
    state.write_text(f'model_checkpoint_path: "ckpt-{step}"\\n')
"""


def test_a_shrunken_job_grows_back_once_it_saved(tmp_path):
    ckpt, log, err = tmp_path / "ckpt", tmp_path / "starts.txt", io.StringIO()
    command = [sys.executable, "-c", _FAKE_JOB, str(ckpt), str(log)]
    status = launch.launch(
        command,
        2,
        elastic=Elastic(min_workers=1, max_workers=2, checkpoint_dir=str(ckpt)),
        out=io.StringIO(),
        err=err,
        timeout_s=120,
    )
    said = err.getvalue()
    assert status == 0, said
    starts = [tuple(map(int, line.split())) for line in log.read_text().splitlines()]
    # (workers, index, resumed from): 2 workers, then 1, then 2 again from its save
    shrunk = starts.index((1, 0, 0))  # worker 0 of the first start may die before it logs
    assert (2, 1, 0) in starts[:shrunk] and set(starts[:shrunk]) <= {(2, 0, 0), (2, 1, 0)}
    grown_from = starts[-1][2]
    assert grown_from >= 4 and sorted(starts[shrunk + 1 :]) == [
        (2, 0, grown_from),
        (2, 1, grown_from),
    ]
    assert "worker 1 lost; continuing on 1 worker(s)" in said
    assert (
        f"[launch] capacity back: re-forming the job on 2 worker(s) from step {grown_from} "
        f"(the last checkpoint in {ckpt})"
    ) in said


def publish(folder, step):
    """A checkpoint as the Trainer leaves it: its files, then the state file naming it."""
    (folder / f"ckpt-{step}.index").touch()
    (folder / f"ckpt-{step}.data-00000-of-00001").touch()
    (folder / "checkpoint").write_text(
        f'model_checkpoint_path: "ckpt-{step}"\nall_model_checkpoint_paths: "ckpt-{step}"\n'
    )


def test_the_grow_watch_waits_for_a_newer_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setattr(elastic, "_POLL_S", 0.0)
    publish(tmp_path, 12)
    watch = elastic.GrowWatch(str(tmp_path), 1, 2)
    assert not watch.due() and watch.step is None
    (tmp_path / "ckpt-16.index").touch()  # being written: not published yet
    assert not watch.due()
    publish(tmp_path, 16)
    assert watch.due() and watch.step == 16
    assert not elastic.GrowWatch(str(tmp_path), 2, 2).due()  # at full size: never


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"max_workers": 1, "checkpoint_dir": "c"}, "--max-workers must be an integer >= "),
        ({"max_workers": True, "checkpoint_dir": "c"}, "--max-workers must be an integer"),
        ({"max_workers": 3}, "--max-workers needs --checkpoint-dir"),
    ],
)
def test_bad_max_workers_is_refused(extra, message):
    with pytest.raises(ValueError, match=message):
        launch.launch([sys.executable, "-c", "pass"], 2, elastic=Elastic(**extra))


def test_the_cli_refuses_max_workers_without_a_checkpoint_dir():
    result = subprocess.run(
        [sys.executable, "-m", "tfaccel", "launch", "--workers", "1", "--max-workers", "2"]
        + ["--", sys.executable, "-c", "pass"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "tfaccel launch: --max-workers needs --checkpoint-dir" in result.stderr
