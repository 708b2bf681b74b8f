"""A Checkpoint folder serving searches: one file per fit (parameters and data), the
finished fits loaded by a search run again, the unfinished one resumed, and the
search's results those of an uninterrupted one."""

import os
import signal
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from _helpers import PausedFit, QuietCallback

pytest.importorskip("sklearn.callback")

from sklearn.model_selection import GridSearchCV  # noqa: E402
from sklearn.neural_network import MLPRegressor  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

from onnxgrad_sklearn import OrtGradientRegressor  # noqa: E402
from onnxgrad_sklearn.callbacks import Checkpoint  # noqa: E402

GRID = {"alpha": [1e-4, 1e-2]}
#: What the search script and the tests share: data, estimator, search.
SETUP = """
import warnings
import numpy as np
from sklearn.datasets import load_diabetes
from sklearn.model_selection import GridSearchCV
from sklearn.neural_network import MLPRegressor
from sklearn.preprocessing import StandardScaler
from onnxgrad_sklearn import OrtGradientRegressor

X, y = load_diabetes(return_X_y=True)
X = StandardScaler().fit_transform(X)[:240]
y = ((y - y.mean()) / y.std())[:240]


def search(*callbacks, n_jobs=1):
    est = OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(8,)), max_iter=6, batch_size=64,
        learning_rate_init=0.01, random_state=0, backend="standard",
    )
    if callbacks:
        est.set_callbacks(*callbacks)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GridSearchCV(est, {"alpha": [1e-4, 1e-2]}, cv=3, n_jobs=n_jobs).fit(X, y)
"""
namespace: dict = {}
exec(SETUP, namespace)
search, X, y = namespace["search"], namespace["X"], namespace["y"]


class Epochs(QuietCallback):
    """Counts the epochs trained (in this process)."""

    def __init__(self):
        self.count = 0

    def on_fit_task_end(self, estimator, context):
        if context.task_name == "epoch":
            self.count += 1
        return False


def _fits(folder):
    return sorted(f for f in os.listdir(folder) if f.startswith("fit-") and f.endswith(".npz"))


def _same_results(a, b):
    for key in ("mean_test_score", "split0_test_score", "split2_test_score"):
        np.testing.assert_array_equal(a.cv_results_[key], b.cv_results_[key])
    assert a.best_estimator_.n_iter_ == b.best_estimator_.n_iter_
    np.testing.assert_array_equal(a.predict(X), b.predict(X))


