"""The documentation site: it builds with --strict, every public name has a docstring, and
every code block on its pages runs (one subprocess per page, blocks in order: run by
tests/test_docs_data_pages.py and tests/test_docs_training_pages.py) or carries a visible
marker saying why it cannot run here.

The marker is an admonition title on the line before the block, rendered on the page:

    !!! info "Not run by the tests: needs two GPUs"

    ```python
    ...
"""

import importlib
import inspect
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
MARKER = re.compile(r'^!!! \w+ "Not run by the tests: (?P<why>[^"]+)"\s*$')
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<lang>[\w-]*)")
SNIPPET = re.compile(r'^--8<-- "(?P<file>[^":]+)(?::(?P<section>[\w-]+))?"\s*$')
OUTPUT_LANGS = {"text", "console-output"}  # shown output, not code
# Pages whose blocks another test runs as pasted.
RUN_ELSEWHERE = {"tutorials/quickstart.md": "tests/test_readme.py runs the README's quickstart"}


def expand_snippets(text: str) -> str:
    """Inlines `--8<-- "file:section"` lines as pymdownx.snippets does."""
    out = []
    for line in text.splitlines():
        match = SNIPPET.match(line)
        if not match:
            out.append(line)
            continue
        included = (ROOT / match["file"]).read_text()
        if match["section"]:
            name = re.escape(match["section"])
            included = re.search(
                rf"--8<-- \[start:{name}\].*?\n(.*?)\n[^\n]*--8<-- \[end:{name}\]", included, re.S
            )[1]
        out.append(included)
    return "\n".join(out)


def code_blocks(text: str) -> list[dict]:
    """Every fenced block: its language, code, and the marker's reason (None without one)."""
    lines = expand_snippets(text).splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence = match["indent"], match["fence"]
        body, i = [], i + 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent) :])
            i += 1
        start = i - len(body) - 1
        before = [line for line in lines[:start] if line.strip()][-1:]
        marker = MARKER.match(before[0].strip()) if before else None
        blocks.append(
            {
                "lang": match["lang"],
                "code": "\n".join(body) + "\n",
                "why": marker["why"] if marker else None,
                "line": start + 1,
            }
        )
        i += 1
    return blocks


def pages() -> list[pathlib.Path]:
    return sorted(DOCS.rglob("*.md"))


def page_script(page: pathlib.Path) -> str:
    """The page's runnable Python blocks, in order, as one script."""
    blocks = code_blocks(page.read_text())
    return "\n".join(b["code"] for b in blocks if b["lang"] == "python" and b["why"] is None)


def page_blocks(page: pathlib.Path) -> list[str]:
    """The page's runnable Python blocks, each on its own (tests/test_launch.py uses it)."""
    blocks = code_blocks(page.read_text())
    return [b["code"] for b in blocks if b["lang"] == "python" and b["why"] is None]


def test_every_code_block_runs_or_says_why_not():
    unmarked = []
    for page in pages():
        for block in code_blocks(page.read_text()):
            runs = block["lang"] == "python" or block["lang"] in OUTPUT_LANGS
            if not runs and block["why"] is None:
                unmarked.append(f"{page.relative_to(ROOT)}:{block['line']} ({block['lang']})")
    assert not unmarked, "blocks neither run nor marked 'Not run by the tests: ...':\n" + (
        "\n".join(unmarked)
    )


RUNNABLE = [
    p.relative_to(DOCS).as_posix()
    for p in pages()
    if page_script(p).strip() and p.relative_to(DOCS).as_posix() not in RUN_ELSEWHERE
]
# What each page's run must print (a regular expression), beyond running.
EXPECTED = {
    "how-to/port-model-fit.md": r"validation accuracy: 0\.[6-9]",
    "how-to/port-custom-loop.md": r"validation accuracy: 0\.[6-9]",
    # The policy is measured on the host: float32, or a 16-bit one where it was faster.
    "how-to/precision.md": r"chosen: (float32|mixed_b?float16)\b[\s\S]*LossScaleOptimizer",
    "how-to/input-pipelines.md": (
        r"\(64, 16, 16, 1\) \(64,\)[\s\S]*\['blue', 'red'\] 9 3[\s\S]*"
        r"freed in background: val accuracy 0\.[6-9]"
    ),
    "how-to/resume.md": r"resumed at epoch 1\n",
    "how-to/batch-size.md": r"batch[\s\S]*largest batch that fits, up to the limit: 256",
    "how-to/learning-rate.md": r"learning rate: ",
    "how-to/data-service.md": r"every example once: True",
    "how-to/train-to-accuracy.md": r"validation accuracy: 0\.[5-9][\s\S]*Trainer validation",
}


