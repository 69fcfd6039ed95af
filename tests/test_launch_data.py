"""`tfaccel launch --data-workers K` and `data.pipeline(..., service="auto")`."""

import json
import os
import subprocess
import sys
import textwrap

from tfaccel import data
from tfaccel.data import service as service_lib

_SCRIPT = textwrap.dedent(
    """
    import json, os
    import numpy as np
    import tensorflow as tf
    from tfaccel import data

    ids = np.arange(90)
    source = data.from_arrays(ids.astype("float32").reshape(-1, 1), ids)
    train = data.pipeline(source, batch_size=8, training=True, service="auto",
                          preprocess=lambda x, y: (tf.sqrt(x + 1.0), y))
    seen = sorted(int(v) for _, y in train for v in y.numpy())
    print(json.dumps({"address": os.environ["TFACCEL_DATA_SERVICE"],
                      "workers": data.plan_of(train).step("service").settings["on"],
                      "once": seen == ids.tolist()}), flush=True)
    """
)

_PYTHON_SCRIPT = textwrap.dedent(
    """
    import json, os, pathlib, tempfile
    import keras
    import numpy as np
    import tensorflow as tf
    import tfaccel
    from tfaccel import data

    ran = tempfile.mkdtemp()  # each process that runs `work` leaves its pid here

    def work(x):
        pathlib.Path(ran, str(os.getpid())).touch()
        return np.concatenate([x, x * 2.0]).astype("float32")

    def decode(x, y):
        out = tf.numpy_function(work, [x], tf.float32)
        out.set_shape([2])
        return out, y

    ids = np.arange(96)
    source = data.from_arrays(ids.astype("float32").reshape(-1, 1), ids)
    train = data.pipeline(source, batch_size=8, training=True, service="auto",
                          preprocess=decode)
    once, doubled = [], True
    for _ in range(2):
        seen = []
        for x, y in train:
            seen.extend(y.numpy().tolist())
            doubled &= bool(np.all(x.numpy()[:, 1] == 2.0 * y.numpy()))
        once.append(sorted(seen) == ids.tolist())
    trainer = tfaccel.Trainer(
        lambda: keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)]),
        optimizer=lambda: keras.optimizers.SGD(0.001),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        strategy=tf.distribute.get_strategy(),
        steps_per_loop=1,
    )
    labelled = data.pipeline(data.from_arrays(ids.astype("float32").reshape(-1, 1), ids % 3),
                             batch_size=8, training=True, service="auto", preprocess=decode)
    history = trainer.fit(labelled, epochs=2, verbose=0)
    print(json.dumps({"once": once, "doubled": doubled, "me": os.getpid(),
                      "ran_in": sorted(int(p) for p in os.listdir(ran)),
                      "epochs": len(history.history["loss"]),
                      "loss": float(history.history["loss"][-1])}), flush=True)
    """
)


def _servers_of(address):
    port = address.rsplit(":", 1)[-1]
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                line = handle.read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "data-service" in line and port in line:
            found.append(int(pid))
    return found


def test_launch_runs_a_service_for_the_job_and_stops_it(worker_zygote):
    job = worker_zygote.command([sys.executable, "-c", _SCRIPT])  # forked (conftest.py)
    result = subprocess.run(
        [sys.executable, "-m", "tfaccel", "launch", "--workers", "1", "--data-workers", "2"]
        + ["--timeout", "300", "--", *job],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "[launch] tf.data service: a dispatcher and 2 worker process(es)" in result.stderr
    assert "tfaccel data service: the dispatcher and 2 worker(s) of grpc://localhost:" in (
        result.stderr
    )
    assert "listen(s) on EVERY network interface" in result.stderr
    line = next(x for x in result.stdout.splitlines() if '"address"' in x)
    said = json.loads(line[line.index("{") :])
    assert said["address"].startswith("grpc://localhost:")
    assert said["workers"].startswith("2 tf.data service worker(s)")
    assert said["once"]
    assert _servers_of(said["address"]) == []


def test_python_functions_of_the_launched_job_run_on_the_launchers_workers(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_PYTHON_SCRIPT)
    result = subprocess.run(
        [sys.executable, "-m", "tfaccel", "launch", "--workers", "1", "--data-workers", "2"]
        + ["--timeout", "300", "--", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    line = next(x for x in result.stdout.splitlines() if '"once"' in x)
    said = json.loads(line[line.index("{") :])
    assert said["once"] == [True, True]  # every example exactly once an epoch
    assert said["doubled"]  # the Python function's result
    assert said["ran_in"] and said["me"] not in said["ran_in"]  # run by the workers
    assert said["epochs"] == 2 and said["loss"] == said["loss"]  # trained, not NaN
    assert "Could not find callback" not in result.stderr


def test_bad_data_workers_is_refused():
    result = subprocess.run(
        [sys.executable, "-m", "tfaccel", "launch", "--workers", "1", "--data-workers", "0"]
        + ["--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--data-workers must be >= 1" in result.stderr


def test_auto_without_a_launched_service_runs_here(monkeypatch):
    monkeypatch.delenv(service_lib.ENV, raising=False)
    assert service_lib.from_env() is None
    ds = data.pipeline(
        data.from_arrays([[1.0], [2.0]], [0, 1]), batch_size=2, training=False, service="auto"
    )
    assert "service" not in data.plan_of(ds).names
