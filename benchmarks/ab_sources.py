"""A/B of two source trees of the package, in separate processes taking turns.

For a change that must leave every figure as it was (a restructuring), each round runs,
for each tree in turn and in fresh processes (the tree first on ``PYTHONPATH``):

- ``cold``: a process's first fit, the clock started before any import: the diabetes
  data, ``OrtGradientRegressor(MLPRegressor())`` with default parameters (the training
  artifacts on disk, built by an earlier round), and ``MLPRegressor`` alone in another
  fresh process: the ratio of the two;
- ``warm``: in one process, the epoch (median inside the fit loop, after a warm-up fit)
  of the MLP workloads of ``bench.py`` on both backends, a second diabetes fit and a
  ``GridSearchCV`` (``n_jobs=1``), each beside ``MLPRegressor`` in the same process;
- ``dask`` (with ``--dask``): a ``LocalCluster`` of 2 one-thread workers, the seconds
  per L-BFGS evaluation of a logistic regression and the rows per second of a
  ``sync_every=1`` mini-batch fit.

Run from the repository root with two trees (for instance a ``git worktree`` of the
commit before the change)::

    python benchmarks/ab_sources.py BEFORE_TREE AFTER_TREE [--rounds 3] [--dask]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MARK = "@@RESULT@@"

COLD = r"""
import time
t0 = time.perf_counter()
from sklearn.datasets import load_diabetes
from sklearn.neural_network import MLPRegressor
import warnings
warnings.simplefilter("ignore")
X, y = load_diabetes(return_X_y=True)
if KIND == "ours":
    from onnxgrad_sklearn import OrtGradientRegressor
    OrtGradientRegressor(MLPRegressor(), random_state=0).fit(X, y)
else:
    MLPRegressor(random_state=0).fit(X, y)
