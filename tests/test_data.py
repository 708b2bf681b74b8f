"""The data interface (``onnxgrad_sklearn._data``): rows in memory as a fit reaches them.

A fit asks its rows for the batches of an epoch, the held-out split and the full-batch
objective; these tests check what the in-memory implementation gives against what the
arrays themselves (and scikit-learn) give.
"""

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPRegressor

from onnxgrad_sklearn import OrtGradientRegressor, _data, _model
from onnxgrad_sklearn._data import (
    FullBatchObjective,
    MemoryRows,
    by_chunks,
    is_rows,
    run_by_chunks,
    shuffled,
    slices,
)


class _Recorder:
    """Stands in for a training engine: records the batches it is given."""

    def __init__(self):
        self.batches = []

    def train_batch(self, X, y, sample_weight, learning_rate):
        self.batches.append((np.array(X), np.array(y), np.array(sample_weight)))
        return float(np.sum(y))


def _rows(n=23, width=5, sparse=False, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.randn(n, width).astype(np.float32)
    if sparse:
        X[X < 0.5] = 0
        X = sp.csr_matrix(X)
    y = rng.randn(n, 1).astype(np.float32)
    sw = rng.uniform(0.5, 2, n).astype(np.float32)
    return X, y, sw


class _Fit:
    """What a data source reads of the fit that uses it."""

    def __init__(self, batch_size, seed=0):
        self.batch_size = batch_size
        self._random_state = np.random.RandomState(seed)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("shuffle", [False, True], ids=["slices", "shuffled"])
def test_an_epoch_of_memory_rows_trains_on_every_row_once_in_the_epochs_order(sparse, shuffle):
    X, y, sw = _rows(sparse=sparse)
    rows = MemoryRows(X, y, sw)
    rows.start_epochs(_Fit(batch_size=7), None, None)
    order = shuffled(np.arange(23), np.random.RandomState(3)) if shuffle else None
    feed, engine = rows.batches(order), _Recorder()
    trained = [feed.train(engine, batch, 0.1)[1] for batch in slices(23, 7)]
    assert trained == [7, 7, 7, 2]  # the rows of each batch, the last one short
    dense = X.toarray() if sparse else X
    expected = np.arange(23) if order is None else order
    got_X = np.concatenate([b[0] for b in engine.batches])
    np.testing.assert_array_equal(got_X, dense[expected])
    np.testing.assert_array_equal(np.concatenate([b[1] for b in engine.batches]), y[expected])
    np.testing.assert_array_equal(np.concatenate([b[2] for b in engine.batches]), sw[expected])


def test_a_batch_whose_weights_sum_to_zero_makes_no_step():
    X, y, sw = _rows()
    sw[:7] = 0
    rows = MemoryRows(X, y, sw)
    rows.start_epochs(_Fit(batch_size=7), None, None)
    engine = _Recorder()
    assert rows.batches(None).train(engine, slice(0, 7), 0.1) == (None, 0)
    assert engine.batches == []


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_unit_weights_are_not_gathered_and_the_batches_are_the_same(sparse):
    # every weight 1 (no sample_weight given): the weights' buffer holds ones once,
    # the same array object from batch to batch (bound once by the engine)
    X, y, _ = _rows(sparse=sparse)
    ones = np.ones(23, dtype=np.float32)
    rows = MemoryRows(X, y, ones)
    assert rows.unit_weights and not MemoryRows(X, y, _rows()[2]).unit_weights
    rows.start_epochs(_Fit(batch_size=7), None, None)
    order = shuffled(np.arange(23), np.random.RandomState(3))
    feed, engine = rows.batches(order), _Recorder()
    seen = []
    for batch in slices(23, 7):
        seen.append(feed._feed(batch)[2])
        assert feed.train(engine, batch, 0.1)[1] == batch.stop - batch.start
    assert seen[0] is seen[1] is seen[2] and len(seen[3]) == 2
    dense = X.toarray() if sparse else X
    np.testing.assert_array_equal(np.concatenate([b[0] for b in engine.batches]), dense[order])
    np.testing.assert_array_equal(np.concatenate([b[1] for b in engine.batches]), y[order])
    np.testing.assert_array_equal(np.concatenate([b[2] for b in engine.batches]), ones)


@pytest.mark.parametrize("backend", ["standard", "agent"])
def test_a_fit_without_weights_is_the_fit_with_equal_weights(backend):
    # equal weights of 2 go through the gathered weights, none through the ones kept:
    # the weighted mean loss is the same, bit for bit (a scaling by a power of two;
    # no penalty: its weight depends on the sum of the sample weights)
    if backend == "agent":
        pytest.importorskip("onnxruntime.training", reason="no TrainingAgent")
    X, y, _ = _rows(n=90)
    fits = []
    for sw in (None, np.full(90, 2.0)):
        est = OrtGradientRegressor(
            MLPRegressor(hidden_layer_sizes=(8,), alpha=0.0),
            max_iter=3,
            batch_size=16,
            random_state=0,
            backend=backend,
        )
        fits.append(est.fit(X, y.ravel(), sample_weight=sw))
    for a, b in zip(fits[0].estimator_.coefs_, fits[1].estimator_.coefs_):
        np.testing.assert_array_equal(a, b)
    assert fits[0].loss_curve_ == fits[1].loss_curve_


def test_auto_batch_size_is_mlpregressors_rule():
    X, y, sw = _rows(n=450)
    rows = MemoryRows(X, y, sw)
    rows.start_epochs(_Fit(batch_size="auto"), None, None)
    engine = _Recorder()
    rows.batches(np.arange(450)).train(engine, slice(0, 200), 0.1)
    assert engine.batches[0][0].shape == (200, 5)  # min(200, n_samples)


@pytest.mark.parametrize("labels", [None, "binary"])
def test_the_held_out_split_is_train_test_splits_with_the_fits_random_state(labels):
    X, y, sw = _rows(n=40)
    stratify = (y[:, 0] > 0).astype(int) if labels else None
    rows = MemoryRows(X, y, sw)
    rows.start_epochs(_Fit(batch_size=8), None, None)
    train, (validation, y_val, sw_val), held = rows.split(_Fit(8, seed=5), 0.25, stratify)
    expected = train_test_split(
        X, y, sw, np.arange(40), random_state=np.random.RandomState(5), test_size=0.25,
        stratify=stratify,
    )  # fmt: skip
    np.testing.assert_array_equal(train.X, expected[0])
    np.testing.assert_array_equal(validation.X, expected[1])
    np.testing.assert_array_equal(y_val, expected[3])
    np.testing.assert_array_equal(sw_val, expected[5])
    np.testing.assert_array_equal(held, expected[7])
    assert train.shape == (30, 5) and train.batch_size == 8  # the fit's parameter kept


def test_a_held_out_split_of_one_row_is_refused():
    X, y, sw = _rows(n=4)
    with pytest.raises(ValueError, match="validation set is too small"):
        MemoryRows(X, y, sw).split(_Fit(2), 0.25, None)


@pytest.mark.parametrize("outputs", [1, 2], ids=["array", "list"])
def test_by_chunks_of_a_sparse_matrix_gives_what_the_dense_matrix_gives(outputs, monkeypatch):
    X, _, _ = _rows(n=37, sparse=True)
    monkeypatch.setattr(_data, "CHUNK_VALUES", 3 * 5)  # three rows a chunk: 13 chunks
    calls = []

    def function(part):
        assert isinstance(part, np.ndarray) and part.shape[0] <= 3
        calls.append(part.shape[0])
        out = part.sum(axis=1, keepdims=True) * 2
        return out if outputs == 1 else [out, part[:, :2]]

    got = by_chunks(function, X)
    dense = X.toarray()
    want = dense.sum(axis=1, keepdims=True) * 2
    assert len(calls) == 13
    if outputs == 1:
        np.testing.assert_allclose(got, want, rtol=1e-6)
    else:
        np.testing.assert_allclose(got[0], want, rtol=1e-6)
        np.testing.assert_array_equal(got[1], dense[:, :2])


def test_run_by_chunks_gives_a_fitted_models_outputs_by_name(monkeypatch):
    X, y, _ = _rows(n=60, sparse=True)
    est = OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(4,)), max_iter=2, random_state=0
    ).fit(X, y.ravel())
    session = _model.export_session(est)
    whole = run_by_chunks(session, X.toarray())
    monkeypatch.setattr(_data, "CHUNK_VALUES", 7 * 5)
    chunked = run_by_chunks(session, X)
    assert list(chunked) == [o.name for o in session.get_outputs()]
    for name, value in whole.items():
        np.testing.assert_allclose(chunked[name], value, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(est.predict(X), next(iter(whole.values())).ravel(), rtol=1e-6)


def test_the_full_batch_objective_over_chunks_is_the_one_over_all_rows(monkeypatch):
    X, y, sw = _rows(n=50)
    est = OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(3,)), optimizer="lbfgs", max_iter=1, random_state=0
    ).fit(X, y.ravel(), sample_weight=sw)
    engine, penalized = est._engine, est._penalized_mask()
    alpha, l1_ratio = est._penalty  # the engine's: each chunk's loss holds it once
    assert alpha > 0
    whole = FullBatchObjective(engine, X, y, sw, penalized, alpha, l1_ratio)
    monkeypatch.setattr(FullBatchObjective, "chunk_values", 9 * 5)  # 9 rows a chunk
    chunked = FullBatchObjective(engine, X, y, sw, penalized, alpha, l1_ratio)
    assert len(chunked.chunks) == 6 and len(whole.chunks) == 1
    x = whole.pack(engine.get_weights())
    (loss_a, grad_a), (loss_b, grad_b) = whole(x), chunked(x)
    np.testing.assert_allclose(loss_b, loss_a, rtol=1e-5)
    np.testing.assert_allclose(grad_b, grad_a, rtol=1e-4, atol=1e-6)
    assert loss_a > 0 and np.abs(grad_a).max() > 0


def test_only_rows_a_source_placed_are_rows():
    assert not is_rows(np.zeros((2, 2)))
    assert not is_rows(sp.csr_matrix((2, 2)))
    assert not is_rows(MemoryRows(*_rows()))  # made by the fit from checked arrays

    class Placed:
        _onnxgrad_rows = True

    assert is_rows(Placed())
