"""The benchmark's report: the JSON document, the targets, the tables and the chart."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections import defaultdict

import numpy as np
from bench_common import THREADS, fmt
from bench_driver import contention, cpu_model, uptime, versions
from bench_workloads import (
    EPOCH_COLUMNS,
    FITS,
    FLOOR,
    FRAMEWORKS,
    ORT_BACKENDS,
    SKLEARN_NOTE,
    WORKLOADS,
)

LABELS = {
    "agent": "ORT agent",
    "standard": "ORT standard",
    "torch": "PyTorch",
    "sklearn": "scikit-learn",
    FLOOR: "NumPy floor (matrix products and activations only)",
}

#: What the floor column computes, under the epoch tables.
FLOOR_NOTE = (
    "NumPy floor (matrix products and activations only): not a framework, a floor. "
    "NumPy float32 at the same BLAS thread count (threadpoolctl), the PyTorch loop's "
    "epoch shuffle (a permuted copy of the data, then slices), and per batch only the "
    "forward matrix products and ReLUs, the output layer, the output gradient (pred - y; "
    "softmax - onehot for the classifier) and the backward products (A_prev.T @ dZ for "
    "every layer, dZ @ W.T times the ReLU mask but for the first layer; the linear "
    "model: X @ w and X.T @ r). No biases or bias gradients, no optimizer update, no "
    "loss read back. In brackets after each framework's time: that time / the floor's."
)


#: The group of each target, by its number in the results.
_GROUPS = {18: "training", 20: "daily use"}


def _median(values):
    return statistics.median(values) if values else None


def cell_of(runs: list[dict]) -> dict:
    """The figures of one (workload, framework) cell from its workers' answers."""
    good = [r for r in runs if "samples" in r]
    samples = [s for r in good for s in r["samples"]]
    cell = {
        "median": _median(samples),
        "min": min(samples) if samples else None,
        "max": max(samples) if samples else None,
        "samples": samples,
        "errors": [r["error"] for r in runs if "error" in r],
        "skipped": next((r["skipped"] for r in runs if "skipped" in r), None),
        "others_cpu_share": [contention(r, extras=False) for r in good],
        "load_before": [r.get("process_load_before") for r in good],
        "discarded_attempts": sum(len(r.get("discarded_attempts_others_share", [])) for r in good),
        "library": sorted({r["library"] for r in good if r.get("library")}),
    }
    by_threads = defaultdict(list)
    for r in good:
        for threads, values in r.get("samples_by_threads", {}).items():
            by_threads[threads].extend(values)
    cell["by_threads"] = {t: _median(v) for t, v in by_threads.items()}
    if cell["by_threads"]:
        cell["best_threads"], cell["best"] = min(cell["by_threads"].items(), key=lambda kv: kv[1])
    else:
        cell["best"] = cell["median"]
    if good:
        for key in (
            "rss_after_import_mb",
            "rss_after_data_mb",
            "rss_after_engine_mb",
            "rss_after_warmup_mb",
            "data_mb",
            "memory",
            "model_memory",
            "threads",
            "backend_",
            "epochs",
        ):
            if key in good[0]:
                cell[key] = good[0][key]
        in_loop = [s for r in good for s in r.get("epoch_in_loop_s", [])]
        if in_loop:
            cell["epoch_in_loop_s"] = _median(in_loop)
        per_batch = [r["batch_in_loop_us"] for r in good if "batch_in_loop_us" in r]
        if per_batch:
            cell["batch_in_loop_us"] = _median(per_batch)
    return cell


def ratios(cells: dict, base: str) -> dict:
    """``<fw>_over_<base>`` for every framework, and the backends against each other.

    From the medians at ``THREADS`` threads; the keys ending in ``_best`` from each
    framework's faster thread count (``best``).
    """
    out = {}
    for key, suffix in (("median", ""), ("best", "_best")):

        def s(fw, key=key):
            return cells.get(fw, {}).get(key)

        for fw in FRAMEWORKS:
            if fw != base and s(fw) and s(base):
                out[f"{fw}_over_{base}{suffix}"] = s(fw) / s(base)
        if base != FLOOR and s("standard") and s("agent"):
            out[f"standard_over_agent{suffix}"] = s("standard") / s("agent")
        for fw in ORT_BACKENDS:
            if s("sklearn") and s(fw) and base not in ("sklearn", FLOOR):
                out[f"sklearn_over_{fw}{suffix}"] = s("sklearn") / s(fw)
    if base == FLOOR and cells.get(FLOOR, {}).get("median"):
        # the epochs alone (the fit loop's, at THREADS threads), as the floor times its
        # own: a fit's setup (a few ms, counted once in a timed fit of a few epochs) apart
        for fw in ORT_BACKENDS:
            in_loop = cells.get(fw, {}).get("epoch_in_loop_s")
            if in_loop:
                out[f"{fw}_in_loop_over_{FLOOR}"] = in_loop / cells[FLOOR]["median"]
    return out


