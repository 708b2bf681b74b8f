"""Helpers shared by the tests (fixtures stay in conftest.py)."""

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


def no_artifacts(monkeypatch):
    """No training artifact kept in memory or on disk for the rest of the test."""
    from collections import OrderedDict

    from onnxgrad_sklearn import artifacts

    monkeypatch.setenv(artifacts.CACHE_ENV, "")
    monkeypatch.setattr(artifacts, "_memory", OrderedDict())
