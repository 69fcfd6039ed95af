"""`tfaccel data-service` servers stop on Ctrl-C (SIGINT) and say so; the CLI says
that they listen on every interface."""

import os
import signal
import subprocess
import sys

from tfaccel.data.service import server


def _start(*arguments):
    return subprocess.Popen(
        [sys.executable, "-m", "tfaccel", "data-service", *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES=""),
    )


def _interrupt(process, role):
    process.send_signal(signal.SIGINT)
    try:
        status = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    said = process.stderr.read()
    assert status == 130, said
    assert f"tfaccel data-service {role}: interrupted (Ctrl-C); stopped" in said
    return said


def test_ctrl_c_stops_the_dispatcher_and_a_worker_saying_so():
    dispatcher = _start("dispatcher", "--port", "0")
    worker = None
    try:
        line = dispatcher.stdout.readline()
        assert line.startswith(f"{server.READY} dispatcher port "), line
        port = line.split()[-1]
        worker = _start("worker", "--dispatcher", f"localhost:{port}", "--quiet")
        assert worker.stdout.readline().startswith(f"{server.READY} worker of localhost:{port}")
        _interrupt(worker, "worker")
        said = _interrupt(dispatcher, "dispatcher")
        assert "dispatcher: listening on every interface of this machine" in said
        assert "no authentication" in said
    finally:
        for process in (worker, dispatcher):
            if process is not None and process.poll() is None:
                process.kill()
