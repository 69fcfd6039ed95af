"""The share of tfaccel's public functions that are fully annotated.

A public function is a function or method whose name does not start with `_`, defined at
module level or in a class body (functions nested inside a function are not reachable, so
they do not count), in a module whose path has no `_`-prefixed part (`tfaccel/__init__.py`
itself counts; `tfaccel/callbacks/_steps.py` does not). Fully annotated: every parameter
but a method's `self` / `cls` has an annotation, `*args` and `**kwargs` included, and the
function has a return annotation. The code is read with `ast`; nothing of it is run.

Run: `python benchmarks/annotations.py [--min 0.9] [--worst 10] [--list]`; prints the
share and the files with the most functions left to annotate; with `--min`, exits 1 when
the share is below it.
"""

from __future__ import annotations

import argparse
import ast
import pathlib
import sys
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tfaccel"
Function = ast.FunctionDef | ast.AsyncFunctionDef


def public_module(path: pathlib.Path) -> bool:
    """No part of the path below the repository root starts with `_` (`__init__` aside)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return not any(p.startswith("_") and p != "__init__" for p in parts)


def public_functions(tree: ast.Module) -> Iterator[tuple[str, Function, bool]]:
    """`(qualified name, node, is_method)` for each public function of a module."""

    def walk(body: list[ast.stmt], prefix: str, in_class: bool) -> Iterator:
        for node in body:
            if isinstance(node, ast.ClassDef):
                yield from walk(node.body, f"{prefix}{node.name}.", True)
            elif isinstance(node, Function) and not node.name.startswith("_"):
                yield f"{prefix}{node.name}", node, in_class

    yield from walk(tree.body, "", False)


def fully_annotated(node: Function, is_method: bool) -> bool:
    """Every parameter (bar a method's first, unless it is a staticmethod) and the return."""
    args = node.args
    params = [*args.posonlyargs, *args.args]
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)
    if is_method and not static and params:
        params = params[1:]
    params += args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a is not None]
    return node.returns is not None and all(p.annotation is not None for p in params)


def measure(package: pathlib.Path = PACKAGE) -> dict[str, list[tuple[str, bool]]]:
    """Per file (relative path): `(function, fully annotated)` for its public functions."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        if not public_module(path):
            continue
        tree = ast.parse(path.read_text())
        rows = [(name, fully_annotated(n, m)) for name, n, m in public_functions(tree)]
        if rows:
            found[str(path.relative_to(ROOT))] = rows
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min", type=float, default=None, help="exit 1 below this share")
    parser.add_argument("--worst", type=int, default=10, help="files to list (default 10)")
    parser.add_argument("--list", action="store_true", help="name every function left")
    args = parser.parse_args(argv)
    found = measure()
    total = sum(len(rows) for rows in found.values())
    done = sum(ok for rows in found.values() for _, ok in rows)
    share = done / total if total else 1.0
    print(f"public functions fully annotated: {done}/{total} = {share:.1%}")
    left = sorted(
        ((sum(not ok for _, ok in rows), f) for f, rows in found.items()), key=lambda t: -t[0]
    )
    for count, file in [t for t in left if t[0]][: args.worst]:
        print(f"  {count:3d} left  {file}")
        if args.list:
            for name, ok in found[file]:
                if not ok:
                    print(f"        {name}")
    if args.min is not None and share < args.min:
        print(f"below the minimum {args.min:.0%}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
