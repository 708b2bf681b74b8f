"""The n_jobs parameter: onnxruntime's intra-op threads, within the process's thread limit."""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from joblib import Parallel, cpu_count, delayed
from sklearn.model_selection import cross_validate
from sklearn.neural_network import MLPRegressor
from sklearn.utils._param_validation import InvalidParameterError
from threadpoolctl import threadpool_limits

from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor
from onnxgrad_sklearn.runtime import intra_op_threads

rng = np.random.RandomState(0)
X = rng.rand(80, 4).astype(np.float32)
y = X @ np.array([1.0, -1.0, 0.5, 2.0], dtype=np.float32)

# Records the intra-op threads of every InferenceSession the estimators create
# (training, update, inference), then prints them as JSON.
RECORDING = """
import json, sys, warnings
import numpy as np
import onnxruntime

threads = []
original = onnxruntime.InferenceSession.__init__

def recording(self, *args, sess_options=None, **kwargs):
    threads.append(None if sess_options is None else sess_options.intra_op_num_threads)
    original(self, *args, sess_options=sess_options, **kwargs)

onnxruntime.InferenceSession.__init__ = recording

from sklearn.neural_network import MLPRegressor
from onnxgrad_sklearn import OrtGradientRegressor

X = np.random.RandomState(0).rand(50, 3).astype(np.float32)
y = X.sum(axis=1)
warnings.simplefilter("ignore")
result = {}
for backend in ("agent", "standard"):
    threads.clear()
    reg = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(4,)), optimizer="adam",
                               max_iter=2, backend=backend, n_jobs=N_JOBS).fit(X, y)
    reg.predict(X)
    result[backend] = list(threads)
print(json.dumps(result))
"""


