"""Splits the CPU into two logical devices before TensorFlow initialises.

Any test can then build a 2-replica `MirroredStrategy` on `/cpu:0` and `/cpu:1`.
"""

import os
import signal

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# A shell starts a background job (`make test &`, nohup) with SIGINT ignored, and an
# ignored signal stays ignored in every child: the Ctrl-C tests' processes then never
# hear the SIGINT they are sent. A handled SIGINT is reset to the default in a child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest  # noqa: E402

from tfaccel import devices  # noqa: E402

devices.configure(virtual_cpus=2)

CPUS = ["/cpu:0", "/cpu:1"]


@pytest.fixture(autouse=True)
def probe_cache(tmp_path_factory, monkeypatch):
    """Each test's own, empty cache of the operations' rates (never ~/.cache, never
    another test's: no test depends on what ran before it)."""
    path = tmp_path_factory.mktemp("tfaccel-cache")
    monkeypatch.setenv("TFACCEL_CACHE_DIR", str(path))
    return path


@pytest.fixture(scope="session")
def jobs():
    """Runs `python SCRIPT ARGS...` jobs, each a process of its own forked from one that
    imported TensorFlow once for this test process (forked.py): `jobs.run(argv, timeout)`
    as `subprocess.run(argv, capture_output=True, text=True, timeout=timeout)`."""
    from forked import ForkServer

    server = ForkServer()
    yield server
    server.close()


@pytest.fixture(scope="session")
def worker_zygote():
    """Command lines for the workers that `tfaccel launch` starts: `worker_zygote.command(
    [sys.executable, SCRIPT, *args])` runs as that command, in a process forked from one
    that imported TensorFlow once (forked.py's WorkerZygote)."""
    from forked import WorkerZygote

    zygote = WorkerZygote()
    yield zygote
    zygote.close()


@pytest.fixture
def mirrored():
    """A 2-replica MirroredStrategy over two logical CPUs."""
    return devices.strategy("mirrored", devices=CPUS)


# The slowest files, slowest first (their tests' seconds summed, `--junitxml` times, from a
# 3-process run of the suite after the jobs were forked (`jobs` above): a run beside a
# benchmark, so the seconds are ~1.8x a quiet run's; the files marked * since scaled by
# the measured before/after ratios of their launched workers' forking (`worker_zygote`
# above)). `make test` runs pytest-xdist with
# `--dist loadfile --no-loadscope-reorder`, which hands out whole files in collection
# order: these start first, longest first, and the many short files fill the processes in
# at the end (files ordered by older times ended one process 46 s after the others).
SLOW_FILES = (
    "test_notebooks.py",  # 252
    "test_recipes.py",  # 291 -> ~250*
    "test_ray_train.py",  # 249
    "test_launch.py",  # 397 -> ~210*
    "test_models.py",  # 193 -> ~190*
    "test_data_service_faults.py",  # 164
    "test_data_service.py",  # 164 -> ~145*
    "test_fault_tolerance.py",  # 128
    "test_async_checkpoint.py",  # 124
    "test_notebooks_doctor.py",  # 112
    "test_keras_fit_args.py",  # 111
    "test_tuning.py",  # 105
    "test_cli.py",  # 104
    "test_parallel.py",  # 93
    "test_launch_data.py",  # 109 -> ~80*
    "test_checkpoint_ownership.py",  # 76
    "test_methods_trainer.py",  # 69
    "test_checkpoint_recovery.py",  # 64
)


def pytest_collection_modifyitems(config, items):
    """The files of SLOW_FILES first, in its order; the others after, as collected."""
    rank = {name: index for index, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FILES)))


def _reaper_stats() -> dict:
    from tfaccel.data import iterators

    return iterators.stats()


def pytest_sessionfinish(session):
    """Under pytest-xdist, a worker hands its reaper figures to the controller."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["reaper"] = _reaper_stats()


class _WorkerFigures:
    """The controller keeps each worker's reaper figures (a pytest-xdist hook)."""

    @staticmethod
    def pytest_testnodedown(node, error):
        stats = getattr(node, "workeroutput", {}).get("reaper")
        if stats is not None:
            node.config._reaper_stats = [*getattr(node.config, "_reaper_stats", []), stats]


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist"):  # the suite also runs without it
        config.pluginmanager.register(_WorkerFigures())


def pytest_terminal_summary(terminalreporter, config):
    """One line on the iterator reaper over the whole run, every worker's summed."""
    runs = getattr(config, "_reaper_stats", None) or [_reaper_stats()]
    total = {key: sum(s[key] for s in runs) for key in ("adopted", "freed", "pending")}
    most = max(s["most_pending"] for s in runs)
    longest = max(s["longest_free_s"] for s in runs)
    workers = f" ({len(runs)} workers)" if len(runs) > 1 else ""
    terminalreporter.write_line(
        f"iterator reaper{workers}: {total['adopted']} adopted, {total['freed']} freed, "
        f"{total['pending']} pending at the end, at most {most} pending at once, the longest "
        f"deletion {longest:.2f} s"
    )
