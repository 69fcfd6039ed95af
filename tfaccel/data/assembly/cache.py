"""Where a pipeline caches, and recovery from a cache lock left by a killed run.

tf.data's file cache writes `<path>_<n>.lockfile` (holding "Created at:
<unix seconds>") and `<path>_<n>.data-*.tempstate*` while it fills the cache,
and renames them to `<path>.index` / `<path>.data-*` when an epoch completes.
If the writing process dies, the lock stays and the next run fails with
`AlreadyExistsError`.

Stale rule: a writer keeps its partial `.tempstate` file open while it fills
the cache. A lock whose partial files no process on this machine holds open
(checked with psutil, this process first) was left by a run that died; the
lock and its partial files are removed with a `StaleCacheWarning`, and the
cache is rebuilt. A lock whose files are open (a live iterator here or in
another local process) is left alone. Writers on other machines cannot be
seen: give each one its own cache path (`pipeline` adds a per-input-pipeline
suffix when it shards).

What a cache holds: `<path>.fingerprint.json` records the data it is built from
(the source's fingerprint, see `tfaccel.data.fingerprint`, the cached elements'
dtypes and shapes, and the preprocess function). It is written when a pipeline is
built over a path holding no complete cache (none, or one being rebuilt), so it is
there before the first element is cached. A complete cache whose record differs,
is never read: its files are removed with one `CacheMismatchWarning` naming the
path and both fingerprints, and it is rebuilt (or `CacheMismatchError` is raised,
with `cache_mismatch="error"`). Files without our record beside them (a user's
TensorFlow checkpoint `best_model.index`, an older tfaccel's cache) are never
deleted: `CacheMismatchError` says so.

Who owns a path (`cache_to_file`): one data fingerprint at a time. The owning
process holds an advisory lock on `<path>.owner` while a pipeline over it lives.
A pipeline of other data while the owner lives (a train/validation copy-paste, a
second process) caches to its own file `<path>-<fingerprint>` with a
`CacheMismatchWarning`; one of the same data in another process while the cache
is being filled reads its source without the cache (`CacheBusyWarning`).
"""

from __future__ import annotations

import errno
import fcntl
import gc
import glob
import hashlib
import json
import os
import socket
import tempfile
import threading
import time
import warnings
import weakref
from typing import TYPE_CHECKING, Any

import psutil

from tfaccel import strict_json
from tfaccel.errors import (
    CacheBusyWarning,
    CacheMismatchError,
    CacheMismatchWarning,
    StaleCacheWarning,
)

if TYPE_CHECKING:
    import tensorflow as tf

MISMATCH_MODES = ("rebuild", "error")
# The longest suffix the cache's files add: "-pipeline99of99", "-<fingerprint>" and
# tf.data's ".data-00000-of-00001.tempstate<digits>".
_SUFFIX_ROOM = 80


def check_cache(cache: Any) -> str | None:
    """Validates the `cache` argument; returns "memory", a file path, or None.

    Raises:
        ValueError: not "memory", None/False, or a non-empty path; a file name too long
            for the file system.
        FileNotFoundError: the path's directory does not exist.
        PermissionError: no file can be written in that directory.
    """
    if cache is None or cache is False:
        return None
    if cache == "memory":
        return "memory"
    if not isinstance(cache, (str, os.PathLike)) or not os.fspath(cache):
        raise ValueError(
            f"cache must be 'memory', None (no cache) or a file path prefix, got {cache!r}."
        )
    path = os.path.abspath(os.fspath(cache))
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise FileNotFoundError(
            f"cache={os.fspath(cache)!r}: the directory {folder!r} does not exist. Create it "
            "first (os.makedirs), or use cache='memory'."
        )
    try:
        name_max = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    name = os.path.basename(path)
    if len(name.encode()) + _SUFFIX_ROOM > name_max:
        raise ValueError(
            f"cache={os.fspath(cache)!r}: its file name is {len(name.encode())} bytes long, too "
            f"long for this file system ({os.strerror(errno.ENAMETOOLONG)}: at most {name_max} "
            f"bytes, and the cache's files add up to {_SUFFIX_ROOM} bytes of suffixes). Use a "
            f"name of at most {name_max - _SUFFIX_ROOM} bytes."
        )
    try:  # tf.data writes a lock file here at the first read: try it now
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise PermissionError(
            f"cache={os.fspath(cache)!r}: cannot write in {folder!r} ({error.strerror}). "
            "Point cache= at a writable directory, or use cache='memory'."
        ) from None
    return path


def _created_at(lockfile: str) -> float:
    try:
        with open(lockfile) as handle:
            text = handle.read()
        return float(text.rsplit(":", 1)[1].strip())
    except (OSError, ValueError, IndexError):
        return os.path.getmtime(lockfile)


