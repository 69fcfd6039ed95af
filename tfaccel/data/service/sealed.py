"""Sealed lines of functions: an HMAC-SHA256 under a per-service secret, checked first.

Every line of pickled functions bound for the service's workers is a space-separated
list of chunks `MAC:BASE64`, where MAC is the hex HMAC-SHA256 of the base64 text under
the service's secret (`new_key`, made by `local` in memory). The secret reaches only
the service's own children: its workers (and, under `tfaccel launch --data-workers`,
the launched processes) through the environment variable `ENV_KEY`. The relay and the
workers `open_line` before anything is unpickled: a chunk without a valid MAC is
refused whole, never loaded.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import MutableMapping

from tfaccel.errors import ServiceError

ENV_KEY = "TFACCEL_DATA_SERVICE_KEY"
"""The environment variable that hands the service's secret (hex) to its children."""

__all__ = ["ENV_KEY", "key_from_env", "new_key", "open_line", "seal"]


def new_key() -> bytes:
    """A fresh 32-byte secret."""
    return secrets.token_bytes(32)


def key_from_env(
    environ: MutableMapping[str, str] | None = None, pop: bool = False
) -> bytes | None:
    """The secret in `ENV_KEY` (None when unset); `pop` removes it from `environ`.

    Raises:
        ServiceError: `ENV_KEY` is set but is not 64 hex digits.
    """
    environ = os.environ if environ is None else environ
    text = environ.pop(ENV_KEY, None) if pop else environ.get(ENV_KEY)
    if not text:
        return None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise ServiceError(f"{ENV_KEY} must be 64 hex digits (the service's secret).")
    return key


def _mac(key: bytes, chunk: str) -> str:
    return hmac.new(key, chunk.encode(), hashlib.sha256).hexdigest()


def seal(line: str, key: bytes) -> str:
    """`line` (base64 chunks, space-separated) with each chunk sealed as `MAC:BASE64`."""
    return " ".join(f"{_mac(key, chunk)}:{chunk}" for chunk in line.split()) + "\n"


def open_line(line: str, key: bytes | None) -> list[str]:
    """The base64 chunks of a sealed `line`, each checked against its MAC.

    Raises:
        ServiceError: no secret, an empty line, or a chunk whose MAC is missing or wrong
            (nothing of the line is to be loaded).
    """
    if not key:
        raise ServiceError(f"refused: no secret to check the functions' MAC with ({ENV_KEY} unset)")
    chunks = []
    for number, sealed in enumerate(line.split()):
        mac, _, chunk = sealed.partition(":")
        if not chunk or not hmac.compare_digest(mac.encode(), _mac(key, chunk).encode()):
            raise ServiceError(
                f"refused: chunk {number} has no valid MAC (HMAC-SHA256 under this "
                "service's secret); nothing was loaded"
            )
        chunks.append(chunk)
    if not chunks:
        raise ServiceError("refused: an empty line of functions")
    return chunks
