"""Errors that name their real cause, progress and messages that tell what happened."""

import logging
import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper
from sklearn.datasets import load_diabetes
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPRegressor
from sklearn.preprocessing import StandardScaler

from onnxgrad_sklearn import OrtGradientRegressor, _fit
from onnxgrad_sklearn.losses import OnnxLoss


def _data():
    X, y = load_diabetes(return_X_y=True)
    return StandardScaler().fit_transform(X), (y - y.mean()) / y.std()


def _scaled_squared_error(scale, keepdims=0, pad=0):
    """An ONNX loss ``scale * sum((p - t) ** 2)`` per sample; ``pad``: an unused constant."""
    nodes = [
        helper.make_node("Sub", ["p", "t"], ["r"]),
        helper.make_node("Mul", ["r", "r"], ["r2"]),
        helper.make_node("Mul", ["r2", "scale"], ["s"]),
        helper.make_node("ReduceSum", ["s", "axes"], ["loss"], keepdims=keepdims),
    ]
    inits = [
        helper.make_tensor("scale", TensorProto.FLOAT, [], [scale]),
        helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
    ]
    if pad:
        inits.append(helper.make_tensor("unused", TensorProto.FLOAT, [pad], [0.0] * pad))
    graph = helper.make_graph(
        nodes,
        "loss",
        [
            helper.make_tensor_value_info("p", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("t", TensorProto.FLOAT, None),
        ],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, None)],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_loss_of_the_wrong_shape_is_refused_at_graph_build_and_the_estimator_kept():
    X, y = _data()
    est = OrtGradientRegressor(optimizer="sgd", max_iter=2).fit(X, y)
    before = est.predict(X)
    bad = OnnxLoss(_scaled_squared_error(0.5, keepdims=1))  # (n, 1) instead of (n,)
    with pytest.raises(ValueError, match=r"shape \(n_samples, 1\).*one value per sample"):
        est.set_params(loss=bad).fit(X, y)
    np.testing.assert_array_equal(est.predict(X), before)  # still the first fit's model
    with pytest.raises(ValueError, match=r"one value per sample"):
        OrtGradientRegressor(loss=bad).fit(X, y)


def test_all_zero_sample_weights_are_refused_as_scikit_learn_refuses_them():
    X, y = _data()
    with pytest.raises(ValueError, match="Sample weights must contain at least one non-zero"):
        OrtGradientRegressor().fit(X, y, sample_weight=np.zeros(len(y)))


