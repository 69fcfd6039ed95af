"""What is this data: one cheap, process-stable fingerprint of a dataset's source.

Used by the file cache (`pipeline(cache=path)`), the checkpoint's run shape and the
batch-size search, so that nothing stored is reused for other data. No pass over the
data is made:

* arrays (`from_arrays`): every array up to 8 MiB is hashed whole; a larger one
  by evenly spaced rows (first and last included) totalling about 8 MiB;
* file sources (`from_csv`, `from_tfrecords`, `from_image_folder`): the file names
  (relative to their common folder), sizes and modification times, plus what the
  source adds (labels, columns, parse function's name);
* any other dataset: the source found by following its input chain back (a tfaccel
  source, else the first dataset of the chain), whose first `FIRST_ELEMENTS`
  elements are hashed when two reads agree; otherwise the content is not checked
  (`Fingerprint.content` is None, and `Fingerprint.how` says so).

Digests are SHA-1 of bytes only, 16 hex digits kept (no `id()`, no absolute paths,
no randomness), so they are equal in every process that reads the same data.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from tfaccel.data import graph
from tfaccel.data.sources.info import source_info

SAMPLE_BYTES = 8 << 20
FIRST_ELEMENTS = 64


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """A dataset's identity: how its content was seen, and a digest of it.

    Attributes:
        kind: the source ("arrays", "csv", "tfrecords", "image_folder", "elements"...).
        content: hex digest of the content seen, or None when it could not be seen.
        how: what the digest covers, in words.
    """

    kind: str
    content: str | None
    how: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.content}" if self.content else f"{self.kind}:unchecked"


def _hasher():
    return hashlib.sha1(usedforsecurity=False)  # an identity, not a secret: the fastest here


def _numpy(leaf: Any) -> np.ndarray:
    if isinstance(leaf, (tf.Tensor, tf.Variable)):
        leaf = leaf.numpy()
    return np.asarray(leaf, dtype=object) if isinstance(leaf, bytes) else np.asarray(leaf)


def _update_array(h, array: np.ndarray, budget: int = SAMPLE_BYTES) -> None:
    """Hashes `array`'s dtype, shape and bytes (evenly spaced rows when over `budget`)."""
    h.update(f"{array.dtype.str}{array.shape}".encode())
    if array.ndim and array.nbytes > budget:
        stride = -(-array.nbytes // budget)
        array = np.concatenate([array[::stride], array[-1:]])
    if array.dtype == object:  # strings: the bytes of each, not the pointers
        for item in array.reshape(-1):
            data = item if isinstance(item, bytes) else str(item).encode()
            h.update(len(data).to_bytes(8, "little") + data)
    else:
        h.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8))


def digest_arrays(structure: Any) -> str:
    """The content digest of arrays (a nest of arrays, tensors, ragged or sparse tensors)."""
    h = _hasher()
    for leaf in tf.nest.flatten(structure, expand_composites=True):
        _update_array(h, _numpy(leaf))
    return h.hexdigest()[:16]


def digest_files(files: list[str]) -> str:
    """The digest of file names (relative to their common folder), sizes and mtimes."""
    files = [os.fspath(f) for f in files]
    if not files:
        return _hasher().hexdigest()[:16]
    root = os.path.dirname(os.path.commonprefix(files)) if len(files) > 1 else ""
    h = _hasher()
    for file in files:
        try:
            stat = os.stat(file)
            size, mtime = stat.st_size, stat.st_mtime_ns
        except OSError:  # remote (gs://...) or vanished: the name alone
            size, mtime = -1, -1
        name = os.path.relpath(file, root) if root else os.path.basename(file)
        h.update(f"{name}\0{size}\0{mtime}\n".encode())
    return h.hexdigest()[:16]


def files_identity(files: list[str], *extra: Any) -> Callable[[], tuple[str, str]]:
    """A `SourceInfo.identity`: the files' names, sizes and mtimes plus `extra` settings."""
    files = list(files)

    def identity() -> tuple[str, str]:
        h = _hasher()
        h.update(digest_files(files).encode())
        h.update(repr(extra).encode())
        return h.hexdigest()[:16], f"{len(files)} file(s): names, sizes and modification times"

    return identity


def _first_elements(dataset: tf.data.Dataset) -> str | None:
    """Digest of the first elements, or None when two reads of them differ (random)."""
    digests = set()
    for _ in range(2):
        h = _hasher()
        for element in dataset.take(FIRST_ELEMENTS):
            for leaf in tf.nest.flatten(element, expand_composites=True):
                _update_array(h, _numpy(leaf))
        digests.add(h.hexdigest()[:16])
    return digests.pop() if len(digests) == 1 else None


def of_dataset(dataset: tf.data.Dataset) -> Fingerprint:
    """The fingerprint of the source `dataset` was built from (see the module docstring)."""
    chain = list(graph.chain(dataset))
    for node in chain:
        info = source_info(node)
        if info is not None:
            if info.identity is None:
                return Fingerprint(info.kind, None, f"a {info.kind} source: content not seen")
            return Fingerprint(info.kind, *info.identity())
    root = chain[-1]
    if len(chain) > 1 and "FlatMap" in type(chain[-2]).__name__:
        return Fingerprint("generator", None, "a flat_map / Python generator source: not seen")
    try:
        content = _first_elements(root)
    except (tf.errors.OpError, TypeError, ValueError):
        content = None
    if content is None:
        return Fingerprint("elements", None, "its first elements differ between reads: not seen")
    return Fingerprint(
        "elements", content, f"the first {FIRST_ELEMENTS} elements of {type(root).__name__}"
    )


def describe_spec(dataset: tf.data.Dataset) -> str:
    """Element dtypes and shapes (without the batch axis) and the length, in words."""
    spec = tf.nest.map_structure(
        lambda s: f"{s.dtype.name}{s.shape.as_list()[1:] if s.shape.rank else []}",
        dataset.element_spec,
    )
    count = int(dataset.cardinality())
    length = {-1: "infinite", -2: "unknown length"}.get(count, f"{count} batches")
    return f"{spec}, {length}"


def element_spec_text(dataset: tf.data.Dataset) -> str:
    """The unbatched elements' dtypes and full shapes, e.g. `(float32[4], int32[])`."""
    return str(
        tf.nest.map_structure(
            lambda s: f"{s.dtype.name}{s.shape.as_list() if s.shape.rank is not None else '?'}",
            dataset.element_spec,
        )
    )


def function_identity(fn: Callable | None) -> str:
    """A function's qualified name and a digest of its bytecode ("" for None)."""
    if fn is None:
        return ""
    name = getattr(fn, "__qualname__", type(fn).__name__)
    code = getattr(getattr(fn, "python_function", fn), "__code__", None)
    if code is None:
        return name
    return f"{name}:{hashlib.sha1(code.co_code, usedforsecurity=False).hexdigest()[:8]}"
