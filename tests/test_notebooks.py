"""The tutorials in `notebooks/` run top to bottom and keep the pictures they must show.

Each notebook is executed with nbclient on the `python3` kernel that ipykernel installs
into the virtual environment (so it runs on this interpreter and this tree's tfaccel);
a failing cell fails its test. The stored notebooks must hold their outputs: readers
on the web see the saved file, so a notebook saved without its plot is a defect.

Re-execute them in place (refresh the stored outputs) with `make notebooks`, i.e.
`python tests/test_notebooks.py [NAME ...]`.
"""

from __future__ import annotations

import ast
import copy
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
TIMEOUT_S = 600

# notebook → tags of the cells whose outputs must hold a PNG image.
IMAGES = {
    "01_devices.ipynb": [],
    "02_input_pipelines.ipynb": ["throughput-chart"],
    "03_auto_parallelism.ipynb": ["timeline"],
    "04_mixed_precision_and_memory.ipynb": ["precision-chart", "remat-chart"],
    "05_batch_size.ipynb": ["throughput-knee", "loss-vs-time", "lr-finder"],
    "06_distributed_training.ipynb": ["training-curves"],
    "07_doctor.ipynb": ["report-plot", "gains-chart"],
    "08_data_service.ipynb": ["scaling-plot"],
    "09_time_to_accuracy.ipynb": ["tta-curves"],
}
# notebook → {tag: pattern the cell's text output must match}.
TEXTS = {
    "01_devices.ipynb": {
        "devices-table": r"logical\s+/device:CPU:0[\s\S]*logical\s+/device:CPU:1",
        "op-placement": r"ran on \S*device:CPU:0[\s\S]*ran on \S*device:CPU:1",
    },
    "03_auto_parallelism.ipynb": {"speed-up": r"speed-up: \d+\.\d+x"},
    "04_mixed_precision_and_memory.ipynb": {
        "policy-table": r"A100[^\n]*mixed_bfloat16[\s\S]*V100[^\n]*mixed_float16",
        "loss-scaling": r"skipped steps: [1-9]",
    },
    "09_time_to_accuracy.ipynb": {
        "summary-table": r"digits_cnn \(target [\s\S]*fast +time +\d",
        "live-run": r"plain: \d+ epochs to the target[\s\S]*fast: \d+ epochs to the target",
    },
    "06_distributed_training.ipynb": {
        "weight-difference": r"max \|weight difference\| vs model\.fit: \d\.\d+e[-+]\d+",
    },
    "07_doctor.ipynb": {
        "gains-chart": r"planted input +verdict input[\s\S]*planted communication +verdict "
        r"communication",
        "recipe-report": r"Verdict: \w+-bound",
    },
    "08_data_service.ipynb": {
        "doctor-verdict": r"Verdict: input-bound[\s\S]*- data\.pipeline\(\.\.\., service=",
        "measured-gain": r"measured gain \d+\.\d+x \(predicted \d+\.\d+x\)",
    },
}
# What the cells may import besides the standard library (keras_tuner: notebook 05's search;
# IPython: notebook 07 shows a saved plot with IPython.display.Image).
ALLOWED_IMPORTS = {"tfaccel", "keras", "keras_tuner", "tensorflow", "numpy", "matplotlib"}
ALLOWED_IMPORTS |= {"IPython", "sklearn"}  # scikit-learn: the real data it ships


def execute(
    notebook: nbformat.NotebookNode, folder: Path, timeout: int = TIMEOUT_S, zygote=None
) -> None:
    """Runs a notebook top to bottom in a fresh kernel started in `folder`, in place (with
    `zygote`, the tests' `worker_zygote`: a kernel forked from it, see `forked_kernels`).

    TensorFlow's C++ start-up log lines go to the kernel's stderr, not into the notebook
    (`capture_fd_output=False`).

    Raises:
        CellExecutionError: a cell raised; the message names the cell and the error (the
            outputs up to the failing cell are in `notebook`).
    """
    extra, options = ["--IPKernelApp.capture_fd_output=False"], {}
    if zygote is not None:  # the kernel's parent is the zygote: no parent-PID watch; the
        # zygote imported matplotlib before the kernel could name its inline backend
        extra += ["--IPKernelApp.parent_handle=0", "--IPKernelApp.matplotlib=inline"]
        options["kernel_manager_class"] = forked_kernels(zygote)
    client = NotebookClient(
        notebook,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(folder)}},
        extra_arguments=extra,
        **options,
    )
    client.execute()


def forked_kernels(zygote) -> type:
    """A kernel manager whose kernels on this interpreter are forked from `zygote`
    (conftest.py's `worker_zygote`: TensorFlow imported once), less the imports' CPU."""
    from jupyter_client.manager import KernelManager

    class ForkedKernelManager(KernelManager):
        def format_kernel_cmd(self, extra_arguments=None):
            command = super().format_kernel_cmd(extra_arguments)
            if Path(command[0]).resolve() != Path(sys.executable).resolve():
                return command
            return zygote.command([sys.executable, *command[1:]])

    return ForkedKernelManager


def kernel_environment() -> dict[str, str]:
    """Environment changes so that the kernel imports this tree's tfaccel and shows plots inline."""
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}


def _tagged(notebook: nbformat.NotebookNode, tag: str) -> list:
    return [cell for cell in notebook.cells if tag in cell.get("metadata", {}).get("tags", [])]


