"""What scikit-learn's callbacks add to a fit: this package beside scikit-learn, warm.

Run from the repository root::

    python benchmarks/callbacks.py               # 5 fits per column (about a minute)
    python benchmarks/callbacks.py --repeats 9
    python benchmarks/callbacks.py --quick       # checks that it runs (a few seconds)
    python benchmarks/callbacks.py --out DIR     # where callbacks.json goes

For each case, in one process at 2 threads (``n_jobs=2``; scikit-learn's BLAS limited
to 2 threads by ``threadpoolctl``), the fits take turns: without callbacks, with
``ScoringMonitor`` (scikit-learn's, scoring the task's ``fitted_estimator`` on the
training data at the end of every epoch or L-BFGS iteration), and with a callback that
takes the ``fitted_estimator`` and does not predict. Each fit is timed whole and
divided by its epochs or iterations (``n_iter_``); the minimum over ``--repeats`` fits
is kept (the machine may be shared: the least disturbed fit). The time a callback adds
is the difference with the fit without callbacks.

Cases, on scikit-learn's bundled data (standardised):

* ``logistic_iris``: ``OrtGradientClassifier(LogisticRegression())`` (L-BFGS, one task
  per iteration) beside scikit-learn's ``LogisticRegression`` (lbfgs), 50 iterations at
  most and ``tol=0`` on both; the ratio of the times added;
* ``mlp_classifier_iris``: ``OrtGradientClassifier(MLPClassifier((16,)))``, Adam, 50
  epochs;
* ``mlp_regressor_diabetes``: ``OrtGradientRegressor(MLPRegressor((64,)))``, Adam, 50
  epochs.

scikit-learn 1.9's MLPs take no callbacks: the MLP cases have no scikit-learn column;
their row gives the added time beside the epoch's own. Every fit is warm: a first fit
of each estimator, not timed, makes the process's sessions and artifacts.

Output: ``DIR/callbacks.json`` (meta: date, commit, versions, load before and after;
every fit's time) and, printed, a Markdown table.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata as md
import json
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from bench_common import THREADS, git_state, load_average  # noqa: E402

FULL = {"iterations": 50, "repeats": 5}
QUICK = {"iterations": 5, "repeats": 1}
VERSIONS = ("scikit-learn", "onnxruntime", "onnxruntime-training", "numpy")


class TakesFittedEstimator:
    """A callback that takes every task's ``fitted_estimator`` and does not predict (a
    checkpoint that keeps it in memory costs this much)."""

    def setup(self, estimator, context):
        pass

    def on_fit_task_begin(self, estimator, context):
        pass

    def on_fit_task_end(self, estimator, context, *, fitted_estimator=None):
        self.last = fitted_estimator

    def teardown(self, estimator, context):
        pass


def _data(name):
    from sklearn.datasets import load_diabetes, load_iris
    from sklearn.preprocessing import StandardScaler

    X, y = (load_iris if name == "iris" else load_diabetes)(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    if name == "diabetes":
        y = (y - y.mean()) / y.std()
    return X, y


def cases(iterations: int) -> dict:
    """``{case: (data, ours(), scikit-learn's() or None, scoring)}``."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor

    n = iterations
    return {
        "logistic_iris": (
            "iris",
            lambda: OrtGradientClassifier(LogisticRegression(), max_iter=n, tol=0, n_jobs=THREADS),
            lambda: LogisticRegression(max_iter=n, tol=0),
            "accuracy",
        ),
        "mlp_classifier_iris": (
            "iris",
            lambda: OrtGradientClassifier(
                MLPClassifier(hidden_layer_sizes=(16,)), max_iter=n, random_state=0, n_jobs=THREADS
            ),
            None,
            "accuracy",
        ),
        "mlp_regressor_diabetes": (
            "diabetes",
            lambda: OrtGradientRegressor(
                MLPRegressor(hidden_layer_sizes=(64,)), max_iter=n, random_state=0, n_jobs=THREADS
            ),
            None,
            "r2",
        ),
    }


def _per_iteration(make, callbacks, X, y) -> float:
    """Milliseconds per epoch or L-BFGS iteration of one fit of ``make()``."""
    est = make()
    if callbacks:
        est.set_callbacks(*callbacks)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        est.fit(X, y)
        elapsed = time.perf_counter() - start
    n_iter = est.n_iter_
    n_iter = int(max(n_iter)) if hasattr(n_iter, "__len__") else int(n_iter)
    return 1000 * elapsed / max(n_iter, 1)


def measure(make, scoring, X, y, repeats) -> dict:
    """Minimum ms per iteration: without callbacks, with ScoringMonitor, with a callback
    taking the fitted estimator; the fits taking turns."""
    from sklearn.callback import ScoringMonitor

    columns = {
        "none": lambda: [],
        "scoring_monitor": lambda: [ScoringMonitor(scoring=scoring)],
        "fitted_estimator": lambda: [TakesFittedEstimator()],
    }
    if not hasattr(make(), "set_callbacks"):
        return {"error": "no callback support"}
    _per_iteration(make, [], X, y)  # warm: sessions, artifacts
    _per_iteration(make, columns["scoring_monitor"](), X, y)
    times = {name: [] for name in columns}
    for _ in range(repeats):
        for name, callbacks in columns.items():
            times[name].append(_per_iteration(make, callbacks(), X, y))
    best = {name: min(values) for name, values in times.items()}
    return {
        "ms_per_iteration": best,
        "added_ms": {name: best[name] - best["none"] for name in columns if name != "none"},
        "times": times,
    }


def _versions() -> dict:
    found = {}
    for name in VERSIONS:
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            found[name] = None
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)
    sizes = dict(QUICK if args.quick else FULL)
    if args.repeats:
        sizes["repeats"] = args.repeats

    from threadpoolctl import threadpool_limits

    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        **git_state("onnxgrad_sklearn"),
        "python": sys.version.split()[0],
        "versions": _versions(),
        "threads": THREADS,
        "cpus": os.cpu_count(),
        "quick": args.quick,
        **sizes,
        "load_before": load_average(),
    }
    results = {}
    with threadpool_limits(THREADS):
        for name, (data, ours, theirs, scoring) in cases(sizes["iterations"]).items():
            X, y = _data(data)
            row = {"ours": measure(ours, scoring, X, y, sizes["repeats"])}
            if theirs is not None:
                row["scikit-learn"] = measure(theirs, scoring, X, y, sizes["repeats"])
                added = row["ours"]["added_ms"]["scoring_monitor"]
                reference = row["scikit-learn"].get("added_ms", {}).get("scoring_monitor")
                row["scoring_monitor_added_ratio"] = added / reference if reference else None
            results[name] = row
    meta["load_after"] = load_average()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "callbacks.json")
    with open(path, "w") as f:
        json.dump({"meta": meta, "cases": results}, f, indent=1)

    print(f"Callbacks, {meta['date']}, commit {meta['commit']}, {sizes}")
    print(f"load before {meta['load_before']}, after {meta['load_after']}\n")
    print(
        "| case | side | ms per iteration, no callback | ScoringMonitor adds "
        "| a fitted_estimator taken adds |"
    )
    print("|---|---|---|---|---|")
    for name, row in results.items():
        for side in ("ours", "scikit-learn"):
            m = row.get(side)
            if m is None or "error" in m:
                continue
            per, added = m["ms_per_iteration"], m["added_ms"]
            print(
                f"| {name} | {side} | {per['none']:.3f} | {added['scoring_monitor']:.3f} ms "
                f"| {added['fitted_estimator']:.3f} ms |"
            )
        if row.get("scoring_monitor_added_ratio") is not None:
            print(
                f"| {name} | ours / scikit-learn, ScoringMonitor's added time | "
                f"{row['scoring_monitor_added_ratio']:.2f} x | | |"
            )
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
