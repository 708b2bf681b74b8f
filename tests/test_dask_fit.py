"""fit on a dask cluster: full-batch L-BFGS on the workers, predict by partition.

One LocalCluster of 2 worker processes (1 thread each) serves the module; the tests
that kill a worker come last.
"""

import contextlib
import functools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest

dask = pytest.importorskip("dask")
da = pytest.importorskip("dask.array")
dd = pytest.importorskip("dask.dataframe")
distributed = pytest.importorskip("distributed")
pd = pytest.importorskip("pandas")
onnxruntime = pytest.importorskip("onnxruntime")

from _dask_counts import Counting, engines, predicted, predictors, served  # noqa: E402
from _helpers import BACKENDS  # noqa: E402
from sklearn.compose import ColumnTransformer  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.impute import SimpleImputer  # noqa: E402
from sklearn.linear_model import LogisticRegression, PoissonRegressor  # noqa: E402
from sklearn.neural_network import MLPClassifier, MLPRegressor  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import OneHotEncoder, StandardScaler  # noqa: E402

import onnxgrad_sklearn  # noqa: E402
from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor, _dask  # noqa: E402
from onnxgrad_sklearn._dask import batches, rounds  # noqa: E402
from onnxgrad_sklearn._dask import client as dask_client  # noqa: E402
from onnxgrad_sklearn._fit import Fit  # noqa: E402

#: Seconds any test of this module may take before it fails (a hang guard).
TEST_TIMEOUT_S = 150


@pytest.fixture(autouse=True)
def hang_guard():
    """Fail a test that runs past TEST_TIMEOUT_S instead of hanging the suite."""

    def expire(signum, frame):
        raise TimeoutError(f"the test ran past {TEST_TIMEOUT_S} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(TEST_TIMEOUT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def client():
    # A LocalCluster closes a worker's nanny for good when no worker of its name is
    # back 15 s (lost-worker-timeout) after it left: checked at that instant, a timer
    # of an earlier test's kill that lands while the nanny restarts the worker of a
    # later kill closes it, and the cluster stays at one worker (seen once in CI).
    with (
        dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"}),
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        c.run(dask_client._versions)  # the workers import the package and onnxruntime once
        c.register_plugin(Counting())  # what the tests count on the workers (_dask_counts)
        yield c


def binary_data(n=6000, p=10, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.randn(n, p).astype(np.float32)
    y = (X @ rng.randn(p) + 0.5 * rng.randn(n) > 0).astype(np.int64)
    return X, y


def weights_of(est):
    final = est.estimator_
    return np.concatenate([np.ravel(final.coef_), np.ravel(final.intercept_)])


def assert_close_fit(got, expected, rtol, atol):
    np.testing.assert_allclose(weights_of(got), weights_of(expected), rtol=rtol, atol=atol)


def assert_close_fit_of(got, expected, rtol, atol):
    """Coefficients of two fitted linear models."""
    for name in ("coef_", "intercept_"):
        np.testing.assert_allclose(
            getattr(got, name), getattr(expected, name), rtol=rtol, atol=atol
        )


# without a client (first: the module's cluster is not started yet) ---------------
def test_import_does_not_import_dask():
    code = "import sys, onnxgrad_sklearn; print(sorted(m for m in sys.modules if 'dask' in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_onnx_template_trains_where_its_batches_are(client, caplog):
    """An ONNX template's rows are not placed on the workers (its input interface says
    why): the collections are computed into memory, the fit is the one in memory."""
    from onnx import TensorProto, helper, numpy_helper

    from onnxgrad_sklearn import OnnxTemplate, OrtGradientRegressor

    W = numpy_helper.from_array(np.full((4, 1), 0.1, np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["y"])],
        "linear",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1])],
        [W],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    rng = np.random.RandomState(0)
    X = rng.rand(400, 4).astype(np.float32)
    y = X @ np.array([1.0, -1.0, 0.5, 2.0], np.float32)
    Xd, yd = da.from_array(X, chunks=100), da.from_array(y, chunks=100)
    with caplog.at_level(logging.INFO, logger="onnxgrad_sklearn"):
        got = OrtGradientRegressor(OnnxTemplate(model), max_iter=3, random_state=0).fit(Xd, yd)
    assert "the template is an ONNX model" in caplog.text
    expected = OrtGradientRegressor(OnnxTemplate(model), max_iter=3, random_state=0).fit(X, y)
    np.testing.assert_array_equal(got.predict(X), expected.predict(X))


def test_no_client_computes_into_memory(caplog):
    if dask_client._get_client() is not None:
        pytest.skip("a distributed client of another test is running")
    X, y = binary_data(2000, 5)
    Xd, yd = da.from_array(X, chunks=500), da.from_array(y, chunks=500)
    with caplog.at_level(logging.INFO, logger="onnxgrad_sklearn"):
        got = OrtGradientClassifier(LogisticRegression()).fit(Xd, yd)
    assert "distributed.Client()" in caplog.text
    expected = OrtGradientClassifier(LogisticRegression()).fit(X, y)
    np.testing.assert_array_equal(weights_of(got), weights_of(expected))
    # predict on dask collections with the local scheduler
    proba = got.predict_proba(Xd)
    assert isinstance(proba, da.Array)
    np.testing.assert_array_equal(proba.compute(), expected.predict_proba(X))
    assert got.score(Xd, yd) == pytest.approx(expected.score(X, y), abs=1e-12)
    # a dask DataFrame and Series: as the pandas ones
    frame = pd.DataFrame(X, columns=[f"f{i}" for i in range(X.shape[1])])
    ddf, ds = dd.from_pandas(frame, npartitions=3), dd.from_pandas(pd.Series(y), npartitions=3)
    got = OrtGradientClassifier(LogisticRegression()).fit(ddf, ds)
    expected = OrtGradientClassifier(LogisticRegression()).fit(frame, y)
    np.testing.assert_array_equal(weights_of(got), weights_of(expected))
    assert list(got.feature_names_in_) == list(frame.columns)