def _text(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            parts.append(output.text)
        elif "data" in output and "text/plain" in output.data:
            parts.append(output.data["text/plain"])
    return "".join(parts)


def missing_outputs(name: str, notebook: nbformat.NotebookNode) -> list[str]:
    """Lists what the notebook's outputs lack: required images, required text, or errors."""
    problems = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.output_type == "error":
                problems.append(f"a cell failed: {output.ename}: {output.evalue}")
    for tag in IMAGES[name]:
        cells = _tagged(notebook, tag)
        if not cells:
            problems.append(f"no cell tagged {tag!r}")
        elif not any("image/png" in o.get("data", {}) for c in cells for o in c.outputs):
            problems.append(f"the cell tagged {tag!r} shows no image")
    for tag, pattern in TEXTS.get(name, {}).items():
        cells = _tagged(notebook, tag)
        if not cells:
            problems.append(f"no cell tagged {tag!r}")
        elif not any(re.search(pattern, _text(c)) for c in cells):
            problems.append(f"the output of the cell tagged {tag!r} does not match {pattern!r}")
    return problems


def test_every_notebook_is_listed():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(IMAGES)


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_stored_notebook_shows_its_outputs(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert not missing_outputs(name, notebook), (
        f"{name} was saved without outputs it must show; run `make notebooks`."
    )
    unexecuted = [c.source[:60] for c in notebook.cells if c.cell_type == "code" and not c.outputs]
    assert all(c.execution_count for c in notebook.cells if c.cell_type == "code"), unexecuted


def test_a_notebook_saved_without_its_plot_is_caught():
    name = "02_input_pipelines.ipynb"
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    stripped = copy.deepcopy(notebook)
    for cell in _tagged(stripped, IMAGES[name][0]):
        cell.outputs = [o for o in cell.outputs if "image/png" not in o.get("data", {})]
    assert missing_outputs(name, stripped) == [
        f"the cell tagged {IMAGES[name][0]!r} shows no image"
    ]
    name = "06_distributed_training.ipynb"
    stripped = copy.deepcopy(nbformat.read(NOTEBOOKS / name, as_version=4))
    for cell in stripped.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    problems = missing_outputs(name, stripped)
    assert any("training-curves" in p for p in problems)
    assert any("weight-difference" in p for p in problems)


def _imports(source: str) -> list[str]:
    """Dotted names a cell imports (`from a.b import c` gives `a.b.c`), magics skipped."""
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("%"))
    names = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names += [f"{node.module or ''}.{alias.name}" for alias in node.names]
    return names


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_cells_use_only_the_public_api(name):
    import tfaccel

    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        for module in _imports(cell.source):
            top, *rest = module.split(".")
            assert top in ALLOWED_IMPORTS or top in sys.stdlib_module_names, module
            if top == "tfaccel":
                assert not rest or rest[0] in tfaccel.__all__, f"{module} is not public"
                assert not any(part.startswith("_") for part in rest), f"{module} is private"
        private = re.findall(r"\btfaccel(?:\.\w+)*\._\w+", cell.source)
        assert not private, f"{name} uses private names {private}"


# The two doctor notebooks (about 45 s each) run in tests/test_notebooks_doctor.py: a
# second file, so that pytest-xdist's `--dist loadfile` hands them to another process.
DOCTOR_NOTEBOOKS = ["07_doctor.ipynb", "08_data_service.ipynb"]


def run_top_to_bottom(name: str, monkeypatch, tmp_path: Path, zygote=None) -> None:
    """Executes the notebook in a fresh kernel; fails on a failing cell or a missing output."""
    for key, value in kernel_environment().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the notebooks' temporary files go here
    monkeypatch.delenv("MPLBACKEND", raising=False)
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    try:
        execute(notebook, NOTEBOOKS, zygote=zygote)
    except CellExecutionError as error:
        pytest.fail(f"{name} failed:\n{error}", pytrace=False)
    assert not missing_outputs(name, notebook)


@pytest.mark.parametrize("name", [n for n in sorted(IMAGES) if n not in DOCTOR_NOTEBOOKS])
def test_notebook_runs_top_to_bottom(name, monkeypatch, tmp_path, worker_zygote):
    run_top_to_bottom(name, monkeypatch, tmp_path, worker_zygote)


def test_kernel_is_this_interpreter_and_a_failing_cell_fails(tmp_path, monkeypatch):
    for key, value in kernel_environment().items():
        monkeypatch.setenv(key, value)
    code = [
        "import importlib.util, os, sys\n"
        "print(sys.executable)\n"
        "print(importlib.util.find_spec('tfaccel').origin)\n"
        "print(os.getcwd())",
        "raise ValueError('a broken cell')",
        "print('never reached')",
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in code])
    with pytest.raises(CellExecutionError, match="a broken cell"):
        execute(notebook, tmp_path)
    executable, package, cwd = notebook.cells[0].outputs[0].text.split()
    assert Path(executable).resolve() == Path(sys.executable).resolve()
    assert Path(package).resolve() == ROOT / "tfaccel" / "__init__.py"
    assert Path(cwd).resolve() == tmp_path.resolve()
    assert not notebook.cells[2].get("outputs")


def main(argv: list[str]) -> int:
    """Re-executes the named notebooks (default: all) and saves them with their outputs."""
    os.environ.update(kernel_environment())
    os.environ.pop("MPLBACKEND", None)
    with tempfile.TemporaryDirectory(prefix="tfaccel-notebooks-") as scratch:
        os.environ["TMPDIR"] = scratch  # the notebooks' temporary files, deleted after
        for name in argv or sorted(IMAGES):
            path = NOTEBOOKS / (name if name.endswith(".ipynb") else f"{name}.ipynb")
            started = time.perf_counter()
            notebook = nbformat.read(path, as_version=4)
            try:
                execute(notebook, path.parent)
            except CellExecutionError as error:
                print(f"{path.name}: FAILED\n{error}", file=sys.stderr)
                return 1
            nbformat.write(notebook, path)
            print(f"{path.name}: executed in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
