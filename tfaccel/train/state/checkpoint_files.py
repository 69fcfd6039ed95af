"""The files of a checkpoint directory: listing, checking, moving aside, cleaning up.

A checkpoint `ckpt-N` is the files `ckpt-N.index` and `ckpt-N.data-*` in the
directory. TensorFlow writes a checkpoint's shards into a `ckpt-N_temp/` folder and
its index last (through a temporary file and a rename), so a crash during a save
leaves the older checkpoints untouched and at most a stray temporary folder, which
`remove_temporaries` clears at the next start. The `checkpoint` state file (what
`tf.train.latest_checkpoint` reads) is rewritten atomically after every save; it is a
convenience for other tools, never the source of truth: the files are.
"""

from __future__ import annotations

import os
import re
import uuid

import tensorflow as tf

from tfaccel.train.state.policies import check_directory_named

PREFIX = "ckpt"
CORRUPT = "corrupt"
_FILE = re.compile(rf"^{PREFIX}-(\d+)\.(index|data-\d+-of-\d+)$")
_STATE_ENTRY = re.compile(r'^\s*(?:all_)?model_checkpoint_paths?:\s*"([^"]+)"', re.MULTILINE)
# What our saves leave behind, and nothing a user could have named alike: TensorFlow's
# shard folder and partial files of our own `ckpt-N` prefix, our uuid-named state file.
_UNFINISHED = re.compile(rf"^{PREFIX}-(\d+)_temp$")  # TensorFlow's shard folder of a save
_TEMPORARY = re.compile(
    rf"^({PREFIX}-\d+_temp.*|checkpoint\.tmp[0-9a-f]{{32}}|{PREFIX}-\d+\.\S*\.tempstate\d+)$"
)


def check_directory(directory: str, *, writable: bool) -> None:
    """Creates `directory` if needed and checks that checkpoints can be written there.

    Raises:
        ValueError: `directory` is "" (e.g. an unset environment variable), which would
            put checkpoints in the working directory and clean up there.
        FileNotFoundError: `directory` is a dangling symbolic link.
        NotADirectoryError: `directory` (or a parent) is a file.
        PermissionError: the directory cannot be created or written to.
    """
    check_directory_named(directory)
    if os.path.islink(directory) and not os.path.exists(directory):
        raise FileNotFoundError(
            f"checkpoint_dir={directory!r} is a symbolic link to {os.readlink(directory)!r}, "
            "which does not exist (a dangling link). Create its target, point the link at "
            "a directory, or pass another checkpoint_dir."
        )
    if tf.io.gfile.exists(directory) and not tf.io.gfile.isdir(directory):
        raise NotADirectoryError(
            f"checkpoint_dir={directory!r} is a file, not a directory. Pass a directory "
            "path (it is created if missing), or move the file away."
        )
    try:
        tf.io.gfile.makedirs(directory)
        if writable:
            probe = os.path.join(directory, f".tfaccel-write-test-{uuid.uuid4().hex}")
            with tf.io.gfile.GFile(probe, "w") as handle:
                handle.write("")
            tf.io.gfile.remove(probe)
    except (tf.errors.OpError, OSError) as error:
        if isinstance(error, NotADirectoryError) or isinstance(
            error, tf.errors.FailedPreconditionError
        ):
            raise NotADirectoryError(
                f"checkpoint_dir={directory!r} cannot be a directory: part of its path is a "
                f"file ({error}). Pass a path under a real directory."
            ) from error
        raise PermissionError(
            f"checkpoint_dir={directory!r} is not writable ({type(error).__name__}: {error}). "
            "Checkpoints would fail at the first save, after training; pass a directory "
            "this process may write to, or fix its permissions."
        ) from error


def numbers(directory: str) -> list[int]:
    """The checkpoint numbers N with any `ckpt-N.*` file in `directory`, newest first."""
    if not tf.io.gfile.isdir(directory):
        return []
    found = {int(m.group(1)) for m in map(_FILE.match, tf.io.gfile.listdir(directory)) if m}
    return sorted(found, reverse=True)


def prefix(directory: str, number: int) -> str:
    """The path prefix of checkpoint `number` (what `tf.train.Checkpoint.read` takes)."""
    return os.path.join(directory, f"{PREFIX}-{number}")


def files(directory: str, number: int) -> list[str]:
    """The files of checkpoint `number`, index first."""
    names = []
    for name in tf.io.gfile.listdir(directory):
        match = _FILE.match(name)
        if match and int(match.group(1)) == number:
            names.append(name)
    return sorted(names, key=lambda n: (not n.endswith(".index"), n))


def unreadable(path: str) -> str | None:
    """Why checkpoint `path` cannot be read (index missing, truncated, bad checksum), or None.

    Reads every tensor once (but an input iterator's state, which only a restore can
    read), so checksums and file lengths are verified; nothing is assigned to any
    variable.
    """
    try:
        reader = tf.train.load_checkpoint(path)
        for key, dtype in reader.get_variable_to_dtype_map().items():
            if dtype != tf.variant:  # an iterator's state; restore reads it
                reader.get_tensor(key)
    except Exception as error:  # noqa: BLE001 - TF raises OpError, IndexError, ValueError...
        lines = str(error).strip().splitlines() or [type(error).__name__]
        return f"{type(error).__name__}: {lines[0][:300]}"
    return None