def _sessions_threads(env_threads, n_jobs="None"):
    env = dict(os.environ)
    # earlier tests of the session (dask, joblib) may leave thread limits in os.environ
    for name in ("OMP_NUM_THREADS", "OMP_THREAD_LIMIT", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.pop(name, None)
    if env_threads is not None:
        env["OMP_NUM_THREADS"] = str(env_threads)
    code = textwrap.dedent(RECORDING).replace("N_JOBS", n_jobs)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_omp_num_threads_1_gives_every_session_one_thread():
    result = _sessions_threads(1)
    for backend in ("agent", "standard"):
        # training (the update in it), then the inference sessions
        assert len(result[backend]) >= 2
        assert set(result[backend]) == {1}, (backend, result[backend])


@pytest.mark.slow
@pytest.mark.skipif(cpu_count() < 2, reason="needs 2 CPUs to tell the settings apart")
def test_an_explicit_n_jobs_reaches_the_training_and_inference_sessions():
    result = _sessions_threads(None, n_jobs="2")
    # Adam is element-wise: the agent updates in its training session (no update
    # session of its own, which would run on one thread).
    assert set(result["agent"]) == {2}
    assert set(result["standard"]) == {2}
    # Without a limit nor n_jobs: the runtime's default (0).
    default = _sessions_threads(None)
    assert set(default["agent"]) == {0}
    assert set(default["standard"]) == {0}


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_threadpool_limits_caps_the_default_not_an_explicit_n_jobs():
    with threadpool_limits(1):
        assert intra_op_threads() == 1
        assert intra_op_threads(-1) == 1
        assert intra_op_threads(3) == 3
        reg = OrtGradientRegressor(max_iter=2).fit(X, y)
    assert reg._intra_op_threads == 1
    assert intra_op_threads(5) == 5
    assert intra_op_threads(-1) == cpu_count()
    assert intra_op_threads(-cpu_count() - 5) == 1


@pytest.mark.skipif(cpu_count() < 2, reason="a limit below the CPU count needs 2 CPUs")
def test_joblib_workers_get_the_inner_thread_limit():
    # loky workers receive OMP_NUM_THREADS = cpu_count() // n_jobs; threads of a pool get 1.
    expected = max(cpu_count() // 2, 1)
    expected = expected if expected < cpu_count() else 0
    assert Parallel(n_jobs=2)(delayed(intra_op_threads)() for _ in range(2)) == [expected] * 2
    threaded = Parallel(n_jobs=2, backend="threading")(
        delayed(intra_op_threads)() for _ in range(2)
    )
    assert threaded == [1, 1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cv = cross_validate(
            OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(3,)), max_iter=2),
            X,
            y,
            cv=2,
            n_jobs=2,
            return_estimator=True,
        )
    assert [est._intra_op_threads for est in cv["estimator"]] == [expected] * 2


def _spinning(threads):
    from onnxgrad_sklearn.runtime import session_options

    try:
        return session_options(threads).get_session_config_entry("session.intra_op.allow_spinning")
    except RuntimeError:  # not set: the runtime's default (spinning)
        return None


def test_sessions_of_joblib_worker_processes_do_not_spin():
    """Beside its sibling workers (OMP_NUM_THREADS=2 set by the user, which loky keeps),
    a worker's pool threads sleep between kernels; one thread has no pool; a process
    of its own keeps the runtime's default."""
    assert _spinning(2) is None
    found = Parallel(n_jobs=2)(delayed(_spinning)(t) for t in (2, 0, 1))
    assert found == ["0", "0", None]


@pytest.mark.parametrize("Estimator", [OrtGradientRegressor, OrtGradientClassifier])
def test_n_jobs_zero_is_refused_and_n_jobs_is_a_parameter(Estimator):
    assert Estimator(n_jobs=3).get_params()["n_jobs"] == 3
    target = y if Estimator is OrtGradientRegressor else (y > y.mean())
    with pytest.raises(InvalidParameterError, match="n_jobs"):
        Estimator(n_jobs=0).fit(X, target)


def test_changing_n_jobs_rebuilds_the_engine_with_the_new_threads():
    reg = OrtGradientRegressor(optimizer="adam", max_iter=2, warm_start=True, n_jobs=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reg.fit(X, y)
        first = reg._engine
        reg.set_params(n_jobs=2).fit(X, y)
    assert reg._engine is not first
    assert reg._intra_op_threads == 2
    assert reg._engine._backend.options.intra_op_num_threads == 2


# Records, for every InferenceSession an estimator makes, whether its threads spin and
# which graph it runs (its inputs' names), then prints them as JSON.
SPINS = """
import json, warnings
import numpy as np
import onnxruntime
from onnxgrad_sklearn.runtime import spins

made = []
original = onnxruntime.InferenceSession.__init__

def recording(self, *args, sess_options=None, **kwargs):
    original(self, *args, sess_options=sess_options, **kwargs)
    made.append([spins(sess_options), [i.name for i in self.get_inputs()]])

onnxruntime.InferenceSession.__init__ = recording

from sklearn.neural_network import MLPRegressor
from onnxgrad_sklearn import OrtGradientRegressor

rng = np.random.RandomState(0)
X = rng.rand(60, 3).astype(np.float32)
y = X.sum(axis=1)
warnings.simplefilter("ignore")
result = {}
for backend in ("agent", "standard"):
    made.clear()
    reg = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(4,)), max_iter=2, n_jobs=2,
                               early_stopping=True, validation_fraction=0.3, backend=backend)
    reg.fit(X, y)
    reg.predict(X)
    result[backend] = list(made)
print(json.dumps(result))
"""


@pytest.mark.skipif(cpu_count() < 2, reason="needs 2 CPUs for threads that could spin")
def test_only_the_training_sessions_spin():
    """The training step's sessions spin between their runs; the sessions that run now
    and then (the validation set's predictions, the estimator's predict) sleep: spinning
    after a run, their threads took the cores from the training and from the next fit."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SPINS)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    for backend, made in json.loads(out.stdout.strip().splitlines()[-1]).items():
        # the step: forward, backward and the update (its inputs: update/learning_rate...)
        step = [spin for spin, inputs in made if any(n.startswith("update/") for n in inputs)]
        others = [spin for spin, inputs in made if not any(n.startswith("update/") for n in inputs)]
        assert step and all(step), (backend, made)
        # the validation set's predictions (and the loss alone), the trained graph's and
        # the exported's
        assert len(others) >= 2 and not any(others), (backend, made)
