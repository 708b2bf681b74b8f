"""Checkpoint files a fit cannot use: damaged, foreign, of another format, or paths
that cannot hold one. Each gets a CheckpointError naming the file before training
(never a raw zipfile, NumPy or EOF error), or with on_unreadable="restart" a fresh
start that replaces the file."""

import json
import os
import warnings

import numpy as np
import pytest
from _helpers import QuietCallback, small_mlp, smooth_regression

pytest.importorskip("sklearn.callback")

from onnxgrad_sklearn import CheckpointError  # noqa: E402
from onnxgrad_sklearn.callbacks import Checkpoint  # noqa: E402


def _mlp(**params):
    return small_mlp("standard", **{"learning_rate_init": 0.05, "max_iter": 4, **params})


def _data():
    return smooth_regression(96)


def _fit(path, **checkpoint):
    X, y = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=Warning)
        return _mlp().set_callbacks(Checkpoint(path, **checkpoint)).fit(X, y)


def _saved(tmp_path):
    """A whole checkpoint of an interrupted fit (epoch 2 of 4) at ``fit.ckpt.npz``."""
    path = tmp_path / "fit.ckpt.npz"
    X, y = _data()

    class Stop(QuietCallback):
        def on_fit_task_end(self, estimator, context):
            if context.task_name == "epoch" and estimator.n_iter_ == 2:
                raise KeyboardInterrupt
            return False

    with pytest.raises(KeyboardInterrupt), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _mlp().set_callbacks(Checkpoint(path), Stop()).fit(X, y)
    return path


def _damage(path, how):
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "overwritten":
        path.write_bytes(np.random.RandomState(0).bytes(len(data)))
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "pickled":
        with open(path, "wb") as out:
            np.save(out, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    elif how == "objects":
        np.savez(open(path, "wb"), meta=np.array([{"a": 1}], dtype=object))
    elif how == "foreign archive":
        np.savez(open(path, "wb"), weights=np.zeros(3))
    elif how == "newer format":
        with np.load(path, allow_pickle=False) as saved:
            arrays = {k: saved[k] for k in saved.files}
        meta = json.loads(str(arrays["meta"]))
        meta.update(version=99, written_by="onnxgrad-sklearn 9.0")
        arrays["meta"] = np.array(json.dumps(meta))
        np.savez(open(path, "wb"), **arrays)


DAMAGE = {
    "truncated": "is truncated or not a checkpoint",
    "overwritten": "is not a checkpoint \\(not an .npz archive",
    "empty": "is empty",
    "pickled": "is not a checkpoint \\(not an .npz archive",
    "objects": "is not a checkpoint \\(it holds objects, not arrays\\)",
    "foreign archive": "is not a checkpoint of onnxgrad_sklearn",
    "newer format": "was written by onnxgrad-sklearn 9.0 with format 99",
}


@pytest.mark.parametrize("how", list(DAMAGE))
def test_an_unusable_file_is_refused_with_its_name_and_the_ways_on(tmp_path, how):
    path = _saved(tmp_path)
    _damage(path, how)
    before = path.read_bytes()
    est = _mlp()
    with pytest.raises(CheckpointError, match=DAMAGE[how]) as raised:
        est.set_callbacks(Checkpoint(path)).fit(*_data())
    message = str(raised.value)
    assert str(path) in message and "on_unreadable='restart'" in message
    assert "Remove the file" in message
    assert isinstance(raised.value, ValueError)
    assert path.read_bytes() == before  # left as it was
    assert not hasattr(est, "n_iter_")  # refused before training
    assert not os.path.exists(str(path) + ".lock")


@pytest.mark.parametrize("how", ["truncated", "pickled", "newer format"])
def test_restart_starts_afresh_with_a_warning_and_replaces_the_file(tmp_path, how):
    path = _saved(tmp_path)
    _damage(path, how)
    X, y = _data()
    checkpoint = Checkpoint(path, on_unreadable="restart")
    with pytest.warns(UserWarning, match=f"{path}.*starts afresh"):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Stochastic Optimizer")
            got = _mlp().set_callbacks(checkpoint).fit(X, y)
    assert checkpoint.resumed_from_ is None and checkpoint.saved_epochs_ == [1, 2, 3, 4]
    fresh = _fit(tmp_path / "fresh.npz")
    assert got.loss_curve_ == fresh.loss_curve_  # as a fit that never saw the file
    with np.load(path, allow_pickle=False) as saved:  # the fit's own checkpoint now
        meta = json.loads(str(saved["meta"]))
    assert meta["finished"] is True and meta["final_epoch"] == 4


def test_a_missing_folder_is_made(tmp_path):
    path = tmp_path / "a" / "b" / "fit.ckpt.npz"
    _fit(path)
    assert path.is_file()


def test_a_folder_that_cannot_be_written_is_refused_before_training(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # root writes anywhere
    est = _mlp()
    with pytest.raises(CheckpointError, match="cannot be written"):
        est.set_callbacks(Checkpoint(tmp_path / "fit.ckpt.npz")).fit(*_data())
    assert not hasattr(est, "n_iter_")


def test_a_file_where_the_folder_should_be_is_refused(tmp_path):
    (tmp_path / "taken").write_text("a file")
    with pytest.raises(CheckpointError, match="cannot be made"):
        _mlp().set_callbacks(Checkpoint(tmp_path / "taken" / "fit.npz")).fit(*_data())


def test_on_unreadable_is_checked():
    with pytest.raises(ValueError, match="on_unreadable must be 'raise' or 'restart'"):
        Checkpoint("fit.npz", on_unreadable="ignore")