def summarise(cells, extras_cells, fit_cells, daily, memory, frameworks, cfg) -> dict:
    """Turn the raw worker answers into the JSON document."""
    quick = cfg["quick"]
    doc = {
        "meta": {
            "mode": "quick" if quick else "full",
            "command": "python benchmarks/bench.py" + (" --quick" if quick else ""),
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "threads": THREADS,
            "versions": versions(),
            "epochs_per_measurement": cfg["epochs"],
            "rounds": cfg["rounds"],
            "fit_rounds": cfg["fit_rounds"],
            "fit_repeats_per_process": cfg["fit_repeats"],
            "max_wait_for_quiet_s": cfg["max_wait"],
            "library_snapshot": cfg["snapshot"],
            "measure_again_above_others_share": cfg["retry_above"],
            "attempts_per_worker": cfg["attempts"],
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "uptime_start": cfg.get("uptime_start"),
            "uptime_end": uptime(),
        },
        "workloads": {},
        "fits": {},
    }
    for name, spec in WORKLOADS.items():
        entry = {
            "title": spec["title"],
            "rows": spec["quick_rows"] if quick else spec["rows"],
            "features": spec["features"],
            "batch": spec["batch"],
            "sklearn_note": SKLEARN_NOTE.get(name, "MLP, same batch size and epochs"),
            "frameworks": {},
        }
        for fw in (*frameworks, FLOOR):
            cell = cell_of(cells.get((name, fw), []))
            cell["s_per_epoch"] = cell["median"]
            if fw == FLOOR:
                for key in ("blas", "framework_modules_loaded"):
                    first = next((r for r in cells.get((name, fw), []) if key in r), None)
                    if first is not None:
                        cell[key] = first[key]
            extra = extras_cells.get((name, fw)) or {}
            for key in ("phases_us", "startup", "rss_growth", "profile", "extras_others_share"):
                if key in extra:
                    cell[key] = extra[key]
            entry["frameworks"][fw] = cell
        entry["ratios"] = ratios(entry["frameworks"], "torch")
        entry["ratios"].update(ratios(entry["frameworks"], FLOOR))
        doc["workloads"][name] = entry
    for name, spec in FITS.items():
        entry = {"title": spec["title"], "dtype": spec["dtype"], "frameworks": {}}
        for fw in frameworks:
            if (name, fw) in fit_cells:
                cell = cell_of(fit_cells[(name, fw)])
                cell["s_per_fit"] = cell["median"]
                entry["frameworks"][fw] = cell
        entry["ratios"] = ratios(entry["frameworks"], "sklearn")
        doc["fits"][name] = entry
    doc["daily_use"] = daily
    doc["memory_scaling"] = memory
    states = sorted(
        {
            r["library"]
            for runs in (*cells.values(), *fit_cells.values())
            for r in runs
            if r.get("library")
        }
    )
    doc["meta"]["library_source_sha256"] = states
    doc["targets"] = targets(doc)
    return doc


def _predict_us(doc, who, rows):
    pred = doc.get("daily_use", {}).get("predict", {})
    src = pred.get("sklearn" if who == "MLPRegressor" else "ort", {})
    return (src.get(who) or {}).get(rows, {}).get("median_us")


