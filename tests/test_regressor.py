"""OrtGradientRegressor end to end: predictions, accuracy, losses, errors, reproducibility."""

import copy
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnxruntime
import pytest
from _helpers import BACKENDS, onnx_predict, rel_error
from onnx import TensorProto, helper
from sklearn.datasets import load_diabetes
from sklearn.decomposition import PCA
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import ElasticNet, Lasso, LinearRegression, Ridge, SGDRegressor
from sklearn.metrics import mean_absolute_error, r2_score
from sklearn.model_selection import train_test_split
from sklearn.neighbors import KNeighborsRegressor
from sklearn.neural_network import MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import MinMaxScaler, PolynomialFeatures, StandardScaler
from sklearn.tree import DecisionTreeRegressor

from onnxgrad_sklearn import OrtGradientRegressor
from onnxgrad_sklearn.losses import BaseLoss, OnnxLoss, Quantile, SquaredError
from onnxgrad_sklearn.optim import BaseOptimizer

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


TEMPLATES = [
    LinearRegression(),
    Ridge(alpha=0.5),
    Lasso(alpha=0.01),
    ElasticNet(alpha=0.01),
    SGDRegressor(),
    MLPRegressor(hidden_layer_sizes=(8,), activation="relu"),
    MLPRegressor(hidden_layer_sizes=(8, 4), activation="tanh"),
    MLPRegressor(hidden_layer_sizes=(8,), activation="logistic"),
    MLPRegressor(hidden_layer_sizes=(8,), activation="identity"),
    make_pipeline(StandardScaler(), LinearRegression()),
    make_pipeline(MinMaxScaler(), MLPRegressor(hidden_layer_sizes=(6,))),
    make_pipeline(PCA(3), Ridge()),
    make_pipeline(PolynomialFeatures(2), Lasso(alpha=0.01)),
]


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda t: type(t).__name__ + str(id(t))[-3:])
def test_predict_estimator_and_onnx_export_agree(template, regression_data):
    X, y = regression_data
    reg = OrtGradientRegressor(
        template,
        optimizer="adam",
        learning_rate_init=0.01,
        batch_size=16,
        max_iter=30,
        random_state=0,
    ).fit(X, y)
    pred = reg.predict(X)
    assert pred.shape == (X.shape[0],)
    assert rel_error(reg.estimator_.predict(X), pred) < 1e-5
    onnx_pred = onnx_predict(reg.to_onnx(), X).ravel()
    assert rel_error(onnx_pred, pred) < 1e-5
    # training moved the model towards the targets
    assert reg.loss_curve_[-1] < reg.loss_curve_[0]
    assert r2_score(y, pred) > 0.1


def test_onnx_export_keeps_skl2onnx_inputs_and_outputs(regression_data):
    X, y = regression_data
    from skl2onnx import to_onnx

    mlp = MLPRegressor(hidden_layer_sizes=(5,), max_iter=5, random_state=0).fit(X, y)
    reg = OrtGradientRegressor(mlp, max_iter=2).fit(X, y)
    ref = to_onnx(mlp, X[:1].astype(np.float32))
    model = reg.to_onnx()
    assert [i.name for i in model.graph.input] == [i.name for i in ref.graph.input]
    assert [o.name for o in model.graph.output] == [o.name for o in ref.graph.output]
    onnx.checker.check_model(model)


def test_multi_output_regression(regression_data):
    X, y = regression_data
    Y = np.c_[y, -2 * y + 1]
    for template in (LinearRegression(), MLPRegressor(hidden_layer_sizes=(8,))):
        reg = OrtGradientRegressor(
            template, optimizer="adam", learning_rate_init=0.02, max_iter=40, random_state=0
        ).fit(X, Y)
        pred = reg.predict(X)
        assert pred.shape == (X.shape[0], 2)
        assert rel_error(reg.estimator_.predict(X), pred) < 1e-5
        assert r2_score(Y, pred) > 0.5


