"""A fit from cached artifacts imports no onnx, and the fits of a process share sessions.

A fit whose training artifacts are on disk makes its sessions from their bytes:
fit and predict import none of onnx, skl2onnx and onnx_ad, and ``to_onnx`` makes
the ONNX model when asked. The sessions of an artifact serve every later fit of the
structure in the process (the weights, optimizer state, learning rate and penalty
are each fit's own): a fit after another gives, bit for bit, what it gives alone in
a fresh process, and two fits at once in two threads each give what they give alone.
"""

import json
import os
import subprocess
import sys
import textwrap
import threading
import warnings

import numpy as np
import pytest
from _helpers import BACKENDS
from sklearn.neural_network import MLPClassifier, MLPRegressor

from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor, artifacts, runtime

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")

#: Fits and predicts a regressor and a classifier, then exports them: what was
#: imported before the export, and the predictions of both.
CACHED_FIT = """
import json, sys, warnings
import numpy as np
from sklearn.neural_network import MLPClassifier, MLPRegressor
from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor
warnings.simplefilter("ignore")
rng = np.random.RandomState(0)
X = rng.rand(90, 4)
y = X @ [1.0, -2.0, 0.5, 0.3] + 0.1 * rng.rand(90)
labels = (y > np.median(y)).astype(int) + (y > np.quantile(y, 0.8))
params = dict(max_iter=5, random_state=0, alpha=1e-3, backend={backend!r})
reg = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(7,)), **params).fit(X, y)
clf = OrtGradientClassifier(MLPClassifier(hidden_layer_sizes=(5,)), **params).fit(X, labels)
pred, proba = reg.predict(X), clf.predict_proba(X)
labels_pred = clf.predict(X)
modules = sorted(m for m in ("onnx", "skl2onnx", "onnx_ad") if m in sys.modules)
import onnxruntime
def run(model):
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, {{session.get_inputs()[0].name: X.astype(np.float32)}})
exported_pred = run(reg.to_onnx())[0]
exported_labels, exported_proba = run(clf.to_onnx())
print(json.dumps({{
    "modules": modules,
    "pred": pred.tolist(),
    "exported_pred": exported_pred.ravel().astype(np.float64).tolist(),
    "proba": proba.tolist(),
    "exported_proba": exported_proba.astype(np.float64).tolist(),
    "labels": labels_pred.tolist(),
    "exported_labels": exported_labels.ravel().tolist(),
    "coefs": [c.tolist() for c in reg.estimator_.coefs_],
}}))
"""

#: Fit B alone, or after fit A of the same structure (other seed, learning rate and
#: alpha) in the same process: B's weights and loss curve, and what the pool holds.
AFTER_ANOTHER = """
import json, sys, warnings
import numpy as np
from sklearn.neural_network import MLPRegressor
from onnxgrad_sklearn import OrtGradientRegressor, runtime
warnings.simplefilter("ignore")
rng = np.random.RandomState(0)
X = rng.rand(150, 5)
y = np.tanh(X @ [1.0, -2.0, 0.5, 0.3, 1.5]) + 0.1 * rng.rand(150)
def fit(seed, rate, alpha):
    return OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(9,)), max_iter=8, batch_size=32, n_jobs=1,
        random_state=seed, learning_rate_init=rate, alpha=alpha, backend={backend!r},
    ).fit(X, y)
pool = runtime.SESSIONS
counts = []
if {after!r}:
    fit(1, 1e-2, 1e-4)
    counts.append((len(pool._shared), sum(map(len, pool._waiting.values()))))
b = fit(2, 3e-3, 1e-2)
counts.append((len(pool._shared), sum(map(len, pool._waiting.values()))))
print(json.dumps({{
    "coefs": [c.tolist() for c in b.estimator_.coefs_ + b.estimator_.intercepts_],
    "loss_curve": b.loss_curve_,
    "counts": counts,
}}))
"""


