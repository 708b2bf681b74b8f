import os
import tempfile

import numpy as np
import pytest

# The suite's training artifacts go to a folder of its own (subprocesses inherit it),
# never to the user's cache.
os.environ["ONNXGRAD_SKLEARN_CACHE_DIR"] = tempfile.mkdtemp(prefix="onnxgrad-sklearn-cache-")


@pytest.fixture
def regression_data():
    rng = np.random.RandomState(0)
    X = rng.randn(120, 5).astype(np.float32)
    w = rng.randn(5)
    y = (np.tanh(X @ w) + 0.1 * rng.randn(120)).astype(np.float32)
    return X.astype(np.float64), y.astype(np.float64)