def targets(doc: dict) -> list[dict]:
    """Check the targets against the measurements: training (18) and daily use (20)."""
    w, fits = doc["workloads"], doc["fits"]
    out = []

    def add(what, value, limit, issue, unit="x", at_threads=None):
        met = None if value is None else value <= limit
        row = {"target": what, "measured": value, "limit": limit, "met": met, "unit": unit}
        row["issue"] = issue
        if at_threads is not None:
            row[f"measured_at_{THREADS}_threads"] = at_threads
        out.append(row)

    for name, entry in {**w, **fits}.items():
        if "agent" in entry["frameworks"]:
            add(
                f"{name}: standard backend / agent <= 1 (each at its faster thread count)",
                entry["ratios"].get("standard_over_agent_best"),
                1.0,
                18,
                at_threads=entry["ratios"].get("standard_over_agent"),
            )
    add(
        "mlp_reg_b32: ORT standard s/epoch / PyTorch s/epoch <= 0.6 (each at its faster "
        "thread count)",
        w["mlp_reg_b32"]["ratios"].get("standard_over_torch_best"),
        0.6,
        18,
        at_threads=w["mlp_reg_b32"]["ratios"].get("standard_over_torch"),
    )
    add(
        "mlp_reg_b256: ORT standard s/epoch / PyTorch s/epoch <= 0.8 (each at its faster "
        "thread count)",
        w["mlp_reg_b256"]["ratios"].get("standard_over_torch_best"),
        0.8,
        18,
        at_threads=w["mlp_reg_b256"]["ratios"].get("standard_over_torch"),
    )
    for name, entry in fits.items():
        add(
            f"{name}: whole fit, standard backend / MLPRegressor <= 1 (each at its faster "
            "thread count)",
            entry["ratios"].get("standard_over_sklearn_best"),
            1.0,
            18,
            at_threads=entry["ratios"].get("standard_over_sklearn"),
        )
    slope = doc.get("memory_scaling", {}).get("frameworks", {}).get("standard", {}).get("slope")
    add(
        "peak RSS per MB of weights+grads+state (standard backend, slope between the two "
        "largest MLPs) <= 3",
        slope,
        3.0,
        18,
        unit="MB/MB",
    )
    ours, theirs = _predict_us(doc, "standard", "1"), _predict_us(doc, "MLPRegressor", "1")
    add(
        "predict of 1 row: OrtGradientRegressor / MLPRegressor <= 2",
        ours / theirs if ours and theirs else None,
        2.0,
        20,
    )
    imports = doc.get("daily_use", {}).get("import", {})
    a = imports.get("onnxgrad_sklearn, agent", {}).get("import_s")
    b = imports.get("sklearn.neural_network", {}).get("import_s")
    add(
        "import onnxgrad_sklearn (torch installed) - import sklearn.neural_network <= 0.5 s",
        a - b if a is not None and b is not None else None,
        0.5,
        20,
        unit="s",
    )
    return out


# ---------------------------------------------------------------------------
# printed tables
# ---------------------------------------------------------------------------


def _cell(entry, fw, key, spec=".3f"):
    return fmt(entry["frameworks"].get(fw, {}).get(key), spec)


