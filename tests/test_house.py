"""The house's plan, checked from the code: imports point down, no circles, folders and
functions a reader can take in, and every documented name importable.

The imports are read with `ast` (those inside functions too: a lazy import is still a
dependency), so nothing of the package is run to draw them.
"""

import ast
import importlib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tfaccel"

# The concerns of tfaccel/ from the bottom up: a module may import its own concern and
# any concern on a lower row, never a higher one. Two concerns on one row may not import
# each other both ways (the circle test says so).
LAYERS = [
    {
        "errors",
        "strict_json",
        "files",
        "moved",
        "shared_strategy",
        "cluster",
        "launcher",  # tfaccel launch (launcher/launch.py) and what lower layers share with it
    },
    {"blocks", "devices"},
    {"models", "parallel", "data"},
    {"choices"},  # the measured choices: precision, XLA, steps per loop, the op-rate probe
    {"precision", "precision_probe", "methods", "callbacks"},
    {"train"},
    {"tuning", "doctor"},
    {"check"},  # tfaccel check: its runner (check/__init__.py) and suite (check/suite.py)
    {"cli", "__main__", "tfaccel"},
]
RANK = {concern: rank for rank, row in enumerate(LAYERS) for concern in row}
MAX_MODULES, MAX_FILE_LINES, MAX_FUNCTION_CODE = 16, 500, 80
MAX_CLASS_LINES = 400
MAX_PARAMETERS = 10
# Functions that mirror model.fit / model.compile or tf.data take their arguments as those
# do (at most 4); any other function over MAX_PARAMETERS groups what it shares in an object
# (as the tuners take one tuning.TuningJob).
MIRRORS = {"Trainer.__init__", "Trainer.fit", "training_data", "pipeline"}
TRAINER_MODULE = PACKAGE / "train" / "trainer.py"


def _name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def concern(module: str) -> str:
    """`tfaccel.data.assembly.feed` -> `data`; the package itself -> `tfaccel`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "tfaccel"


def imports_of(path: pathlib.Path) -> set[str]:
    """The tfaccel modules a file imports (a name imported from a package counts as the
    submodule when it is one, else as the package)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "tfaccel"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "tfaccel":
                continue
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in MODULES else node.module)
    me = _name(path)
    return {m for m in found if m in MODULES and m != me}