def _held_open(files: list[str]) -> bool:
    """Whether any local process (this one first) has one of `files` open."""
    targets = {os.path.realpath(f) for f in files}
    if not targets:
        return False
    me = psutil.Process()
    for process in [me, *(p for p in psutil.process_iter() if p.pid != me.pid)]:
        try:
            paths = {os.path.realpath(f.path) for f in process.open_files()}
        except (psutil.Error, OSError):
            continue
        if targets & paths:
            return True
    return False


def recover_stale_lock(path: str) -> list[str]:
    """Removes the lock and partial files of a cache abandoned by a dead writer.

    Args:
        path: the cache path prefix given to `Dataset.cache`.

    Returns:
        The files removed (empty when nothing was stale).
    """
    removed = []
    for lockfile in sorted(glob.glob(glob.escape(path) + "_*.lockfile")):
        shard = lockfile[: -len(".lockfile")]
        partial = glob.glob(glob.escape(shard) + ".data-*tempstate*")
        if _held_open(partial):
            continue
        age = time.time() - _created_at(lockfile)
        for file in [lockfile, *partial]:
            try:
                os.remove(file)
                removed.append(file)
            except FileNotFoundError:
                pass
        warnings.warn(
            f"Cache {path!r} was left locked by an interrupted run ({lockfile}, created "
            f"{age:,.0f}s ago; no process has its partial files open): removed the lock "
            f"and {len(partial)} partial file(s); the cache will be rebuilt.",
            StaleCacheWarning,
            stacklevel=3,
        )
    return removed


def record_of(source: str, elements: str, preprocess: str) -> dict:
    """What a cache is built from, with its short fingerprint."""
    record = {"source": source, "elements": elements, "preprocess": preprocess}
    text = json.dumps(record, sort_keys=True).encode()
    record["fingerprint"] = hashlib.sha1(text, usedforsecurity=False).hexdigest()[:16]
    return record


def _read_record(path: str) -> dict | None:
    try:
        with open(path + ".fingerprint.json") as handle:
            record = json.load(handle)
        return record if isinstance(record, dict) else None
    except (OSError, ValueError):
        return None


def _mismatch(saved: dict | None, record: dict) -> str | None:
    """Why a complete cache recorded as `saved` does not hold `record`'s data, or None."""
    if saved is None:
        return "it has no fingerprint file beside it (an older tfaccel), so its data is unproven"
    if saved.get("elements") != record["elements"]:
        return (
            f"its elements have another shape/dtype: cached {saved.get('elements')}, "
            f"now {record['elements']}"
        )
    if saved.get("source") != record["source"]:
        return f"it was built from other data: source {saved.get('source')}, now {record['source']}"
    if saved.get("preprocess") != record["preprocess"]:
        return (
            f"it was built with another preprocess: {saved.get('preprocess') or 'none'}, now "
            f"{record['preprocess'] or 'none'}"
        )
    return None


def check_fingerprint(path: str, record: dict, mismatch: str = "rebuild") -> None:
    """Makes the file cache at `path` hold `record`'s data, or be rebuilt from it.

    Call after `recover_stale_lock`. A complete cache (`<path>.index`) of other data
    is removed (with a `CacheMismatchWarning`), or `CacheMismatchError` is raised
    when `mismatch` is "error". Where no complete cache is left and no live writer
    holds the lock, the record is written to `<path>.fingerprint.json`.
    """
    saved = _read_record(path)
    if os.path.exists(path + ".index"):
        reason = _mismatch(saved, record)
        if reason is None:
            return
        old = (saved or {}).get("fingerprint", "none")
        text = (
            f"The file cache {path!r} does not hold this pipeline's data ({reason}; cache "
            f"fingerprint {old}, this pipeline's {record['fingerprint']})"
        )
        if mismatch == "error":
            raise CacheMismatchError(
                f"{text}. Delete its files, use another cache path, or pass "
                "cache_mismatch='rebuild'."
            )
        if saved is None:
            raise CacheMismatchError(
                f"cache={path!r}: {path}.index exists but tfaccel cannot prove it wrote it (no "
                f"{os.path.basename(path)}.fingerprint.json beside it): it may be a TensorFlow "
                "checkpoint or another program's file, and tfaccel never deletes those. Point "
                "cache= at another path, or delete the files yourself if they are an old cache."
            )
        files = [path + ".index", *glob.glob(glob.escape(path) + ".data-*")]
        for file in files:
            try:
                os.remove(file)
            except FileNotFoundError:
                pass
        warnings.warn(
            f"{text}: removed its {len(files)} file(s); it is rebuilt from the source.",
            CacheMismatchWarning,
            stacklevel=3,
        )
    if glob.glob(glob.escape(path) + "_*.lockfile"):
        return  # a live writer (recover_stale_lock left its lock): its record stands
    if saved != record:
        with open(path + ".fingerprint.json", "w") as handle:
            handle.write(strict_json.dumps(record, indent=1, sort_keys=True))