def _diabetes():
    X, y = load_diabetes(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0)
    scaler = StandardScaler().fit(X_train)
    mean, std = y_train.mean(), y_train.std()
    return (
        scaler.transform(X_train),
        scaler.transform(X_test),
        (y_train - mean) / std,
        (y_test - mean) / std,
    )


@pytest.mark.parametrize(
    "optimizer,sk_params",
    [
        ("nesterov", dict(solver="sgd", momentum=0.9)),
        ("adam", dict(solver="adam")),
    ],
)
def test_diabetes_r2_matches_mlpregressor(optimizer, sk_params):
    X_train, X_test, y_train, y_test = _diabetes()
    params = dict(learning_rate_init=0.005, batch_size=32, max_iter=30, random_state=1)
    ours = OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(32,)), optimizer=optimizer, **params
    ).fit(X_train, y_train)
    ref = MLPRegressor(hidden_layer_sizes=(32,), **sk_params, **params).fit(X_train, y_train)
    r2_ours = r2_score(y_test, ours.predict(X_test))
    r2_ref = r2_score(y_test, ref.predict(X_test))
    assert r2_ref > 0.3
    assert abs(r2_ours - r2_ref) < 0.02


def test_fine_tuning_with_absolute_error_lowers_training_mae():
    X_train, _, y_train, _ = _diabetes()
    y_train = y_train.copy()
    y_train[:15] += 8.0  # outliers pull least squares away from the median
    lr = LinearRegression().fit(X_train, y_train)
    before = mean_absolute_error(y_train, lr.predict(X_train))
    reg = OrtGradientRegressor(
        lr,
        loss="absolute_error",
        optimizer="adam",
        learning_rate_init=0.01,
        max_iter=40,
        alpha=0.0,
        random_state=0,
    ).fit(X_train, y_train)
    after = mean_absolute_error(y_train, reg.predict(X_train))
    assert after < before - 0.02
    # the template passed in is never modified
    np.testing.assert_array_equal(lr.coef_, LinearRegression().fit(X_train, y_train).coef_)


def test_quantile_loss_leaves_the_quantile_below_the_prediction():
    rng = np.random.RandomState(0)
    X = rng.randn(2000, 3)
    y = X @ [1.0, -1.0, 0.5] + rng.standard_t(3, 2000)
    reg = OrtGradientRegressor(
        LinearRegression(),
        loss=Quantile(quantile=0.9),
        optimizer="adam",
        learning_rate_init=0.02,
        max_iter=60,
        alpha=0.0,
        random_state=0,
    ).fit(X, y)
    below = np.mean(y <= reg.predict(X))
    assert abs(below - 0.9) < 0.03


@pytest.mark.parametrize(
    "template,name",
    [
        (DecisionTreeRegressor(), "DecisionTreeRegressor"),
        (KNeighborsRegressor(), "KNeighborsRegressor"),
        (make_pipeline(StandardScaler(), DecisionTreeRegressor()), "DecisionTreeRegressor"),
    ],
)
def test_models_without_weights_are_refused_with_their_name(template, name, regression_data):
    X, y = regression_data
    with pytest.raises(ValueError, match=name + r".*cannot be trained by gradient descent"):
        OrtGradientRegressor(template).fit(X, y)


def test_same_random_state_gives_bit_identical_weights(regression_data):
    X, y = regression_data

    def fit():
        return OrtGradientRegressor(
            MLPRegressor(hidden_layer_sizes=(16,)),
            optimizer="adam",
            batch_size=16,
            learning_rate_init=0.01,
            max_iter=8,
            random_state=42,
        ).fit(X, y)

    a, b = fit(), fit()
    for wa, wb in zip(
        a.estimator_.coefs_ + a.estimator_.intercepts_,
        b.estimator_.coefs_ + b.estimator_.intercepts_,
    ):
        np.testing.assert_array_equal(wa, wb)
    assert a.loss_curve_ == b.loss_curve_
    c = fit().set_params(random_state=43).fit(X, y)
    assert not np.array_equal(a.estimator_.coefs_[0], c.estimator_.coefs_[0])


