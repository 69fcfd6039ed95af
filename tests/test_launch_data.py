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


def test_launch_runs_a_service_for_the_job_and_stops_it():
    result = subprocess.run(
        [sys.executable, "-m", "tfaccel", "launch", "--workers", "1", "--data-workers", "2"]
        + ["--timeout", "300", "--", sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "[launch] tf.data service: a dispatcher and 2 worker process(es)" in result.stderr
    line = next(x for x in result.stdout.splitlines() if '"address"' in x)
    said = json.loads(line[line.index("{") :])
    assert said["address"].startswith("grpc://localhost:")
    assert said["workers"].startswith("2 tf.data service worker(s)")
    assert said["once"]
    assert _servers_of(said["address"]) == []


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