class _Owner:
    """This process's claim on a cache path: the data it holds and the locked `.owner` file."""

    def __init__(self, fingerprint: str, handle):
        self.fingerprint, self.handle, self.users = fingerprint, handle, 0


_OWNER_MARK = "tfaccel cache owner:"
_OWNED: dict[str, _Owner] = {}
_OWNED_LOCK = threading.RLock()


def _release(path: str, owner: _Owner) -> None:
    with _OWNED_LOCK:
        owner.users -= 1
        if owner.users <= 0 and _OWNED.get(path) is owner:
            del _OWNED[path]
            owner.handle.close()  # releases the advisory lock


def _try_own(path: str):
    """Locks `<path>.owner` (never through a symlink); returns (handle, None) or (None, holder)."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    handle = os.fdopen(os.open(path + ".owner", flags, 0o644), "r+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = handle.read().strip().removeprefix(_OWNER_MARK).strip() or "another process"
        handle.close()
        return None, holder
    handle.seek(0)
    text = handle.read()
    if text and not text.startswith(_OWNER_MARK):
        handle.close()
        raise CacheMismatchError(
            f"cache={path!r}: {path}.owner exists and was not written by tfaccel; tfaccel "
            "never overwrites it. Point cache= at another path."
        )
    handle.seek(0)
    handle.truncate()
    handle.write(f"{_OWNER_MARK} pid {os.getpid()} on {socket.gethostname()}\n")
    handle.flush()
    return handle, None


def _elsewhere(
    dataset: tf.data.Dataset, path: str, record: dict, mismatch: str, holder: str
) -> tuple[tf.data.Dataset, str]:
    alternative = f"{path}-{record['fingerprint']}"
    text = (
        f"The file cache {path!r} belongs to {holder}, built from other data than this "
        f"pipeline (fingerprint {record['fingerprint']})"
    )
    if mismatch == "error":
        raise CacheMismatchError(f"{text}. Give each pipeline its own cache path.")
    warnings.warn(
        f"{text}: this pipeline caches to {alternative!r} instead. Give each pipeline its "
        "own cache path (e.g. train.cache / validation.cache).",
        CacheMismatchWarning,
        stacklevel=4,
    )
    return cache_to_file(dataset, alternative, record, mismatch)


def cache_to_file(
    dataset: tf.data.Dataset, path: str, record: dict, mismatch: str = "rebuild"
) -> tuple[tf.data.Dataset, str]:
    """`dataset.cache(path)` once this process owns `path` for `record`'s data.

    Args:
        dataset: the `tf.data.Dataset` to cache.
        path: the cache path prefix.
        record: what the data is (`record_of`).
        mismatch: "rebuild" or "error", for a cache of other data (`check_fingerprint`).

    Returns:
        (dataset, where): the cached dataset and a phrase for the plan; the dataset
        uncached while another process fills the same data's cache.

    Raises:
        CacheMismatchError: files at `path` tfaccel did not write, or other data with
            `mismatch="error"`.
    """
    fingerprint = record["fingerprint"]
    with _OWNED_LOCK:
        owner = _OWNED.get(path)
        if owner is not None and owner.fingerprint != fingerprint:
            gc.collect()  # an owner that is only garbage lets go
            owner = _OWNED.get(path)
        if owner is not None and owner.fingerprint != fingerprint:
            holder = f"a live pipeline in this process (fingerprint {owner.fingerprint})"
            return _elsewhere(dataset, path, record, mismatch, holder)
        if owner is None:
            handle, holder = _try_own(path)
            if handle is None:
                if (_read_record(path) or {}).get("fingerprint") != fingerprint:
                    return _elsewhere(dataset, path, record, mismatch, holder)
                filling = glob.glob(glob.escape(path) + "_*.lockfile")
                if os.path.exists(path + ".index") and not filling:
                    return dataset.cache(path), f"file {path} (read; owned by {holder})"
                warnings.warn(
                    f"The file cache {path!r} is being filled by {holder}: this pipeline "
                    "reads its source without the cache this time (it is read once complete).",
                    CacheBusyWarning,
                    stacklevel=3,
                )
                return dataset, f"none: {path} is being filled by {holder}"
            owner = _Owner(fingerprint, handle)
            try:
                recover_stale_lock(path)
                check_fingerprint(path, record, mismatch)
            except BaseException:
                handle.close()
                raise
            _OWNED[path] = owner
        owner.users += 1
    cached = dataset.cache(path)
    weakref.finalize(cached, _release, path, owner)
    return cached, f"file {path}"