class SignSGD(BaseOptimizer):
    """A user-written optimizer: move each weight by the sign of its gradient."""

    def __init__(self, scale=1.0):
        self.scale = scale

    def update(self, g, param, grad, state, learning_rate):
        step = g.mul(g.mul(learning_rate, g.const(self.scale)), g.op("Sign", grad))
        return g.sub(param, step), {}


def test_user_optimizer_subclass(regression_data):
    X, y = regression_data
    lr = LinearRegression().fit(X, y + 0.5 * X[:, 0] ** 2)
    reg = OrtGradientRegressor(
        lr,
        optimizer=SignSGD(scale=2.0),
        learning_rate_init=0.01,
        batch_size=X.shape[0],
        shuffle=False,
        max_iter=1,
        alpha=0.0,
    ).fit(X, y)
    # closed-form gradient of 0.5 * mean((y - Xw - b)^2)
    residual = y - lr.predict(X)
    grad_coef = -(X.T @ residual) / X.shape[0]
    grad_intercept = -residual.mean()
    np.testing.assert_allclose(
        reg.estimator_.coef_, lr.coef_ - 0.02 * np.sign(grad_coef), rtol=1e-6, atol=1e-6
    )
    assert reg.estimator_.intercept_ == pytest.approx(
        lr.intercept_ - 0.02 * np.sign(grad_intercept), abs=1e-6
    )


def _squared_error_graph():
    pred = helper.make_tensor_value_info("pred", TensorProto.FLOAT, [None, None])
    true = helper.make_tensor_value_info("true", TensorProto.FLOAT, [None, None])
    out = helper.make_tensor_value_info("per_sample", TensorProto.FLOAT, [None])
    nodes = [
        helper.make_node("Sub", ["pred", "true"], ["diff"]),
        helper.make_node("Mul", ["diff", "diff"], ["sq"]),
        helper.make_node("Mul", ["sq", "half"], ["hsq"]),
        helper.make_node("ReduceSum", ["hsq", "axes"], ["per_sample"], keepdims=0),
    ]
    inits = [
        helper.make_tensor("half", TensorProto.FLOAT, [], [0.5]),
        helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
    ]
    return helper.make_graph(nodes, "sq", [pred, true], [out], inits)


class DoubledSquaredError(BaseLoss):
    """A user-written loss: twice the squared error."""

    def build(self, g, y_pred, y_true):
        return g.mul(SquaredError().build(g, y_pred, y_true), g.const(2.0))


def test_user_losses_as_onnx_graph_and_as_subclass(regression_data):
    X, y = regression_data
    params = dict(optimizer="sgd", shuffle=False, max_iter=3, alpha=0.0, random_state=0)
    template = MLPRegressor(hidden_layer_sizes=(6,))
    ref = OrtGradientRegressor(template, learning_rate_init=0.02, **params).fit(X, y)
    graph = OrtGradientRegressor(
        template, loss=OnnxLoss(_squared_error_graph()), learning_rate_init=0.02, **params
    ).fit(X, y)
    doubled = OrtGradientRegressor(
        template, loss=DoubledSquaredError(), learning_rate_init=0.01, **params
    ).fit(X, y)
    for other in (graph, doubled):
        for a, b in zip(other.estimator_.coefs_, ref.estimator_.coefs_):
            assert rel_error(a, b) < 1e-5
    np.testing.assert_allclose(graph.loss_curve_, ref.loss_curve_, rtol=1e-6)
    np.testing.assert_allclose(doubled.loss_curve_, 2 * np.array(ref.loss_curve_), rtol=1e-5)


def test_sample_weight_two_equals_a_duplicated_row(regression_data):
    X, y = regression_data
    X, y = X[:50], y[:50]
    sw = np.ones(50)
    sw[[3, 17]] = 2.0
    X_dup = np.r_[X, X[[3, 17]]]
    y_dup = np.r_[y, y[[3, 17]]]
    params = dict(
        optimizer="momentum", learning_rate_init=0.05, shuffle=False, max_iter=5, random_state=0
    )
    template = MLPRegressor(hidden_layer_sizes=(5,))
    weighted = OrtGradientRegressor(template, batch_size=50, **params).fit(X, y, sw)
    duplicated = OrtGradientRegressor(template, batch_size=52, **params).fit(X_dup, y_dup)
    for a, b in zip(weighted.estimator_.coefs_, duplicated.estimator_.coefs_):
        assert rel_error(a, b) < 1e-5
    unweighted = OrtGradientRegressor(template, batch_size=50, **params).fit(X, y)
    assert rel_error(unweighted.estimator_.coefs_[0], weighted.estimator_.coefs_[0]) > 1e-4


