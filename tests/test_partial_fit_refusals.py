"""partial_fit refuses what it cannot do chunk by chunk, as scikit-learn does."""

import warnings

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression, SGDClassifier
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler

from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor

rng = np.random.RandomState(0)
X = rng.rand(60, 3).astype(np.float32) * 10
y = X @ np.array([1.0, -1.0, 2.0], dtype=np.float32)
labels = (y > np.median(y)).astype(int)


def test_partial_fit_refuses_an_unfitted_preprocessing_head_and_says_what_to_do():
    template = make_pipeline(StandardScaler(), MLPRegressor(hidden_layer_sizes=(3,)))
    reg = OrtGradientRegressor(template)
    with pytest.raises(ValueError, match=r"\['standardscaler'\].*Fit them first"):
        reg.partial_fit(X[:20], y[:20])
    assert not hasattr(reg, "estimator_")  # nothing was fitted
    # fitted on enough data first (the final model unfitted): accepted, scaler kept
    template[:-1].fit(X)
    reg.partial_fit(X[:20], y[:20])
    scaler = reg.estimator_[0]
    np.testing.assert_allclose(scaler.mean_, X.mean(axis=0), rtol=1e-6)
    # a stateless step needs no fitting; fit still fits the head on the whole data
    stateless = make_pipeline(FunctionTransformer(), MLPRegressor(hidden_layer_sizes=(3,)))
    OrtGradientRegressor(stateless).partial_fit(X[:20], y[:20])
    fresh = make_pipeline(StandardScaler(), MLPRegressor(hidden_layer_sizes=(3,)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = OrtGradientRegressor(fresh, max_iter=2).fit(X, y)
    np.testing.assert_allclose(fitted.estimator_[0].mean_, X.mean(axis=0), rtol=1e-6)


@pytest.mark.parametrize(
    "clf",
    [
        OrtGradientClassifier(MLPClassifier(), class_weight="balanced"),
        OrtGradientClassifier(LogisticRegression(class_weight="balanced")),
    ],
    ids=["estimator", "template"],
)
def test_partial_fit_refuses_balanced_class_weight_as_sgdclassifier(clf):
    with pytest.raises(ValueError, match="class_weight 'balanced'") as ours:
        clf.partial_fit(X, labels, classes=[0, 1])
    with pytest.raises(ValueError) as sklearn_error:
        SGDClassifier(class_weight="balanced").partial_fit(X, labels, classes=[0, 1])
    assert "compute_class_weight('balanced', classes=classes, y=y)" in str(ours.value)
    assert str(sklearn_error.value).endswith(str(ours.value).split("partial_fit.")[-1])
    assert not hasattr(clf, "classes_")
    # fit itself balances the classes over the whole data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        OrtGradientClassifier(
            MLPClassifier(hidden_layer_sizes=(3,)), class_weight="balanced", max_iter=2
        ).fit(X, labels)
