"""Side-by-side training benchmark: onnxgrad_sklearn (both backends), PyTorch, scikit-learn.

Run from the repository root::

    python benchmarks/bench.py              # full run, about 15 minutes on 2 cores
    python benchmarks/bench.py --quick      # small data: checks that it all runs
    python benchmarks/bench.py --out DIR    # where latest.json and benchmark.png go
    python benchmarks/bench.py --max-wait 0 # do not wait for other processes to go quiet
    python benchmarks/bench.py --no-snapshot  # import the package's files, not a copy

The same data (same seed) and the same models (same architecture, same initial
weights, equivalent update formulas) are trained by ``OrtGradientRegressor`` /
``OrtGradientClassifier`` with ``backend="agent"`` and ``backend="standard"``, by
a PyTorch CPU loop (skipped with a message when torch is not importable) and by
scikit-learn's ``MLPRegressor`` / ``MLPClassifier`` (``SGDRegressor`` for the
linear workload), each framework in its own processes, 2 threads everywhere.
The epoch workloads also have a NumPy floor: the same matrix products and
activations per batch, nothing else, at the same thread count; every framework's
time is also given as a ratio to it.

Reported, as ratios: seconds per epoch of the large workloads, whole fits of
new estimators on small data (float32 and float64), predict latency, import
time and the first fit after it, ``GridSearchCV(n_jobs=2)``, peak RSS against
the size of the model, and the targets (training, daily use: met / not met).

The modules: :mod:`bench_workloads` (data, models, each framework's estimator),
:mod:`bench_runners` (what one worker process measures), :mod:`bench_driver`
(the plan, the processes, the retries), :mod:`bench_report` (JSON, targets,
tables, chart) and :mod:`bench_common` (RSS, CPU shares, the epoch clock, the
session-options hook).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import HERE  # noqa: E402


def run_all(quick: bool, max_wait: float | None = None, snapshot: str | None = None) -> dict:
    """Run every part of the benchmark, frameworks alternating; return the JSON document."""
    import bench_driver as driver
    import bench_report as report

    cfg = driver.plan(quick)
    if max_wait is not None:
        cfg["max_wait"] = max_wait
    cfg["env"] = driver.worker_env(snapshot)
    cfg["snapshot"] = snapshot is not None
    cfg["uptime_start"] = driver.uptime()
    print(f"load: {cfg['uptime_start']}")
    frameworks = driver.available_frameworks()
    print("epoch workloads")
    cells, extras = driver.run_epoch_workloads(frameworks, cfg)
    print("whole fits on small data")
    fits = driver.run_fit_workloads(frameworks, cfg)
    print("predict, GridSearchCV, import")
    daily = driver.run_daily_use(frameworks, cfg)
    print("memory scaling")
    memory = driver.memory_scaling(frameworks, cfg)
    return report.summarise(cells, extras, fits, daily, memory, frameworks, cfg)


def main(argv=None) -> int:
    """Command line: run the benchmark, print the tables, write JSON and PNG."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small data, fewer repeats")
    parser.add_argument(
        "--out", default=os.path.join(HERE, "results"), help="folder for latest.json and the PNG"
    )
    parser.add_argument(
        "--max-wait",
        type=float,
        default=None,
        help="seconds to wait for other processes to go quiet before each worker "
        "(default: 5 full, 0 quick)",
    )
    parser.add_argument(
        "--no-snapshot",
        action="store_true",
        help="workers import the library's files as they are, not a copy made at the start",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        from bench_runners import worker_main

        return worker_main(args.worker)
    import bench_driver as driver
    import bench_report as report

    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    snapshot = None if args.no_snapshot else driver.snapshot_library()
    try:
        doc = run_all(args.quick, args.max_wait, snapshot)
    finally:
        if snapshot:
            shutil.rmtree(snapshot, ignore_errors=True)
    doc["meta"]["total_wall_s"] = time.perf_counter() - t0
    json_path, png_path = report.write(doc, args.out)
    report.print_report(doc)
    print(f"\nwrote {json_path} and {png_path} ({doc['meta']['total_wall_s']:.0f} s)")
    failed = [
        f"{name}/{fw}"
        for group in ("workloads", "fits")
        for name, e in doc[group].items()
        for fw in ("agent", "standard", "sklearn", "floor")
        if fw in e["frameworks"] and e["frameworks"][fw]["median"] is None
    ]
    if failed:
        print(f"failed measurements: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
