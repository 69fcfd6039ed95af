"""`tfaccel data-service` servers stop on Ctrl-C (SIGINT) and say so; the CLI says
that they listen on every interface."""

import os
import signal
import subprocess
import sys
import textwrap

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


_OTHER_THREAD = textwrap.dedent(
    """
    import signal, sys, threading, time
    from tfaccel.data.service import server

    class Server:  # a stand-in with the TensorFlow server's stop
        def _stop(self):
            print("stopped", flush=True)

    other = threading.Thread(target=time.sleep, args=(30,), daemon=True)
    other.start()
    # Ctrl-C's SIGINT delivered to another thread (the kernel may pick any of
    # TensorFlow's): its handler runs only when the main thread runs Python again.
    threading.Timer(0.5, signal.pthread_kill, (other.ident, signal.SIGINT)).start()
    began = time.monotonic()
    try:
        server._serve(Server())
    except KeyboardInterrupt:
        print(f"interrupted after {time.monotonic() - began:.1f} s", flush=True)
    """
)


def test_ctrl_c_heard_by_another_thread_still_stops_the_server_at_once():
    # Before: the main thread slept an hour at a time and heard such a signal only then.
    ran = subprocess.run(
        [sys.executable, "-c", _OTHER_THREAD], capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    lines = ran.stdout.split()
    assert "stopped" in lines and "interrupted" in lines, ran.stdout
