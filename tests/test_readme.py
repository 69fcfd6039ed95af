"""The README's Quickstart runs as pasted, and the README stays a first read (<= 12 KB).

The other pages' code blocks are run by tests/test_docs.run_page (tests/test_docs_*_pages.py)."""

import pathlib
import re
import sys

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
EXECUTED_SECTIONS = ("Quickstart",)


def python_blocks(text: str, sections=EXECUTED_SECTIONS) -> list[str]:
    """The ```python blocks under the given `## ` sections, in order."""
    blocks = []
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        title = section.splitlines()[0].strip()
        if title in sections:
            blocks += re.findall(r"^```python\n(.*?)^```", section, flags=re.M | re.S)
    return blocks


def test_readme_python_blocks_run_as_pasted(tmp_path, jobs):
    blocks = python_blocks(README.read_text())
    assert len(blocks) == 1  # the quickstart
    script = "\n".join(blocks) + (
        "\nprint('FINAL', results['accuracy'], len(trainer.model.history.history['loss']))\n"
    )
    result = jobs.run(  # a process of its own, forked from one that imported TF (conftest)
        [sys.executable, "-c", script],
        cwd=tmp_path,  # the quickstart writes runs/quickstart here
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    final = result.stdout.strip().splitlines()[-1].split()
    assert final[0] == "FINAL"
    assert float(final[1]) > 0.6  # a ResNet that learned the digits (about 0.9 in 5 epochs)
    assert final[2] == "5"
    assert (tmp_path / "runs" / "quickstart" / "checkpoint").exists()


def test_readme_is_a_first_read():
    text = README.read_text()
    assert len(text.encode()) <= 12 * 1024
    assert text.index("make run") < text.index("make test") < text.index("## Quickstart")
    linked = re.findall(r"\]\((docs/[^)#]+)", text)
    assert len(linked) >= 10
    root = README.parent
    assert [page for page in linked if not (root / page).exists()] == []