def print_report(doc: dict) -> None:
    """Print the tables of a run."""
    meta = doc["meta"]
    print()
    print(f"{meta['cpu']}, {meta['cores']} cores, {meta['threads']} threads; {meta['versions']}")
    print(f"load: start {meta.get('uptime_start')}; end {meta.get('uptime_end')}")
    states = meta.get("library_source_sha256") or []
    print(f"onnxgrad_sklearn sources: {', '.join(states) or '?'}")
    if len(states) > 1:
        print("WARNING: the library's sources changed during the run.")
    if meta["mode"] == "quick":
        print("Quick run: small data, one process per framework; the figures only show that")
        print("everything runs, they do not measure the workloads.")
    print()
    print(f"At {THREADS} threads (median of the processes):")
    print(markdown(doc, "median"))
    for name, note in SKLEARN_NOTE.items():
        print(f"  {name}: scikit-learn column is {note}.")
    print()
    print("Each framework at its faster thread count (threads in brackets):")
    print(markdown(doc, "best"))
    print()
    for name, e in doc["workloads"].items():
        for fw in ORT_BACKENDS:
            c = e["frameworks"].get(fw, {})
            st = c.get("startup") or {}
            prof = c.get("profile") or {}
            per_batch = fmt(c.get("batch_in_loop_us"), ".0f")
            line = f"  {name:14s} {fw:8s} per batch in loop {per_batch} us"
            if "fit_one_batch_ms" in st:
                line += f", fit(1 batch) {st['fit_one_batch_ms']:.1f} ms (cold {st['cold_ms']:.0f})"
            if "kernel_us_per_batch" in prof:
                line += f", kernels {prof['kernel_us_per_batch']:.0f} us/batch"
            print(line)
        tch = e["frameworks"].get("torch", {}).get("phases_us")
        if tch:
            print(
                f"  {name:14s} torch    per batch {tch['sum']:.0f} us (data {tch['data']:.0f}, "
                f"forward {tch['forward']:.0f}, backward {tch['backward']:.0f}, "
                f"update {tch['update']:.0f})"
            )
    daily = doc.get("daily_use", {})
    print()
    for res in daily.get("predict", {}).values():
        for who, rows in res.items():
            if isinstance(rows, dict) and "1" in rows:
                print(
                    f"  predict {who:17s} 1 row {rows['1']['median_us']:8.1f} us, "
                    f"1000 rows {rows['1000']['median_us']:8.1f} us"
                )
    for fw, res in daily.get("grid", {}).items():
        print(
            f"  GridSearchCV(n_jobs=2) {fw:8s} first {fmt(res.get('first_s'))} s, "
            f"second {fmt(res.get('second_s'))} s"
        )
    for name, entry in daily.get("import", {}).items():
        print(
            f"  import {name:42s} {fmt(entry.get('import_s'))} s, first fit "
            f"{fmt(entry.get('first_fit_s'))} s, second {fmt(entry.get('second_fit_s'))} s"
        )
    scaling = doc.get("memory_scaling", {}).get("frameworks", {})
    for fw, entry in scaling.items():
        points = ", ".join(
            f"{p['hidden'][0]}: {p['peak_above_data_mb']:.1f} MB "
            f"for {p['weights_grads_state_mb']:.1f}"
            for p in entry["points"]
        )
        print(
            f"  peak RSS above imports + data, {fw}: {points} MB of weights+grads+state; "
            f"slope {fmt(entry.get('slope'), '.2f')}, intercept "
            f"{fmt(entry.get('intercept_mb'), '.1f')} MB"
        )
    for fw in ORT_BACKENDS:
        growth = doc["workloads"]["mlp_reg_b256"]["frameworks"].get(fw, {}).get("rss_growth")
        if growth and "growth_mb" in growth:
            print(f"  RSS growth, {fw} mlp_reg_b256: {growth['growth_mb']:+.2f} MB")
    print()
    for t in doc["targets"]:
        status = {True: "met", False: "NOT met", None: "not measured"}[t["met"]]
        print(
            f"  [{status:12s}] ({_GROUPS.get(t['issue'], t['issue'])}) {t['target']}: measured "
            f"{fmt(t['measured'], '.3f')} {t['unit']}"
            + (
                f" ({fmt(t[f'measured_at_{THREADS}_threads'], '.3f')} at {THREADS} threads)"
                if f"measured_at_{THREADS}_threads" in t
                else ""
            )
        )


def _value(entry, fw, key, floor: bool = False):
    """A cell of a table: seconds, the threads in brackets for ``best``.

    With ``floor``, the framework's time / the floor's follows (``0.165 (1.22x)``,
    ``0.148 (2; 1.10x)``).
    """
    cell = entry["frameworks"].get(fw, {})
    value, brackets = cell.get(key), []
    if key == "best" and value is not None and cell.get("best_threads"):
        brackets.append(str(cell["best_threads"]))
    if floor and fw != FLOOR and value is not None:
        ratio = entry["ratios"].get(f"{fw}_over_{FLOOR}" + ("_best" if key == "best" else ""))
        if ratio is not None:
            brackets.append(f"{ratio:.2f}x")
    return fmt(value) + (f" ({'; '.join(brackets)})" if brackets else "")


