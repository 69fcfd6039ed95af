"""Workers meet before TensorFlow's server starts: a greeting both ways, bounded, and
a plain script with a stale TF_CONFIG ends with a message (timeout, SIGTERM, Ctrl-C)."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from tfaccel.errors import PeersMissingError
from tfaccel.launcher import rendezvous
from tfaccel.launcher.processes import free_ports


def test_two_workers_meet_and_leave_their_ports_free():
    addresses = [f"127.0.0.1:{p}" for p in free_ports(2)]
    errors = []

    def worker(index):
        try:
            rendezvous.wait(addresses[index], [addresses[1 - index]], 20.0, "TF_CONFIG")
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == [] and not any(t.is_alive() for t in threads)
    for address in addresses:  # TensorFlow's server can take the port now
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does
            probe.bind(("127.0.0.1", int(address.rpartition(":")[2])))


@pytest.fixture
def silent_peer():
    """A port that accepts connections and never answers: a leftover server."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield f"127.0.0.1:{listener.getsockname()[1]}"


def test_a_port_that_accepts_but_does_not_greet_is_no_peer(silent_peer):
    own = f"127.0.0.1:{free_ports(1)[0]}"
    with pytest.raises(PeersMissingError) as raised:
        rendezvous.wait(own, [silent_peer], 0.5, "TF_CONFIG")
    assert f"worker(s) ['{silent_peer}'] never came within 0.5 s" in str(raised.value)
    assert "accept connections but do not answer as workers of this cluster" in str(raised.value)


_SCRIPT = "from tfaccel import devices\ndevices.strategy('auto', startup_timeout_s={})\n"


def _plain(zygote, peer, timeout_s):
    """The script as a process of its own, forked from one that imported TensorFlow
    (conftest's worker_zygote)."""
    own = f"127.0.0.1:{free_ports(1)[0]}"
    config = {"cluster": {"worker": [own, peer]}, "task": {"type": "worker", "index": 0}}
    return subprocess.Popen(
        zygote.command([sys.executable, "-c", _SCRIPT.format(timeout_s)]),
        env=dict(os.environ, TF_CONFIG=json.dumps(config), TF_CPP_MIN_LOG_LEVEL="2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_plain_script_with_a_stale_peer_ends_within_the_startup_timeout(
    silent_peer, worker_zygote
):
    # before: the port accepted, TensorFlow's cluster set-up waited for ever
    script = _plain(worker_zygote, silent_peer, 3)
    try:
        _, said = script.communicate(timeout=120)
    finally:
        script.kill()
    assert script.returncode == 1
    assert "DeviceConfigError" in said and "never came within 3 s" in said
    assert silent_peer in said and "unset TF_CONFIG to run alone" in said


def _when_waiting(script):
    lines = [script.stderr.readline()]
    while "joining a 2-worker cluster" not in lines[-1]:
        lines.append(script.stderr.readline())
        assert lines[-1], "".join(lines)
    time.sleep(1.0)  # inside the wait now


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGINT, -signal.SIGINT)])
def test_a_signal_during_the_wait_ends_it_with_a_message(silent_peer, sig, status, worker_zygote):
    script = _plain(worker_zygote, silent_peer, "None")
    try:
        _when_waiting(script)
        script.send_signal(sig)
        _, said = script.communicate(timeout=60)
    finally:
        script.kill()
    assert script.returncode == status  # SIGINT: an uncaught KeyboardInterrupt
    name = signal.Signals(sig).name
    assert f"tfaccel: {name} while worker 127.0.0.1:" in said
    assert f"waited for its peers ['{silent_peer}'] (from TF_CONFIG); stopped." in said


@pytest.fixture
def vanishing_peer():
    """A peer that answers the greeting, then never starts TensorFlow's server."""
    peer = f"127.0.0.1:{free_ports(1)[0]}"
    own = f"127.0.0.1:{free_ports(1)[0]}"
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", int(peer.rpartition(":")[2])))
    listener.listen(8)
    listener.settimeout(0.1)
    meeting = rendezvous._Meeting(peer, [own], listener)
    meeting.thread.start()
    yield own, peer
    meeting.done.set()
    meeting.thread.join(5)
    listener.close()


def _met(zygote, own, peer, timeout_s):
    config = {"cluster": {"worker": [own, peer]}, "task": {"type": "worker", "index": 0}}
    return subprocess.Popen(
        zygote.command([sys.executable, "-c", _SCRIPT.format(timeout_s)]),
        env=dict(os.environ, TF_CONFIG=json.dumps(config), TF_CPP_MIN_LOG_LEVEL="2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_tensorflows_set_up_after_the_meeting_is_bounded(vanishing_peer, worker_zygote):
    # before: the peer met, then gone: TensorFlow's set-up waited for ever
    script = _met(worker_zygote, *vanishing_peer, 3)
    try:
        _, said = script.communicate(timeout=120)
    finally:
        script.kill()
    assert script.returncode == -signal.SIGKILL
    assert (
        "tfaccel: TensorFlow's cluster set-up did not finish within 3 s of meeting the peers"
    ) in said


def test_ctrl_c_during_tensorflows_set_up_ends_it_with_a_message(vanishing_peer, worker_zygote):
    script = _met(worker_zygote, *vanishing_peer, "None")
    try:
        _when_waiting(script)
        time.sleep(2.0)  # met; inside TensorFlow's set-up now
        script.send_signal(signal.SIGINT)
        _, said = script.communicate(timeout=60)
    finally:
        script.kill()
    assert script.returncode == -signal.SIGKILL
    assert "tfaccel: Ctrl-C (SIGINT) during TensorFlow's cluster set-up; stopping" in said
