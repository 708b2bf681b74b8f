"""Sparse X (CSR, CSC): the same training as the dense matrix, densified one batch at a time."""

import json
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.utils import get_tags

import onnxgrad_sklearn._data as data_module
from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor

rng = np.random.RandomState(0)
X_SPARSE = sp.random(240, 30, density=0.15, format="csr", random_state=0, dtype=np.float32)
X_DENSE = X_SPARSE.toarray()
Y = X_DENSE @ rng.randn(30).astype(np.float32) + 0.1 * rng.randn(240).astype(np.float32)
LABELS = np.digitize(Y, np.quantile(Y, [0.33, 0.66]))


def _weights(est):
    final = est.estimator_
    if hasattr(final, "coefs_"):
        return [*final.coefs_, *final.intercepts_]
    return [np.atleast_1d(final.coef_), np.atleast_1d(final.intercept_)]


def _fit(est, X, y, method="fit", **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(est, method)(X, y, **kwargs)


@pytest.fixture
def small_chunks(monkeypatch):
    # A few rows per chunk: L-BFGS, predict and the validation split go over several.
    monkeypatch.setattr(data_module, "CHUNK_VALUES", 7 * 30)
    monkeypatch.setattr(data_module.FullBatchObjective, "chunk_values", 7 * 30)


@pytest.mark.parametrize("optimizer", ["adam", "lbfgs"])
@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_sparse_regressor_trains_the_same_weights_as_dense(optimizer, fmt, small_chunks):
    def make():
        return OrtGradientRegressor(
            MLPRegressor(hidden_layer_sizes=(6,)),
            optimizer=optimizer,
            batch_size=32,
            max_iter=4,
            random_state=0,
        )

    dense = _fit(make(), X_DENSE, Y)
    sparse = _fit(make(), X_SPARSE.asformat(fmt), Y)
    assert dense.n_iter_ == sparse.n_iter_
    for a, b in zip(_weights(dense), _weights(sparse)):
        np.testing.assert_array_equal(a, b)
    assert dense.loss_curve_ == sparse.loss_curve_
    np.testing.assert_array_equal(dense.predict(X_DENSE), sparse.predict(X_SPARSE.asformat(fmt)))


@pytest.mark.parametrize("optimizer", ["adam", "lbfgs"])
def test_sparse_classifier_trains_the_same_weights_as_dense(optimizer, small_chunks):
    def make():
        return OrtGradientClassifier(
            LogisticRegression(), optimizer=optimizer, max_iter=5, random_state=0
        )

    dense = _fit(make(), X_DENSE, LABELS)
    sparse = _fit(make(), X_SPARSE, LABELS)
    for a, b in zip(_weights(dense), _weights(sparse)):
        np.testing.assert_array_equal(a, b)
    for method in ("predict", "predict_proba", "decision_function"):
        np.testing.assert_array_equal(
            getattr(dense, method)(X_DENSE), getattr(sparse, method)(X_SPARSE)
        )
    # an unseen sparse matrix: predictions of its rows, chunk by chunk
    other = sp.random(50, 30, density=0.2, format="csr", random_state=1, dtype=np.float64)
    np.testing.assert_allclose(
        sparse.predict_proba(other), dense.predict_proba(other.toarray()), rtol=1e-6
    )


def test_sparse_early_stopping_and_partial_fit_follow_dense(small_chunks):
    def make(**kwargs):
        return OrtGradientClassifier(
            MLPClassifier(hidden_layer_sizes=(5,)),
            optimizer="adam",
            batch_size=40,
            max_iter=6,
            random_state=0,
            **kwargs,
        )

    dense = _fit(make(early_stopping=True), X_DENSE, LABELS)
    sparse = _fit(make(early_stopping=True), X_SPARSE, LABELS)
    assert dense.validation_scores_ == sparse.validation_scores_
    for a, b in zip(_weights(dense), _weights(sparse)):
        np.testing.assert_array_equal(a, b)

    dense, sparse = make(), make()
    for start in (0, 120):
        rows = slice(start, start + 120)
        classes = np.unique(LABELS)
        _fit(dense, X_DENSE[rows], LABELS[rows], "partial_fit", classes=classes)
        _fit(sparse, X_SPARSE[rows], LABELS[rows], "partial_fit", classes=classes)
    for a, b in zip(_weights(dense), _weights(sparse)):
        np.testing.assert_array_equal(a, b)


def test_sparse_input_is_in_the_tags_and_a_linear_template_trains():
    assert get_tags(OrtGradientRegressor()).input_tags.sparse
    assert get_tags(OrtGradientClassifier(MLPClassifier())).input_tags.sparse
    reg = _fit(OrtGradientRegressor(Ridge(), max_iter=200), X_SPARSE, Y)
    assert reg.score(X_SPARSE, Y) > 0.9


PEAK_RSS = """
import json, resource, warnings
import numpy as np
import scipy.sparse as sp
from sklearn.linear_model import LogisticRegression
from onnxgrad_sklearn import OrtGradientClassifier

# TF-IDF-like: 50 random columns per row, density 0.1%, positive values. Built row by
# row: scipy.sparse.random draws its positions among all n_rows * n_features cells,
# which takes gigabytes itself at this size.
n_rows, n_features, per_row = 20_000, 50_000, 50
rng = np.random.default_rng(0)
indices = np.sort(rng.integers(0, n_features, size=(n_rows, per_row)), axis=1).ravel()
indptr = np.arange(0, n_rows * per_row + 1, per_row)
data = rng.random(n_rows * per_row, dtype=np.float32)
X = sp.csr_matrix((data, indices, indptr), shape=(n_rows, n_features))
X.sum_duplicates()
w = rng.standard_normal(n_features).astype(np.float32)
y = (X @ w > 0).astype(np.int64)
clf = OrtGradientClassifier(LogisticRegression(), optimizer="adam", max_iter=1, random_state=0)
baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB on Linux
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    clf.fit(X, y)
accuracy = float((clf.predict(X[:2000]) == y[:2000]).mean())
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"baseline_mb": baseline / 1024, "peak_mb": peak / 1024,
                  "dense_mb": n_rows * n_features * 4 / 2**20, "n_iter": clf.n_iter_,
                  "density": X.nnz / (n_rows * n_features), "accuracy": accuracy}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss in KB is Linux's unit")
def test_one_epoch_on_a_large_sparse_matrix_never_densifies_it():
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PEAK_RSS)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["n_iter"] == 1
    assert result["dense_mb"] > 3800  # what densifying the matrix would cost
    assert 0.0009 < result["density"] <= 0.001
    assert result["peak_mb"] - result["baseline_mb"] < 1024, result
    assert result["accuracy"] > 0.5  # the epoch trained something