def test_a_search_run_again_loads_every_fit_it_finished(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    reference = search()
    counted = Epochs()
    first = search(Checkpoint(folder), counted)
    assert len(_fits(folder)) == 7  # 2 candidates x 3 folds, and the refit
    assert counted.count == 7 * 6
    _same_results(first, reference)  # the checkpoint changes no result
    stamps = {f: os.stat(folder / f).st_mtime_ns for f in _fits(folder)}
    again = Epochs()
    second = search(Checkpoint(folder), again)
    assert again.count == 0  # nothing trained
    assert {f: os.stat(folder / f).st_mtime_ns for f in _fits(folder)} == stamps
    _same_results(second, reference)


def test_two_worker_processes_share_the_folder(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    reference = search()
    first = search(Checkpoint(folder), n_jobs=2)
    assert len(_fits(folder)) == 7
    stamps = {f: os.stat(folder / f).st_mtime_ns for f in _fits(folder)}
    second = search(Checkpoint(folder), n_jobs=2)  # loaded in the workers
    assert {f: os.stat(folder / f).st_mtime_ns for f in _fits(folder)} == stamps
    _same_results(first, reference)
    _same_results(second, reference)


KILLED = SETUP + textwrap.dedent(
    """
    import os, signal, sys
    from onnxgrad_sklearn.callbacks import Checkpoint

    class Kill:
        fits = 0

        def setup(self, estimator, context):
            pass

        def on_fit_task_begin(self, estimator, context):
            if context.task_name == "fit":
                Kill.fits += 1

        def on_fit_task_end(self, estimator, context):
            if Kill.fits == 4 and context.task_name == "epoch" and estimator.n_iter_ == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            return False

        def teardown(self, estimator, context):
            pass

    search(Checkpoint(sys.argv[1]), Kill())
    """
)


def test_a_search_killed_mid_fit_goes_on_where_it_stopped(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    killed = subprocess.run(
        [sys.executable, "-c", KILLED, str(folder)], capture_output=True, text=True, timeout=600
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert len(_fits(folder)) == 4  # three fits finished, the fourth at epoch 2
    counted = Epochs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resumed = search(Checkpoint(folder), counted)
    # the three finished fits loaded, the fourth from epoch 2: 4 epochs of it, and
    # 6 for each of the other three fits (two folds and the refit)
    assert counted.count == 4 + 3 * 6
    _same_results(resumed, search())


KILLED_IN_A_WORKER = SETUP + textwrap.dedent(
    """
    import os, signal, sys
    from onnxgrad_sklearn.callbacks import Checkpoint

    class Log:
        # what each process trains, one line an epoch, in a file all of them append to
        def setup(self, estimator, context):
            pass

        def on_fit_task_begin(self, estimator, context):
            pass

        def on_fit_task_end(self, estimator, context):
            if context.task_name == "epoch":
                with open(sys.argv[2], "a") as log:
                    log.write(f"{os.getpid()}\\n")
                with open(sys.argv[2]) as log:
                    epochs = len(log.readlines())
                # two fits or more ended (6 epochs each), this one at its second epoch
                if sys.argv[3] == "kill" and epochs >= 14 and estimator.n_iter_ == 2:
                    os.kill(os.getppid(), signal.SIGKILL)  # the search's process
                    os.kill(os.getpid(), signal.SIGKILL)
            return False

        def teardown(self, estimator, context):
            pass

    found = search(Checkpoint(sys.argv[1]), Log(), n_jobs=2)
    print(repr(list(found.cv_results_["mean_test_score"])))
    """
)


@pytest.mark.slow
def test_a_search_on_two_workers_killed_mid_fit_goes_on_where_it_stopped(tmp_path):
    """SIGKILL of the search's process while its loky workers train: the search run
    again (the same arguments, two workers) trains only what the first left."""
    folder, log = tmp_path / "ckpt", tmp_path / "epochs.log"
    folder.mkdir()

    def run(mode):
        return subprocess.run(
            [sys.executable, "-c", KILLED_IN_A_WORKER, str(folder), str(log), mode],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip

    killed = run("kill")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    before = len(log.read_text().splitlines())
    assert 0 < before < 7 * 6
    again = run("go on")
    assert again.returncode == 0, again.stderr[-2000:]
    trained = len(log.read_text().splitlines()) - before
    assert trained <= 7 * 6 - before  # nothing trained twice beyond the lost epochs
    assert trained < 7 * 6
    expected = list(search().cv_results_["mean_test_score"])
    assert again.stdout.strip().splitlines()[-1] == repr(expected)


def test_clear_removes_the_fits_files(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    search(Checkpoint(folder))
    checkpoint = Checkpoint(folder)
    removed = checkpoint.clear()
    assert len(removed) == 7 and _fits(folder) == []
    single = tmp_path / "one.npz"
    est = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(4,)), max_iter=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.set_callbacks(Checkpoint(single)).fit(X, y)
    assert Checkpoint(single).clear() == [str(single)] and not single.exists()


def test_a_folder_path_ending_with_a_separator_is_made(tmp_path):
    folder = str(tmp_path / "new" / "ckpt") + os.sep
    est = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(4,)), max_iter=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.set_callbacks(Checkpoint(folder)).fit(X, y)
    assert len(_fits(folder)) == 1


def test_the_same_fit_twice_at_once_trains_the_second_without_the_file(tmp_path):
    """A candidate listed twice: the second fit finds its file's lock held and trains
    without the file, with a warning; neither fails."""
    folder = tmp_path / "ckpt"
    folder.mkdir()

    def make(*callbacks):
        est = OrtGradientRegressor(
            MLPRegressor(hidden_layer_sizes=(8,)), max_iter=3, random_state=0,
            backend="standard",
        )  # fmt: skip
        return est.set_callbacks(Checkpoint(folder), *callbacks)

    pause = PausedFit(tmp_path)
    first = make(pause)
    with pause.fitting(first.fit, X, y) as errors:
        with pytest.warns(UserWarning, match="trains without the checkpoint"):
            second = make().fit(X, y)
    assert not errors
    assert second.loss_curve_ == first.loss_curve_  # the same fit, both complete
    assert len(_fits(folder)) == 1  # the first fit's, finished


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_one_file_given_to_a_search_is_refused_before_any_fit(tmp_path, n_jobs):
    path = tmp_path / "fit.ckpt.npz"
    counted = Epochs()
    with pytest.raises(ValueError, match="give Checkpoint a folder"):
        est = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(4,)), max_iter=2)
        est.set_callbacks(Checkpoint(path), counted)
        GridSearchCV(est, GRID, cv=3, n_jobs=n_jobs, error_score="raise").fit(X, y)
    assert counted.count == 0 and not path.exists()  # no fit trained, no file written
    est = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(4,)), max_iter=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.set_callbacks(Checkpoint(path)).fit(X, y)  # alone, one file is fine
    assert path.exists()


def test_cross_validate_a_randomized_and_a_halving_search_of_a_pipeline_each_fit_its_file(
    tmp_path,
):
    """The estimator inside a Pipeline; each kind of cross-validation: a file per fit,
    all loaded when run again, the same scores."""
    from sklearn.experimental import enable_halving_search_cv  # noqa: F401
    from sklearn.model_selection import (
        HalvingGridSearchCV,
        RandomizedSearchCV,
        cross_validate,
    )
    from sklearn.pipeline import make_pipeline

    def pipeline(folder, *callbacks):
        est = OrtGradientRegressor(
            MLPRegressor(hidden_layer_sizes=(4,)), max_iter=3, random_state=0,
            backend="standard",
        )  # fmt: skip
        if folder is not None:
            est.set_callbacks(Checkpoint(folder), *callbacks)
        return make_pipeline(StandardScaler(), est)

    grid = {"ortgradientregressor__alpha": [1e-4, 1e-2]}
    runs = {
        "cross_validate": lambda m: cross_validate(m, X, y, cv=3)["test_score"],
        "randomized": lambda m: (
            RandomizedSearchCV(m, grid, n_iter=2, cv=3, random_state=0)
            .fit(X, y)
            .cv_results_["mean_test_score"]
        ),
        "halving": lambda m: (
            HalvingGridSearchCV(m, grid, cv=3, factor=2, random_state=0)
            .fit(X, y)
            .cv_results_["mean_test_score"]
        ),
    }
    for name, run in runs.items():
        folder = tmp_path / name
        folder.mkdir()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            reference = run(pipeline(None))
            first = run(pipeline(folder))
            counted = Epochs()
            again = run(pipeline(folder, counted))
        assert len(_fits(folder)) >= 3, name
        assert counted.count == 0, name  # every fit loaded
        np.testing.assert_array_equal(first, reference)
        np.testing.assert_array_equal(again, reference)


def test_partial_fit_with_a_folder_writes_no_final_state_a_fit_would_load(tmp_path):
    """A partial_fit call is one epoch: a later fit of the same parameters and data
    trains (it does not load the call's state as a whole fit)."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    est = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(4,)), max_iter=3, random_state=0)
    est.set_callbacks(Checkpoint(folder))
    est.partial_fit(X, y)
    est.partial_fit(X, y)  # trains again: no state loaded
    assert est.n_iter_ == 1 and len(est.loss_curve_) == 2
    counted = Epochs()
    fresh = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(4,)), max_iter=3, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fresh.set_callbacks(Checkpoint(folder), counted).fit(X, y)
    assert counted.count == 3  # trained, not loaded


def test_a_warm_start_fit_continues_and_has_a_file_of_its_own(tmp_path):
    """Fits that go on from a fitted model are told apart by where they start: the
    second warm-start fit trains; the same two fits run again load both."""
    folder = tmp_path / "ckpt"
    folder.mkdir()

    def two_fits(counted):
        est = OrtGradientRegressor(
            MLPRegressor(hidden_layer_sizes=(4,)), max_iter=3, random_state=0, warm_start=True
        )
        est.set_callbacks(Checkpoint(folder), counted)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(X, y)
            est.fit(X, y)
        return est

    counted = Epochs()
    first = two_fits(counted)
    assert counted.count == 6 and len(first.loss_curve_) == 6 and len(_fits(folder)) == 2
    again = Epochs()
    second = two_fits(again)
    assert again.count == 0  # both loaded
    assert second.loss_curve_ == first.loss_curve_
    np.testing.assert_array_equal(second.predict(X), first.predict(X))