def markdown(doc: dict, key: str = "median") -> str:
    """The tables of ``docs/performance.md`` and ``benchmarks/README.md`` as Markdown.

    ``key``: ``"median"`` (at ``THREADS`` threads) or ``"best"`` (each framework at
    its faster thread count, given in brackets).
    """
    suffix = "_best" if key == "best" else ""
    lines = [
        "| s/epoch (x the floor) | ORT agent | ORT standard | PyTorch | scikit-learn "
        f"| {LABELS[FLOOR]} | standard / agent "
        "| standard / PyTorch | agent / PyTorch | scikit-learn / standard |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, e in doc["workloads"].items():
        r = e["ratios"]
        keys = ("standard_over_agent", "standard_over_torch", "agent_over_torch")
        keys += ("sklearn_over_standard",)
        lines.append(
            f"| `{name}` | "
            + " | ".join(_value(e, fw, key, floor=True) for fw in EPOCH_COLUMNS)
            + " | "
            + " | ".join(fmt(r.get(k + suffix), ".2f") for k in keys)
            + " |"
        )
    if key == "median":
        lines += [
            "",
            "| epochs alone (in the fit loop) / the floor | ORT agent | ORT standard |",
            "|---|---|---|",
        ]
        for name, e in doc["workloads"].items():
            r = e["ratios"]
            cells = [fmt(r.get(f"{fw}_in_loop_over_{FLOOR}"), ".2f") for fw in ORT_BACKENDS]
            lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    lines += [
        "",
        FLOOR_NOTE,
        "",
        "| s/whole fit | ORT agent | ORT standard | PyTorch | scikit-learn | standard / agent "
        "| agent / scikit-learn | standard / scikit-learn | PyTorch / scikit-learn |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, e in doc["fits"].items():
        r = e["ratios"]
        keys = ("standard_over_agent", "agent_over_sklearn", "standard_over_sklearn")
        keys += ("torch_over_sklearn",)
        lines.append(
            f"| `{name}` | "
            + " | ".join(_value(e, fw, key) for fw in FRAMEWORKS)
            + " | "
            + " | ".join(fmt(r.get(k + suffix), ".2f") for k in keys)
            + " |"
        )
    return "\n".join(lines)


def plot(doc: dict, path: str) -> None:
    """Write grouped bar charts: seconds per epoch, and seconds per whole fit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {
        "agent": "#1f77b4",
        "standard": "#9467bd",
        "torch": "#ff7f0e",
        "sklearn": "#2ca02c",
        FLOOR: "#7f7f7f",
    }
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.8), gridspec_kw={"width_ratios": [4, 4]})
    panels = [
        (axes[0], doc["workloads"], "s_per_epoch", "seconds per epoch (median; bars: min-max)"),
        (axes[1], doc["fits"], "s_per_fit", "seconds per whole fit (median; bars: min-max)"),
    ]
    for (ax, entries, key, ylabel), columns in zip(panels, (EPOCH_COLUMNS, FRAMEWORKS)):
        names = list(entries)
        x = np.arange(len(names))
        width = 0.8 / len(columns)
        for k, fw in enumerate(columns):
            values, lo, hi = [], [], []
            for name in names:
                cell = entries[name]["frameworks"].get(fw, {})
                v = cell.get(key)
                values.append(v if v is not None else 0.0)
                lo.append(v - cell["min"] if v is not None else 0.0)
                hi.append(cell["max"] - v if v is not None else 0.0)
            if not any(values):
                continue
            bars = ax.bar(
                x + (k - (len(columns) - 1) / 2) * width,
                values,
                width,
                yerr=[lo, hi],
                capsize=2,
                label=LABELS[fw],
                color=colors[fw],
            )
            ax.bar_label(bars, labels=[f"{v:.2f}" if v else "" for v in values], fontsize=6)
        ax.set_xticks(x, [n.replace("_", "\n", 1) for n in names], fontsize=7)
        ax.set_yscale("log")  # under load one column can be 50 times the others
        ax.set_ylabel(ylabel + ", log scale", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    meta = doc["meta"]
    fig.suptitle(
        f"Training time, {meta['threads']} threads, {meta['cpu']} ({meta['mode']} run)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(doc: dict, out: str) -> tuple[str, str]:
    """Write ``latest.json`` and ``benchmark.png`` into ``out``; return their paths."""
    json_path = os.path.join(out, "latest.json")
    with open(json_path, "w") as f:
        json.dump(doc, f, indent=1)
    png_path = os.path.join(out, "benchmark.png")
    try:
        plot(doc, png_path)
    except ImportError as exc:  # the figures are in the JSON and the printed report
        print(f"no plot ({exc}): pip install matplotlib to draw {png_path}")
        png_path = None
    return json_path, png_path
