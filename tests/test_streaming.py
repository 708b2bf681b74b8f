"""Larger than memory: partial_fit over the blocks of a CSV file, through dask-ml's Incremental.

The file is several times larger than the memory the training process may grow by
(its peak RSS, measured with ``resource.getrusage`` in a subprocess, no limit set on
the process); the weights equal those of sequential partial_fit over the same blocks.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pandas")
pytest.importorskip("dask.dataframe")
pytest.importorskip("dask_ml.wrappers")
resource = pytest.importorskip("resource")  # POSIX only

ROOT = Path(__file__).resolve().parents[1]
N_FEATURES = 100
N_ROWS = 560_000  # 7 bytes per feature, 9 for the target: 397 MB
#: How much the training process may grow past its baseline (imports, one warm-up fit)
#: while dask-ml streams the file (58-62 MiB measured), and by the end of the reference
#: pass over the same blocks (74 MiB measured; 117 MiB with the threaded scheduler).
MAX_GROWTH_MB = 100
MAX_GROWTH_WITH_REFERENCE_MB = 150

SCRIPT = r"""
import json, resource, sys, warnings
import dask, dask.dataframe as dd, numpy as np, pandas as pd
from dask_ml.wrappers import Incremental
from sklearn.base import clone
from sklearn.neural_network import MLPRegressor
from onnxgrad_sklearn import OrtGradientRegressor

def peak_mb():  # the largest resident set size so far (Linux reports kilobytes)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

path, out = sys.argv[1], sys.argv[2]
est = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(16,)), optimizer="adam",
                           learning_rate_init=0.001, batch_size=500, random_state=0, n_jobs=1)
sample = pd.read_csv(path, nrows=2000).to_numpy()
clone(est).partial_fit(sample[:, :-1], sample[:, -1])  # the runtime's own allocations
baseline = peak_mb()

frame = dd.read_csv(path, blocksize="8MB")
data = frame.to_dask_array()  # X and y slice one array: each block is read once
dask.config.set(scheduler="synchronous")  # one block in memory at a time
streamed = Incremental(est, shuffle_blocks=False).fit(data[:, :-1], data[:, -1]).estimator_
after_dask = peak_mb()
sequential, lengths = clone(est), []
for part in frame.partitions:  # the same blocks, one partial_fit each, in order
    block = part.compute().to_numpy()
    lengths.append(len(block))
    sequential.partial_fit(block[:, :-1], block[:, -1])
after_sequential = peak_mb()

np.savez(out, *streamed.estimator_.coefs_, *sequential.estimator_.coefs_)
print(json.dumps({
    "baseline_mb": baseline, "after_dask_mb": after_dask, "after_sequential_mb": after_sequential,
    "t": [streamed.t_, sequential.t_], "blocks": len(lengths), "min_block": min(lengths),
    "r2_on_sample": streamed.score(sample[:, :-1], sample[:, -1]),
}))
"""


def write_csv(path, n_rows, n_features, seed=0, chunk=20_000):
    """A CSV of ``n_features`` columns ``x0, x1, ...`` of the form 0.0000 and a target ``y``.

    Written as bytes (7 per value), chunk by chunk: about 0.1 s per 10 MB. The target
    is a linear function of the features' first two digits plus noise.
    """
    rng = np.random.RandomState(seed)
    w = rng.randn(n_features) / 10
    header = ",".join([f"x{k}" for k in range(n_features)] + ["y"]) + "\n"
    with open(path, "wb") as f:
        f.write(header.encode())
        for start in range(0, n_rows, chunk):
            r = min(chunk, n_rows - start)
            digits = np.frombuffer(rng.bytes(r * n_features * 5), dtype=np.uint8) % 10
            digits = digits.reshape(r, n_features, 5)
            x = np.empty((r, n_features, 7), dtype=np.uint8)
            x[:, :, 0] = digits[:, :, 0] + 48
            x[:, :, 1] = ord(".")
            x[:, :, 2:6] = digits[:, :, 1:] + 48
            x[:, :, 6] = ord(",")
            values = digits[:, :, 0] + 0.1 * digits[:, :, 1]
            y = ((values - 5) @ w) * 0.2 + 0.05 * rng.randn(r)  # |y| < 100: +dd.dddd
            code = np.round(np.abs(y) * 1e4).astype(np.int64)
            t = np.empty((r, 9), dtype=np.uint8)
            t[:, 0] = np.where(y < 0, ord("-"), ord("+"))
            for k, p in enumerate((100_000, 10_000, 1000, 100, 10, 1)):
                t[:, k + 1 + (k > 1)] = (code // p) % 10 + 48
            t[:, 3] = ord(".")
            t[:, 8] = ord("\n")
            f.write(np.concatenate([x.reshape(r, -1), t], axis=1).tobytes())


def test_generated_csv_reads_back():
    pd = pytest.importorskip("pandas")
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "small.csv"
        write_csv(path, 1000, 3, chunk=300)
        frame = pd.read_csv(path)
    assert list(frame.columns) == ["x0", "x1", "x2", "y"] and len(frame) == 1000
    assert frame.to_numpy().dtype == np.float64
    assert 0 <= frame[["x0", "x1", "x2"]].to_numpy().min() and frame.x0.max() < 10
    assert frame.y.std() > 0.01


@pytest.mark.slow
def test_stream_a_csv_larger_than_the_memory_it_may_use(tmp_path):
    path = tmp_path / "large.csv"
    write_csv(path, N_ROWS, N_FEATURES)
    size_mb = os.path.getsize(path) / 2**20
    assert size_mb > 3 * MAX_GROWTH_MB
    weights = tmp_path / "weights.npz"
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(path), str(weights)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    path.unlink()
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    growth = report["after_dask_mb"] - report["baseline_mb"]
    total = report["after_sequential_mb"] - report["baseline_mb"]
    print(
        f"file {size_mb:.0f} MiB, peak RSS growth {growth:.0f} MiB ({total:.0f} MiB with the "
        f"reference pass)",
        report,
    )
    assert growth < MAX_GROWTH_MB, report
    assert total < MAX_GROWTH_WITH_REFERENCE_MB, report
    assert report["t"] == [N_ROWS, N_ROWS]  # every row seen once by both
    assert report["blocks"] > 10 and report["min_block"] > 1000
    assert report["r2_on_sample"] > 0.5, report  # one epoch over the file learns the target
    arrays = np.load(weights)
    coefs = [arrays[f"arr_{k}"] for k in range(4)]  # two layers each
    streamed, sequential = coefs[:2], coefs[2:]
    for a, b in zip(streamed, sequential):
        assert a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(streamed[0], np.zeros_like(streamed[0]))


def _user_guide_section(title):
    text = (ROOT / "docs" / "user_guide.md").read_text(encoding="utf-8")
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end > 0 else None]
    return "\n".join(re.findall(r"```python\n(.*?)```", section, flags=re.S))


def test_user_guide_example_runs(tmp_path):
    """The docs' example streams a small file and checks the same equality itself."""
    code = _user_guide_section("Data larger than memory")
    assert "Incremental" in code and "partial_fit" in code
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "same weights: True" in result.stdout
    assert os.path.getsize(tmp_path / "train.csv") < 2**20