def is_damage(error: tf.errors.OpError) -> bool:
    """Whether a restore failed on damaged bytes (checksum, truncation), not on a mismatch."""
    text = str(error).lower()
    return isinstance(error, tf.errors.DataLossError) or any(
        word in text for word in ("checksum", "corrupt", "truncat", "data loss", "decode")
    )


def move_aside(directory: str, number: int) -> str:
    """Moves checkpoint `number`'s files to `<directory>/corrupt/`; returns that folder.

    A name already taken there gets a `.1`, `.2`... suffix, so nothing is overwritten.
    """
    target = os.path.join(directory, CORRUPT)
    tf.io.gfile.makedirs(target)
    for name in files(directory, number):
        destination = os.path.join(target, name)
        suffix = 0
        while tf.io.gfile.exists(destination):
            suffix += 1
            destination = os.path.join(target, f"{name}.{suffix}")
        tf.io.gfile.rename(os.path.join(directory, name), destination)
    return target


def delete(directory: str, number: int) -> None:
    """Deletes checkpoint `number`'s files (rotation of readable, older checkpoints); a
    file deleted meanwhile by someone else is no error."""
    for name in files(directory, number):
        try:
            tf.io.gfile.remove(os.path.join(directory, name))
        except tf.errors.NotFoundError:
            pass


def complete(directory: str, number: int) -> bool:
    """Whether checkpoint `number` has its index and every data shard in `directory`."""
    try:
        names = files(directory, number)
    except tf.errors.NotFoundError:  # the directory itself is gone
        return False
    shards = [n for n in names if ".data-" in n]
    if f"{PREFIX}-{number}.index" not in names or not shards:
        return False
    return len(shards) == int(shards[0].rsplit("-of-", 1)[1])


def remove_temporaries(directory: str) -> list[str]:
    """Removes what interrupted saves left behind; returns the names removed.

    That includes the files of a save killed after it moved its data out of
    `ckpt-N_temp/`: TensorFlow deletes that folder only once the index is written, so
    `ckpt-N` files next to it are an unfinished save (never published: no data file
    without index, no half-written index), not a damaged checkpoint.
    """
    removed: list[str] = []
    if not tf.io.gfile.isdir(directory):
        return removed
    names = [name.rstrip("/") for name in tf.io.gfile.listdir(directory)]
    unfinished = {int(m.group(1)) for m in map(_UNFINISHED.match, names) if m}
    for name in names:
        match = _FILE.match(name)
        if match and int(match.group(1)) in unfinished:
            tf.io.gfile.remove(os.path.join(directory, name))
            removed.append(name)
    for name in names:
        if not _TEMPORARY.match(name):
            continue
        path = os.path.join(directory, name)
        if tf.io.gfile.isdir(path):
            tf.io.gfile.rmtree(path)
        else:
            tf.io.gfile.remove(path)
        removed.append(name)
    return sorted(removed)


def state_names(directory: str) -> list[str]:
    """The checkpoint names the state file lists (whether or not their files exist)."""
    path = os.path.join(directory, "checkpoint")
    try:
        with tf.io.gfile.GFile(path, "rb") as handle:
            text = handle.read().decode("utf-8", "replace")
    except (tf.errors.OpError, OSError):
        return []
    found = _STATE_ENTRY.findall(text)
    return sorted({os.path.basename(name) for name in found}, key=_number, reverse=True)


def _number(name: str) -> int:
    digits = re.search(r"(\d+)$", name)
    return int(digits.group(1)) if digits else -1


def state_latest(directory: str) -> str | None:
    """The latest checkpoint the state file names, or None (missing or unreadable file)."""
    try:
        return tf.train.latest_checkpoint(directory)
    except (ValueError, tf.errors.OpError):
        return None


def write_state(directory: str, kept: list[int]) -> None:
    """Atomically rewrites the state file to list `kept` (the highest is the latest).

    The text is `tf.train.latest_checkpoint`'s format, written to a temporary file and
    renamed over the old one, so the state file is always complete.
    """
    if not kept:
        return
    names = [f"{PREFIX}-{n}" for n in sorted(kept)]
    text = f'model_checkpoint_path: "{names[-1]}"\n' + "".join(
        f'all_model_checkpoint_paths: "{name}"\n' for name in names
    )
    for attempt in range(3):  # its temporary file deleted under it: written again
        temporary = os.path.join(directory, f"checkpoint.tmp{uuid.uuid4().hex}")
        try:
            with tf.io.gfile.GFile(temporary, "w") as handle:
                handle.write(text)
            tf.io.gfile.rename(temporary, os.path.join(directory, "checkpoint"), overwrite=True)
            return
        except tf.errors.NotFoundError:
            if attempt == 2 or not tf.io.gfile.isdir(directory):
                raise