def test_adaptive_schedule_and_stopping_follow_mlpregressor(regression_data):
    X, y = regression_data
    common = dict(
        learning_rate_init=0.01,
        tol=10.0,
        n_iter_no_change=2,
        max_iter=7,
        random_state=0,
        shuffle=False,
    )
    for schedule in ("adaptive", "constant"):
        ours = OrtGradientRegressor(
            MLPRegressor(hidden_layer_sizes=(4,)),
            optimizer="sgd",
            learning_rate=schedule,
            **common,
        ).fit(X, y)
        ref = MLPRegressor(
            hidden_layer_sizes=(4,),
            solver="sgd",
            momentum=0.0,
            learning_rate=schedule,
            **common,
        ).fit(X, y)
        assert ours.n_iter_ == ref.n_iter_
        assert ours._schedule.learning_rate == pytest.approx(ref._optimizer.learning_rate)
    assert ours.n_iter_ == 4  # constant: the first epoch sets best_loss_, 3 more fail


def test_early_stopping_matches_mlpregressor_and_keeps_best_weights():
    X_train, _, y_train, _ = _diabetes()
    common = dict(
        learning_rate_init=0.05,
        batch_size=16,
        max_iter=200,
        random_state=0,
        early_stopping=True,
        n_iter_no_change=5,
        alpha=0.0,
    )
    ours = OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(64,)), optimizer="adam", **common
    ).fit(X_train, y_train)
    ref = MLPRegressor(hidden_layer_sizes=(64,), solver="adam", **common).fit(X_train, y_train)
    assert ours.n_iter_ < 200
    assert ours.n_iter_ == ref.n_iter_
    np.testing.assert_allclose(ours.validation_scores_, ref.validation_scores_, rtol=1e-3)
    assert ours.best_validation_score_ == max(ours.validation_scores_)
    # the kept weights are the best epoch's, not the last one's
    for a, b in zip(ours.estimator_.coefs_, ref.coefs_):
        assert rel_error(a, b) < 1e-3


@pytest.mark.filterwarnings("ignore:X does not have valid feature names")
def test_fit_with_dataframe_records_feature_names(regression_data):
    pd = pytest.importorskip("pandas")
    X, y = regression_data
    df = pd.DataFrame(X, columns=[f"f{i}" for i in range(X.shape[1])])
    reg = OrtGradientRegressor(max_iter=3).fit(df, y)
    assert list(reg.feature_names_in_) == list(df.columns)
    np.testing.assert_allclose(reg.predict(df), reg.predict(X), rtol=1e-6)


def test_warm_start_continues_from_previous_weights(regression_data):
    X, y = regression_data
    reg = OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(6,)),
        optimizer="sgd",
        learning_rate_init=0.05,
        max_iter=3,
        random_state=0,
        shuffle=False,
        warm_start=True,
    )
    reg.fit(X, y)
    first = copy.deepcopy(reg.estimator_.coefs_)
    reg.fit(X, y)
    six = OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(6,)),
        optimizer="sgd",
        learning_rate_init=0.05,
        max_iter=6,
        random_state=0,
        shuffle=False,
    ).fit(X, y)
    assert rel_error(reg.estimator_.coefs_[0], first[0]) > 1e-4
    for a, b in zip(reg.estimator_.coefs_, six.estimator_.coefs_):
        assert rel_error(a, b) < 1e-5


