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


# The benchmark scripts' quick runs (tests/test_benchmark.py, a few minutes in all) start
# when the session does and go on while the other tests run; their tests run last.
def _benchmark_runs_of(item) -> set:
    import _benchmark_runs

    return set(getattr(item, "fixturenames", ())) & set(_benchmark_runs.RUNS)


@pytest.hookimpl(trylast=True)  # after the selection (-k, -m) is made
def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: bool(_benchmark_runs_of(item)))  # stable: the rest keep order


def pytest_collection_finish(session):
    import _benchmark_runs

    if session.config.option.collectonly:
        return
    _benchmark_runs.start(set().union(*map(_benchmark_runs_of, session.items)))


def pytest_sessionfinish(session):
    import _benchmark_runs

    _benchmark_runs.stop()
