"""What is wrong with a `.keras` file Keras could not load (it reports "File not found")."""

from __future__ import annotations

import os
import zipfile


def damage(path: str | os.PathLike) -> str | None:
    """Why the `.keras` file at `path` cannot be loaded, or None when it looks whole."""
    size = os.path.getsize(path)
    if size == 0:
        return "is empty (0 bytes)"
    if not zipfile.is_zipfile(path):
        return (
            f"is not a zip archive ({size:,} bytes), as every .keras file is: it is truncated "
            "or was not written by model.save"
        )
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        return f"is a damaged zip archive ({error})"
    if bad is not None:
        return f"holds a damaged member {bad!r} (its checksum does not match)"
    if "config.json" not in names:
        return f"has no config.json (it holds {names[:5]}), so it is not a Keras model file"
    return None


def explain_load_failure(path: str | os.PathLike, error: Exception) -> Exception | None:
    """A clear error for a failed load of an existing or missing file, or None."""
    path = os.fspath(path)
    if not os.path.exists(path):
        return FileNotFoundError(f"load_model: no file at {path!r}.")
    if not os.path.isfile(path):
        return None
    found = damage(path)
    if found is None:
        return None
    return ValueError(
        f"load_model: {path!r} {found}. The file is damaged, not missing: save the model "
        f"again (model.save({path!r})) or restore the file from a copy. Keras said: {error}"
    )
