"""`tfaccel check`: a self-test of every hardware-dependent path on this machine.

Run it first on a new machine (a GPU box, a cluster node) and keep its JSON with a bug
report: it says what TensorFlow sees, and whether each path that depends on the hardware
works here, with a figure for each. Every check uses a tiny model (most of the time is
tracing); about a minute on two CPU cores.

Checks, in order (`CHECKS`):

- **devices**: what TensorFlow sees (`tfaccel.devices.describe`) and, without a GPU, why;
  fails when an NVIDIA driver is loaded but TensorFlow sees no GPU.
- **memory growth**: applied on every visible GPU (skipped without one).
- **precision choice**: `tfaccel.precision.choose()`, measured on this hardware.
- **precision step**: `Trainer(precision="auto")`'s step, and (on a CPU that chose
  float32) a `mixed_bfloat16` step, each with a loss close to float32's.
- **float16 loss scaling**: under `mixed_float16`, an overflowing step is skipped (the
  weights stay, the loss scale halves) and the next finite one is applied.
- **xla**: a `jit_compile=True` step equal to the plain one, and XLA's speed on the
  passes as `Trainer(jit_compile="auto")` measures it.
- **mirrored**: a `MirroredStrategy` over all local devices (two logical CPUs where there
  are fewer than two GPUs) equal to one device on the same global batch.
- **all-reduce**: a value summed over the replicas, and its bandwidth.
- **device memory**: the allocator's readings on a GPU; the process's RSS on a CPU.
- **doctor**: `tfaccel.doctor.diagnose` names a planted input-bound job "input".

Example:
    >>> results = tfaccel.check.run(json_path="check.json")     # doctest: +SKIP
    >>> print(tfaccel.check.format_table(results))               # doctest: +SKIP
    >>> any(r.status == "failed" for r in results)               # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys
import time
from collections.abc import Callable

from tfaccel.check.suite import CHECKS, CheckFailed, Context, Found, Skip, configure

__all__ = ["CheckFailed", "Found", "Result", "Skip", "format_table", "run", "write_json"]

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclasses.dataclass
class Result:
    """One check's outcome.

    Attributes:
        name: the check's name (a row of the table).
        status: "passed", "failed" or "skipped".
        ran: what it ran on, or why it was skipped.
        result: what it found, or the error that failed it.
        figure: the measured figure, as text (e.g. "max |Δw| 2e-08").
        value: the figure as a number, when it has one.
        seconds: how long the check took.
    """

    name: str
    status: str
    ran: str
    result: str = ""
    figure: str = ""
    value: float | None = None
    seconds: float = 0.0


def _one(name: str, check: Callable[[Context], Found], ctx: Context) -> Result:
    began = time.perf_counter()
    try:
        found = check(ctx)
        result = Result(name, PASSED, found.ran, found.result, found.figure, found.value)
    except Skip as skip:
        result = Result(name, SKIPPED, f"skipped: {skip}")
    except CheckFailed as failed:
        result = Result(name, FAILED, "ran", f"FAILED: {failed}", failed.figure, failed.value)
    except Exception as error:  # noqa: BLE001 - a check's error is its result
        text = str(error).strip().splitlines()[0] if str(error).strip() else ""
        result = Result(name, FAILED, "ran", f"FAILED: {type(error).__name__}: {text}"[:300])
    result.seconds = time.perf_counter() - began
    return result


def run(
    json_path: str | os.PathLike | None = None,
    *,
    checks: dict[str, Callable] | None = None,
    verbose: bool = False,
) -> list[Result]:
    """Runs the checks (default: all of `CHECKS`) and returns one `Result` each.

    Configures the devices first (`configure`), so call it before TensorFlow runs an op
    (as `tfaccel check` does). A check that raises fails; its error is its result.

    Args:
        json_path: also write the results, the device report and the versions here.
        checks: {name: function(Context) -> Found} to run instead of `CHECKS`.
        verbose: say on stderr which check runs.

    Returns:
        The results, in order.
    """
    import logging

    if json_path is not None:
        check_json_path(json_path)
    began = time.perf_counter()
    results = []
    try:
        configure()
    except Exception as error:  # noqa: BLE001 - the checks run on the devices as they are
        why = "TensorFlow had initialised its devices before the check; they are checked as found"
        text = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
        results.append(Result("configure", SKIPPED, f"skipped: {why}", text))
    tf_logger = logging.getLogger("tensorflow")
    level = tf_logger.level
    tf_logger.setLevel(logging.ERROR)  # each check traces anew: no retracing warnings
    try:
        ctx = Context()
        for name, check in (CHECKS if checks is None else checks).items():
            if verbose:
                print(f"tfaccel check: {name} ...", file=sys.stderr, flush=True)
            results.append(_one(name, check, ctx))
    finally:
        tf_logger.setLevel(level)
    if json_path is not None:
        write_json(results, json_path, time.perf_counter() - began)
    return results


def check_json_path(path: str | os.PathLike) -> None:
    """Raises ValueError, before any check runs, when the JSON cannot be written to `path`."""
    target = pathlib.Path(path)
    existed = target.exists()
    try:
        with open(target, "a"):
            pass
    except OSError as error:
        raise ValueError(
            f"cannot write the JSON to {path}: {error.strerror or error}; pass a file path "
            "in a folder you can write to, e.g. --json check.json"
        ) from None
    if not existed:
        target.unlink()


def write_json(results: list[Result], path: str | os.PathLike, seconds: float) -> None:
    """Writes the results with the versions and `tfaccel.devices.describe()`'s report."""
    from importlib import metadata

    from tfaccel import devices, strict_json

    document = {
        "tfaccel": metadata.version("tfaccel"),
        "passed": not any(r.status == FAILED for r in results),
        "seconds": seconds,
        "checks": [dataclasses.asdict(r) for r in results],
        "devices": devices.describe(),
    }
    pathlib.Path(path).write_text(strict_json.dumps(document, indent=2, default=str) + "\n")


def format_table(results: list[Result], widths: tuple[int, ...] = (20, 44, 56, 44)) -> str:
    """The results as one table: check | ran or skipped, and why | result | figure.

    Long cells wrap within `widths` (characters per column).
    """
    import textwrap

    header = ("check", "ran or skipped, and why", "result", "figure")
    rows = [header]
    for r in results:
        if r.status == PASSED:
            outcome = f"ok: {r.result}"
        else:
            outcome = r.result or "-"
        rows.append((r.name, r.ran, outcome, r.figure or "-"))
    cells = [
        [textwrap.wrap(cell, width) or [""] for cell, width in zip(row, widths, strict=True)]
        for row in rows
    ]
    used = [max(len(line) for row in cells for line in row[i]) for i in range(4)]
    lines = []
    for index, row in enumerate(cells):
        for k in range(max(len(c) for c in row)):
            parts = [(c[k] if k < len(c) else "").ljust(used[i]) for i, c in enumerate(row)]
            lines.append(" | ".join(parts).rstrip())
        if index == 0:
            lines.append("-+-".join("-" * w for w in used))
    failed = sum(r.status == FAILED for r in results)
    skipped = sum(r.status == SKIPPED for r in results)
    lines.append(f"{len(results) - failed - skipped} passed, {skipped} skipped, {failed} failed")
    return "\n".join(lines)