def run_page(page: str, folder: pathlib.Path, jobs) -> None:
    """Runs the page's Python blocks in order in one process of their own (forked from one
    that imported TensorFlow: conftest.py's `jobs`); checks what it prints.

    tests/test_docs_data_pages.py and tests/test_docs_training_pages.py run the pages, in
    two files so that pytest-xdist's `--dist loadfile` hands them to two processes."""
    result = jobs.run(
        [sys.executable, "-c", page_script(DOCS / page)],
        cwd=folder,  # pages write their files (runs/, images/) here
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(EXPECTED[page], result.stdout), result.stdout[-3000:]


def test_the_runnable_pages_are_the_expected_ones():
    import test_docs_data_pages
    import test_docs_training_pages

    assert set(RUNNABLE) == set(EXPECTED)
    run = [*test_docs_data_pages.PAGES, *test_docs_training_pages.PAGES]
    assert sorted(run) == sorted(RUNNABLE), "each runnable page is run by one of the two files"


def public_modules() -> list[str]:
    import tfaccel

    return ["tfaccel", *(f"tfaccel.{name}" for name in tfaccel._SUBMODULES), "tfaccel.train"]


def test_every_public_name_has_a_docstring():
    """What the reference renders: each module's `__all__` (else its own public names),
    constants included (read by griffe, as mkdocstrings reads them), and the public
    methods and properties of each exported class (inherited docstrings count)."""
    import griffe

    package = griffe.load("tfaccel", search_paths=[str(ROOT)], resolve_aliases=True)
    missing = []
    for name in public_modules():
        module = package if name == "tfaccel" else package[name.removeprefix("tfaccel.")]
        assert module.docstring, f"{name} has no module docstring"
        if module.exports is not None:
            names = [str(n) for n in module.exports]
        else:
            names = [n for n, m in module.members.items() if m.is_public and not m.is_alias]
        assert names, name
        for member_name in names:
            member = module.members[member_name]
            target = member.final_target if member.is_alias else member
            if not target.is_module and not target.docstring:
                missing.append(f"{name}.{member_name}")
        runtime = importlib.import_module(name)
        for member_name in names:
            obj = getattr(runtime, member_name)
            if not inspect.isclass(obj) or not obj.__module__.startswith("tfaccel"):
                continue
            for attr, value in vars(obj).items():
                if attr.startswith("_") or not (callable(value) or isinstance(value, property)):
                    continue
                if not inspect.getdoc(getattr(obj, attr)) and not _inherited_doc(obj, attr):
                    missing.append(f"{name}.{member_name}.{attr}")
    assert not missing, "public names without a docstring:\n" + "\n".join(sorted(set(missing)))


def _exported(module: str) -> list[str]:
    """A module's `__all__`, else its own public functions, classes and constants."""
    runtime = importlib.import_module(module)
    if hasattr(runtime, "__all__"):
        return [n for n in runtime.__all__ if not inspect.ismodule(getattr(runtime, n))]
    return [
        n
        for n, obj in vars(runtime).items()
        if not n.startswith("_")
        and not inspect.ismodule(obj)
        and (
            getattr(obj, "__module__", None) == module
            or (n.isupper() and not callable(obj))  # a constant
        )
    ]


def _inherited_doc(cls, attr: str) -> bool:
    """True for an override of a framework hook (Keras' `build`, `call`, callbacks' `on_*`):
    the framework documents it."""
    return any(
        attr in vars(base) and not base.__module__.startswith("tfaccel") for base in cls.__mro__[1:]
    )


def test_strict_build_has_every_page(tmp_path):
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-5000:]
    reference = sorted(p.parent.name for p in (site / "reference").glob("*/index.html"))
    assert reference == sorted(m.removeprefix("tfaccel.") for m in public_modules()[1:])
    for module in public_modules()[1:]:
        page = (site / "reference" / module.removeprefix("tfaccel.") / "index.html").read_text()
        for name in _exported(module):
            # a name shadowed by its own submodule (data.pipeline) is rendered from there
            ids = (f'id="{module}.{name}"', f'id="{module}.{name}.{name}"')
            assert any(i in page for i in ids), f"{module}.{name} is not in the reference"
    data_page = (site / "reference" / "data" / "index.html").read_text()
    for needle in ("from_image_folder", "skip_corrupt", "augment", "shuffle_buffer"):
        assert needle in data_page
    for notebook in (ROOT / "notebooks").glob("*.ipynb"):
        page = site / "tutorials" / "notebooks" / notebook.stem / "index.html"
        assert page.exists(), page
        # rendered from the stored outputs: the plots are there
        assert ("image/png" in notebook.read_text()) == ("<img alt" in page.read_text())
    home = (site / "index.html").read_text()
    assert "Quickstart" in home and "make test" in home
