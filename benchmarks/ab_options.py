"""A/B of session options for the standard backend, in separate processes taking turns.

Each variant changes the package's ``SessionOptions`` through the documented hook
(``onnxgrad_sklearn.runtime.SESSION_OPTIONS_HOOKS``); each process trains the
epoch workloads of ``bench.py`` (MLP regression, batch 32 and 256) for a warm-up
epoch and ``--epochs`` timed epochs, and reports the median epoch inside the fit
loop (the package logger's epoch records). Run from the repository root::

    python benchmarks/ab_options.py [--rounds 3] [--rows 20000] [--epochs 3]
        [--variants default spinning_off] [--backend standard]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import RESULT_MARK, epoch_clock, load_average, quiet_fit  # noqa: E402
from bench_workloads import WORKLOADS, make_data, ort_estimator  # noqa: E402


def _spinning_off(so, threads):
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")


def _spinning_on(so, threads):
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")


def _denormal_as_zero(so, threads):
    so.add_session_config_entry("session.set_denormal_as_zero", "1")


def _basic(so, threads):
    import onnxruntime

    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC


def _mem_pattern_off(so, threads):
    so.enable_mem_pattern = False


#: name -> hook (None: the package's options as they are).
VARIANTS = {
    "default": None,
    "spinning_off": _spinning_off,
    "spinning_on": _spinning_on,
    "denormal_as_zero": _denormal_as_zero,
    "optimization_basic": _basic,
    "mem_pattern_off": _mem_pattern_off,
}


def worker(variant: str, backend: str, rows: int, epochs: int) -> dict:
    """Median epoch (s) inside the fit loop for each workload, under ``variant``."""
    from onnxgrad_sklearn import runtime

    hook = VARIANTS[variant]
    if hook is not None:
        runtime.SESSION_OPTIONS_HOOKS.append(hook)
    out = {}
    for name in ("mlp_reg_b32", "mlp_reg_b256"):
        spec = WORKLOADS[name]
        X, y = make_data(spec, rows)
        est = ort_estimator(spec, backend, 1)
        quiet_fit(est, X, y)  # engine, warm-up epoch
        est.max_iter = epochs + 1
        with epoch_clock() as clock:
            quiet_fit(est, X, y)
        per_epoch = [b - a for a, b in zip(clock.times, clock.times[1:])]
        out[name] = statistics.median(per_epoch)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--backend", default="standard")
    parser.add_argument("--variants", nargs="+", default=["default", "spinning_off"])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        res = worker(args.worker, args.backend, args.rows, args.epochs)
        print(RESULT_MARK + json.dumps(res))
        return 0
    env = dict(os.environ, OMP_NUM_THREADS="2", PYTHONWARNINGS="ignore")
    results = {v: [] for v in args.variants}
    for r in range(args.rounds):
        for variant in args.variants:
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", variant]
            cmd += ["--backend", args.backend, "--rows", str(args.rows)]
            cmd += ["--epochs", str(args.epochs)]
            load = load_average()
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
            line = next((x for x in proc.stdout.splitlines() if x.startswith(RESULT_MARK)), None)
            if line is None:
                print(f"{variant}: failed {proc.stderr[-1500:]}")
                continue
            res = json.loads(line[len(RESULT_MARK) :])
            res["load"] = load
            results[variant].append(res)
            print(
                f"round {r + 1} {variant:18s} "
                + " ".join(f"{k} {v:.4f} s" for k, v in res.items() if k != "load")
                + f"  load {load}  ({time.perf_counter() - t0:.0f} s)"
            )
    print()
    for variant, runs in results.items():
        for name in ("mlp_reg_b32", "mlp_reg_b256"):
            values = [r[name] for r in runs]
            if values:
                print(
                    f"{variant:18s} {name:13s} median {statistics.median(values):.4f} s/epoch "
                    f"({', '.join(f'{v:.4f}' for v in values)})"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
