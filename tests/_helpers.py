"""Helpers shared by the tests (fixtures stay in conftest.py)."""

import contextlib
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from onnxgrad_sklearn.backends import agent_available

#: Both backends, the agent's case skipped where onnxruntime-training is not installed.
BACKENDS = [
    pytest.param(
        "agent",
        marks=pytest.mark.skipif(
            not agent_available(), reason="onnxruntime-training (the TrainingAgent) not installed"
        ),
    ),
    "standard",
]


def rel_error(actual, expected):
    """Relative error of ``actual`` against ``expected``, in the Frobenius norm."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    return np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-30)


def onnx_predict(model, X):
    """The first output of ONNX ``model`` on ``X`` (float32), run by onnxruntime alone."""
    import onnxruntime

    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, {session.get_inputs()[0].name: X.astype(np.float32)})[0]


def no_artifacts(monkeypatch, kept=True):
    """No training artifact from an earlier test or process for the rest of the test:
    the disk cache off, the process's memory emptied. ``kept=False``: none kept in
    memory either, every fit builds its graphs (a test patching what builds them)."""
    from collections import OrderedDict

    from onnxgrad_sklearn import artifacts

    monkeypatch.setenv(artifacts.CACHE_ENV, "")
    monkeypatch.setattr(artifacts, "_memory", OrderedDict())
    if not kept:
        monkeypatch.setattr(artifacts, "MEMORY_ENTRIES", 0)


def count_random_state_copies(monkeypatch) -> list:
    """The ``RandomState`` copies a fit makes of its progress (``_fit._own``), appended
    to the list returned as they are made."""
    from onnxgrad_sklearn import _fit

    made = []
    real = _fit._own

    def counting(value):
        if isinstance(value, np.random.RandomState):
            made.append(value)
        return real(value)

    monkeypatch.setattr(_fit, "_own", counting)
    return made


def smooth_regression(n, seed=0, noise=0.1):
    """A smooth regression target on 4 random features (the callback tests' data)."""
    rng = np.random.RandomState(seed)
    X = rng.randn(n, 4)
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] - X[:, 2] + noise * rng.randn(n)
    return X, y


def small_mlp(backend, **params):
    """An OrtGradientRegressor of an MLP (8,), seeded, batch 32, no stop on the loss."""
    from sklearn.neural_network import MLPRegressor

    from onnxgrad_sklearn import OrtGradientRegressor

    settings = dict(batch_size=32, n_iter_no_change=np.inf, random_state=0, backend=backend)
    return OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(8,)), **{**settings, **params})


class QuietCallback:
    """A callback of scikit-learn's protocol whose hooks do nothing; tests override one."""

    def setup(self, estimator, context):
        pass

    def on_fit_task_begin(self, estimator, context):
        pass

    def on_fit_task_end(self, estimator, context):
        return False

    def teardown(self, estimator, context):
        pass


class PausedFit(QuietCallback):
    """Pauses a fit at the end of its first epoch until released: set it on an estimator,
    then ``with callback.fitting(est.fit, X, y) as errors:`` runs the fit in a thread,
    enters once the fit is paused (its lock, its first checkpoint there) and releases it
    when the block ends; ``errors`` gets what the fit raised."""

    def __init__(self, folder):
        self.flag, self.go = Path(folder) / "paused", Path(folder) / "go"

    def on_fit_task_end(self, estimator, context):
        if context.task_name == "epoch" and estimator.n_iter_ == 1:
            self.flag.touch()
            deadline = time.monotonic() + 120
            while not self.go.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
        return False

    @contextlib.contextmanager
    def fitting(self, fit, *args):
        errors = []

        def run():
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    fit(*args)
            except BaseException as exc:  # pragma: no cover - shown by the caller's assert
                errors.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        try:
            deadline = time.monotonic() + 120
            while not self.flag.exists() and thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert self.flag.exists(), errors
            yield errors
        finally:
            self.go.touch()
            thread.join()


#: The command-line tests' features and classes.
CLI_FEATURES = ["a", "b", "c", "d"]
CLI_CLASSES = ["cat", "dog", "fish"]


def write_cli_tables(folder, offset=0.0):
    """Write the command-line tests' tables into ``folder``: ``reg.csv`` (features and
    a linear ``price``, plus ``offset``) and ``cls.csv`` (features and the ``kind`` of
    the largest of the first three). Return the features, the price table and the
    random state that made them (for more tables)."""
    import pandas as pd

    rng = np.random.RandomState(0)
    X = rng.randn(200, 4)
    frame = pd.DataFrame(X, columns=CLI_FEATURES)
    frame["price"] = X @ np.array([1.5, -2.0, 0.5, 1.0]) + offset + 0.1 * rng.randn(200)
    frame.to_csv(folder / "reg.csv", index=False)
    kinds = pd.DataFrame(X, columns=CLI_FEATURES)
    kinds["kind"] = np.array(CLI_CLASSES)[X[:, :3].argmax(axis=1)]
    kinds.to_csv(folder / "cls.csv", index=False)
    return X, frame, rng
