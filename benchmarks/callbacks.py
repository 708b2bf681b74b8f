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

That difference, divided by the iterations, also spreads what the monitor costs once
per fit (its scorer made at ``setup``, the root task scored at the end) over however
many iterations each side runs: on iris ours stops after 22-23 (a float32 objective's
line search ends there) and scikit-learn's goes on to 36. So the ``logistic_iris``
case is also timed with ``max_iter`` 5 and 20 on both sides (both run them all), the
fits taking turns, minimum of ``--slope-repeats``: the time the monitor adds per
iteration is the slope of its added time between the two, and what it adds per fit
the intercept.

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
import functools
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

FULL = {"iterations": 50, "repeats": 5, "slope": (5, 20), "slope_repeats": 7}
QUICK = {"iterations": 5, "repeats": 1, "slope": (2, 4), "slope_repeats": 1}
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


def cases() -> dict:
    """``{case: (data, ours(n), scikit-learn's(n) or None, scoring)}``: ``n`` the most
    epochs or iterations."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor

    return {
        "logistic_iris": (
            "iris",
            lambda n: OrtGradientClassifier(
                LogisticRegression(), max_iter=n, tol=0, n_jobs=THREADS
            ),
            lambda n: LogisticRegression(max_iter=n, tol=0),
            "accuracy",
        ),
        "mlp_classifier_iris": (
            "iris",
            lambda n: OrtGradientClassifier(
                MLPClassifier(hidden_layer_sizes=(16,)), max_iter=n, random_state=0, n_jobs=THREADS
            ),
            None,
            "accuracy",
        ),
        "mlp_regressor_diabetes": (
            "diabetes",
            lambda n: OrtGradientRegressor(
                MLPRegressor(hidden_layer_sizes=(64,)), max_iter=n, random_state=0, n_jobs=THREADS
            ),
            None,
            "r2",
        ),
    }


def _timed_fit(est, callbacks, X, y) -> tuple[float, int]:
    """Milliseconds of ``est.fit(X, y)`` with ``callbacks``, and its iterations."""
    if callbacks:
        est.set_callbacks(*callbacks)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        est.fit(X, y)
        elapsed = time.perf_counter() - start
    n_iter = est.n_iter_
    n_iter = int(max(n_iter)) if hasattr(n_iter, "__len__") else int(n_iter)
    return 1000 * elapsed, n_iter


def _per_iteration(make, callbacks, X, y) -> float:
    """Milliseconds per epoch or L-BFGS iteration of one fit of ``make()``."""
    elapsed, n_iter = _timed_fit(make(), callbacks, X, y)
    return elapsed / max(n_iter, 1)


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


def slope(ours, theirs, scoring, X, y, budgets, repeats) -> dict:
    """The ScoringMonitor's added time per iteration (slope between the ``budgets``) and
    per fit (intercept), ours and scikit-learn's, the fits of both taking turns."""
    from sklearn.callback import ScoringMonitor

    sides = {"ours": ours, "scikit-learn": theirs}
    times: dict = {}
    for _ in range(repeats + 1):  # the first round warms up, not kept
        for side, make in sides.items():
            for budget in budgets:
                for monitored in (False, True):
                    callbacks = [ScoringMonitor(scoring=scoring)] if monitored else []
                    found = _timed_fit(make(budget), callbacks, X, y)
                    times.setdefault((side, budget, monitored), []).append(found)
    out = {}
    for side in sides:
        best = {k[1:]: min(v) for k, v in times.items() if k[0] == side}
        lo, hi = budgets
        n_lo, n_hi = best[lo, False][1], best[hi, False][1]
        if n_hi == n_lo or best[lo, True][1] != n_lo or best[hi, True][1] != n_hi:
            out[side] = {"error": f"iterations run {n_lo} and {n_hi}: no slope"}
            continue
        added_lo = best[lo, True][0] - best[lo, False][0]
        added_hi = best[hi, True][0] - best[hi, False][0]
        per_iteration = (added_hi - added_lo) / (n_hi - n_lo)
        out[side] = {
            "iterations": [n_lo, n_hi],
            "added_ms_per_fit": [added_lo, added_hi],
            "added_ms_per_iteration": per_iteration,
            "added_ms_once_per_fit": added_lo - per_iteration * n_lo,
            "times": {
                f"{b}/{'monitor' if m else 'none'}": [t for t, _ in v]
                for (s, b, m), v in times.items()
                if s == side
            },
        }
    ours_slope = out["ours"].get("added_ms_per_iteration")
    theirs_slope = out["scikit-learn"].get("added_ms_per_iteration")
    out["ratio"] = ours_slope / theirs_slope if ours_slope and theirs_slope else None
    return out


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
    parser.add_argument("--slope-repeats", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)
    sizes = dict(QUICK if args.quick else FULL)
    if args.repeats:
        sizes["repeats"] = args.repeats
    if args.slope_repeats:
        sizes["slope_repeats"] = args.slope_repeats

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
        n = sizes["iterations"]
        for name, (data, ours, theirs, scoring) in cases().items():
            X, y = _data(data)
            row = {"ours": measure(functools.partial(ours, n), scoring, X, y, sizes["repeats"])}
            if theirs is not None:
                row["scikit-learn"] = measure(
                    functools.partial(theirs, n), scoring, X, y, sizes["repeats"]
                )
                added = row["ours"]["added_ms"]["scoring_monitor"]
                reference = row["scikit-learn"].get("added_ms", {}).get("scoring_monitor")
                row["scoring_monitor_added_ratio"] = added / reference if reference else None
                budgets, repeats = sizes["slope"], sizes["slope_repeats"]
                row["per_iteration_slope"] = slope(ours, theirs, scoring, X, y, budgets, repeats)
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
    for name, row in results.items():
        found = row.get("per_iteration_slope")
        if not found:
            continue
        lo, hi = sizes["slope"]
        print(f"\n{name}, ScoringMonitor's added time, fits of {lo} and {hi} iterations:\n")
        print("| side | per iteration (slope) | once per fit (intercept) |")
        print("|---|---|---|")
        for side in ("ours", "scikit-learn"):
            m = found[side]
            if "error" in m:
                print(f"| {side} | {m['error']} | |")
                continue
            print(
                f"| {side} | {m['added_ms_per_iteration']:.3f} ms "
                f"| {m['added_ms_once_per_fit']:.3f} ms |"
            )
        if found.get("ratio") is not None:
            print(f"| ours / scikit-learn | {found['ratio']:.2f} x | |")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
