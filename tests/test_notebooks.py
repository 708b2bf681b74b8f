"""The notebooks run from top to bottom, and are stored without outputs."""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook tests need nbformat")
nbclient = pytest.importorskip("nbclient", reason="the notebook tests need nbclient")
pytest.importorskip("ipykernel", reason="the notebook tests need ipykernel")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_the_three_notebooks_are_there():
    assert [p.name for p in NOTEBOOKS] == [
        "01_regression_quickstart.ipynb",
        "02_classification_gridsearch.ipynb",
        "03_custom_optimizer_and_loss.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    for number, cell in enumerate(notebook.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"cell {number} of {path.name} has outputs"
            assert cell.execution_count is None, f"cell {number} of {path.name} was run"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_without_errors(path, tmp_path):
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},  # the kernel's working directory
    )
    client.execute()  # raises CellExecutionError on the first failing cell
    errors = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "error"
    ]
    assert not errors
    if path.stem.startswith("01_"):
        assert (tmp_path / "diabetes_mlp.onnx").is_file()
        assert (tmp_path / "loss_curve.png").is_file()
