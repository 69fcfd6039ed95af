"""`tfaccel.data.service.relay`: a launched process's Python functions reach the
launcher's workers (answered, failed, unanswered; private files, none left), and a
restarted worker gets every line of functions sent before it died."""

import base64
import os
import signal
import stat
import tempfile
import time

import cloudpickle
import numpy as np
import pytest
import tensorflow as tf
from test_data_service import guarded

from tfaccel import data
from tfaccel.data import service as service_lib
from tfaccel.data.service import relay as relay_lib
from tfaccel.data.service import sealed


class _Workers:
    """Stands for a `LocalService`: takes a line and answers as its workers would."""

    def __init__(self, fail=None, delay_s=0.0):
        self.lines, self.fail, self.delay_s = [], fail, delay_s
        self.key = sealed.new_key()

    def send_functions(self, line, timeout_s):
        time.sleep(self.delay_s)
        self.lines.append(line)
        if self.fail is not None:
            raise self.fail
        return 3


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_request_is_answered_and_its_files_removed():
    workers = _Workers()
    with relay_lib.relay_for(workers) as directory:
        assert _mode(directory) == 0o700
        assert relay_lib.request(directory, "bGluZQ==\n", timeout_s=10, key=workers.key) == 3
        assert relay_lib.request(directory, "c2Vjb25k", timeout_s=10, key=workers.key) == 3
        assert os.listdir(directory) == []
    assert [sealed.open_line(x, workers.key) for x in workers.lines] == [["bGluZQ=="], ["c2Vjb25k"]]
    assert not os.path.exists(directory)


def test_a_worker_that_fails_is_said_with_its_reason():
    reason = service_lib.ServiceError("worker 1 could not load: ModuleNotFoundError: mine")
    workers = _Workers(fail=reason)
    with relay_lib.relay_for(workers) as directory:
        with pytest.raises(service_lib.ServiceError, match="ModuleNotFoundError: mine"):
            relay_lib.request(directory, "eA==", timeout_s=10, key=workers.key)
        assert os.listdir(directory) == []
    workers = _Workers(fail=ValueError("odd"))
    with relay_lib.relay_for(workers) as directory:
        with pytest.raises(service_lib.ServiceError, match="ValueError\\('odd'\\)"):
            relay_lib.request(directory, "eA==", timeout_s=10, key=workers.key)


def test_no_answer_is_a_bounded_clear_error():
    with tempfile.TemporaryDirectory() as nobody:  # no relay watches it
        started = time.monotonic()
        with pytest.raises(service_lib.ServiceError, match="did not take .* within 0 s"):
            relay_lib.request(nobody, "eA==", timeout_s=0.3, key=sealed.new_key())
        assert time.monotonic() - started < 5
        assert os.listdir(nobody) == []  # the request withdrawn
    with pytest.raises(service_lib.ServiceError, match="relay .* is gone"):
        relay_lib.request(nobody, "eA==", timeout_s=0.3)


def test_request_files_are_private():
    with tempfile.TemporaryDirectory() as directory:
        relay_lib._write(os.path.join(directory, "x.request"), "eA==\n")
        assert os.listdir(directory) == ["x.request"]
        assert _mode(os.path.join(directory, "x.request")) == 0o600


def _with_python(count, scale):
    def work(x):
        return (x * scale).astype(np.float32)

    def decode(x, y):
        out = tf.numpy_function(work, [x], tf.float32)
        out.set_shape([1])
        return out, y

    ids = np.arange(count)
    return data.from_arrays(ids.astype(np.float32).reshape(-1, 1), ids), decode


def test_a_pipeline_without_a_relay_or_functions_sends_nothing(monkeypatch):
    monkeypatch.delenv(service_lib.ENV_FUNCTIONS, raising=False)
    source, decode = _with_python(4, 2.0)
    with_python = source.map(decode)
    assert relay_lib.share_launched(with_python, "grpc://localhost:1") is None
    assert relay_lib.share_launched(source, "grpc://localhost:1") == 0
    monkeypatch.setenv(service_lib.ENV_FUNCTIONS, "/nowhere")
    monkeypatch.setenv(service_lib.ENV, "grpc://localhost:2")  # another service's relay
    assert relay_lib.share_launched(with_python, "grpc://localhost:1") is None


def test_a_restarted_worker_gets_every_line_sent_before():
    with service_lib.local(1) as running, guarded(running, 180):
        pipelines = []
        for scale in (2.0, 3.0):
            source, decode = _with_python(20, scale)
            pipelines.append(
                data.pipeline(
                    source, batch_size=5, training=False, preprocess=decode, service=running
                )
            )
        assert len(running.functions_lines) == 2
        os.kill(running.worker_processes[0].pid, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while not running.watch.restarts and time.monotonic() < deadline:
            time.sleep(0.2)
        while running.worker_processes[0].poll() is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        with running.lock:  # revive is done: its functions registered, it serves
            assert running.watch.restarts == [1]
        for scale, ds in zip((2.0, 3.0), pipelines, strict=True):
            pairs = [
                (float(x), int(y))
                for xb, yb in ds
                for x, y in zip(xb.numpy()[:, 0], yb.numpy(), strict=True)
            ]
            assert sorted(pairs) == [(i * scale, i) for i in range(20)]


@pytest.fixture(scope="module")
def listener():
    """A dispatcher in this process, without workers (a pipeline's build registers there)."""
    dispatcher = tf.data.experimental.service.DispatchServer()
    yield dispatcher.target
    dispatcher._stop()


def test_a_launched_pipeline_sends_its_functions_through_the_relay(monkeypatch, listener):
    workers = _Workers()
    source, decode = _with_python(8, 2.0)
    with relay_lib.relay_for(workers) as directory:
        monkeypatch.setenv(service_lib.ENV, listener)
        monkeypatch.setenv(service_lib.ENV_FUNCTIONS, directory)
        monkeypatch.setenv(sealed.ENV_KEY, workers.key.hex())
        data.pipeline(source, batch_size=4, training=True, preprocess=decode, service="auto")
        (line,) = workers.lines
        (chunk,) = sealed.open_line(line, workers.key)
        functions = cloudpickle.loads(base64.b64decode(chunk))
        assert functions and all(t.startswith("pyfunc_") for t in functions)
        assert [float(f(np.float32([1.5]))[0]) for f in functions.values()] == [3.0]
        workers.fail = service_lib.ServiceError("worker 0 could not load: boom")
        with pytest.raises(service_lib.ServiceError, match="`: worker 0 could not load: boom"):
            data.pipeline(source, batch_size=4, training=True, preprocess=decode, service="auto")


def test_python_functions_for_a_service_elsewhere_are_warned_of(monkeypatch, listener):
    monkeypatch.delenv(service_lib.ENV_FUNCTIONS, raising=False)
    source, decode = _with_python(8, 2.0)
    with pytest.warns(UserWarning, match="Could not find callback"):
        ds = data.pipeline(source, batch_size=4, training=True, preprocess=decode, service=listener)
    assert any("Could not find callback" in note for note in data.plan_of(ds).notes)
