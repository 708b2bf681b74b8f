import sys
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.linear_model import LinearRegression
from sklearn.neural_network import MLPClassifier, MLPRegressor

from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor
from onnxgrad_sklearn.plotting import plot_loss_curve

matplotlib = pytest.importorskip("matplotlib")
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _data(n=120):
    rng = np.random.RandomState(0)
    X = rng.randn(n, 4)
    y = X @ np.array([1.0, -2.0, 0.5, 0.0]) + 0.1 * rng.randn(n)
    return X, y


def _fit(est, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return est.fit(X, y)


@pytest.fixture(scope="module")
def regressor():
    X, y = _data()
    est = OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(8,)),
        optimizer="adam",
        learning_rate_init=0.01,
        max_iter=6,
        random_state=0,
    )
    return _fit(est, X, y)


@pytest.fixture(scope="module")
def early_stopped():
    X, y = _data()
    est = OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(8,)),
        optimizer="adam",
        learning_rate_init=0.01,
        max_iter=6,
        early_stopping=True,
        validation_fraction=0.2,
        n_iter_no_change=50,
        random_state=0,
    )
    return _fit(est, X, y)


def _agg_axes():
    fig = Figure(figsize=(6, 4))
    FigureCanvasAgg(fig)
    return fig.subplots()


def test_png_is_a_real_image(regressor, tmp_path):
    ax = plot_loss_curve(regressor, ax=_agg_axes())
    path = tmp_path / "loss.png"
    ax.figure.savefig(path, dpi=80)
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.shape == (320, 480, 4)  # 6 x 4 inches at 80 dpi, RGBA
    pixels = image.reshape(-1, image.shape[-1])
    assert len(np.unique(pixels, axis=0)) > 10  # drawn, not a blank canvas


def test_loss_line_holds_loss_curve(regressor):
    ax = _agg_axes()
    assert plot_loss_curve(regressor, ax=ax) is ax
    lines = ax.get_lines()
    assert len(lines) == 1
    assert len(ax.figure.axes) == 1  # no validation axis without early stopping
    np.testing.assert_allclose(lines[0].get_ydata(), regressor.loss_curve_)
    np.testing.assert_array_equal(lines[0].get_xdata(), np.arange(1, regressor.n_iter_ + 1))
    assert ax.get_xlabel() == "epoch"
    assert ax.get_ylabel() == "training loss"
    assert "MLPRegressor" in ax.get_title()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["training loss (SquaredError())"]  # loss="auto": the template's


def test_validation_scores_on_second_axis(early_stopped):
    assert len(early_stopped.validation_scores_) == 6
    ax = plot_loss_curve(early_stopped, ax=_agg_axes())
    axes = ax.figure.axes
    assert len(axes) == 2
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), early_stopped.loss_curve_)
    (val_line,) = axes[1].get_lines()
    np.testing.assert_allclose(val_line.get_ydata(), early_stopped.validation_scores_)
    assert axes[1].get_ylabel() == "validation score (R2)"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["training loss (SquaredError())", "validation score (R2)"]


def test_classifier_validation_is_accuracy():
    X, y = _data()
    labels = np.where(y > 0, "high", "low")
    clf = OrtGradientClassifier(
        MLPClassifier(hidden_layer_sizes=(4,)),
        learning_rate_init=0.01,
        max_iter=3,
        early_stopping=True,
        validation_fraction=0.25,
        random_state=0,
    )
    _fit(clf, X, labels)
    ax = plot_loss_curve(clf, ax=_agg_axes())
    twin = ax.figure.axes[1]
    assert twin.get_ylabel() == "validation score (accuracy)"
    np.testing.assert_allclose(twin.get_lines()[0].get_ydata(), clf.validation_scores_)


def test_wide_loss_range_uses_log_scale(regressor):
    mlp = _fit(MLPRegressor(hidden_layer_sizes=(3,), max_iter=3, random_state=0), *_data())
    mlp.loss_curve_ = [500.0, 20.0, 2.0]  # scikit-learn's MLP works too
    ax = plot_loss_curve(mlp, ax=_agg_axes())
    assert ax.get_yscale() == "log"
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), [500.0, 20.0, 2.0])
    assert plot_loss_curve(regressor, ax=_agg_axes()).get_yscale() == "linear"


def test_without_axes_draws_a_new_figure(regressor):
    plt = pytest.importorskip("matplotlib.pyplot")
    plt.switch_backend("agg")
    ax = plot_loss_curve(regressor)
    try:
        np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), regressor.loss_curve_)
    finally:
        plt.close(ax.figure)


def test_unfitted_estimator_raises_not_fitted():
    with pytest.raises(NotFittedError):
        plot_loss_curve(OrtGradientRegressor(MLPRegressor()), ax=_agg_axes())


def test_estimator_without_loss_curve_raises():
    fitted = LinearRegression().fit(*_data())
    with pytest.raises(ValueError, match="LinearRegression has no loss curve"):
        plot_loss_curve(fitted, ax=_agg_axes())


def test_missing_matplotlib_says_how_to_install(regressor, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install matplotlib .*onnxgrad-sklearn\[plot\]"):
        plot_loss_curve(regressor)