print(MARK + repr(time.perf_counter() - t0))
"""


def warm() -> dict:
    """Epochs of the MLP workloads on both backends, a second diabetes fit and a
    GridSearchCV, beside MLPRegressor in this process."""
    import warnings

    warnings.simplefilter("ignore")
    sys.path.insert(0, HERE)
    from bench_common import epoch_clock, quiet_fit
    from bench_workloads import WORKLOADS, make_data, ort_estimator
    from sklearn.datasets import load_diabetes
    from sklearn.model_selection import GridSearchCV
    from sklearn.neural_network import MLPRegressor

    from onnxgrad_sklearn import OrtGradientRegressor

    out = {}
    for backend in ("agent", "standard"):
        for name in ("mlp_reg_b256", "mlp_reg_b32", "mlp_clf_b64"):
            spec = WORKLOADS[name]
            X, y = make_data(spec, 20_000)
            est = ort_estimator(spec, backend, 1)
            quiet_fit(est, X, y)  # engine, warm-up epoch
            est.max_iter = 4
            with epoch_clock() as clock:
                quiet_fit(est, X, y)
            per_epoch = [b - a for a, b in zip(clock.times, clock.times[1:])]
            out[f"{name} {backend}"] = statistics.median(per_epoch)
    X, y = load_diabetes(return_X_y=True)

    def timed(make, search=False):
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            model = make()
            if search:
                model = GridSearchCV(model, {"alpha": [1e-4, 1e-2]}, cv=3, n_jobs=1)
            model.fit(X, y)
            best = min(best, time.perf_counter() - t0)
        return best

    def ours():
        return OrtGradientRegressor(MLPRegressor(), random_state=0)

    def theirs():
        return MLPRegressor(random_state=0)

    ours().fit(X, y)  # the first fit of the process is the cold part's
    out["diabetes second fit / MLPRegressor"] = timed(ours) / timed(theirs)
    out["GridSearchCV n_jobs=1 / MLPRegressor's"] = timed(ours, True) / timed(theirs, True)
    return out


def dask() -> dict:
    """Seconds per L-BFGS evaluation and sync_every=1 rows per second on a LocalCluster."""
    import warnings

    warnings.simplefilter("ignore")
    import dask.array as da
    import numpy as np
    from distributed import Client, LocalCluster
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPRegressor

    from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor

    rng = np.random.RandomState(0)
    out = {}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True) as cluster:
        with Client(cluster):
            X = rng.randn(400_000, 50).astype(np.float32)
            y = (X @ rng.randn(50) > 0).astype(int)
            Xd, yd = da.from_array(X, chunks=100_000), da.from_array(y, chunks=100_000)
            est = OrtGradientClassifier(LogisticRegression(max_iter=10))
            est.fit(Xd, yd)  # engines and placement once
            t0 = time.perf_counter()
            est.fit(Xd, yd)
            out["dask lbfgs s/iteration"] = (time.perf_counter() - t0) / max(est.n_iter_, 1)
            X = rng.randn(10_000, 20).astype(np.float32)
            y = X[:, 0] - X[:, 1]
            Xd, yd = da.from_array(X, chunks=2_500), da.from_array(y, chunks=2_500)
            reg = OrtGradientRegressor(
                MLPRegressor(hidden_layer_sizes=(32,)), batch_size=128, max_iter=1
            )
            reg.fit(Xd, yd)
            t0 = time.perf_counter()
            reg.set_params(max_iter=2).fit(Xd, yd)
            out["dask sync_every=1 rows/s"] = 2 * len(y) / (time.perf_counter() - t0)
    return out


def _run(tree: str, code: str, env: dict) -> object:
    """``code`` run in a fresh process with ``tree`` first on the path: its result."""
    env = dict(env, PYTHONPATH=os.pathsep.join([tree, env.get("PYTHONPATH", "")]).strip(os.pathsep))
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True,
        timeout=1800,
    )  # fmt: skip
    line = next((x for x in proc.stdout.splitlines() if x.startswith(MARK)), None)
    if line is None:
        raise RuntimeError(f"{tree}: {proc.stderr[-2000:]}")
    return eval(line[len(MARK) :])  # noqa: S307 - our own process's repr of a number or dict


def _part(name: str) -> str:
    return (
        f"import sys; sys.path.insert(0, {HERE!r}); import ab_sources; "
        f"print({MARK!r} + repr(ab_sources.{name}()))"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs=2, help="the two source trees (before, after)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dask", action="store_true")
    args = parser.parse_args(argv)
    env = dict(os.environ, OMP_NUM_THREADS="2", PYTHONWARNINGS="ignore")
    trees = [os.path.abspath(t) for t in args.trees]
    for tree in trees:  # the training artifacts on disk before the cold runs
        _run(tree, COLD.replace("KIND", "'ours'").replace("MARK", repr(MARK)), env)
    results = {t: {} for t in trees}
    for r in range(args.rounds):
        for tree in trees:
            found = results[tree]
            ours = _run(tree, COLD.replace("KIND", "'ours'").replace("MARK", repr(MARK)), env)
            mlp = _run(tree, COLD.replace("KIND", "'mlp'").replace("MARK", repr(MARK)), env)
            found.setdefault("cold first fit / MLPRegressor", []).append(ours / mlp)
            parts = {**_run(tree, _part("warm"), env)}
            if args.dask:
                parts.update(_run(tree, _part("dask"), env))
            for key, value in parts.items():
                found.setdefault(key, []).append(value)
            print(
                f"round {r + 1} {tree}: "
                + json.dumps({k: round(v[-1], 4) for k, v in found.items()})
            )
    print()
    keys = list(results[trees[0]])
    print(f"| median of {args.rounds} | before | after | after / before |")
    print("|---|---|---|---|")
    for key in keys:
        a = statistics.median(results[trees[0]][key])
        b = statistics.median(results[trees[1]][key])
        print(f"| {key} | {a:.4g} | {b:.4g} | {b / a:.3f} |")
    print(json.dumps({"trees": trees, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
