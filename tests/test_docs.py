"""The Sphinx documentation builds without warnings, and its examples run."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx", reason="the docs need sphinx")
pytest.importorskip("numpydoc", reason="the docs need numpydoc")
pytest.importorskip("myst_parser", reason="the docs need myst-parser")

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

#: Pages whose Python blocks run as they are, top to bottom, in one namespace.
RUNNABLE_PAGES = ["getting_started.md", "extending.md"]


@pytest.fixture(scope="module")
def html(tmp_path_factory):
    """Build the HTML pages with warnings as errors; return the output folder."""
    out = tmp_path_factory.mktemp("html")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", str(DOCS), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, (
        f"sphinx failed with exit code {result.returncode}\n"
        f"{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
    )
    return out


def test_docs_build_without_warnings(html):
    assert (html / "index.html").is_file()


def test_api_page_documents_the_public_objects(html):
    page = (html / "api.html").read_text(encoding="utf-8")
    assert "OrtGradientRegressor" in page
    assert "ConvergenceError" in page
    for target in [
        "onnxgrad_sklearn.OrtGradientRegressor",
        "onnxgrad_sklearn.OrtGradientClassifier",
        "onnxgrad_sklearn.ConvergenceError",
        "onnxgrad_sklearn.GraphBuilder",
        "onnxgrad_sklearn.OrtGradientForwardBackward",
        "onnxgrad_sklearn.TrainingAgent",
        "onnxgrad_sklearn.losses.BaseLoss",
        "onnxgrad_sklearn.losses.OnnxLoss",
        "onnxgrad_sklearn.optim.BaseOptimizer",
        "onnxgrad_sklearn.optim.Adam",
        "onnxgrad_sklearn.optim.LearningRateSchedule",
        "onnxgrad_sklearn.engine.TrainingEngine",
        "onnxgrad_sklearn.engine.build_training_graph",
        "onnxgrad_sklearn.plotting.plot_loss_curve",
    ]:
        assert f'id="{target}"' in page, f"{target} has no entry in the API page"


def test_how_it_works_page_names_the_modules(html):
    page = html / "how_it_works.html"
    assert page.is_file()
    text = page.read_text(encoding="utf-8")
    for module in ["templates.py", "engine.py", "ortgrad.py", "optim.py", "_base.py"]:
        assert module in text


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("page", RUNNABLE_PAGES)
def test_python_examples_of_the_page_run(page, tmp_path, monkeypatch):
    text = (DOCS / page).read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    assert blocks, f"no Python example in {page}"
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"docs_{Path(page).stem}"}
    for number, block in enumerate(blocks, 1):
        exec(compile(block, f"{page}, example {number}", "exec"), namespace)
