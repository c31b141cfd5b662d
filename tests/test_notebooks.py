"""Every notebook in notebooks/ runs top to bottom without an error, and is
stored without outputs (so what is committed can never show stale results).

The notebooks run in a Jupyter kernel of this interpreter (``sys.executable``,
through a kernelspec written for the test), in a temporary working directory,
with the environment of the test session (its private ``LAZYTPU_CACHE_DIR``).
``NOTEBOOKS_OUT=dir`` keeps the executed notebooks, outputs included, in
``dir`` (``make notebooks`` does this).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import nbclient
import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
KERNEL = "lazytpu-tests"
CELL_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory) -> Path:
    """A kernelspec that runs ipykernel with this interpreter, whatever other
    ``python3`` kernelspecs the machine has."""
    root = tmp_path_factory.mktemp("kernels")
    spec = root / KERNEL
    spec.mkdir()
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"}))
    return root


def _execute(nb, kernel_dir: Path, cwd: Path):
    manager = AsyncKernelManager(
        kernel_name=KERNEL, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernel_dir)])
    )
    client = nbclient.NotebookClient(
        nb, km=manager, timeout=CELL_TIMEOUT_S, allow_errors=False, resources={"metadata": {"path": str(cwd)}}
    )
    client.execute()  # raises CellExecutionError at the first failing cell
    return nb


@pytest.fixture
def quiet_kernel_env(monkeypatch):
    # ipykernel's debugger warns about frozen modules on every start.
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")


def test_there_are_notebooks():
    names = [p.name for p in NOTEBOOKS]
    for expected in (
        "01_quickstart",
        "02_porting_from_cuda",
        "03_defer_and_fuse",
        "04_recompiles",
        "05_distributed",
        "06_generation",
    ):
        assert f"{expected}.ipynb" in names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name} cell {i} has outputs"


def test_kernel_is_this_interpreter(kernel_dir, tmp_path, quiet_kernel_env):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import sys; print(sys.executable)")])
    _execute(nb, kernel_dir, tmp_path)
    printed = "".join(out.get("text", "") for out in nb.cells[0].outputs).strip()
    assert Path(printed).resolve() == Path(sys.executable).resolve()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, kernel_dir, tmp_path, quiet_kernel_env):
    nb = _execute(nbformat.read(path, as_version=4), kernel_dir, tmp_path)
    errors = [out for cell in nb.cells for out in cell.get("outputs", []) if out.output_type == "error"]
    assert not errors
    out_dir = os.environ.get("NOTEBOOKS_OUT")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, Path(out_dir) / path.name)