GRAPH = {name: imports_of(path) for name, path in MODULES.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a concern to a higher one, as `importer -> imported`."""
    return sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        for b in targets
        if RANK[concern(a)] < RANK[concern(b)]
    )


def two_way_folders(graph: dict[str, set[str]]) -> list[str]:
    """Sibling folders (packages with one parent) that import each other both ways, each
    pair with one import of each direction: `a <-> b (x -> y; z -> w)`."""
    edges: dict[tuple[str, str], str] = {}
    for importer, targets in sorted(graph.items()):
        for imported in sorted(targets):
            here = MODULES[importer].relative_to(ROOT).parent.parts
            there = MODULES[imported].relative_to(ROOT).parent.parts
            common = 0
            while common < min(len(here), len(there)) and here[common] == there[common]:
                common += 1
            if common < len(here) and common < len(there):  # two folders below the common one
                pair = ("/".join(here[: common + 1]), "/".join(there[: common + 1]))
                edges.setdefault(pair, f"{importer} -> {imported}")
    return [
        f"{a} <-> {b} ({edges[a, b]}; {edges[b, a]})"
        for a, b in sorted(edges)
        if a < b and (b, a) in edges
    ]


def trainer_names(tree: ast.AST) -> set[str]:
    """The names that hold a Trainer in a module: `trainer` (or `..._trainer`, also as an
    attribute: `self.trainer`), names assigned a `Trainer(...)` call, arguments annotated
    `Trainer`."""
    names = {"trainer"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            if getattr(func, "id", getattr(func, "attr", None)) == "Trainer":
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.arg) and node.annotation is not None:
            if re.search(r"\bTrainer\b", ast.unparse(node.annotation)):
                names.add(node.arg)
    return names


def private_trainer_reads(source: str) -> list[str]:
    """`line: holder._name` for every private attribute read on a name holding a Trainer
    (`getattr(trainer, "_name")` included)."""
    tree = ast.parse(source)
    names = trainer_names(tree)
    found = []
    for node in ast.walk(tree):
        holder, attr = None, None
        if isinstance(node, ast.Attribute):
            holder, attr = node.value, node.attr
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) in ("getattr", "hasattr", "setattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            holder, attr = node.args[0], node.args[1].value
        if attr is None or not attr.startswith("_") or attr.startswith("__"):
            continue
        name = getattr(holder, "id", None) or getattr(holder, "attr", None)
        if name in names or (isinstance(name, str) and name.endswith("_trainer")):
            found.append(f"{node.lineno}: {name}.{attr}")
    return found


def long_classes(path: pathlib.Path) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}::{node.name} ({n} lines)"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and (n := node.end_lineno - node.lineno + 1) > MAX_CLASS_LINES
    ]


def code_lines(node: ast.AST, source: list[str]) -> int:
    """Lines of a function holding code: its docstring, comments and blank lines left out."""
    skip = set()
    body = getattr(node, "body", [])
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            skip = set(range(body[0].lineno, body[0].end_lineno + 1))
    return sum(
        1
        for number in range(node.lineno, node.end_lineno + 1)
        if number not in skip
        and source[number - 1].strip()
        and not source[number - 1].strip().startswith("#")
    )


def long_functions(path: pathlib.Path) -> list[str]:
    text = path.read_text()
    source = text.splitlines()
    return [
        f"{path.relative_to(ROOT)}::{node.name} ({code_lines(node, source)} lines of code)"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and code_lines(node, source) > MAX_FUNCTION_CODE
    ]


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's parameters, `self` and `cls` left out; `*args` and `**kwargs` one each."""
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + (args.vararg is not None) + (args.kwarg is not None)


def long_parameter_lists(source: str, where: str) -> list[tuple[str, str]]:
    """`(qualified name, "where::name (n parameters)")` of each function in `source`
    taking more than MAX_PARAMETERS (a method as `Class.name`)."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = prefix
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                inner = f"{prefix}{child.name}."
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                if (n := parameter_count(child)) > MAX_PARAMETERS:
                    name = prefix + child.name
                    found.append((name, f"{where}::{name} ({n} parameters)"))
            visit(child, inner)

    visit(ast.parse(source), "")
    return found


# -- the rules, on the real tree -------------------------------------------------------


def test_every_concern_has_a_row():
    assert {concern(m) for m in MODULES} <= set(RANK), "add the new concern to LAYERS"


def test_no_import_circles():
    found = circles(GRAPH)
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_imports_only_point_down():
    found = upward(GRAPH)
    assert not found, "imports that run back up the house:\n" + "\n".join(found)


def test_no_function_passes_80_lines_of_code():
    found = [f for path in MODULES.values() for f in long_functions(path)]
    assert not found, "\n".join(found)


def test_no_file_passes_500_lines():
    found = [
        f"{p.relative_to(ROOT)}: {n} lines"
        for p in MODULES.values()
        if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    ]
    assert not found, "\n".join(found)


def test_no_folder_holds_more_than_16_modules():
    folders = {p.parent for p in MODULES.values()}
    found = [
        f"{f.relative_to(ROOT)}: {n} modules"
        for f in sorted(folders)
        if (n := len(list(f.glob("*.py")))) > MAX_MODULES
    ]
    assert not found, "\n".join(found)


# Known cases being fixed (issue 70): each entry goes when its fix lands; none may be added.
KNOWN_LONG_CLASSES: set[str] = set()
KNOWN_PRIVATE_TRAINER_READS: set[str] = set()
KNOWN_TWO_WAY_FOLDERS: set[str] = set()
KNOWN_LONG_PARAMETER_LISTS: set[str] = set()


def test_no_sibling_folders_import_each_other_both_ways():
    found = [f for f in two_way_folders(GRAPH) if f.split(" (")[0] not in KNOWN_TWO_WAY_FOLDERS]
    assert not found, "sibling folders importing each other both ways:\n" + "\n".join(found)


def test_no_module_but_the_trainers_reads_its_private_attributes():
    found = [
        f"{path.relative_to(ROOT)}:{read}"
        for path in MODULES.values()
        if path != TRAINER_MODULE
        for read in private_trainer_reads(path.read_text())
        if read.rsplit(".", 1)[1] not in KNOWN_PRIVATE_TRAINER_READS
    ]
    assert not found, "private Trainer attributes read outside trainer.py:\n" + "\n".join(found)


def test_no_class_passes_400_lines():
    found = [
        c
        for path in MODULES.values()
        for c in long_classes(path)
        if c.split("::")[1].split(" ")[0] not in KNOWN_LONG_CLASSES
    ]
    assert not found, "\n".join(found)


def test_no_function_takes_more_than_10_parameters():
    assert len(MIRRORS) <= 4, "at most 4 functions mirror model.fit or tf.data"
    found = [
        text
        for path in MODULES.values()
        for name, text in long_parameter_lists(path.read_text(), str(path.relative_to(ROOT)))
        if name not in MIRRORS | KNOWN_LONG_PARAMETER_LISTS
    ]
    assert not found, (
        "functions over 10 parameters (put what they share in one object, as the tuners' "
        "tuning.TuningJob):\n" + "\n".join(found)
    )


def test_each_allowed_long_parameter_list_is_still_long():
    names = {
        name
        for path in MODULES.values()
        for name, _ in long_parameter_lists(path.read_text(), path.name)
    }
    stale = (MIRRORS | KNOWN_LONG_PARAMETER_LISTS) - names
    assert not stale, f"no longer over 10 parameters: drop them from test_house's sets: {stale}"


# -- the checks themselves catch what they are for ------------------------------------


def test_the_circle_finder_names_every_file_of_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_an_upward_import_is_named():
    graph = {"tfaccel.data.sources.arrays": {"tfaccel.train.setup.array_inputs"}}
    assert upward(graph) == ["tfaccel.data.sources.arrays -> tfaccel.train.setup.array_inputs"]
    assert upward({"tfaccel.train.trainer": {"tfaccel.data.assembly.feed"}}) == []


def test_two_way_sibling_folders_are_named_and_one_way_passes():
    graph = {
        "tfaccel.train.setup.compiled": {"tfaccel.train.step.losses"},
        "tfaccel.train.step.runner": {"tfaccel.train.setup.inputs", "tfaccel.train.trainer"},
        "tfaccel.train.trainer": {"tfaccel.train.step.runner"},
    }
    assert two_way_folders(graph) == [
        "tfaccel/train/setup <-> tfaccel/train/step (tfaccel.train.setup.compiled -> "
        "tfaccel.train.step.losses; tfaccel.train.step.runner -> tfaccel.train.setup.inputs)"
    ]
    del graph["tfaccel.train.step.runner"]  # a module beside a folder is no sibling folder
    assert two_way_folders(graph) == []


def test_private_trainer_reads_are_found_on_names_that_hold_a_trainer():
    source = (
        "def f(trainer, job, fitted: Trainer, runner):\n"
        "    trainer._given_optimizer; job.trainer._builder; fitted._auto_jit\n"
        "    getattr(trainer, '_clock'); trainer.__class__; trainer.model\n"
        "    job._private; runner._stats\n"
        "t = tfaccel.Trainer(model)\n"
        "t._make_runner()\n"
    )
    assert private_trainer_reads(source) == [
        "2: trainer._given_optimizer",
        "2: trainer._builder",
        "2: fitted._auto_jit",
        "3: trainer._clock",
        "6: t._make_runner",
    ]


def test_parameters_leave_out_self_and_count_star_args_once():
    source = (
        "class A:\n"
        "    def f(self, a, /, b, c, d, e, f, g, h, i, *args, j, **kw):\n"
        "        def inner(a, b, c, d, e, f, g, h, i, j, k): pass\n"
        "def short(cls, a, b, c, d, e, f, g, h, i, j): pass\n"
    )
    tree = ast.parse(source)
    counts = {n.name: parameter_count(n) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert counts == {"f": 12, "inner": 11, "short": 10}
    assert long_parameter_lists(source, "m.py") == [
        ("A.f", "m.py::A.f (12 parameters)"),
        ("A.f.inner", "m.py::A.f.inner (11 parameters)"),
    ]


def test_code_lines_leave_out_docstrings_comments_and_blanks():
    text = 'def f():\n    """Doc.\n\n    More."""\n    # note\n\n    x = 1\n    return x\n'
    node = ast.parse(text).body[0]
    assert code_lines(node, text.splitlines()) == 3  # def, x = 1, return


# -- every documented name imports ----------------------------------------------------


def _resolve(dotted: str):
    """Imports the longest module prefix of `dotted`, then reads the rest as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            value = getattr(value, attr)
        return value
    raise ModuleNotFoundError(dotted)


def _documented() -> list[str]:
    """`::: name` of the reference pages, and every `tfaccel.x.y` the docs and README
    name in backticks (a name followed by `(` counts without its call)."""
    pages = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
    names = set()
    for page in pages:
        text = page.read_text()
        names |= set(re.findall(r"^::: (tfaccel[\w.]*)", text, flags=re.M))
        names |= set(re.findall(r"`(tfaccel(?:\.\w+)+)[(`]", text))
    return sorted(names)


@pytest.mark.parametrize("dotted", _documented())
def test_every_documented_name_imports(dotted):
    assert _resolve(dotted) is not None


@pytest.mark.parametrize(
    "module", ["tfaccel", "tfaccel.data", "tfaccel.tuning", "tfaccel.doctor", "tfaccel.callbacks"]
)
def test_every_exported_name_is_there(module):
    runtime = importlib.import_module(module)
    missing = [n for n in runtime.__all__ if getattr(runtime, n, None) is None]
    assert not missing, f"{module}.__all__ names what it lacks: {missing}"