def test_a_batch_whose_weights_are_zero_makes_no_step_and_is_no_divergence():
    X, y = _data()
    X, y = X[:24], y[:24]
    weights = np.zeros(24)
    weights[16:] = 1.0  # batches of 8: only the last one counts
    params = dict(optimizer="sgd", batch_size=8, shuffle=False, max_iter=1, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(4,)), **params)
        ours.fit(X, y, sample_weight=weights)
        last = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(4,)), **params)
        last.fit(X[16:], y[16:])
    for a, b in zip(ours.estimator_.coefs_, last.estimator_.coefs_):
        np.testing.assert_allclose(a, b, rtol=1e-6)  # one step, on the last batch only
    # 90% zero weights in batches of 8: training goes on, nothing reads as divergence
    rng = np.random.RandomState(0)
    X, y = _data()
    sparse = (rng.rand(len(y)) < 0.1).astype(float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = OrtGradientRegressor(optimizer="adam", batch_size=8, max_iter=5, random_state=0)
        est.fit(X, y, sample_weight=sparse)
    assert np.isfinite(est.loss_curve_).all() and np.isfinite(est.predict(X)).all()


def test_n_iter_no_change_may_be_infinite():
    X, y = _data()
    est = OrtGradientRegressor(optimizer="adam", max_iter=6, tol=10.0, n_iter_no_change=np.inf)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(X, y)
    assert est.n_iter_ == 6  # no improvement of 10 ever, and no stop


def test_the_engine_is_reused_only_for_a_loss_equal_in_its_parameters():
    X, y = _data()
    # Two losses whose reprs are cut to the same text: only their graphs differ.
    first, second = (OnnxLoss(_scaled_squared_error(s, pad=4000)) for s in (0.5, 2.0))
    assert repr(first) == repr(second)
    est = OrtGradientRegressor(loss=first, optimizer="sgd", max_iter=1, warm_start=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(X, y)
        engine = est._engine
        loss_first = engine.loss(X, y.reshape(-1, 1))
        est.set_params(loss=second).fit(X, y)
    assert est._engine is not engine
    # the new engine's loss is four times the old one at the same weights
    est._engine.set_weights(engine.get_weights())
    assert est._engine.loss(X, y.reshape(-1, 1)) == pytest.approx(4 * loss_first, rel=1e-5)
    est.set_params(loss=OnnxLoss(_scaled_squared_error(2.0, pad=4000)))  # equal: reused
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        engine = est._engine
        est.fit(X, y)
    assert est._engine is engine


class _RecordingBar:
    def __init__(self, events, total):
        self.events, self.total, self.n, self.postfix = events, total, 0, None

    def set_postfix(self, post=None, refresh=True, **kwargs):
        self.postfix = dict(post or {}, **kwargs)
        if refresh:
            self.events.append(("shown", self.n, self.postfix))

    def update(self, k):
        self.n += k
        self.events.append(("shown", self.n, self.postfix))

    def write(self, line):
        self.events.append(("line", line))

    def close(self):
        self.events.append(("closed",))


def test_progress_shows_each_epoch_with_its_loss_and_warns_after_the_bar(monkeypatch):
    X, y = _data()
    events = []

    def progress(show, total, desc, unit, leave=True):
        return _RecordingBar(events, total) if show and unit == "epoch" else None

    monkeypatch.setattr(_fit, "_progress", progress)

    def showwarning(message, *args, **kwargs):
        events.append(("warning", str(message)))

    monkeypatch.setattr(warnings, "showwarning", showwarning)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = showwarning
        est = OrtGradientRegressor(optimizer="adam", max_iter=3, verbose=1).fit(X, y)
    shown = [e for e in events if e[0] == "shown"]
    assert [n for _, n, _ in shown] == [1, 2, 3]
    for _, n, post in shown:
        assert post["loss"] == f"{est.loss_curve_[n - 1]:.6g}"  # the loss of epoch n
    kinds = [e[0] for e in events]
    assert kinds.index("closed") < kinds.index("warning")
    assert "Maximum iterations (3)" in [e for e in events if e[0] == "warning"][0][1]


def test_early_stopping_says_when_it_stopped_and_which_epoch_is_kept(caplog):
    X, y = _data()
    est = OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(32,)),
        optimizer="adam",
        learning_rate_init=0.05,
        early_stopping=True,
        n_iter_no_change=3,
        max_iter=200,
        random_state=0,
    )
    with caplog.at_level(logging.INFO, logger="onnxgrad_sklearn"):
        est.fit(X, y)
    assert est.n_iter_ < 200
    kept = int(np.argmax(est.validation_scores_)) + 1
    lines = [r.getMessage() for r in caplog.records if "Early stopping" in r.getMessage()]
    assert len(lines) == 1
    assert f"Early stopping at epoch {est.n_iter_}" in lines[0]
    assert f"Keeping the weights of epoch {kept}" in lines[0]


@pytest.mark.parametrize("when", ["before", "after"])
def test_the_logging_recipe_works_before_or_after_the_runtime_is_loaded(when):
    import subprocess
    import sys
    import textwrap

    configure = "logging.basicConfig(level=logging.INFO)"
    code = textwrap.dedent(
        f"""
        import logging, warnings
        import numpy as np
        warnings.simplefilter("ignore")
        {configure if when == "before" else ""}
        from onnxgrad_sklearn import OrtGradientRegressor
        X = np.random.RandomState(0).rand(50, 3); y = X.sum(axis=1)
        OrtGradientRegressor(max_iter=2).fit(X, y)  # the runtime is loaded here
        {configure if when == "after" else ""}
        OrtGradientRegressor(max_iter=2).fit(X, y)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("INFO:onnxgrad_sklearn")]
    assert any("Iteration 2, loss" in line for line in lines)
    assert any("backend:" in line for line in lines)


def test_a_model_fitted_on_cuda_loads_and_predicts_on_the_cpu_with_a_warning():
    import pickle

    X, y = _data()
    est = OrtGradientRegressor(optimizer="adam", max_iter=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(X, y)
    expected = est.predict(X)
    est.device = "cuda"  # as if fitted on a GPU machine (none here: CI has no GPU)
    with pytest.warns(UserWarning, match=r"fitted with device='cuda'.*predicts on the CPU"):
        loaded = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(loaded.predict(X), expected)
