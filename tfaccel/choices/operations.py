"""The operation-rate probe behind `policy.choose()` (`tfaccel.precision.choose()`).

Times a matmul and a convolution of typical training sizes under each candidate's
compute dtype, in alternating rounds after a warm-up, for at most `BUDGET_S` seconds.
A training step mixes these with element-wise work, so the Trainer's `precision="auto"`
times the model's own step instead.

The rates are a fact about the machine, not the model: `cached_rates` keeps them across
processes in a small JSON file under `cache_dir()` ($TFACCEL_CACHE_DIR, default
~/.cache/tfaccel), named by a digest of everything they depend on (the machine's
description its caller gives: host, CPU model and flags, GPUs; TensorFlow's and Keras's
versions, the threads TensorFlow may use, the policies and this probe's parameters). A
file of another machine, TensorFlow or probe is never read as this one's; an unreadable,
corrupt or mismatched file is measured again (and rewritten), never an error; a file
that is not this user's (or root's), that others can write, or that is not a regular
file (a FIFO, a link) is ignored with a warning; a cache that cannot be written costs
nothing but the next process's measurement.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import logging
import math
import os
import pathlib
import tempfile
import time
import warnings

import keras
import tensorflow as tf

from tfaccel import strict_json
from tfaccel.files.trusted import Untrusted, read_trusted

BUDGET_S = 2.0
WHAT = "a 1024x1024 matmul and a 3x3 convolution (32x32x64, batch 16)"
MAX_ROUNDS = 5
VERSION = 1  # this probe's operations and rules: bump when `_ops` or `op_rates` change
CACHE_ENV = "TFACCEL_CACHE_DIR"
"""The environment variable naming the cache directory (default ~/.cache/tfaccel)."""
logger = logging.getLogger("tfaccel")


def _ops(dtype: tf.DType):
    """`[(fn, args, flops)]`: the probe's operations in `dtype`."""
    normal = tf.random.stateless_normal
    a = tf.cast(normal([1024, 1024], seed=[1, 2]), dtype)
    images = tf.cast(normal([16, 32, 32, 64], seed=[3, 4]), dtype)
    kernel = tf.cast(normal([3, 3, 64, 64], seed=[5, 6]) * 0.05, dtype)

    @tf.function
    def matmul(x):
        return tf.reduce_sum(tf.cast(tf.matmul(x, x)[:1, :1], tf.float32))

    @tf.function
    def conv(x, k):
        y = tf.nn.conv2d(x, k, strides=1, padding="SAME")
        return tf.reduce_sum(tf.cast(y[:1, :1, :1, :1], tf.float32))

    return [
        (matmul, (a,), 2 * 1024**3),
        (conv, (images, kernel), 2 * 16 * 32 * 32 * 64 * 64 * 9),
    ]


def _seconds(fn, args) -> float:
    start = time.perf_counter()
    fn(*args).numpy()  # the result read back: the clock stops after the work
    return time.perf_counter() - start


@functools.cache
def op_rates(policies: tuple[str, ...], budget_s: float = BUDGET_S) -> dict[str, float]:
    """FLOP/s of the probe's operations under each policy's compute dtype (best of the
    alternating rounds that fit in `budget_s`, at least one after the warm-up)."""
    began = time.perf_counter()
    ops = {p: _ops(tf.as_dtype(keras.DTypePolicy(p).compute_dtype)) for p in policies}
    best = {p: [float("inf")] * len(ops[p]) for p in policies}
    for p in policies:  # warm-up: tracing and the kernels' first run
        for fn, args, _ in ops[p]:
            _seconds(fn, args)
    rounds = 0
    while rounds < 1 or (rounds < MAX_ROUNDS and time.perf_counter() - began < budget_s):
        for p in policies if rounds % 2 == 0 else reversed(policies):
            for i, (fn, args, _) in enumerate(ops[p]):
                best[p][i] = min(best[p][i], _seconds(fn, args))
        rounds += 1
    return {p: sum(f for _, _, f in ops[p]) / sum(best[p]) for p in policies}


