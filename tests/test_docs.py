"""The Sphinx documentation builds without warnings, and its examples run."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx", reason="the docs need sphinx")
pytest.importorskip("numpydoc", reason="the docs need numpydoc")
pytest.importorskip("myst_parser", reason="the docs need myst-parser")
pytest.importorskip("pydata_sphinx_theme", reason="the docs need pydata-sphinx-theme")
pytest.importorskip("sphinx_gallery", reason="the gallery needs sphinx-gallery")
pytest.importorskip("matplotlib", reason="the gallery examples draw with matplotlib")
pytest.importorskip("pandas", reason="a gallery example trains on a DataFrame")
pytest.importorskip("sklearn.callback", reason="callbacks.md and an example need scikit-learn 1.9")
pytest.importorskip("rich", reason="callbacks.md shows ProgressBar, which needs rich")

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXAMPLES = sorted((ROOT / "examples").glob("plot_*.py"))

#: The build, gallery included, must stay well under this many seconds.
BUILD_TIMEOUT_S = 300

#: Pages whose Python blocks run as they are, top to bottom, in one namespace.
RUNNABLE_PAGES = ["getting_started.md", "extending.md", "callbacks.md"]


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """Build the HTML pages with warnings as errors; return (output folder, stdout)."""
    out = tmp_path_factory.mktemp("html")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", str(DOCS), str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        env={**os.environ, "MPLBACKEND": "agg"},
    )
    assert result.returncode == 0, (
        f"sphinx failed with exit code {result.returncode}\n"
        f"{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
    )
    return out, result.stdout


@pytest.fixture(scope="module")
def html(build):
    return build[0]


@pytest.mark.slow
def test_docs_build_without_warnings(html):
    assert (html / "index.html").is_file()


def test_theme_bar_links_the_main_sections(html):
    page = (html / "index.html").read_text(encoding="utf-8")
    assert "pydata-sphinx-theme" in page or "pydata_sphinx_theme" in page
    for target in [
        "getting_started.html",
        "user_guide.html",
        "auto_examples/index.html",
        "when_to_use.html",
        "performance.html",
        "api.html",
    ]:
        assert f'href="{target}"' in page, f"the top bar has no link to {target}"


def test_gallery_runs_every_example(build):
    """Every script of examples/ runs at each build (none is skipped as unchanged)."""
    html, stdout = build
    assert EXAMPLES, "no example in examples/"
    assert f"executed {len(EXAMPLES)} out of {len(EXAMPLES)} files" in stdout
    gallery = (html / "auto_examples" / "index.html").read_text(encoding="utf-8")
    for script in EXAMPLES:
        page = html / "auto_examples" / f"{script.stem}.html"
        assert page.is_file(), f"{script.name} has no page"
        assert f"{script.stem}.html" in gallery, f"{script.name} is not in the gallery"
        assert (html / "_images" / f"sphx_glr_{script.stem}_001.png").is_file(), (
            f"{script.name} drew no figure"
        )


@pytest.mark.parametrize(
    "example, expected",
    [
        ("plot_1_loss_curve", "epochs on the"),
        ("plot_2_quantile_bands", "of the training points below"),
        ("plot_3_finetune_logistic", "fine-tuned: accuracy"),
        ("plot_4_dataframe_pipeline", "largest difference to predict: 0.0"),
        ("plot_5_custom_loss", "backend: standard"),
        ("plot_6_scoring_monitor", "epoch rows and one for the fit"),
        ("plot_7_onnx_cnn", "frozen weights unchanged: True"),
    ],
)
def test_gallery_example_shows_its_result(html, example, expected):
    """The outputs the text of each example describes are on its page."""
    text = (html / "auto_examples" / f"{example}.html").read_text(encoding="utf-8")
    assert expected in text


def test_quantile_bands_hold_their_quantiles(html):
    """On the training points, the fraction below each curve is its quantile."""
    text = (html / "auto_examples" / "plot_2_quantile_bands.html").read_text(encoding="utf-8")
    found = re.findall(r"quantile (0\.\d): ([\d.]+)% of the training points below", text)
    assert [q for q, _ in found] == ["0.1", "0.5", "0.9"]
    for q, below in found:
        assert abs(float(below) - 100 * float(q)) <= 1.5, (q, below)


def test_scoring_monitor_example_scores_the_kept_epoch(html):
    """The monitor's row for the fit, its row for the kept epoch and score() agree."""
    text = (html / "auto_examples" / "plot_6_scoring_monitor.html").read_text(encoding="utf-8")
    found = re.search(
        r"kept epoch (\d+): training R2 ([-\d.]+) in the fit.s row, ([-\d.]+) in the "
        r"epoch.s row, ([-\d.]+) from reg.score",
        text,
    )
    assert found, "the example does not print its kept epoch"
    assert int(found[1]) > 1 and found[2] == found[3] == found[4]


def test_user_pages_are_built(html):
    for page in ["performance.html", "when_to_use.html"]:
        assert (html / page).is_file()
    performance = (html / "performance.html").read_text(encoding="utf-8")
    assert "benchmark.png" in performance
    assert "benchmarks/bench.py" in performance


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
