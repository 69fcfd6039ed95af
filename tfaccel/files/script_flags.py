"""Which command-line flags a user's script takes, read from its code (never run).

`tfaccel tune` and `tfaccel tune-batch-size` run a script with their flag only when its
code takes it: the flag as a string in the code (`add_argument("--tune", ...)`,
`"--tune" in sys.argv`), exactly (`--tune-batch-size` is not `--tune`), in the script or
in what it uses of a module beside it (a recipe's `common.parser(...)`, followed through
`import common` or `from common import parser`). A comment or a docstring that mentions
the flag does not count, nor a module beside it whose flag-taking code it never uses.
"""

from __future__ import annotations

import ast
import os
import pathlib

__all__ = ["declares_flag"]

MAX_LOOKS = 100  # (module, name) pairs followed from one script


def declares_flag(path: str | os.PathLike, flag: str) -> bool:
    """Whether the script at `path` takes `flag` (see the module)."""
    return _takes(pathlib.Path(path).resolve(), None, flag, set())


def _takes(path: pathlib.Path, name: str | None, flag: str, seen: set) -> bool:
    """Whether `name`'s code in the module at `path` (all its code: None) holds `flag`,
    or uses a name of a module beside it whose code does."""
    if (path, name) in seen or len(seen) >= MAX_LOOKS:
        return False
    seen.add((path, name))
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except (SyntaxError, ValueError, OSError):
        return False
    imports, everything = _imports(tree, path.parent)
    parts = _definitions(tree, name)
    if name is not None and not parts:  # re-exported: `from common import parser` there
        file, imported = imports.get(name, (None, None))
        return file is not None and _takes(file, imported, flag, seen)
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    used = []
    for node in (node for part in parts for node in ast.walk(part)):
        if isinstance(node, ast.Constant) and node.value == flag and id(node) not in docstrings:
            return True
        if isinstance(node, ast.Name) and imports.get(node.id, (None, None))[1] is not None:
            used.append(imports[node.id])  # from common import parser; parser(...)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            file, imported = imports.get(node.value.id, (None, ""))
            if file is not None and imported is None:  # import common; common.parser(...)
                used.append((file, node.attr))
    used += [(file, None) for file in everything]
    return any(_takes(file, what, flag, seen) for file, what in used)


def _definitions(tree: ast.Module, name: str | None) -> list[ast.AST]:
    """The module (None), or the top-level statements that define `name`."""
    if name is None:
        return [tree]
    found: list[ast.AST] = []
    for statement in tree.body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if statement.name == name:
                found.append(statement)
        elif isinstance(statement, ast.Assign | ast.AnnAssign):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                found.append(statement)
    return found


def _imports(
    tree: ast.Module, folder: pathlib.Path
) -> tuple[dict[str, tuple[pathlib.Path, str | None]], list[pathlib.Path]]:
    """({alias: (file, name imported or None for the module)}, [files star-imported]) for
    the modules beside the file (`folder`) that its code imports."""
    aliases: dict[str, tuple[pathlib.Path, str | None]] = {}
    everything: list[pathlib.Path] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                file = _local(folder, alias.name.split(".")[0])
                if file is not None:
                    aliases[alias.asname or alias.name.split(".")[0]] = (file, None)
        elif isinstance(node, ast.ImportFrom) and (node.module or node.level):
            module = _local(folder, node.module.split(".")[0]) if node.module else None
            for alias in node.names:
                if module is not None and alias.name == "*":
                    everything.append(module)
                elif module is not None:
                    aliases[alias.asname or alias.name] = (module, alias.name)
                elif node.level and (local := _local(folder, alias.name)) is not None:
                    aliases[alias.asname or alias.name] = (local, None)  # from . import m
    return aliases, everything


def _local(folder: pathlib.Path, name: str) -> pathlib.Path | None:
    for candidate in (folder / f"{name}.py", folder / name / "__init__.py"):
        if candidate.is_file():
            return candidate.resolve()
    return None