def test_cuda_device_without_cuda_build_says_what_to_install(regression_data):
    X, y = regression_data
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("the CUDA build is installed")
    with pytest.raises(ValueError, match="onnxruntime-training==1.19.2"):
        OrtGradientRegressor(device="cuda:0").fit(X, y)
    with pytest.raises(ValueError, match="device='tpu' is not valid"):
        OrtGradientRegressor(device="tpu").fit(X, y)


def test_an_incomplete_onnxruntime_is_refused_at_first_use_with_the_fix(tmp_path):
    # A module 'onnxruntime' without OrtValue and IO binding (overwritten files): plain
    # onnxruntime itself is fine (the standard backend), see tests/test_backends.py.
    # The package imports without onnxruntime; the first fit checks it.
    fake = tmp_path / "onnxruntime"
    (fake / "capi").mkdir(parents=True)
    (fake / "__init__.py").write_text("__version__ = '1.19.2'\n")
    (fake / "capi" / "__init__.py").write_text("")
    (fake / "capi" / "_pybind_state.py").write_text("class InferenceSession: pass\n")
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import numpy as np
        import onnxgrad_sklearn
        print("IMPORTED")
        X = np.arange(20, dtype=np.float32).reshape(10, 2)
        try:
            onnxgrad_sklearn.OrtGradientRegressor(max_iter=1).fit(X, X[:, 0])
        except ImportError as exc:
            print("IMPORTERROR", exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "IMPORTED" in out.stdout, out.stderr
    assert "IMPORTERROR" in out.stdout, out.stderr
    assert "pip install onnxruntime-training-cpu==1.19.2" in out.stdout


def test_verbose_shows_progress_bars_over_epochs_and_batches(regression_data, capsys):
    X, y = regression_data
    sgd = dict(optimizer="sgd", batch_size=40)
    OrtGradientRegressor(max_iter=3, verbose=1, **sgd).fit(X, y)
    err = capsys.readouterr().err
    assert "3/3" in err and "epoch" in err and "loss=" in err
    assert "batch" not in err
    OrtGradientRegressor(max_iter=2, verbose=2, **sgd).fit(X, y)
    err = capsys.readouterr().err
    assert "/3 [" in err and "batch/s" in err  # 120 rows in batches of 40
    OrtGradientRegressor(max_iter=2, **sgd).fit(X, y)
    assert capsys.readouterr().err == ""
    # L-BFGS (the default for a linear template): a bar over its iterations
    est = OrtGradientRegressor(verbose=1).fit(X, y)
    err = capsys.readouterr().err
    assert f"{est.n_iter_}/200" in err and "iter" in err and "loss=" in err


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("early_stopping", [False, True])
def test_a_fitted_mlp_keeps_one_copy_of_its_weights(regression_data, early_stopping, backend):
    X, y = regression_data
    est = OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(8,)),
        early_stopping=early_stopping,
        backend=backend,
        max_iter=4,
        random_state=0,
    ).fit(X, y)
    final = est.estimator_
    # MLPRegressor's best weights are the trained ones, as it leaves them after early
    # stopping: views of coefs_, not the initial weights kept for the model's life
    for best, trained in zip(
        final._best_coefs + final._best_intercepts, final.coefs_ + final.intercepts_
    ):
        assert np.shares_memory(best, trained)
    # no session keeps the serialized model it was made from (a copy of the weights)
    sessions = [est._session, est._logit_session]
    if early_stopping:  # validation predictions ran in the training backend's session
        trainer = est._engine._backend
        sessions.append(
            trainer._predict if backend == "standard" else trainer.forward_backward.eval_session
        )
    for session in sessions:
        assert session is not None and getattr(session, "_model_bytes", None) is None
        assert not session._enable_fallback  # which would make the session again from them
    # which changes nothing the estimator gives: predict, the export, estimator_ itself
    expected = est.predict(X)
    np.testing.assert_allclose(
        onnx_predict(est.to_onnx(), X).ravel(), expected, rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(final.predict(X), expected, rtol=1e-4, atol=1e-4)
    # and scikit-learn's own partial_fit goes on from the trained weights
    reference = copy.deepcopy(final)
    reference.coefs_ = [c.copy() for c in final.coefs_]
    reference.intercepts_ = [i.copy() for i in final.intercepts_]
    final.partial_fit(X, y)
    reference.partial_fit(X, y)
    for a, b in zip(final.coefs_, reference.coefs_):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("warm_start", [False, True])
def test_a_large_models_estimator_and_onnx_hold_no_weights_while_it_trains(
    monkeypatch, backend, warm_start
):
    """Models of a million weights or more: during training the weights are only in the
    engine; the fit gives the same model as with the copies kept."""
    from onnxgrad_sklearn import runtime
    from onnxgrad_sklearn.engine import TrainingEngine

    X, y = load_diabetes(return_X_y=True)
    X = StandardScaler().fit_transform(X)

    def make():
        return OrtGradientRegressor(
            make_pipeline(StandardScaler(), MLPRegressor(hidden_layer_sizes=(16,))),
            backend=backend,
            max_iter=3,
            random_state=0,
            warm_start=warm_start,
        )

    reference = make().fit(X, y).fit(X, y)
    seen = []
    original = TrainingEngine.train_batch

    def train_batch(self, *args):
        if not seen:
            coefs = est.estimator_[-1].coefs_
            seen.append([c.strides for c in coefs])
            seen.append(bool(np.isnan(coefs[0]).all()))
            for call in (lambda: est.predict(X[:2]), est.to_onnx):
                with pytest.raises(RuntimeError, match="while a fit of this estimator"):
                    call()
        return original(self, *args)

    monkeypatch.setattr(runtime, "LARGE_MODEL", 0)  # as for a model of 1M weights
    monkeypatch.setattr(runtime, "map_large_blocks", lambda threshold: False)  # not here
    monkeypatch.setattr(TrainingEngine, "train_batch", train_batch)
    est = make()
    est.fit(X, y)
    assert seen[0] == [(0, 0), (0, 0)] and seen[1]
    seen.clear()
    est.fit(X, y)  # the second fit (a warm start or not) too
    assert seen[0] == [(0, 0), (0, 0)] and seen[1]  # placeholders: one NaN each
    assert est.loss_curve_ == reference.loss_curve_
    np.testing.assert_array_equal(est.predict(X), reference.predict(X))
    for a, b in zip(est.estimator_[-1].coefs_, reference.estimator_[-1].coefs_):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(est.estimator_.predict(X), est.predict(X), rtol=1e-5, atol=1e-3)
    exported = onnx_predict(est.to_onnx(), X)
    np.testing.assert_allclose(exported.ravel(), est.predict(X), rtol=1e-5, atol=1e-3)
    # an error during training leaves no half-trained model: the previous model's weights
    # were only in the engine (keeping them would have cost a copy), so it is unfitted
    monkeypatch.setattr(TrainingEngine, "train_batch", lambda self, *a: 1 / 0)
    with pytest.raises(ZeroDivisionError) as raised:
        est.fit(X, y)
    if hasattr(raised.value, "add_note"):
        assert "it is unfitted" in str(raised.value.__notes__)
    with pytest.raises(NotFittedError):
        est.predict(X)
    assert "estimator_" not in est.__dict__  # no placeholder weights left


def test_a_glms_fit_makes_the_session_of_the_exported_model_it_predicts_with():
    """A GLM regressor predicts with its exported model (its link applied): that
    session is made at the end of the fit; the trained graph's (the linear predictor)
    only when something runs it."""
    from sklearn.linear_model import PoissonRegressor

    from onnxgrad_sklearn import _model

    X, y = load_diabetes(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    reg = OrtGradientRegressor(PoissonRegressor()).fit(X, y)
    assert reg._session is not None and reg.__dict__.get("_logit_session") is None
    predicted = reg.predict(X)
    np.testing.assert_allclose(predicted, reg.estimator_.predict(X), rtol=1e-4)
    assert reg.__dict__.get("_logit_session") is None
    linear = _model.run_onnx(reg, X, trained_graph=True)[reg._converted.output_name]
    assert reg._logit_session is not None
    np.testing.assert_allclose(np.exp(linear.ravel()), predicted, rtol=1e-4)
