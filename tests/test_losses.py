"""The margin, epsilon-insensitive and deviance losses against scikit-learn's own.

Values are compared with scikit-learn's loss objects on the same predictions;
gradients of a linear model's weights, from onnxruntime-training's gradient
builder (TrainingEngine) and from onnx-ad's reverse mode, with float64 central
finite differences away from the kinks, and with scikit-learn's SGD ``dloss``
at the kinks.
"""

import math
import warnings

import numpy as np
import onnx
import onnx_ad
import onnxruntime
import pytest
from _helpers import rel_error
from sklearn._loss.loss import (
    HalfGammaLoss,
    HalfPoissonLoss,
    HalfTweedieLoss,
    HalfTweedieLossIdentity,
)
from sklearn.base import clone
from sklearn.linear_model import LinearRegression
from sklearn.linear_model import _sgd_fast as sgd
from sklearn.metrics import mean_gamma_deviance, mean_poisson_deviance, mean_tweedie_deviance

from onnxgrad_sklearn._graph import GraphBuilder, tensor_info
from onnxgrad_sklearn.engine import TrainingEngine, build_training_graph, weights_as_inputs
from onnxgrad_sklearn.losses import (
    CLASSIFICATION_LOSSES,
    REGRESSION_LOSSES,
    AbsoluteError,
    BaseLoss,
    EpsilonInsensitive,
    GammaDeviance,
    Hinge,
    Huber,
    LogLoss,
    ModifiedHuber,
    OneVsRestLogLoss,
    OnnxLoss,
    Perceptron,
    PoissonDeviance,
    Quantile,
    SquaredEpsilonInsensitive,
    SquaredError,
    SquaredHinge,
    TweedieDeviance,
    get_loss,
)
from onnxgrad_sklearn.optim import SGD
from onnxgrad_sklearn.templates import convert_template, final_estimator

# References -------------------------------------------------------------------------


def _sgd_margin(sk_loss):
    """Per-sample one-vs-rest sum of an SGDClassifier loss: columns of decision values."""
    loss, dloss = np.vectorize(sk_loss.py_loss), np.vectorize(sk_loss.py_dloss)

    def value(pred, target):
        return loss(pred, 2 * target - 1).sum(axis=1)

    def derivative(pred, target):  # d loss / d pred, element-wise
        return dloss(pred, 2 * target - 1)

    return value, derivative


def _sgd_regression(sk_loss):
    """Per-sample sum over outputs of an SGDRegressor loss."""
    loss, dloss = np.vectorize(sk_loss.py_loss), np.vectorize(sk_loss.py_dloss)
    return (lambda p, y: loss(p, y).sum(axis=1)), (lambda p, y: dloss(p, y))


def _half_loss(sk_loss, constant=True):
    """Per-sample sum over outputs of a ``sklearn._loss`` loss, plus its constant term."""

    def value(pred, target):
        total = np.zeros(len(pred))
        for k in range(pred.shape[1]):
            y = np.ascontiguousarray(target[:, k], dtype=np.float64)
            raw = np.ascontiguousarray(pred[:, k], dtype=np.float64)
            total += sk_loss.loss(y_true=y, raw_prediction=raw)
            if constant:
                total += sk_loss.constant_to_optimal_zero(y)
        return total

    return value, None


MARGIN = {
    "hinge": (Hinge(), _sgd_margin(sgd.Hinge(1.0)), [1.0]),
    "hinge-0.5": (Hinge(threshold=0.5), _sgd_margin(sgd.Hinge(0.5)), [0.5]),
    "squared_hinge": (SquaredHinge(), _sgd_margin(sgd.SquaredHinge(1.0)), [1.0]),
    "squared_hinge-2": (SquaredHinge(threshold=2.0), _sgd_margin(sgd.SquaredHinge(2.0)), [2.0]),
    "modified_huber": (ModifiedHuber(), _sgd_margin(sgd.ModifiedHuber()), [-1.0, 1.0]),
    "perceptron": (Perceptron(), _sgd_margin(sgd.Hinge(0.0)), [0.0]),
}

EPSILON = {
    "epsilon_insensitive": (EpsilonInsensitive(), _sgd_regression(sgd.EpsilonInsensitive(0.1))),
    "epsilon_insensitive-0": (
        EpsilonInsensitive(epsilon=0.0),
        _sgd_regression(sgd.EpsilonInsensitive(0.0)),
    ),
    "squared_epsilon_insensitive": (
        SquaredEpsilonInsensitive(),
        _sgd_regression(sgd.SquaredEpsilonInsensitive(0.1)),
    ),
    "squared_epsilon_insensitive-0.5": (
        SquaredEpsilonInsensitive(epsilon=0.5),
        _sgd_regression(sgd.SquaredEpsilonInsensitive(0.5)),
    ),
}


