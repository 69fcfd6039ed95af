"""The function relay trusts no file: requests of another owner, another mode or without
the service's MAC are refused, said, and never unpickled (relay and worker both check)."""

import base64
import io
import os
import pickle
import time

import pytest

from tfaccel.data.service import relay as relay_lib
from tfaccel.data.service import sealed, server
from tfaccel.errors import ServiceError


class _Plant:
    """Unpickling it makes the directory `marker`: proof that a payload ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


class _Worker:
    """Stands for a `LocalService`: hands each line to what a real worker runs."""

    def __init__(self):
        self.key, self.lines = sealed.new_key(), []

    def send_functions(self, line, timeout_s):
        self.lines.append(line)
        server._register(line, self.key)
        return 1


def _payload(marker):
    return base64.b64encode(pickle.dumps(_Plant(marker))).decode()


def _plant(directory, text, mode=0o600, owner=None):
    """Renames a prepared file into the relay's directory, as an intruder would."""
    hidden = os.path.join(directory, ".planted.tmp")
    with open(hidden, "w") as handle:
        handle.write(text)
    os.chmod(hidden, mode)
    if owner is not None:
        os.chown(hidden, owner, -1)
    os.replace(hidden, os.path.join(directory, "planted.request"))
    return os.path.join(directory, "planted.answer")


def _answer(path, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        assert time.monotonic() < deadline, "the relay never answered"
        time.sleep(0.05)
    time.sleep(0.05)  # renamed into place whole
    with open(path) as handle:
        return handle.read().strip()


@pytest.mark.parametrize(
    "case, reason",
    [
        ("wrong_mac", "refused: chunk 0 has no valid MAC"),
        ("no_mac", "refused: chunk 0 has no valid MAC"),
        ("mode_0644", "refused: mode 0644, not 0600; not loaded"),
        ("other_owner", "refused: owned by uid 65534, not the relay's uid"),
    ],
)
def test_a_planted_request_is_refused_said_and_never_loaded(tmp_path, monkeypatch, case, reason):
    marker = str(tmp_path / "ran")
    worker = _Worker()
    key = sealed.new_key() if case == "wrong_mac" else worker.key
    text = _payload(marker) if case == "no_mac" else sealed.seal(_payload(marker), key)
    mode = 0o644 if case == "mode_0644" else 0o600
    owner = None
    if case == "other_owner" and os.geteuid() == 0:
        owner = 65534  # nobody: a real chown
    elif case == "other_owner":
        real = os.fstat
        monkeypatch.setattr(
            os,
            "fstat",
            lambda fd: os.stat_result((*real(fd)[:4], 65534, *real(fd)[5:])),
        )
    err = io.StringIO()
    with relay_lib.relay_for(worker, err=err) as directory:
        answer = _answer(_plant(directory, text, mode, owner))
    assert answer.startswith("failed " + reason)
    assert f"planted.request {reason}" in err.getvalue()
    assert worker.lines == [] and not os.path.exists(marker)


def test_the_same_request_sealed_and_private_is_loaded(tmp_path):
    """The control: what the refusals stop does run when it is genuine."""
    marker = str(tmp_path / "ran")
    worker = _Worker()
    err = io.StringIO()
    with relay_lib.relay_for(worker, err=err) as directory:
        _answer(_plant(directory, sealed.seal(_payload(marker), worker.key)))
    assert len(worker.lines) == 1 and os.path.isdir(marker) and err.getvalue() == ""


def test_a_symlink_request_is_refused(tmp_path):
    worker = _Worker()
    target = tmp_path / "elsewhere"
    target.write_text(sealed.seal(_payload(str(tmp_path / "ran")), worker.key))
    target.chmod(0o600)
    with relay_lib.relay_for(worker, err=io.StringIO()) as directory:
        os.symlink(target, os.path.join(directory, "planted.request"))
        answer = _answer(os.path.join(directory, "planted.answer"))
    assert answer.startswith("failed refused: cannot open it safely")
    assert worker.lines == [] and not (tmp_path / "ran").exists()


def test_the_worker_checks_the_mac_before_unpickling(tmp_path, capsys):
    marker = str(tmp_path / "ran")
    key = sealed.new_key()
    server._register(sealed.seal(_payload(marker), sealed.new_key()), key)
    server._register(_payload(marker), key)
    server._register(sealed.seal(_payload(marker), key), None)
    said = capsys.readouterr()
    assert said.out.splitlines() == [
        "failed refused: chunk 0 has no valid MAC (HMAC-SHA256 under this service's "
        "secret); nothing was loaded"
    ] * 2 + [f"failed refused: no secret to check the functions' MAC with ({sealed.ENV_KEY} unset)"]
    assert said.err.count("tfaccel data-service worker: refused") == 3
    assert not os.path.exists(marker)
    # one bad chunk refuses the whole line, the good chunk before it included
    good, bad = sealed.seal(_payload(marker), key), sealed.seal("eA==", sealed.new_key())
    server._register(good.strip() + " " + bad, key)
    assert capsys.readouterr().out.startswith("failed refused: chunk 1")
    assert not os.path.exists(marker)


def test_a_request_without_the_secret_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv(sealed.ENV_KEY, raising=False)
    with pytest.raises(ServiceError, match=f"takes only sealed requests, and {sealed.ENV_KEY}"):
        relay_lib.request(str(tmp_path), "eA==", timeout_s=0.3)
    monkeypatch.setenv(sealed.ENV_KEY, "zz")
    with pytest.raises(ServiceError, match="must be 64 hex digits"):
        relay_lib.request(str(tmp_path), "eA==", timeout_s=0.3)
    assert os.listdir(tmp_path) == []
