"""The third audit's obscure cases (issue 69, item 9 and "worth fixing"): the doctor on a
script that trains in a child process or on a PyDataset, checkpoint files deleted under a
running job, the elastic launcher's latest checkpoint."""

import sys

SPAWNED = """
import multiprocessing, sys
import keras, numpy as np

def train(marker):
    x = np.ones((64, 4), "float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(x, x[:, :1], epochs=1, verbose=0)
    open(marker, "w").write(str(int(model.optimizer.iterations.numpy())))

if __name__ == "__main__":
    child = multiprocessing.get_context("spawn").Process(target=train, args=(sys.argv[1],))
    child.start()
    child.join()
"""

PY_DATASET = """
import sys
import keras, numpy as np

class Rows(keras.utils.PyDataset):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.x = np.random.default_rng(0).normal(size=(200, 4)).astype("float32")

    def __len__(self):
        return 7  # six batches of 32 and one of 8

    def __getitem__(self, i):
        x = self.x[i * 32 : (i + 1) * 32]
        return x, x.sum(axis=1, keepdims=True)

model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
model.fit(Rows(**eval(sys.argv[1])), epochs=1, verbose=0)
print("AFTER FIT")
"""


def doctor(jobs, tmp_path, code, *args):
    script = tmp_path / "train.py"
    script.write_text(code)
    command = [sys.executable, "-m", "tfaccel", "doctor", "--budget", "2", str(script), *args]
    return jobs.run(command, timeout=240)


def test_the_doctor_says_a_fit_in_a_spawned_child_is_not_measured(jobs, tmp_path):
    marker = tmp_path / "trained.txt"
    result = doctor(jobs, tmp_path, SPAWNED, str(marker))
    said = result.stderr
    assert result.returncode == 3, said[-3000:]
    assert marker.read_text() == "2"  # the child trained for real: the doctor says so
    assert "the script started a child process ('spawn')" in said
    assert (
        "ended without calling model.fit or Trainer.fit in this process, but it started 1 "
        "child process(es) with multiprocessing ('spawn')"
    ) in said
    assert "The doctor measures only the process it runs" in said
    assert "call tfaccel.doctor.diagnose(model, data) inside the child" in said
    assert "nothing to diagnose (the doctor diagnoses the first fit" not in said


def test_the_doctor_reads_a_py_dataset_as_model_fit_does(jobs, tmp_path):
    result = doctor(jobs, tmp_path, PY_DATASET, "{}")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert (
        "model.fit was called with a keras.utils.PyDataset (Rows); measured as model.fit "
        "reads it, 32 examples a batch (a smaller last batch is left out)"
    ) in result.stdout
    assert "Verdict: " in result.stdout and "AFTER FIT" not in result.stdout


def test_the_doctor_refuses_a_py_dataset_with_workers_and_says_what_to_do(jobs, tmp_path):
    result = doctor(jobs, tmp_path, PY_DATASET, "{'workers': 2}")
    assert result.returncode == 2, result.stdout + result.stderr[-3000:]
    assert (
        "model.fit was called with a keras.utils.PyDataset (Rows) read by Keras's worker "
        "pool (workers=2), which the doctor cannot drive"
    ) in result.stderr
    assert "Build it with workers=1 and use_multiprocessing=False" in result.stderr
    assert "Can't convert" not in result.stderr and "AFTER FIT" not in result.stdout


def test_the_elastic_launcher_reads_the_state_file_not_stray_file_names(tmp_path, monkeypatch):
    from tfaccel.launcher import elastic

    monkeypatch.setattr(elastic, "_POLL_S", 0.0)
    for name in ("ckpt-8.index", "ckpt-8.data-00000-of-00001"):
        (tmp_path / name).touch()
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-8"\n')
    watch = elastic.GrowWatch(str(tmp_path), 1, 2)
    assert watch.since == 8
    for name in ("ckpt-99999.index", "ckpt-99999.data-00000-of-00001"):
        (tmp_path / name).touch()  # a stray copy, never published in the state file
    assert elastic.last_step(str(tmp_path)) == 8 and not watch.due()
    (tmp_path / "ckpt-12.index").touch()
    (tmp_path / "checkpoint").write_text(f'model_checkpoint_path: "{tmp_path}/ckpt-12"\n')
    assert watch.due() and watch.step == 12
    (tmp_path / "ckpt-12.index").unlink()  # the state file names files that are gone
    assert elastic.last_step(str(tmp_path)) is None