# on the cluster ------------------------------------------------------------------
def test_lbfgs_binary_float32_matches_one_machine(client):
    X, y = binary_data()
    expected = OrtGradientClassifier(LogisticRegression(C=0.5)).fit(X, y)
    before = served(client)
    Xd, yd = da.from_array(X, chunks=1500), da.from_array(y, chunks=1500)
    got = OrtGradientClassifier(LogisticRegression(C=0.5)).fit(Xd, yd)
    assert_close_fit(got, expected, rtol=1e-4, atol=1e-5)
    assert got.n_iter_ == pytest.approx(expected.n_iter_, abs=2)
    after = served(client)
    # one task per worker and evaluation, on both workers
    assert all(after[a] > before.get(a, 0) for a in after), (before, after)
    # the fit's engines are dropped from the workers once it returns (not waited for)
    deadline = time.monotonic() + 10
    while any(engines(client).values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(engines(client).values())


def test_poisson_float64_from_a_dataframe(client):
    rng = np.random.RandomState(1)
    X = rng.rand(5000, 6)
    y = rng.poisson(np.exp(X @ rng.randn(6) * 0.5)).astype(np.float64)
    frame = pd.DataFrame(X, columns=list("abcdef"))
    expected = OrtGradientRegressor(PoissonRegressor(alpha=0.01), dtype="float64").fit(frame, y)
    ddf = dd.from_pandas(frame, npartitions=4)
    ys = dd.from_pandas(pd.Series(y), npartitions=4)
    got = OrtGradientRegressor(PoissonRegressor(alpha=0.01), dtype="float64").fit(ddf, ys)
    assert_close_fit(got, expected, rtol=1e-8, atol=1e-8)
    assert list(got.feature_names_in_) == list("abcdef")
    # predict and score on the DataFrame: dask collections, the local numbers
    pred = got.predict(ddf)
    assert isinstance(pred, da.Array)
    np.testing.assert_allclose(pred.compute(), expected.predict(frame), rtol=1e-7)
    assert got.score(ddf, ys) == pytest.approx(expected.score(frame, y), rel=1e-7)


def test_lbfgs_mlp_regressor_template_matches_one_machine(client):
    X, y = diabetes()
    template = MLPRegressor(hidden_layer_sizes=(6,), solver="lbfgs", max_iter=40)
    params = dict(random_state=0, max_iter=40)
    with pytest.warns(ConvergenceWarning):
        got = OrtGradientRegressor(template, **params).fit(
            da.from_array(X, chunks=150), da.from_array(y, chunks=150)
        )
    with pytest.warns(ConvergenceWarning):
        expected = OrtGradientRegressor(template, **params).fit(X, y)
    assert got.n_iter_ == expected.n_iter_
    np.testing.assert_allclose(mlp_weights(got), mlp_weights(expected), rtol=1e-4, atol=1e-5)


def test_three_classes_with_weights(client):
    rng = np.random.RandomState(2)
    X = rng.randn(4500, 6).astype(np.float32)
    y = np.digitize(X @ rng.randn(6) + 0.3 * rng.randn(4500), [-0.7, 0.5])  # 3 classes
    labels = np.array(["a", "b", "c"])[y]
    sw = rng.rand(4500)
    template = LogisticRegression(class_weight="balanced")
    expected = OrtGradientClassifier(template).fit(X, labels, sample_weight=sw)
    got = OrtGradientClassifier(template).fit(
        da.from_array(X, chunks=1000),
        da.from_array(labels, chunks=1000),
        sample_weight=da.from_array(sw, chunks=1000),
    )
    np.testing.assert_array_equal(got.classes_, ["a", "b", "c"])
    assert_close_fit(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize(
    "params",
    [
        dict(max_iter=15),  # L-BFGS
        dict(optimizer="adam", batch_size=20_000, max_iter=3, random_state=0),  # sync_every=1
        dict(optimizer="adam", batch_size=20_000, max_iter=3, random_state=0, sync_every=4),
    ],
    ids=["lbfgs", "sync", "local-sgd"],
)
def test_the_data_stays_on_the_workers(client, params):
    """51 MB of float32 rows made on the workers: the client process never holds them
    (a mini-batch fit draws the order of the rows here: a few bytes a row, 256 of X)."""
    import psutil

    n, p = 200_000, 64
    X = da.random.RandomState(0).standard_normal((n, p), chunks=(20_000, p)).astype(np.float32)
    y = (X[:, 0] + X[:, 1] - X[:, 2] > 0).astype(np.int64)
    small = da.random.RandomState(1).standard_normal((2000, p), chunks=(500, p)).astype("f4")
    with warnings.catch_warnings():  # what any fit loads here (libraries, sessions) first
        warnings.simplefilter("ignore", ConvergenceWarning)
        OrtGradientClassifier(LogisticRegression(), **params).fit(small, small[:, 0] > 0)
    process = psutil.Process()
    start = process.memory_info().rss
    peak = [start]
    done = threading.Event()

    def sample():
        while not done.wait(0.01):
            peak[0] = max(peak[0], process.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    before = served(client)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            est = OrtGradientClassifier(LogisticRegression(), **params).fit(X, y)
    finally:
        done.set()
        sampler.join()
    after = served(client)
    grown = (peak[0] - start) / 2**20
    # X alone would be 49 MiB; a mini-batch fit's order of the rows and the workers'
    # shares of it (about 30 bytes a row at the peak, 6 MiB), the fit's own bookkeeping
    # and the scheduler, which runs in this process, stay well below
    assert grown < 30, f"the client grew by {grown:.0f} MiB for 51 MB of data"
    assert all(after[a] > before.get(a, 0) for a in after), (before, after)
    X, y = X.compute(), y.compute()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        expected = OrtGradientClassifier(LogisticRegression(), **params).fit(X, y)
    if params.get("sync_every", 1) == 1:  # L-BFGS, synchronous steps: the same fit
        assert est.n_iter_ == expected.n_iter_
        assert_close_fit(est, expected, rtol=1e-4, atol=1e-5)
    else:  # local SGD: an approximation, which loses little accuracy (after 30 steps
        # of Adam, far from converged, it can as well be ahead, with the placement)
        assert est.score(X, y) > expected.score(X, y) - 0.02


def test_partitions_all_on_one_worker_are_spread_once(client, caplog):
    client.wait_for_workers(2, timeout=60)
    X, y = binary_data(8000, 5, seed=9)
    one = sorted(client.nthreads())[0]
    Xd = client.persist(da.from_array(X, chunks=1000), workers=[one])
    yd = client.persist(da.from_array(y, chunks=1000), workers=[one])
    before = served(client)
    with caplog.at_level(logging.INFO, logger="onnxgrad_sklearn"):
        got = OrtGradientClassifier(LogisticRegression()).fit(Xd, yd)
    after = served(client)
    assert "4 partitions moved before the fit" in caplog.text
    assert all(after[a] > before.get(a, 0) for a in after), (before, after)
    expected = OrtGradientClassifier(LogisticRegression()).fit(X, y)
    assert_close_fit(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("optimizer", ["lbfgs", "adam"])
def test_sparse_blocks_train_on_the_workers(client, optimizer):
    import scipy.sparse as sp

    X, y = binary_data(1200, 8, seed=10)
    X[np.abs(X) < 1] = 0  # about two thirds zeros
    Xs = sp.csr_matrix(X)
    Xd = da.from_array(X, chunks=(300, 8)).map_blocks(sp.csr_matrix, dtype=X.dtype)
    params = dict(optimizer=optimizer, max_iter=5, random_state=0)
    before = served(client)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        got = OrtGradientClassifier(LogisticRegression(), **params).fit(
            Xd, da.from_array(y, chunks=300)
        )
        expected = OrtGradientClassifier(LogisticRegression(), **params).fit(Xs, y)
    assert sum(served(client).values()) > sum(before.values())
    assert_close_fit(got, expected, rtol=1e-4, atol=1e-5)


def test_multilabel_targets_train_on_the_workers(client):
    X, _ = binary_data(900, 6, seed=11)
    Y = np.stack([X[:, 0] > 0, X[:, 1] + X[:, 2] > 0, X[:, 3] > 0.5], axis=1).astype(np.int64)
    params = dict(optimizer="adam", max_iter=3, batch_size=64, random_state=0)
    template = MLPClassifier(hidden_layer_sizes=(8,))
    before = served(client)
    with pytest.warns(ConvergenceWarning):
        got = OrtGradientClassifier(template, **params).fit(
            da.from_array(X, chunks=300), da.from_array(Y, chunks=(300, 3))
        )
    assert sum(served(client).values()) > sum(before.values())
    with pytest.warns(ConvergenceWarning):
        expected = OrtGradientClassifier(template, **params).fit(X, Y)
    assert got._multilabel and list(got.classes_) == [0, 1, 2]
    np.testing.assert_allclose(got.loss_curve_, expected.loss_curve_, rtol=1e-5)
    np.testing.assert_allclose(mlp_weights(got), mlp_weights(expected), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(got.predict(X), expected.predict(X))


def test_partitions_held_by_both_workers_are_served_by_both(client, caplog):
    """Blocks replicated on every worker: each worker serves half of them, none moved."""
    client.wait_for_workers(2, timeout=60)
    X, y = binary_data(8000, 5, seed=12)
    Xd = client.persist(da.from_array(X, chunks=1000))
    yd = client.persist(da.from_array(y, chunks=1000))
    futures = distributed.futures_of(Xd) + distributed.futures_of(yd)
    client.replicate(futures, n=2)
    assert all(len(w) == 2 for w in client.who_has(futures).values())
    before = served(client)
    with caplog.at_level(logging.INFO, logger="onnxgrad_sklearn"):
        got = OrtGradientClassifier(LogisticRegression()).fit(Xd, yd)
    after = served(client)
    assert "moved before the fit" not in caplog.text
    counts = [after[a] - before.get(a, 0) for a in after]
    assert len(counts) == 2 and counts[0] == counts[1] > 0, counts  # one task each a round
    expected = OrtGradientClassifier(LogisticRegression()).fit(X, y)
    assert_close_fit(got, expected, rtol=1e-4, atol=1e-5)


def test_predict_on_dask_collections(client):
    X, y = binary_data(3000, 5, seed=3)
    est = OrtGradientClassifier(LogisticRegression()).fit(X, y)
    Xd = da.from_array(X, chunks=500)
    predictors(client, clear=True)
    for name in ("predict", "predict_proba", "predict_log_proba", "decision_function"):
        out = getattr(est, name)(Xd)
        assert isinstance(out, da.Array), name
        got, expected = out.compute(), getattr(est, name)(X)
        assert got.shape == expected.shape and got.dtype == expected.dtype, name
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7, err_msg=name)
    # the estimator is one key of each graph: unpickled once per worker and call
    seen = predictors(client, clear=True)
    assert sum(sum(c.values()) for c in seen.values()) == 4 * Xd.numblocks[0]
    assert all(len(c) <= 4 for c in seen.values()), seen
    assert est.score(Xd, da.from_array(y, chunks=500)) == pytest.approx(est.score(X, y), abs=1e-12)


def mlp_weights(est):
    final = est.estimator_
    return np.concatenate([np.ravel(w) for w in [*final.coefs_, *final.intercepts_]])


def diabetes():
    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True)
    X = ((X - X.mean(axis=0)) / X.std(axis=0)).astype(np.float32)
    return X, (y - y.mean()) / y.std()


def scattered(monkeypatch, sent):
    """``sent="scattered"``: what a task would carry, whatever its size, is scattered to
    the workers instead (the weights of an L-BFGS evaluation, the validation rows'
    numbers once; a mini-batch round's calls carry theirs)."""
    if sent == "scattered":
        monkeypatch.setattr(rounds, "INLINE_BYTES", 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sync_every_1_adam_matches_one_machine(client, backend):
    """Each step's batch is the one the fit in memory draws, its sums made where its
    rows are: the weights and the loss curve of the one-machine fit."""
    X, y = diabetes()
    params = dict(optimizer="adam", max_iter=3, batch_size=32, random_state=0, backend=backend)
    template = MLPRegressor(hidden_layer_sizes=(16,), alpha=0.1)
    before = served(client)
    with pytest.warns(ConvergenceWarning):
        got = OrtGradientRegressor(template, **params).fit(
            da.from_array(X, chunks=150), da.from_array(y, chunks=150)
        )
    after = served(client)
    with pytest.warns(ConvergenceWarning):
        expected = OrtGradientRegressor(template, **params).fit(X, y)
    assert got.n_iter_ == expected.n_iter_ == 3
    np.testing.assert_allclose(got.loss_curve_, expected.loss_curve_, rtol=1e-5)
    np.testing.assert_allclose(mlp_weights(got), mlp_weights(expected), rtol=1e-4, atol=1e-5)
    # 14 batches an epoch: both workers served rounds
    assert all(after[a] > before.get(a, 0) for a in after), (before, after)
    np.testing.assert_allclose(got.predict(X), expected.predict(X), rtol=1e-4, atol=1e-5)


def test_a_large_model_sends_its_engine_weights_to_the_workers(client, monkeypatch):
    """While a large model trains, its weights are only in the client's engine
    (``_release_trained_values``): the recipe the workers build their engines from
    carries them. The fit of the model in memory."""
    from onnxgrad_sklearn import runtime

    X, y = diabetes()
    params = dict(optimizer="adam", max_iter=2, batch_size=64, random_state=0)
    template = MLPRegressor(hidden_layer_sizes=(8,))
    with pytest.warns(ConvergenceWarning):
        expected = OrtGradientRegressor(template, **params).fit(X, y)
    monkeypatch.setattr(runtime, "LARGE_MODEL", 0)  # as for a model of 1M weights
    monkeypatch.setattr(runtime, "map_large_blocks", lambda threshold: False)  # not here
    with pytest.warns(ConvergenceWarning):
        got = OrtGradientRegressor(template, **params).fit(
            da.from_array(X, chunks=150), da.from_array(y, chunks=150)
        )
    assert got._engine.large
    np.testing.assert_allclose(got.loss_curve_, expected.loss_curve_, rtol=1e-5)
    np.testing.assert_allclose(mlp_weights(got), mlp_weights(expected), rtol=1e-4, atol=1e-5)


def test_sync_every_1_nesterov_classifier_with_weights(client):
    X, y = binary_data(900, 6, seed=4)
    y = y + (X[:, 0] > 1)  # three classes
    w = np.random.RandomState(0).uniform(0.2, 2.0, len(y))
    params = dict(optimizer="nesterov", max_iter=3, batch_size=64, random_state=1)
    template = MLPClassifier(hidden_layer_sizes=(8,), learning_rate_init=0.05)
    with pytest.warns(ConvergenceWarning):
        got = OrtGradientClassifier(template, **params).fit(
            da.from_array(X, chunks=200), da.from_array(y, chunks=200), da.from_array(w, chunks=200)
        )
    with pytest.warns(ConvergenceWarning):
        expected = OrtGradientClassifier(template, **params).fit(X, y, w)
    np.testing.assert_array_equal(got.classes_, expected.classes_)
    np.testing.assert_allclose(got.loss_curve_, expected.loss_curve_, rtol=1e-5)
    np.testing.assert_allclose(mlp_weights(got), mlp_weights(expected), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        got.predict_proba(X), expected.predict_proba(X), rtol=1e-4, atol=1e-6
    )


def test_sync_every_1_early_stopping_on_a_given_validation_set(client):
    X, y = diabetes()
    params = dict(
        optimizer="adam",
        max_iter=30,
        early_stopping=True,
        tol=0.05,
        n_iter_no_change=2,
        random_state=0,
    )
    template = MLPRegressor(hidden_layer_sizes=(8,))
    X_val, y_val = X[:60], y[:60]
    got = OrtGradientRegressor(template, **params).fit(
        da.from_array(X, chunks=150),
        da.from_array(y, chunks=150),
        X_val=da.from_array(X_val, chunks=30),
        y_val=y_val,
    )
    expected = OrtGradientRegressor(template, **params).fit(X, y, X_val=X_val, y_val=y_val)
    assert got.n_iter_ == expected.n_iter_ < 30  # stopped early, at the same epoch
    np.testing.assert_allclose(got.validation_scores_, expected.validation_scores_, rtol=1e-4)
    np.testing.assert_allclose(mlp_weights(got), mlp_weights(expected), rtol=1e-4, atol=1e-5)


@pytest.fixture
def gathered(monkeypatch):
    """The shapes of the arrays the client gathers from the cluster while recording."""
    shapes, recording = [], [False]
    original = distributed.Client.gather

    def walk(value):
        if isinstance(value, np.ndarray):
            shapes.append(value.shape)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)

    def gather(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if recording[0]:
            walk(out)
        return out

    monkeypatch.setattr(distributed.Client, "gather", gather)
    return shapes, recording


def _early_stopping_case(kind, rows):
    """Early stopping's parameters, the estimator's maker and the data (diabetes for a
    regressor, ``rows`` binary rows for a classifier)."""
    params = dict(
        optimizer="adam", max_iter=40, early_stopping=True, tol=0.01, n_iter_no_change=2,
        learning_rate_init=0.01, random_state=0,
    )  # fmt: skip
    if kind == "regressor":
        make = functools.partial(OrtGradientRegressor, MLPRegressor(hidden_layer_sizes=(8,)))
        return params, make, *diabetes()
    make = functools.partial(OrtGradientClassifier, MLPClassifier(hidden_layer_sizes=(8,)))
    return params, make, *binary_data(rows, 5, seed=8)


@pytest.mark.parametrize("kind", ["regressor", "binary"])
def test_a_dask_validation_set_is_scored_on_the_workers(client, kind, caplog):
    """X_val, y_val and sample_weight_val as dask arrays, sync_every=1: the epochs and
    validation scores of the fit in memory; the validation rows are predicted where
    they are, each once an epoch."""
    params, make, X, y = _early_stopping_case(kind, 1200)
    X, X_val, y, y_val = X[100:], X[:100], y[100:], y[:100]
    sw_val = np.random.RandomState(0).uniform(0.5, 2.0, 100)
    sw_val[:40] = 0  # a partition of weights all zero is one of a validation set
    before = predicted(client)
    with caplog.at_level(logging.INFO, logger="onnxgrad_sklearn"):
        got = make(**params).fit(
            da.from_array(X, chunks=150),
            da.from_array(y, chunks=150),
            X_val=da.from_array(X_val, chunks=40),
            y_val=da.from_array(y_val, chunks=40),
            sample_weight_val=da.from_array(sw_val, chunks=40),
        )
    after = predicted(client)
    assert "computed into memory" not in caplog.text
    assert "the validation set: 100 rows in 3 partitions" in caplog.text
    assert sum(after.values()) - sum(before.values()) == 100 * got.n_iter_
    expected = make(**params).fit(X, y, X_val=X_val, y_val=y_val, sample_weight_val=sw_val)
    assert got.n_iter_ == expected.n_iter_ < 40  # stopped early, at the same epoch
    # measured: 1.2e-7 at most (the R2 of a regressor crosses zero)
    np.testing.assert_allclose(got.validation_scores_, expected.validation_scores_, atol=1e-5)
    np.testing.assert_allclose(mlp_weights(got), mlp_weights(expected), rtol=1e-4, atol=1e-5)


def test_a_dask_validation_set_with_local_sgd(client, caplog, gathered):
    """sync_every=4, X_val made on a worker that holds no training rows: it is
    predicted there (the engine's bytes sent to it), never brought to the client; the
    weights kept score best_validation_score_ on it."""
    client.wait_for_workers(2, timeout=60)
    first, second = sorted(client.nthreads())
    p = 7
    rng = da.random.RandomState(3)

    def rows(n, chunks):  # made on the workers
        X = rng.standard_normal((n, p), chunks=(chunks, p)).astype(np.float32)
        return X, X[:, 0] - 0.5 * X[:, 2] + 0.1 * rng.standard_normal(n, chunks=chunks)

    # the training rows in one partition on the first worker, X_val on the second
    X, y = client.persist(list(rows(1000, 1000)), workers=[first])
    X_val, y_val = rows(300, 100)
    sw_val = rng.uniform(0.5, 2.0, 300, chunks=100)
    X_val, y_val, sw_val = client.persist([X_val, y_val, sw_val], workers=[second])
    distributed.wait([X, y, X_val, y_val, sw_val])
    params = dict(
        optimizer="adam", max_iter=15, batch_size=32, learning_rate_init=0.01,
        early_stopping=True, tol=1e-3, n_iter_no_change=3, random_state=0, sync_every=4,
    )  # fmt: skip
    est = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(16,)), **params)
    shapes, recording = gathered
    before, rows_before = served(client), predicted(client)
    recording[0] = True
    with caplog.at_level(logging.INFO, logger="onnxgrad_sklearn"), warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        got = est.fit(X, y, X_val=X_val, y_val=y_val, sample_weight_val=sw_val)
    recording[0] = False
    after, rows_after = served(client), predicted(client)
    assert "computed into memory" not in caplog.text
    assert after[first] > before.get(first, 0) and after[second] == before.get(second, 0)
    # every validation row predicted once an epoch, on the second worker
    assert rows_after[second] - rows_before.get(second, 0) == 300 * got.n_iter_
    assert rows_after[first] == rows_before.get(first, 0)
    # no array with X_val's columns came to the client: predictions, targets, weights
    assert shapes and not any(len(s) == 2 and s[1] == p for s in shapes), shapes
    assert len(got.validation_scores_) == got.n_iter_ >= 2
    # the weights kept are the best epoch's: their score on X_val is the best score
    X_np, y_np, sw_np = client.compute([X_val, y_val, sw_val], sync=True)
    assert got.score(X_np, y_np, sample_weight=sw_np) == pytest.approx(
        got.best_validation_score_, abs=1e-5
    )
    assert got.score(X_val, y_val, sample_weight=sw_val) == pytest.approx(
        got.best_validation_score_, abs=1e-5
    )
    assert got.best_validation_score_ > 0.8


def test_a_dask_validation_set_is_checked_as_one_in_memory(client):
    X, y = binary_data(600, 4, seed=5)
    Xd, yd = da.from_array(X, chunks=200), da.from_array(y, chunks=200)
    est = OrtGradientClassifier(
        MLPClassifier(hidden_layer_sizes=(4,)), optimizer="adam", max_iter=2, early_stopping=True
    )
    X_val = da.from_array(X[:50], chunks=25)
    with pytest.raises(ValueError, match=r"y_val contains labels \[2\] that are not among"):
        est.fit(Xd, yd, X_val=X_val, y_val=da.from_array(np.full(50, 2), chunks=25))
    with pytest.raises(ValueError, match="X has 3 features, but OrtGradientClassifier"):
        est.fit(Xd, yd, X_val=X_val[:, :3], y_val=y[:50])
    with pytest.raises(ValueError, match="must contain at least one non-zero number"):
        est.fit(Xd, yd, X_val=X_val, y_val=y[:50], sample_weight_val=np.zeros(50))
    with pytest.raises(ValueError, match="y_val has 2 columns"):
        est.fit(Xd, yd, X_val=X_val, y_val=np.stack([y[:50], y[:50]], axis=1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_local_sgd_loss_and_score(client, backend):
    """sync_every=4: each worker makes 4 steps on its own rows, then the weights and the
    optimizer state are averaged: 4 rounds an epoch of 14 steps; approximate."""
    X, y = diabetes()
    params = dict(
        optimizer="adam", max_iter=30, batch_size=32, learning_rate_init=0.003, random_state=0
    )
    template = MLPRegressor(hidden_layer_sizes=(32,))
    with pytest.warns(ConvergenceWarning):
        expected = OrtGradientRegressor(template, backend=backend, **params).fit(X, y)
    before = served(client)
    with pytest.warns(ConvergenceWarning):
        got = OrtGradientRegressor(template, backend=backend, sync_every=4, **params).fit(
            da.from_array(X, chunks=150), da.from_array(y, chunks=150)
        )
    after = served(client)
    # 4 rounds an epoch on both workers, and the check of the last update's loss on
    # the last rows (one worker's)
    assert sorted(after[a] - before.get(a, 0) for a in after) == [30 * 4, 30 * 4 + 1]
    assert got.n_iter_ == 30 and len(got.loss_curve_) == 30
    assert np.all(np.diff(got.loss_curve_[:10]) < 0)
    # measured: 0.196 against 0.191 (2.4 %), R2 0.614 against 0.625
    assert got.loss_curve_[-1] == pytest.approx(expected.loss_curve_[-1], rel=0.05)
    assert got.loss_curve_[-1] != pytest.approx(expected.loss_curve_[-1], rel=1e-4)
    assert got.score(X, y) == pytest.approx(expected.score(X, y), abs=0.03)


def _scheduler_keys(dask_scheduler):
    return set(dask_scheduler.tasks)


@pytest.mark.parametrize(
    "params",
    [{}, {"optimizer": "nesterov", "max_iter": 2, "sync_every": 4, "batch_size": 64}],
    ids=["lbfgs", "local SGD"],
)
def test_a_fit_leaves_no_task_on_the_cluster(client, params):
    """A fit holds each round's futures until the next round is submitted (their
    release then goes with the submits); once it returns, nothing of it stays on the
    cluster (the last round's results, the engines' payloads, the partitions'
    futures): the scheduler is left with the user's collections."""
    X, y = binary_data(n=2000)
    Xd = client.persist(da.from_array(X, chunks=500))
    yd = client.persist(da.from_array(y, chunks=500))
    distributed.wait([Xd, yd])
    before = client.run_on_scheduler(_scheduler_keys)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        OrtGradientClassifier(LogisticRegression(), **params).fit(Xd, yd)
    deadline = time.monotonic() + 10
    while client.run_on_scheduler(_scheduler_keys) != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.run_on_scheduler(_scheduler_keys) == before


@pytest.mark.parametrize(
    "make, short, long",
    [
        (lambda n: OrtGradientClassifier(LogisticRegression(), max_iter=n), 2, 12),
        (
            lambda n: OrtGradientRegressor(
                MLPRegressor(hidden_layer_sizes=(8,)), optimizer="adam", max_iter=n,
                batch_size=64, random_state=0,
            ),
            1, 3,
        ),
        (
            lambda n: OrtGradientRegressor(
                MLPRegressor(hidden_layer_sizes=(8,)), optimizer="adam", max_iter=n,
                batch_size=64, random_state=0, sync_every=4,
            ),
            1, 3,
        ),
    ],
    ids=["lbfgs", "sync", "local SGD"],
)  # fmt: skip
def test_rounds_are_calls_not_tasks(client, monkeypatch, make, short, long):
    """The training rounds go to each worker's server as calls: a fit submits as many
    tasks whatever its number of rounds (a round of tasks costs about 11 ms with
    nothing to compute, a round of calls 2 ms: docs/dask.md)."""
    X, y = diabetes()
    if short == 2:  # a classifier
        y = (y > np.median(y)).astype(np.int64)
    Xd, yd = da.from_array(X, chunks=150), da.from_array(y, chunks=150)
    submitted = []
    original = distributed.Client.submit

    def submit(self, func, *args, **kwargs):
        submitted.append(getattr(func, "__name__", str(func)))
        return original(self, func, *args, **kwargs)

    monkeypatch.setattr(distributed.Client, "submit", submit)
    counts, rounds = [], []
    original_serve = _dask.DaskRows.serve

    def serve(self, *args, **kwargs):
        rounds.append(1)
        return original_serve(self, *args, **kwargs)

    monkeypatch.setattr(_dask.DaskRows, "serve", serve)
    for n in (short, long):
        submitted.clear()
        rounds.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            make(n).fit(Xd, yd)
        counts.append((len(submitted), len(rounds)))
        # a server per worker (and per stage: local SGD's last check is a sync step)
        workers = len(client.nthreads())
        assert submitted.count("_Server") in (workers, 2 * workers)
    (short_tasks, short_rounds), (long_tasks, long_rounds) = counts
    assert long_rounds > short_rounds + 2
    assert long_tasks == short_tasks, counts


def test_sync_every_is_ignored_for_data_in_memory():
    X, y = diabetes()
    params = dict(optimizer="adam", max_iter=2, batch_size=32, random_state=0)
    template = MLPRegressor(hidden_layer_sizes=(8,))
    with pytest.warns(ConvergenceWarning):
        a = OrtGradientRegressor(template, sync_every=8, **params).fit(X, y)
    with pytest.warns(ConvergenceWarning):
        b = OrtGradientRegressor(template, **params).fit(X, y)
    np.testing.assert_array_equal(mlp_weights(a), mlp_weights(b))


def customers(n=1000, seed=0):
    rng = np.random.RandomState(seed)
    frame = pd.DataFrame(
        {
            "age": rng.uniform(20, 70, n),
            "amount": rng.lognormal(3, 1, n),
            "city": rng.choice(["paris", "lyon", "nice", "lille"], n),
        }
    )
    noise = rng.randn(n) * 0.5
    y = ((frame.age - 45) / 10 + (frame.city == "nice") + noise > 0.3).astype(np.int64)
    return frame, y


def column_head():
    return ColumnTransformer(
        [("num", StandardScaler(), ["age", "amount"]), ("cat", OneHotEncoder(), ["city"])]
    )


def test_a_string_column_through_an_unfitted_column_transformer(client):
    """The head is fitted on the workers (the scaler's partial_fit partition after
    partition, the encoder's categories merged), applied where the partitions are; the
    final model trains there on its output."""
    frame, y = customers()
    template = make_pipeline(column_head(), LogisticRegression())
    before = served(client)
    got = OrtGradientClassifier(template).fit(
        dd.from_pandas(frame, npartitions=4), dd.from_pandas(y, npartitions=4)
    )
    assert sum(served(client).values()) > sum(before.values())  # rounds on the workers
    expected = OrtGradientClassifier(template).fit(frame, y)
    head, head_expected = got.estimator_[0], expected.estimator_[0]
    np.testing.assert_allclose(
        head.named_transformers_["num"].mean_, head_expected.named_transformers_["num"].mean_
    )
    np.testing.assert_allclose(
        head.named_transformers_["num"].scale_, head_expected.named_transformers_["num"].scale_
    )
    assert [list(c) for c in head.named_transformers_["cat"].categories_] == [
        ["lille", "lyon", "nice", "paris"]
    ]
    assert head.named_transformers_["cat"].get_params()["categories"] == "auto"
    assert_close_fit_of(got.estimator_[-1], expected.estimator_[-1], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        got.predict_proba(frame), expected.predict_proba(frame), rtol=1e-5, atol=1e-6
    )
    ddf = dd.from_pandas(frame, npartitions=3)
    np.testing.assert_allclose(got.predict_proba(ddf).compute(), got.predict_proba(frame))
    assert got.score(ddf, y) == pytest.approx(got.score(frame, y), abs=1e-12)
    # the export takes the raw columns, as after a fit on the pandas frame
    session = onnxruntime.InferenceSession(
        got.to_onnx().SerializeToString(), providers=["CPUExecutionProvider"]
    )
    feed = {
        "age": frame[["age"]].to_numpy(np.float32),
        "amount": frame[["amount"]].to_numpy(np.float32),
        "city": frame[["city"]].to_numpy(object),
    }
    np.testing.assert_allclose(
        session.run(None, feed)[1], got.predict_proba(frame), rtol=1e-5, atol=1e-6
    )


def test_a_numeric_pipeline_head_is_fitted_on_the_workers(client):
    rng = np.random.RandomState(1)
    X = (rng.randn(900, 5) * 10 + 3).astype(np.float32)
    y = X @ rng.randn(5) + rng.randn(900)
    template = make_pipeline(StandardScaler(), MLPRegressor(hidden_layer_sizes=(8,)))
    params = dict(optimizer="adam", max_iter=3, random_state=0)
    with pytest.warns(ConvergenceWarning):
        got = OrtGradientRegressor(template, **params).fit(
            da.from_array(X, chunks=300), da.from_array(y, chunks=300)
        )
    with pytest.warns(ConvergenceWarning):
        expected = OrtGradientRegressor(template, **params).fit(X, y)
    np.testing.assert_allclose(got.estimator_[0].mean_, expected.estimator_[0].mean_)
    np.testing.assert_allclose(got.estimator_[0].var_, expected.estimator_[0].var_, rtol=1e-10)
    np.testing.assert_allclose(got.predict(X), expected.predict(X), rtol=1e-5, atol=1e-5)


def test_a_head_whose_statistics_do_not_merge_is_refused(client):
    X, y = binary_data(400, 3)
    template = make_pipeline(SimpleImputer(), LogisticRegression())
    with pytest.raises(ValueError, match="'simpleimputer' is not fitted.*fit it first"):
        OrtGradientClassifier(template).fit(da.from_array(X, 100), da.from_array(y, 100))
    # fitted, it is applied as it is
    fitted = make_pipeline(SimpleImputer().fit(X), LogisticRegression())
    got = OrtGradientClassifier(fitted).fit(da.from_array(X, 100), da.from_array(y, 100))
    expected = OrtGradientClassifier(fitted).fit(X, y)
    assert_close_fit_of(got.estimator_[-1], expected.estimator_[-1], rtol=1e-4, atol=1e-5)


def test_partial_fit_makes_one_pass_on_the_workers(client):
    X, y = binary_data(900, 5, seed=2)
    template = MLPClassifier(hidden_layer_sizes=(8,))
    params = dict(optimizer="adam", batch_size=64, random_state=0)
    got = OrtGradientClassifier(template, **params)
    expected = OrtGradientClassifier(template, **params)
    before = served(client)
    for half in (slice(0, 450), slice(450, 900)):
        got.partial_fit(
            da.from_array(X[half], chunks=150), da.from_array(y[half], chunks=150), classes=[0, 1]
        )
        expected.partial_fit(X[half], y[half], classes=[0, 1])
    assert sum(served(client).values()) - sum(before.values()) >= 2 * 8  # 8 steps a call
    assert got.n_iter_ == expected.n_iter_ == 1
    np.testing.assert_allclose(got.loss_curve_, expected.loss_curve_, rtol=1e-5)
    np.testing.assert_allclose(mlp_weights(got), mlp_weights(expected), rtol=1e-4, atol=1e-5)
    with pytest.raises(AttributeError, match="partial_fit"):  # before any work
        OrtGradientClassifier(LogisticRegression(), optimizer="lbfgs").partial_fit(
            da.from_array(X, chunks=300), da.from_array(y, chunks=300), classes=[0, 1]
        )


@pytest.mark.parametrize(
    "kind, sent", [("regressor", "in tasks"), ("binary", "in tasks"), ("binary", "scattered")]
)
def test_early_stopping_split_on_the_workers(client, kind, sent, monkeypatch):
    """The split holds out the rows a fit in memory holds out (stratified for a binary
    classifier); the held-out rows are predicted where they are at each epoch."""
    scattered(monkeypatch, sent)
    params, make, X, y = _early_stopping_case(kind, 900)
    before = served(client)
    got = make(**params).fit(da.from_array(X, chunks=150), da.from_array(y, chunks=150))
    assert sum(served(client).values()) > sum(before.values())
    expected = make(**params).fit(X, y)
    assert got.n_iter_ == expected.n_iter_ < 40  # stopped early, at the same epoch
    np.testing.assert_allclose(got.validation_scores_, expected.validation_scores_, rtol=1e-5)
    np.testing.assert_allclose(got.loss_curve_, expected.loss_curve_, rtol=1e-5)
    np.testing.assert_allclose(mlp_weights(got), mlp_weights(expected), rtol=1e-4, atol=1e-5)


def test_what_the_workers_receive_once_is_one_value_of_its_own_key(client):
    """A dict (local SGD's held-out rows by partition) is sent as one value, under a key
    of this fit's, not scattered under its own keys, which every fit would share."""
    rows = _dask.DaskRows(client, da.zeros((4, 2), chunks=2))
    rows.placement = {address: [0] for address in client.nthreads()}
    sent = {0: np.arange(3), 3: np.arange(2)}
    future = rows.payloads[rows.register(sent)][1]
    assert isinstance(future, distributed.Future) and future.key not in (0, 3)
    got = future.result()
    assert sorted(got) == [0, 3] and got[0].tolist() == [0, 1, 2]
    rows.close()


def test_local_sgd_with_a_held_out_split_trains_on_the_workers(client, caplog, monkeypatch):
    """sync_every=4 with early stopping's split: the rows a fit in memory holds out are
    held out on the workers, scored there, and never trained on."""
    X, y = diabetes()
    params = dict(
        optimizer="adam", max_iter=20, batch_size=32, learning_rate_init=0.003,
        early_stopping=True, n_iter_no_change=100, random_state=0,
    )  # fmt: skip
    make = functools.partial(OrtGradientRegressor, MLPRegressor(hidden_layer_sizes=(32,)))
    held = []  # the rows each fit holds out
    original = Fit._split_validation

    def split(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        held.append(np.sort(out[2]))
        return out

    monkeypatch.setattr(Fit, "_split_validation", split)
    with pytest.warns(ConvergenceWarning):
        expected = make(**params).fit(X, y)
    # one placement of the partitions for both fits on the cluster
    Xd = client.persist(da.from_array(X, chunks=150))
    distributed.wait(Xd)
    before = served(client)
    with caplog.at_level(logging.INFO, logger="onnxgrad_sklearn"):
        with pytest.warns(ConvergenceWarning):
            got = make(sync_every=4, **params).fit(Xd, y)
    after = served(client)
    assert "computed into memory" not in caplog.text
    assert all(after[a] > before.get(a, 0) for a in after), (before, after)
    np.testing.assert_array_equal(held[1], held[0])  # the rows a fit in memory holds out
    assert len(got.validation_scores_) == len(expected.validation_scores_) == 20
    # the weights kept are those of the best epoch: on the held-out rows, its score
    rows = held[1]
    assert got.score(X[rows], y[rows]) == pytest.approx(got.best_validation_score_, abs=1e-5)
    # local SGD is approximate (test_local_sgd_loss_and_score: R2 within 0.03)
    assert got.best_validation_score_ == pytest.approx(expected.best_validation_score_, abs=0.03)
    # no held-out row trains: with their targets changed, the same training losses
    changed = y.copy()
    changed[rows] += 50.0
    with pytest.warns(ConvergenceWarning):
        other = make(sync_every=4, **params).fit(Xd, changed)
    np.testing.assert_array_equal(held[2], rows)
    np.testing.assert_array_equal(other.loss_curve_, got.loss_curve_)
    assert other.best_validation_score_ < -100  # scored on the changed targets


def test_the_workers_are_asked_for_not_taken_from_the_client_cache(client, monkeypatch):
    """``Client.scheduler_info()`` returns the client's cached identity, which its
    periodic update (without the workers) may replace between the fetch and the return:
    CI once saw "no worker" on a cluster of two. The fit asks the scheduler itself."""
    monkeypatch.setattr(type(client), "scheduler_info", lambda self, *a, **k: {"workers": {}})
    X, y = binary_data(600, 3)
    got = OrtGradientClassifier(LogisticRegression()).fit(da.from_array(X), da.from_array(y))
    expected = OrtGradientClassifier(LogisticRegression()).fit(X, y)
    assert_close_fit(got, expected, rtol=1e-4, atol=1e-5)


def test_workers_of_another_version_are_refused(client, monkeypatch):
    fake = functools.partial(dict, onnxgrad_sklearn="0.0.1", onnxruntime="0.0.2")
    monkeypatch.setattr(dask_client, "_worker_versions", fake)
    X, y = binary_data(300, 3)
    with pytest.raises(RuntimeError) as info:
        OrtGradientClassifier(LogisticRegression()).fit(da.from_array(X), da.from_array(y))
    message = str(info.value)
    here = dask_client._versions()
    assert f"onnxgrad_sklearn {onnxgrad_sklearn.__version__}" in message
    assert f"onnxruntime {here['onnxruntime']}" in message
    assert "onnxgrad_sklearn 0.0.1 with onnxruntime 0.0.2" in message


def _fit_in_a_task(X, y):
    Xd, yd = da.from_array(X, chunks=len(X) // 3), da.from_array(y, chunks=len(y) // 3)
    est = OrtGradientClassifier(LogisticRegression()).fit(Xd, yd)
    return weights_of(est), dask_client._get_client() is not None


def test_fit_from_inside_a_dask_task(client):
    X, y = binary_data(1500, 4, seed=4)
    import cloudpickle

    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)  # the workers cannot import this file
    try:
        weights, on_cluster = client.submit(_fit_in_a_task, X, y).result(timeout=120)
    finally:
        cloudpickle.unregister_pickle_by_value(module)
    assert on_cluster
    expected = OrtGradientClassifier(LogisticRegression()).fit(X, y)
    np.testing.assert_allclose(weights, weights_of(expected), rtol=1e-4, atol=1e-5)


# a worker dies mid-fit (last: the cluster loses a worker, its nanny starts another) -----
def _kill_a_worker_at(monkeypatch, client, evaluation):
    """Make the worker holding the first partition exit before the given evaluation."""
    original = _dask.DaskRows._round
    killed = []

    def run_round(self, *args, **kwargs):
        if self.rounds == evaluation and not killed:
            address = sorted(self.placement)[0]
            killed.append((address, time.monotonic()))
            try:
                client.run(os._exit, 1, workers=[address])
            except Exception:
                pass  # the worker exits before answering
        return original(self, *args, **kwargs)

    def serve(self, *args, **kwargs):  # local SGD's rounds
        if self.rounds == evaluation and not killed:
            address = sorted(self.placement)[0]
            killed.append((address, time.monotonic()))
            with contextlib.suppress(Exception):  # the worker exits before answering
                client.run(os._exit, 1, workers=[address])
        return original_serve(self, *args, **kwargs)

    original_serve = _dask.DaskRows.serve
    monkeypatch.setattr(_dask.DaskRows, "_round", run_round)
    monkeypatch.setattr(_dask.DaskRows, "serve", serve)
    return killed


def test_a_lost_worker_repeats_the_evaluation(client, monkeypatch):
    """Rows made by a dask graph are computed again: the same weights, no hang."""
    client.wait_for_workers(2, timeout=60)
    X = da.random.RandomState(5).standard_normal((40_000, 8), chunks=(5000, 8)).astype("f4")
    y = (X[:, 0] - X[:, 3] > 0.1).astype(np.int64)
    expected = OrtGradientClassifier(LogisticRegression()).fit(X, y)
    killed = _kill_a_worker_at(monkeypatch, client, evaluation=3)
    got = OrtGradientClassifier(LogisticRegression()).fit(X, y)
    assert killed
    np.testing.assert_array_equal(weights_of(got), weights_of(expected))


def test_ctrl_c_keeps_the_weights_of_the_last_completed_round(client, monkeypatch):
    """Interrupted at its 21st step, a fit on the cluster keeps the weights after 20,
    as a fit in memory interrupted at the same step does."""
    X, y = diabetes()
    from onnxgrad_sklearn import _data

    def interrupted(cls):
        original, calls = cls.train, []

        def train(self, engine, batch, learning_rate):
            calls.append(batch)
            if len(calls) == 21:
                raise KeyboardInterrupt
            return original(self, engine, batch, learning_rate)

        monkeypatch.setattr(cls, "train", train)

    fits = []
    for cls, data in [
        (batches._DaskBatches, (da.from_array(X, chunks=150), da.from_array(y, chunks=150))),
        (_data.MemoryBatches, (X, y)),
    ]:
        interrupted(cls)
        est = OrtGradientRegressor(
            MLPRegressor(hidden_layer_sizes=(8,)), optimizer="adam", batch_size=32, random_state=0
        )
        with pytest.raises(KeyboardInterrupt), pytest.warns(UserWarning, match="interrupted"):
            est.fit(*data)
        assert est.n_iter_ == 1 and len(est.loss_curve_) == 1  # 14 steps an epoch
        fits.append(est)
    np.testing.assert_allclose(mlp_weights(fits[0]), mlp_weights(fits[1]), rtol=1e-4, atol=1e-5)
    assert np.abs(mlp_weights(fits[0]) - mlp_weights(fits[1])).max() < 1e-5
    np.testing.assert_allclose(fits[0].predict(X), fits[1].predict(X), rtol=1e-4, atol=1e-5)


def _graph_rows(seed):
    """4,000 x 6 rows made by a dask graph (dask computes them again when lost)."""
    X = da.random.RandomState(seed).standard_normal((4000, 6), chunks=(500, 6)).astype("f4")
    return X, X[:, 0] - 2 * X[:, 3] + 0.1


def _fits_losing_a_worker(monkeypatch, client, X, y, evaluation, **params):
    """A (8,) MLP regressor fitted as given, then again with the worker of the first
    partition exiting before the round ``evaluation``: both fits."""
    template = MLPRegressor(hidden_layer_sizes=(8,))
    with pytest.warns(ConvergenceWarning):
        expected = OrtGradientRegressor(template, **params).fit(X, y)
    killed = _kill_a_worker_at(monkeypatch, client, evaluation=evaluation)
    with pytest.warns(ConvergenceWarning):
        got = OrtGradientRegressor(template, **params).fit(X, y)
    assert killed
    return expected, got


def test_a_lost_worker_repeats_the_round_of_a_mini_batch_fit(client, monkeypatch):
    """sync_every=1: the round is run again on the rows dask computed again (the
    servers made again for the new placement, and what was scattered to the workers
    sent again); the weights of the fit that lost no worker, within float32 sums'
    reordering."""
    client.wait_for_workers(2, timeout=60)
    X, y = _graph_rows(7)
    params = dict(optimizer="adam", max_iter=2, batch_size=256, random_state=0)
    expected, got = _fits_losing_a_worker(monkeypatch, client, X, y, 5, **params)
    np.testing.assert_allclose(got.loss_curve_, expected.loss_curve_, rtol=1e-5)
    np.testing.assert_allclose(mlp_weights(got), mlp_weights(expected), rtol=1e-4, atol=1e-5)
    client.wait_for_workers(2, timeout=60)


def test_a_lost_worker_repeats_the_round_of_local_sgd(client, monkeypatch):
    """sync_every=4 (4 rounds an epoch): the worker holding the first partition exits
    before the 6th round; its partitions, made by a dask graph, are computed again,
    servers are made for the new placement and the round is run again from the weights
    before it. The workers then hold other rows than in the fit that lost none (local
    SGD's result depends on which rows each worker trains on): the same epochs, a final
    loss within 5%."""
    client.wait_for_workers(2, timeout=60)
    # persisted: both fits start from the same placement (dask computes them again)
    X, y = client.persist(list(_graph_rows(8)))
    params = dict(optimizer="adam", max_iter=4, batch_size=256, random_state=0, sync_every=4)
    expected, got = _fits_losing_a_worker(monkeypatch, client, X, y, 5, **params)
    assert got.n_iter_ == 4 and len(got.loss_curve_) == 4
    # the first epoch, before the loss: the same rounds on the same workers
    np.testing.assert_allclose(got.loss_curve_[0], expected.loss_curve_[0], rtol=1e-5)
    assert got.loss_curve_[-1] == pytest.approx(expected.loss_curve_[-1], rel=0.05)
    Xc, yc = dask.compute(X, y)
    assert got.score(Xc, yc) == pytest.approx(expected.score(Xc, yc), abs=0.02)
    client.wait_for_workers(2, timeout=60)


def test_lost_rows_of_local_sgd_that_cannot_be_computed_again_raise(client, monkeypatch):
    """sync_every=4, y sent from this process: the worker exits before the 2nd round,
    an error names the partitions lost, the fit never hangs."""
    client.wait_for_workers(2, timeout=60)
    monkeypatch.setattr(rounds, "RECOVERY_S", 10.0)
    X, y = binary_data(8000, 6, seed=9)
    killed = _kill_a_worker_at(monkeypatch, client, evaluation=1)
    est = OrtGradientClassifier(
        MLPClassifier(hidden_layer_sizes=(8,)), batch_size=256, sync_every=4, random_state=0
    )
    with pytest.raises(_dask.DaskWorkerLostError, match=r"Partitions \[\d"):
        est.fit(da.from_array(X, chunks=1000), y)
    assert killed and time.monotonic() - killed[0][1] < 40
    client.wait_for_workers(2, timeout=60)


def test_lost_rows_that_cannot_be_computed_again_raise(client, monkeypatch):
    """y sent from this process dies with its worker: an error names the partitions."""
    client.wait_for_workers(2, timeout=60)
    monkeypatch.setattr(rounds, "RECOVERY_S", 10.0)
    X, y = binary_data(8000, 6, seed=6)
    Xd = da.from_array(X, chunks=1000)
    killed = _kill_a_worker_at(monkeypatch, client, evaluation=2)
    with pytest.raises(_dask.DaskWorkerLostError, match=r"Partitions \[\d"):
        OrtGradientClassifier(LogisticRegression()).fit(Xd, y)
    assert killed and time.monotonic() - killed[0][1] < 40
    client.wait_for_workers(2, timeout=60)


def test_a_worker_lost_while_the_validation_set_is_predicted(client, monkeypatch):
    """A worker exits as the validation rows are about to be predicted (they and the
    training rows made by dask graphs): dask computes them again, the prediction and
    the rounds are repeated, and the fit ends as the one that lost no worker."""
    client.wait_for_workers(2, timeout=60)
    rng = da.random.RandomState(11)
    X = rng.standard_normal((3000, 6), chunks=(500, 6)).astype("f4")
    y = X[:, 0] - 2 * X[:, 3] + 0.1
    X_val = rng.standard_normal((600, 6), chunks=(150, 6)).astype("f4")
    y_val = X_val[:, 0] - 2 * X_val[:, 3] + 0.1
    params = dict(
        optimizer="adam", max_iter=4, batch_size=256, early_stopping=True,
        n_iter_no_change=10, random_state=0,
    )  # fmt: skip
    template = MLPRegressor(hidden_layer_sizes=(8,))
    with pytest.warns(ConvergenceWarning):
        expected = OrtGradientRegressor(template, **params).fit(X, y, X_val=X_val, y_val=y_val)
    original, killed = _dask.DaskRows.predict_rows, []

    def predict_rows(self, engine, positions):
        if self.fit is not self and not killed and self.fit.rounds > 12:  # 2nd epoch
            address = sorted(self.placement)[0]
            killed.append((address, time.monotonic()))
            with contextlib.suppress(Exception):
                client.run(os._exit, 1, workers=[address])
        return original(self, engine, positions)

    monkeypatch.setattr(_dask.DaskRows, "predict_rows", predict_rows)
    got = OrtGradientRegressor(template, **params)
    fit = threading.Thread(
        target=got.fit, args=(X, y), kwargs=dict(X_val=X_val, y_val=y_val), daemon=True
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        fit.start()
        fit.join(timeout=180)
    assert killed and not fit.is_alive()  # never hangs
    np.testing.assert_allclose(got.validation_scores_, expected.validation_scores_, rtol=1e-5)
    np.testing.assert_allclose(mlp_weights(got), mlp_weights(expected), rtol=1e-4, atol=1e-5)
    client.wait_for_workers(2, timeout=60)