def _run(code: str, cache) -> dict:
    env = dict(os.environ, **{artifacts.CACHE_ENV: str(cache)})
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_cached_fit_and_predict_import_no_onnx_and_to_onnx_predicts_the_same(tmp_path, backend):
    code = CACHED_FIT.format(backend=backend)
    built = _run(code, tmp_path)  # converts, builds the graphs, fills the cache
    assert "onnx" in built["modules"]
    cached = _run(code, tmp_path)
    assert cached["modules"] == []  # fit, predict and predict_proba from the cache
    assert cached["coefs"] == built["coefs"]  # bit for bit
    # the export is made when asked for: the same predictions as the estimator's (its
    # probabilities come from the logits, in float64: equal to float32 rounding)
    for result in (built, cached):
        np.testing.assert_array_equal(result["exported_pred"], result["pred"])
        np.testing.assert_allclose(result["exported_proba"], result["proba"], rtol=1e-5)
        assert result["exported_labels"] == result["labels"]
    assert cached["pred"] == built["pred"] and cached["proba"] == built["proba"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fit_after_another_gives_bit_for_bit_what_it_gives_alone(tmp_path, backend):
    alone = _run(AFTER_ANOTHER.format(backend=backend, after=False), tmp_path / "alone")
    after = _run(AFTER_ANOTHER.format(backend=backend, after=True), tmp_path / "after")
    assert after["coefs"] == alone["coefs"]
    assert after["loss_curve"] == alone["loss_curve"]
    # the second fit made no session: it ran in those of the first (the agent's: its
    # TrainingAgent, which updates the weights too; the standard backend's: shared)
    (shared_a, waiting_a), (shared_b, waiting_b) = after["counts"]
    assert (shared_b, waiting_b) == (shared_a, waiting_a)
    assert (shared_a > 0, waiting_a) == ((False, 1) if backend == "agent" else (True, 0))


def _data(n=240, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.rand(n, 6)
    y = np.sin(X @ rng.randn(6)) + 0.05 * rng.randn(n)
    return X, y


def _fit(backend, seed, rate, alpha, X, y, classifier=False):
    params = dict(
        max_iter=25,
        batch_size=16,
        n_jobs=1,
        random_state=seed,
        learning_rate_init=rate,
        alpha=alpha,
        backend=backend,
    )
    if classifier:
        est = OrtGradientClassifier(MLPClassifier(hidden_layer_sizes=(11,)), **params)
        y = (y > np.median(y)).astype(int)
    else:
        est = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(11,)), **params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X, y)
    final = est.estimator_
    return [c.copy() for c in final.coefs_ + final.intercepts_], list(est.loss_curve_)


@pytest.mark.parametrize("classifier", [False, True], ids=["regressor", "classifier"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_two_fits_at_once_in_two_threads_give_what_each_gives_alone(backend, classifier):
    X, y = _data()
    settings = [(3, 1e-2, 1e-4), (4, 3e-3, 3e-2)]
    alone = [_fit(backend, *s, X, y, classifier) for s in settings]
    results = [None, None]
    start = threading.Barrier(2)
    errors = []

    def run(k):
        try:
            start.wait()
            results[k] = _fit(backend, *settings[k], X, y, classifier)
        except BaseException as exc:  # reported below
            errors.append(exc)

    for _ in range(2):
        threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        for (weights, curve), (ref_weights, ref_curve) in zip(results, alone):
            assert curve == ref_curve
            for a, b in zip(weights, ref_weights):
                np.testing.assert_array_equal(a, b)


def test_the_pool_gives_a_checked_out_object_to_one_fit_at_a_time():
    """A fit holds its TrainingAgent until it ends; another fit meanwhile gets another."""
    pool = runtime.SessionPool()
    made = []
    first = pool.checkout("k", lambda: made.append(1) or object())
    second = pool.checkout("k", lambda: made.append(2) or object())
    assert first is not second and made == [1, 2]
    pool.give_back("k", first)
    assert pool.checkout("k", lambda: made.append(3)) is first and made == [1, 2]
    assert pool.shared("s", lambda: "session") == pool.shared("s", lambda: "other")
    assert pool.shared(None, lambda: "new") == "new"  # no key: never kept


def test_the_pool_keeps_the_most_recent_sessions_within_its_bounds():
    pool = runtime.SessionPool(size=3, weights=100)
    for k in range(4):
        pool.shared(k, lambda k=k: f"session {k}", weights=10)
    assert list(pool._shared) == [1, 2, 3]  # at most 3: the oldest went
    pool.shared(1, lambda: "again")  # used: now the most recent
    pool.shared(4, lambda: "big", weights=85)  # 4 sessions, then 105 weights: two go
    assert list(pool._shared) == [1, 4]
    assert pool.shared(4, lambda: "other") == "big"