def _tweedie_reference(power, link):
    if link == "log":
        return _half_loss(HalfTweedieLoss(power=power))
    return _half_loss(HalfTweedieLossIdentity(power=power), constant=False)


# name: (loss, reference, link, target kind); the reference takes what the loss takes
DEVIANCE = {
    "poisson": (PoissonDeviance(), _half_loss(HalfPoissonLoss()), "log", "counts"),
    "poisson-identity": (
        PoissonDeviance(link="identity"),
        _tweedie_reference(1.0, "identity"),
        "identity",
        "counts",
    ),
    "gamma": (GammaDeviance(), _half_loss(HalfGammaLoss()), "log", "positive"),
    "gamma-identity": (
        GammaDeviance(link="identity"),
        _tweedie_reference(2.0, "identity"),
        "identity",
        "positive",
    ),
}
for _power, _kind in ((-0.5, "real"), (0.0, "real"), (1.0, "counts"), (1.5, "counts")) + (
    (2.0, "positive"),
    (3.0, "positive"),
):
    for _link in ("log", "identity"):
        DEVIANCE[f"tweedie-{_power}-{_link}"] = (
            TweedieDeviance(power=_power, link=_link),
            _tweedie_reference(_power, _link),
            _link,
            _kind,
        )

ALL = {
    **{k: (v[0], v[1][0], "classification") for k, v in MARGIN.items()},
    **{k: (v[0], v[1][0], "regression") for k, v in EPSILON.items()},
    **{k: (v[0], v[1][0], "regression") for k, v in DEVIANCE.items()},
}


# Helpers ----------------------------------------------------------------------------


def _per_sample(loss, pred, target):
    """Run ``loss.build`` alone on float32 ``pred`` and ``target``; return float64 values."""
    g = GraphBuilder("test")
    g.identity(loss.build(g, "pred", "target"), "out")
    width = pred.shape[1]
    model = g.make_model(
        [tensor_info("pred", [None, width]), tensor_info("target", [None, width])],
        [tensor_info("out", [None])],
    )
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    feeds = {"pred": pred.astype(np.float32), "target": target.astype(np.float32)}
    (out,) = session.run(None, feeds)
    assert out.shape == (len(pred),)
    return out.astype(np.float64)


def _f32(a):
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def _targets(kind, rng, shape):
    if kind == "counts":
        y = rng.poisson(2.0, size=shape).astype(np.float64)
        y.flat[:3] = 0.0  # y = 0 gives the xlogy(0, 0) = 0 branch
        y.flat[3:6] = [1e-4, 0.3, 2.5]  # Poisson deviance takes any y >= 0
        return y
    if kind == "positive":
        return rng.gamma(2.0, 1.5, size=shape)
    return rng.randn(*shape) * 2.0


def _one_hot(rng, n, n_columns):
    if n_columns == 1:
        return (rng.rand(n, 1) > 0.5).astype(np.float64)
    return np.eye(n_columns)[rng.randint(n_columns, size=n)]


