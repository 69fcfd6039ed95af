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


# The slowest files, slowest first (their tests' seconds summed, `--durations=0`, from a
# 3-process run of the whole suite, 2026-12-07, one other job beside it; the files marked
# * since cut, by the before/after CPU-seconds their change measured). `make test` runs
# pytest-xdist with `--dist loadfile --no-loadscope-reorder`, which hands out whole files in
# collection order: these start first, longest first, and the many short files fill the
# processes in at the end (a 140 s file left out of this list ran late and set the end).
SLOW_FILES = (
    "test_launch.py",  # 119
    "test_custom_train_step.py",  # 140 -> ~100*
    "test_ray_train.py",  # 147 -> ~100*
    "test_recipes.py",  # 99
    "test_notebooks_doctor.py",  # 117 -> ~70* (07's probe)
    "test_data_service_faults.py",  # 81 -> ~65*
    "test_keras_fit_args.py",  # 62
    "test_tuning.py",  # 61
    "test_notebooks.py",  # 59
    "test_launch_data.py",  # 58
    "test_audit3_obscure.py",  # 56
    "test_data_service.py",  # 81 -> ~50*
    "test_models.py",  # 52
    "test_doctor.py",  # 47
    "test_methods_trainer.py",  # 43
    "test_checkpoint_recovery.py",  # 43
    "test_docs_training_pages.py",  # 39
    "test_async_checkpoint.py",  # 38
    "test_elastic.py",  # 38
    "test_checkpoint_ownership.py",  # 36
    "test_parallel.py",  # 36
    "test_cli.py",  # 69 -> ~35*
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
