"""TensorFlow's servers cannot be bound to loopback: every path that starts one says
so, with its ports, each time (local(), launch's workers; the CLI and --data-workers
in test_service_signals / test_launch_data), and the servers are measured reachable
through a non-loopback address of this host."""

import io
import socket
import subprocess
import sys

import pytest

from tfaccel.data import service
from tfaccel.launcher import launch


def _non_loopback_address():
    """An IPv4 address of this host other than loopback, or None."""
    try:
        lines = subprocess.run(
            ["ip", "-4", "-o", "addr", "show", "scope", "global"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    for line in lines:
        fields = line.split()
        if "inet" in fields:
            return fields[fields.index("inet") + 1].split("/")[0]
    return None


def test_local_says_its_servers_listen_on_every_interface(capfd):
    with service.local(1) as running:
        ports = [int(a.rsplit(":", 1)[1]) for a in [running.address, *running.worker_addresses]]
        outside = _non_loopback_address()
        reached = []
        for port in ports if outside else []:
            with socket.socket() as client:
                client.settimeout(5)
                reached.append(client.connect_ex((outside, port)) == 0)
    said = capfd.readouterr().err
    assert (
        f"tfaccel data service: the dispatcher and 1 worker(s) of {running.address} listen(s) "
        f"on EVERY network interface of this machine (ports {ports[0]}, {ports[1]})"
    ) in said
    assert "no authentication" in said
    if outside is None:
        pytest.skip("this host has no non-loopback IPv4 address to connect through")
    assert reached == [True, True]  # what the warning says: not loopback only


def test_launch_says_so_at_each_start_of_its_workers():
    err = io.StringIO()
    command = [sys.executable, "-c", "import sys; sys.exit(3)"]
    assert launch.launch(command, 2, max_restarts=1, out=io.StringIO(), err=err) == 3
    notes = [x for x in err.getvalue().splitlines() if "will listen on EVERY network" in x]
    assert len(notes) == 2  # the first start and the restart
    assert all("not only on 127.0.0.1" in x and "unauthenticated" in x for x in notes)
    assert notes[0] != notes[1]  # each names its own ports
    err = io.StringIO()
    assert launch.launch([sys.executable, "-c", "pass"], 1, out=io.StringIO(), err=err) == 0
    assert "EVERY network" not in err.getvalue()  # one worker starts no server