def cache_dir() -> pathlib.Path:
    """Where `cached_rates` keeps its files: $TFACCEL_CACHE_DIR, else ~/.cache/tfaccel."""
    return pathlib.Path(os.environ.get(CACHE_ENV) or pathlib.Path.home() / ".cache" / "tfaccel")


def cache_key(policies: tuple[str, ...], budget_s: float, machine: dict) -> dict:
    """Everything the rates depend on: `machine` (the caller's description of the
    hardware) and what this module knows (versions, threads, the probe itself)."""
    threading = tf.config.threading
    return {
        "machine": machine,
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "threads": [
            threading.get_intra_op_parallelism_threads(),
            threading.get_inter_op_parallelism_threads(),
        ],
        "probe": {"what": WHAT, "version": VERSION, "budget_s": budget_s, "rounds": MAX_ROUNDS},
        "policies": list(policies),
    }


def cache_file(key: dict) -> pathlib.Path:
    """The file of `key`'s rates (named by a digest of the key)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return cache_dir() / f"op_rates-{digest}.json"


def cached_rates(
    policies: tuple[str, ...], machine: dict, budget_s: float = BUDGET_S
) -> tuple[dict[str, float], str, float]:
    """`(op_rates(policies), where they come from, what measuring them took in seconds)`:
    read from the cache file of this key when it holds them (then 0 s); "" when measured
    in this process, then written there. Once per process."""
    key = cache_key(tuple(policies), budget_s, machine)
    return _rates_for(str(cache_file(key)), json.dumps(key, sort_keys=True))


@functools.cache
def _rates_for(path: str, key_text: str) -> tuple[dict[str, float], str, float]:
    key = json.loads(key_text)
    policies = tuple(key["policies"])
    found = _read(pathlib.Path(path), key)
    if found is not None:
        rates, when = found
        return rates, f"rates read from the cache {path}, measured {when}", 0.0
    began = time.perf_counter()
    rates = op_rates(policies, key["probe"]["budget_s"])
    cost_s = time.perf_counter() - began
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    _write(pathlib.Path(path), {"key": key, "rates": rates, "measured": when})
    return rates, "", cost_s


def _read(path: pathlib.Path, key: dict) -> tuple[dict[str, float], str] | None:
    """The rates and their date from `path` when it holds `key`'s, all finite and > 0.

    Only a regular file of this user (or root) that nobody else can write is read
    (`files.trusted`): another is ignored with a warning (in a shared cache directory
    another user could plant rates, or a FIFO that would block the read).
    """
    try:
        text = read_trusted(path, owners=(0,))
    except FileNotFoundError:
        return None
    except Untrusted as refused:
        warnings.warn(
            f"tfaccel: ignored the operations' rates cache {path}: {refused}. Only a regular "
            "file of this user (or root) that nobody else can write is read; measuring "
            "afresh. Remove that file, or set TFACCEL_CACHE_DIR to a directory of your own.",
            stacklevel=2,
        )
        return None
    except (OSError, ValueError) as error:  # ValueError: not text
        logger.info("The operations' rates cache %s is not readable (%s): measuring.", path, error)
        return None
    try:
        stored = json.loads(text)
        rates = {p: float(stored["rates"][p]) for p in key["policies"]}
        when = str(stored["measured"])
        if stored["key"] != key or not all(math.isfinite(r) and r > 0 for r in rates.values()):
            raise ValueError("another key, or rates not finite and positive")
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        logger.info("The operations' rates cache %s is not usable (%s): measuring.", path, error)
        return None
    return rates, when


def _write(path: pathlib.Path, content: dict) -> None:
    """Writes `content` to `path` whole (a temporary file renamed), or logs why not."""
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            temporary = f.name
            f.write(strict_json.dumps(content, indent=1, sort_keys=True))
        os.replace(temporary, path)
    except OSError as error:
        logger.info("The operations' rates were not cached in %s (%s).", path, error)
        if temporary is not None:
            pathlib.Path(temporary).unlink(missing_ok=True)