class _Linear:
    """A LinearRegression template with chosen weights, its engine and references."""

    def __init__(self, loss, X, n_outputs, coef, intercept):
        self.X, self.n_outputs = X, n_outputs
        est = LinearRegression().fit(X, np.random.RandomState(0).randn(len(X), n_outputs))
        self.est = est
        self.conv = convert_template(est, X.shape[1])
        assert all(p.trainable for p in self.conv.params)
        self.names = list(self.conv.initializer_names)
        shapes = [v.shape for v in self.conv.initializer_values()]
        # skl2onnx's black_op graph is MatMul(X, coef) + intercept
        assert shapes == [(X.shape[1], n_outputs), (n_outputs,)], shapes
        self.values = [_f32(coef).reshape(shapes[0]), _f32(intercept).reshape(shapes[1])]
        self.loss = loss
        self.engine = TrainingEngine(
            self.conv.model, self.conv.output_name, self.names, [], n_outputs, loss, SGD()
        )
        self.engine.set_weights([v.astype(np.float32) for v in self.values])

    def predict(self, values):
        """float64 predictions of the template itself with ``values`` written back."""
        self.conv.write_back(final_estimator(self.est), values)
        return np.asarray(self.est.predict(self.X), dtype=np.float64).reshape(-1, self.n_outputs)

    def reference_loss(self, per_sample, values, y, sw):
        return np.sum(sw * per_sample(self.predict(values), y)) / sw.sum()

    def finite_differences(self, per_sample, y, sw, h=1e-5):
        grads = []
        for k, value in enumerate(self.values):
            grad = np.zeros(value.size)
            for j in range(value.size):
                shifted = []
                for sign in (1, -1):
                    moved = [v.copy() for v in self.values]
                    moved[k].ravel()[j] += sign * h
                    shifted.append(self.reference_loss(per_sample, moved, y, sw))
                grad[j] = (shifted[0] - shifted[1]) / (2 * h)
            grads.append(grad.reshape(value.shape))
        return grads

    def onnx_ad_gradients(self, y, sw):
        """Loss and gradients from onnx_ad.reverse run by a plain InferenceSession."""
        training = build_training_graph(
            self.conv.model, self.conv.output_name, self.n_outputs, self.loss
        )
        model = weights_as_inputs(training, self.names)
        adjoint = onnx_ad.reverse(model, inputs=self.names, outputs=["loss"], layout="onnx")
        session = onnxruntime.InferenceSession(
            adjoint.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        feeds = {
            "X": self.X.astype(np.float32),
            "y_true": y.astype(np.float32),
            "sample_weight": sw.astype(np.float32),
            "adj_loss": np.ones(1, dtype=np.float32),
            **{n: v.astype(np.float32) for n, v in zip(self.names, self.values)},
        }
        fetched = ["loss"] + [f"adj_{n}" for n in self.names]
        out = session.run(fetched, feeds)
        grads = [g.reshape(v.shape) for g, v in zip(out[1:], self.values)]  # drop the seed axis
        return float(out[0]), grads

    def chain_rule(self, derivative, y, sw):
        """Weight gradients from a per-element ``d loss / d prediction`` (float64)."""
        d = derivative(self.predict(self.values), y) * sw[:, None] / sw.sum()
        return [self.X.T @ d, d.sum(axis=0)]


def _case(name, n_outputs, seed=0):
    """Data, weights and targets for one loss, with the predictions away from kinks."""
    loss, per_sample, task = ALL[name]
    rng = np.random.RandomState(seed)
    n, n_features = 40, 4
    X = _f32(rng.randn(n, n_features))
    sw = _f32(rng.uniform(0.5, 2.0, n))
    if task == "classification":
        y = _one_hot(rng, n, n_outputs)
        coef, intercept = rng.randn(n_features, n_outputs) * 0.8, rng.randn(n_outputs) * 0.3
    elif name in DEVIANCE and DEVIANCE[name][2] == "identity":
        y = _targets(DEVIANCE[name][3], rng, (n, n_outputs))
        coef, intercept = rng.randn(n_features, n_outputs) * 0.2, np.full(n_outputs, 3.0)
    elif name in DEVIANCE:
        y = _targets(DEVIANCE[name][3], rng, (n, n_outputs))
        coef, intercept = rng.randn(n_features, n_outputs) * 0.3, np.full(n_outputs, 0.5)
    else:
        y = rng.randn(n, n_outputs)
        coef, intercept = rng.randn(n_features, n_outputs) * 0.8, rng.randn(n_outputs) * 0.3
    linear = _Linear(loss, X, n_outputs, coef, intercept)
    y = _f32(y)
    pred = linear.predict(linear.values)
    if name in MARGIN:
        z = (2 * y - 1) * pred
        assert min(np.abs(z - kink).min() for kink in MARGIN[name][2]) > 1e-3
    elif name in EPSILON:
        assert np.abs(np.abs(y - pred) - loss.epsilon).min() > 1e-3
    else:
        assert (pred > 0).all() or DEVIANCE[name][2] == "log"
    return linear, per_sample, y, sw


# (a) values ---------------------------------------------------------------------------


@pytest.mark.parametrize("n_columns", [1, 3])
@pytest.mark.parametrize("name", sorted(MARGIN))
def test_margin_loss_values_match_sgd_classifier(name, n_columns):
    loss, (per_sample, _), kinks = MARGIN[name]
    rng = np.random.RandomState(0)
    pred = _f32(rng.randn(60, n_columns) * 2.0)
    target = _one_hot(rng, 60, n_columns)
    pred[:4] = (2 * target[:4] - 1) * kinks[0]  # exactly at a kink
    pred[4:8] = (2 * target[4:8] - 1) * kinks[-1] + 0.25
    values = _per_sample(loss, pred, target)
    expected = per_sample(pred, target)
    assert np.abs(expected).max() > 1.0  # not a trivially zero comparison
    np.testing.assert_allclose(values, expected, rtol=1e-5, atol=1e-5)


def test_margin_losses_are_one_vs_rest_sums():
    pred = np.array([[2.0, -0.5, 0.3], [-3.0, 0.0, 1.5]])
    target = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    # z = y * f = [[2, 0.5, -0.3], [3, 0, -1.5]]
    np.testing.assert_allclose(_per_sample(Hinge(), pred, target), [0.5 + 1.3, 1 + 2.5], 1e-6)
    np.testing.assert_allclose(_per_sample(Perceptron(), pred, target), [0.3, 1.5], 1e-6)
    np.testing.assert_allclose(
        _per_sample(SquaredHinge(), pred, target), [0.25 + 1.69, 1 + 6.25], 1e-6
    )
    np.testing.assert_allclose(
        _per_sample(ModifiedHuber(), pred, target), [0.25 + 1.69, 1 + 6.0], 1e-6
    )


@pytest.mark.parametrize("n_outputs", [1, 2])
@pytest.mark.parametrize("name", sorted(EPSILON))
def test_epsilon_insensitive_values_match_sgd_regressor(name, n_outputs):
    loss, (per_sample, _) = EPSILON[name]
    rng = np.random.RandomState(1)
    pred, target = _f32(rng.randn(50, n_outputs)), _f32(rng.randn(50, n_outputs))
    target[:3] = pred[:3] + 0.5 * loss.epsilon  # inside the band (on it for epsilon=0)
    target[3:6] = pred[3:6] - 2.0 * loss.epsilon
    values = _per_sample(loss, pred, target)
    expected = per_sample(pred, target)
    assert (expected == 0).sum() >= 3 and np.abs(expected).max() > 0.5
    np.testing.assert_allclose(values, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n_outputs", [1, 2])
@pytest.mark.parametrize("name", sorted(DEVIANCE))
def test_deviance_values_match_half_losses_and_metrics(name, n_outputs):
    loss, (per_sample, _), link, kind = DEVIANCE[name]
    rng = np.random.RandomState(2)
    target = _f32(_targets(kind, rng, (50, n_outputs)))
    mean = _f32(rng.gamma(3.0, 0.8, size=(50, n_outputs)))
    mean[:3] = np.maximum(target[:3], 0.5)
    pred = _f32(np.log(mean)) if link == "log" else mean
    mean = np.exp(pred) if link == "log" else pred
    values = _per_sample(loss, pred, target)
    np.testing.assert_allclose(values, per_sample(pred, target), rtol=2e-5, atol=2e-5)
    # half the unit deviance: scikit-learn's metrics, output by output
    power = {PoissonDeviance: 1.0, GammaDeviance: 2.0}.get(type(loss), getattr(loss, "power", None))
    metrics = {1.0: mean_poisson_deviance, 2.0: mean_gamma_deviance}
    metric = metrics.get(power, lambda y, m: mean_tweedie_deviance(y, m, power=power))
    deviance = sum(metric(target[:, k], mean[:, k]) for k in range(n_outputs))
    assert deviance > 0.1
    assert values.mean() == pytest.approx(0.5 * deviance, rel=1e-5)
    # the constant terms are in: the loss is 0 where the mean is the target
    rows = (target > 0).all(axis=1)
    assert rows.sum() >= 5
    at_target = np.log(target[rows]) if link == "log" else target[rows]
    np.testing.assert_allclose(_per_sample(loss, at_target, target[rows]), 0.0, atol=1e-5)


# (b) gradients away from the kinks, (d) the same from onnx-ad -------------------------


GRADIENT_CASES = [(name, 1) for name in sorted(ALL)] + [
    (name, 3) for name in sorted(ALL) if "tweedie" not in name or "1.5" in name
]


@pytest.mark.parametrize("name, n_outputs", GRADIENT_CASES)
def test_gradients_match_finite_differences_and_onnx_ad(name, n_outputs):
    linear, per_sample, y, sw = _case(name, n_outputs)
    loss, grads = linear.engine.loss_and_gradients(linear.X, y, sw)
    reference = linear.reference_loss(per_sample, linear.values, y, sw)
    assert loss == pytest.approx(reference, rel=1e-5, abs=1e-6)
    numeric = linear.finite_differences(per_sample, y, sw)
    assert max(np.abs(g).max() for g in numeric) > 1e-2  # a gradient worth comparing
    for grad, expected in zip(grads, numeric):
        assert grad.shape == expected.shape
        assert rel_error(grad, expected) < 1e-4
    ad_loss, ad_grads = linear.onnx_ad_gradients(y, sw)
    assert ad_loss == pytest.approx(loss, rel=1e-6, abs=1e-7)
    for grad, ad in zip(grads, ad_grads):
        assert rel_error(ad, grad) < 1e-5


# (c) gradients at the kinks are scikit-learn's subgradient ----------------------------


def _kink_gradients(loss, derivative, X, y, sw, n_outputs, coef, intercept):
    linear = _Linear(loss, X, n_outputs, coef, intercept)
    _, grads = linear.engine.loss_and_gradients(X, y, sw)
    _, ad_grads = linear.onnx_ad_gradients(y, sw)
    return grads, ad_grads, linear.chain_rule(derivative, y, sw)


@pytest.mark.parametrize("n_columns", [1, 3])
@pytest.mark.parametrize(
    "name, bias",
    [
        ("hinge", 1.0),
        ("hinge-0.5", 0.5),
        ("perceptron", 0.0),
        ("squared_hinge", 1.0),
        ("modified_huber", 1.0),
    ],
)
def test_margin_gradient_at_the_kink_is_sgd_dloss(name, bias, n_columns):
    # zero coefficients, intercept ``bias``: f = bias for every sample, so the
    # positive targets sit on the kink z = y * f = bias (and z = -bias for the others)
    loss, (_, derivative), _ = MARGIN[name]
    rng = np.random.RandomState(3)
    X, sw = _f32(rng.randn(30, 4)), _f32(rng.uniform(0.5, 2.0, 30))
    y = _one_hot(rng, 30, n_columns)
    grads, ad_grads, expected = _kink_gradients(
        loss, derivative, X, y, sw, n_columns, np.zeros((4, n_columns)), np.full(n_columns, bias)
    )
    if name in ("hinge", "hinge-0.5", "perceptron"):
        # every sample counts, the ones on the kink included: d loss / d f = -y
        np.testing.assert_allclose(expected[1], -((2 * y - 1) * sw[:, None]).sum(0) / sw.sum())
        assert np.abs(expected[0]).max() > 0.05  # the weights move
    for grad, ad, exp in zip(grads, ad_grads, expected):
        np.testing.assert_allclose(grad, exp, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ad, exp, rtol=1e-5, atol=1e-6)


def test_perceptron_from_zero_weights_moves():
    rng = np.random.RandomState(4)
    X = _f32(rng.randn(50, 4))
    y = _f32((X[:, :1] + 0.5 * X[:, 1:2] > 0).astype(np.float64))
    linear = _Linear(Perceptron(), X, 1, np.zeros((4, 1)), np.zeros(1))
    loss, (g_coef, g_intercept) = linear.engine.loss_and_gradients(X, y, np.ones(50))
    assert loss == 0.0  # max(0, -y * 0) is 0 ...
    s = 2 * y - 1
    np.testing.assert_allclose(g_coef, -(X * s).mean(axis=0)[:, None], rtol=1e-5)  # ... not flat
    np.testing.assert_allclose(g_intercept, -s.mean(axis=0), rtol=1e-5, atol=1e-7)
    # a descent step separates better than chance
    step = -np.concatenate([g_coef.ravel(), g_intercept])
    assert np.mean(((np.c_[X, np.ones(50)] @ step) > 0) == (y[:, 0] > 0)) > 0.8


@pytest.mark.parametrize("n_outputs", [1, 2])
@pytest.mark.parametrize("name", ["epsilon_insensitive", "squared_epsilon_insensitive"])
def test_epsilon_gradient_at_the_kink_is_sgd_dloss(name, n_outputs):
    # prediction 0 for every sample; targets on the band's edges, inside and outside
    cls, sk_cls = {
        "epsilon_insensitive": (EpsilonInsensitive, sgd.EpsilonInsensitive),
        "squared_epsilon_insensitive": (SquaredEpsilonInsensitive, sgd.SquaredEpsilonInsensitive),
    }[name]
    loss, (_, derivative) = cls(epsilon=0.5), _sgd_regression(sk_cls(0.5))
    rng = np.random.RandomState(5)
    X, sw = _f32(rng.randn(30, 3)), _f32(rng.uniform(0.5, 2.0, 30))
    y = rng.choice([-2.0, -0.5, -0.25, 0.5, 2.0], size=(30, n_outputs))
    grads, ad_grads, expected = _kink_gradients(
        loss, derivative, X, y, sw, n_outputs, np.zeros((3, n_outputs)), np.zeros(n_outputs)
    )
    on_edge = np.abs(y) == 0.5
    assert on_edge.sum() > 5 and (derivative(np.zeros_like(y), y)[on_edge] == 0).all()
    assert max(np.abs(e).max() for e in expected) > 0.05
    for grad, ad, exp in zip(grads, ad_grads, expected):
        np.testing.assert_allclose(grad, exp, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ad, exp, rtol=1e-5, atol=1e-6)
    # on the edges alone scikit-learn's gradient is 0 (a ">=" formulation would give +-1)
    edges = np.where(rng.rand(30, n_outputs) > 0.5, 0.5, -0.5)
    grads, ad_grads, expected = _kink_gradients(
        loss, derivative, X, edges, sw, n_outputs, np.zeros((3, n_outputs)), np.zeros(n_outputs)
    )
    for grad, ad, exp in zip(grads, ad_grads, expected):
        assert not exp.any()
        np.testing.assert_array_equal(grad, 0.0)
        np.testing.assert_array_equal(ad, 0.0)


# (e) names, attributes, parameters -----------------------------------------------------


def test_names_resolve_through_get_loss():
    expected = {
        "squared_error": SquaredError,
        "absolute_error": AbsoluteError,
        "huber": Huber,
        "quantile": Quantile,
        "epsilon_insensitive": EpsilonInsensitive,
        "squared_epsilon_insensitive": SquaredEpsilonInsensitive,
        "poisson": PoissonDeviance,
        "gamma": GammaDeviance,
        "tweedie": TweedieDeviance,
        "log_loss": LogLoss,
        "hinge": Hinge,
        "squared_hinge": SquaredHinge,
        "modified_huber": ModifiedHuber,
        "perceptron": Perceptron,
    }
    assert set(REGRESSION_LOSSES) | set(CLASSIFICATION_LOSSES) == set(expected)
    assert not set(REGRESSION_LOSSES) & set(CLASSIFICATION_LOSSES)
    assert CLASSIFICATION_LOSSES == (
        "log_loss",
        "hinge",
        "squared_hinge",
        "modified_huber",
        "perceptron",
    )
    for name, cls in expected.items():
        loss = get_loss(name)
        assert type(loss) is cls
        assert name in (REGRESSION_LOSSES if cls.task == "regression" else CLASSIFICATION_LOSSES)
        assert get_loss(name, task=cls.task).get_params() == loss.get_params()
    defaults = {
        "epsilon_insensitive": {"epsilon": 0.1},
        "squared_epsilon_insensitive": {"epsilon": 0.1},
        "poisson": {"link": "log"},
        "gamma": {"link": "log"},
        "tweedie": {"power": 0.0, "link": "log"},
        "hinge": {"threshold": 1.0},
        "squared_hinge": {"threshold": 1.0},
        "modified_huber": {},
        "perceptron": {},
    }
    for name, params in defaults.items():
        assert get_loss(name).get_params() == params
    obj = TweedieDeviance(power=1.5, link="identity")
    assert get_loss(obj) is obj
    assert clone(obj).get_params() == {"power": 1.5, "link": "identity"}


def test_task_and_gives_proba():
    for cls in (Hinge, SquaredHinge, Perceptron):
        assert (cls.task, cls.gives_proba) == ("classification", False)
    for cls in (ModifiedHuber, LogLoss, OneVsRestLogLoss):
        assert (cls.task, cls.gives_proba) == ("classification", True)
    for cls in (
        SquaredError,
        AbsoluteError,
        Huber,
        Quantile,
        EpsilonInsensitive,
        SquaredEpsilonInsensitive,
        PoissonDeviance,
        GammaDeviance,
        TweedieDeviance,
    ):
        assert cls.task == "regression"
    assert BaseLoss.task is None and OnnxLoss.task is None


def test_get_loss_refuses_a_name_of_the_other_task():
    with pytest.raises(ValueError, match="'hinge' is a classification loss, not a regression"):
        get_loss("hinge", task="regression")
    with pytest.raises(ValueError, match="'poisson' is a regression loss"):
        get_loss("poisson", task="classification")
    with pytest.raises(ValueError, match="'hinge_loss' is not supported.*'perceptron'"):
        get_loss("hinge_loss")
    with pytest.raises(ValueError, match="task must be"):
        get_loss("hinge", task="ranking")


@pytest.mark.parametrize(
    "loss, message",
    [
        (EpsilonInsensitive(epsilon=-0.1), "EpsilonInsensitive epsilon must be .* >= 0, got -0.1"),
        (SquaredEpsilonInsensitive(epsilon=-1), "SquaredEpsilonInsensitive epsilon .* got -1"),
        (EpsilonInsensitive(epsilon=math.nan), "epsilon must be a finite real number >= 0"),
        (EpsilonInsensitive(epsilon="0.1"), "epsilon must be a finite real number >= 0"),
        (TweedieDeviance(power=0.5), r"power must be <= 0 or >= 1 .* got 0.5"),
        (TweedieDeviance(power=1e-3), r"power in \(0, 1\)"),
        (TweedieDeviance(power=math.inf), "power must be a finite real number"),
        (
            TweedieDeviance(link="auto"),
            r"TweedieDeviance link must be one of \['log', 'identity'\]",
        ),
        (PoissonDeviance(link="logit"), "PoissonDeviance link must be one of"),
        (GammaDeviance(link=None), "GammaDeviance link must be one of"),
        (Hinge(threshold=math.nan), "Hinge threshold must be a finite real number"),
        (SquaredHinge(threshold="1"), "SquaredHinge threshold must be a finite real number"),
        (Hinge(threshold=True), "Hinge threshold must be a finite real number"),
    ],
)
def test_invalid_parameters_raise(loss, message):
    with pytest.raises(ValueError, match=message):
        loss.check_params()
    with pytest.raises(ValueError, match=message):
        loss.build(GraphBuilder(), "pred", "target")


@pytest.mark.parametrize(
    "loss",
    [
        EpsilonInsensitive(epsilon=0),
        SquaredEpsilonInsensitive(epsilon=2.5),
        TweedieDeviance(power=0),
        TweedieDeviance(power=-2.0, link="identity"),
        TweedieDeviance(power=1),
        TweedieDeviance(power=7.5),
        Hinge(threshold=-1),
        SquaredHinge(threshold=0.0),
    ],
)
def test_valid_parameters_at_the_boundaries_build(loss):
    loss.check_params()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = loss.build(GraphBuilder(), "pred", "target")
    assert isinstance(out, str)


def test_existing_losses_keep_their_checks():
    with pytest.raises(ValueError, match="Huber epsilon must be > 0"):
        Huber(epsilon=0).build(GraphBuilder(), "p", "t")
    with pytest.raises(ValueError, match=r"Quantile quantile must be in \(0, 1\)"):
        Quantile(quantile=1.0).check_params()


def test_the_kink_is_written_with_a_comparison_mask():
    g = GraphBuilder()
    Hinge().build(g, "p", "t")
    ops = [n.op_type for n in g.nodes]
    assert "LessOrEqual" in ops and "Cast" in ops and "Relu" not in ops
    cast = next(n for n in g.nodes if n.op_type == "Cast")
    assert onnx.helper.get_attribute_value(cast.attribute[0]) == onnx.TensorProto.FLOAT


# (d) the rounded kinks of full-batch L-BFGS's first stages ------------------------------

#: losses with kinks and, in numpy, the kinks ``c * max(0, u)`` their value sums, from the
#: prediction p and the target (r = y - p, or the margin of a 0/1 target)
KINKED = {
    "hinge": (Hinge(), lambda p, t: [(1.0, 1 - (2 * t - 1) * p)]),
    "quantile-0.8": (Quantile(0.8), lambda p, y: [(0.8, y - p), (0.2, p - y)]),
    "absolute": (AbsoluteError(), lambda p, y: [(1.0, y - p), (1.0, p - y)]),
    "epsilon-0.3": (EpsilonInsensitive(0.3), lambda p, y: [(1.0, y - p - 0.3), (1.0, p - y - 0.3)]),
}


def _rounded(kinks, width):
    """sum_k c_k * max(0, u_k), each kink rounded over ``width`` (exact for width 0)."""
    total = 0.0
    for c, u in kinks:
        if width == 0:
            total = total + c * np.maximum(0.0, u)
        else:
            clipped = np.clip(u, 0.0, width)
            total = total + c * clipped * (u - clipped / 2) / width
    return total.sum(axis=1)


def _kinked_case(name, width, rng, n):
    if name == "hinge":  # margins about the threshold 1
        target = rng.randint(0, 2, size=(n, 1)).astype(np.float64)
        return (2 * target - 1) * (1 + rng.randn(n, 1) * 2 * width), target
    pred = rng.randn(n, 1)
    shift = 0.3 if name == "epsilon-0.3" else 0.0
    sign = np.where(rng.rand(n, 1) < 0.5, 1.0, -1.0)
    return pred, pred + sign * (shift + rng.randn(n, 1) * 2 * width)


@pytest.mark.parametrize("width", [1.0, 0.01])
@pytest.mark.parametrize("name", sorted(KINKED))
def test_rounded_kinks_are_the_formula_and_stay_within_half_the_width(name, width):
    loss, kinks = KINKED[name]
    pred, target = _kinked_case(name, width, np.random.RandomState(0), 400)
    smoothed = loss.smoothed(width)
    assert smoothed is not loss and smoothed.get_params() == loss.get_params()
    assert loss._width == 0.0  # the template's loss is left exact
    rounded = _per_sample(smoothed, pred, target)
    pieces = kinks(_f32(pred), _f32(target))
    np.testing.assert_allclose(rounded, _rounded(pieces, width), rtol=1e-5, atol=1e-6)
    exact = _per_sample(loss, pred, target)
    np.testing.assert_allclose(exact, _rounded(pieces, 0), rtol=1e-5, atol=1e-6)
    within = [(0 < u) & (u < width) for _, u in pieces]
    assert sum(w.sum() for w in within) > 50  # the rounded part is in play
    bound = sum(c for c, _ in pieces) * width / 2
    assert np.all(rounded <= exact + 1e-6) and np.all(exact - rounded <= bound * (1 + 1e-5))


@pytest.mark.parametrize("name", sorted(KINKED))
def test_rounded_kink_gradients_match_finite_differences(name):
    """A linear model's gradient of the rounded loss, with points inside the band."""
    loss, kinks = KINKED[name]
    width = 0.5
    rng = np.random.RandomState(1)
    X = rng.randn(60, 3)
    coef, intercept = rng.randn(3, 1) * 0.3, np.array([0.1])
    f = X @ coef + intercept
    if name == "hinge":
        y = (f > 0).astype(np.float64)  # margins |f|, some below 1
    else:
        pred, target = _kinked_case(name, width, rng, 60)
        y = f + target - pred
    sw = rng.rand(60) + 0.5
    linear = _Linear(loss.smoothed(width), X, 1, coef, intercept)
    value, grads = linear.engine.loss_and_gradients(
        linear.X.astype(np.float32), y.astype(np.float32), sw.astype(np.float32)
    )
    per_sample = lambda p, t: _rounded(kinks(p, t), width)  # noqa: E731
    inside = sum(((0 < u) & (u < width)).sum() for _, u in kinks(f, y))
    assert inside >= 5
    assert value == pytest.approx(linear.reference_loss(per_sample, linear.values, y, sw), 1e-5)
    for grad, expected in zip(grads, linear.finite_differences(per_sample, y, sw)):
        assert rel_error(grad, expected) < 1e-4


def test_smooth_losses_have_no_rounded_copy():
    for loss in (SquaredError(), Huber(), LogLoss(), SquaredHinge(), ModifiedHuber()):
        assert loss.smoothed(0.1) is None
    with pytest.raises(ValueError, match="width must be > 0"):
        Hinge().smoothed(0.0)


@pytest.mark.parametrize("smoothing", ["fast", (0.1, -1.0), (0.1, float("nan")), 3])
def test_lbfgs_refuses_an_invalid_smoothing(smoothing):
    from onnxgrad_sklearn.optim import LBFGS

    with pytest.raises(ValueError, match="LBFGS smoothing must be"):
        LBFGS(smoothing=smoothing).widths()


def test_an_invalid_smoothing_is_refused_before_fit_changes_anything():
    from onnxgrad_sklearn import OrtGradientRegressor
    from onnxgrad_sklearn.optim import LBFGS

    X = np.random.RandomState(0).randn(30, 2)
    est = OrtGradientRegressor(optimizer=LBFGS(smoothing=(0.1, 0.0)))
    with pytest.raises(ValueError, match="LBFGS smoothing must be"):
        est.fit(X, X[:, 0])
    assert not hasattr(est, "n_iter_") and not hasattr(est, "estimator_")
