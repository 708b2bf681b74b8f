"""Training artifacts kept for the process and on disk (onnxgrad_sklearn.artifacts)."""

import json
import logging
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from _helpers import BACKENDS

from onnxgrad_sklearn import artifacts, config_context, get_config, set_config

# a fit in a fresh process: its weights and what it imported, as JSON
FIT = """
import json, sys, warnings
import numpy as np
from sklearn.neural_network import MLPRegressor
from onnxgrad_sklearn import OrtGradientRegressor
warnings.simplefilter("ignore")
rng = np.random.RandomState(0)
X = rng.rand(80, 4)
y = X @ [1.0, -2.0, 0.5, 0.3] + 0.1 * rng.rand(80)
reg = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(6,)), max_iter=4,
                           random_state=0, backend={backend!r}).fit(X, y)
print(json.dumps({{
    "coefs": [c.tolist() for c in reg.estimator_.coefs_],
    "pred": reg.predict(X[:5]).tolist(),
    "modules": sorted(
        m for m in ("onnx", "skl2onnx", "onnx_ad", "sklearn.linear_model") if m in sys.modules
    ),
}}))
"""


def _env(cache, **extra):
    env = dict(os.environ, **extra)
    if cache is None:
        env.pop(artifacts.CACHE_ENV, None)
    else:
        env[artifacts.CACHE_ENV] = str(cache)
    return env


def _fit_in_process(cache, backend="standard", **env):
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FIT.format(backend=backend))],
        capture_output=True,
        text=True,
        env=_env(cache, **env),
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _entries(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(artifacts.SUFFIX))


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fit_from_the_disk_cache_gives_the_weights_of_the_fit_that_built_it(tmp_path, backend):
    cache = tmp_path / "cache"
    built = _fit_in_process(cache, backend)
    names = _entries(cache)
    assert any(n.startswith("converted-") for n in names)
    assert any(n.startswith("plan-") for n in names)
    if backend == "standard":
        assert any(n.startswith("step-") for n in names)
    loaded = _fit_in_process(cache, backend)
    without = _fit_in_process("", backend)
    assert loaded["coefs"] == built["coefs"] == without["coefs"]  # bit for bit
    assert loaded["pred"] == built["pred"] == without["pred"]
    # every graph came from the disk: neither skl2onnx, nor onnx, nor onnx_ad is imported
    # (nor scikit-learn's linear models, which an MLP's fit does not need: 16-20 ms)
    assert "skl2onnx" in built["modules"] and loaded["modules"] == []
    assert _entries(cache) == names  # nothing new was written


@pytest.mark.slow
def test_three_processes_fill_the_cache_at_once(tmp_path):
    cache = tmp_path / "cache"
    code = textwrap.dedent(FIT.format(backend="standard"))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(cache),
        )
        for _ in range(3)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert "corrupt" not in err
        results.append(json.loads(out.strip().splitlines()[-1]))
    without = _fit_in_process("")
    assert all(r["coefs"] == without["coefs"] for r in results)
    assert not [p for p in cache.iterdir() if p.name.endswith(".tmp")]
    for path in cache.iterdir():  # every entry whole: read back without a warning
        key = path.name[: -len(artifacts.SUFFIX)]
        assert artifacts._read(path, key) is not None
    again = _fit_in_process(cache)
    assert again["coefs"] == without["coefs"] and "skl2onnx" not in again["modules"]


@pytest.mark.slow
def test_a_truncated_entry_is_rebuilt_with_a_logged_warning(tmp_path, caplog):
    cache = tmp_path / "cache"
    built = _fit_in_process(cache)
    for path in cache.iterdir():
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    key = _entries(cache)[0][: -len(artifacts.SUFFIX)]
    with caplog.at_level(logging.WARNING, logger="onnxgrad_sklearn"):
        assert artifacts._read(cache / (key + artifacts.SUFFIX), key) is None
    assert "corrupt" in caplog.text and "built again" in caplog.text
    assert not (cache / (key + artifacts.SUFFIX)).exists()
    rebuilt = _fit_in_process(cache)  # the other entry is truncated too: rebuilt
    assert rebuilt["coefs"] == built["coefs"]
    assert "skl2onnx" in rebuilt["modules"]
    for path in cache.iterdir():
        assert artifacts._read(path, path.name[: -len(artifacts.SUFFIX)]) is not None


@pytest.mark.slow
def test_an_empty_cache_variable_writes_nothing_anywhere(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    xdg = tmp_path / "xdg"
    _fit_in_process("", HOME=str(home), XDG_CACHE_HOME=str(xdg))
    # (onnxruntime >= 1.2x keeps a device id of its own under XDG_CACHE_HOME)
    written = [p.name for p in tmp_path.rglob("*")]
    assert not [n for n in written if n.endswith(artifacts.SUFFIX) or "onnxgrad" in n], written
    # without the variable: the platform's folder (XDG_CACHE_HOME on Linux)
    if sys.platform.startswith("linux"):
        _fit_in_process(None, HOME=str(home), XDG_CACHE_HOME=str(xdg))
        assert _entries(xdg / "onnxgrad_sklearn")


def test_the_environment_wins_over_set_config(tmp_path, monkeypatch):
    monkeypatch.setenv(artifacts.CACHE_ENV, str(tmp_path / "env"))
    with config_context(cache_dir=str(tmp_path / "config")):
        assert artifacts.cache_dir() == tmp_path / "env"
        monkeypatch.delenv(artifacts.CACHE_ENV)
        assert artifacts.cache_dir() == tmp_path / "config"
        set_config(cache_dir="")
        assert artifacts.cache_dir() is None
        set_config(cache_dir="default")
        assert artifacts.cache_dir() == artifacts.default_cache_dir()
    assert get_config()["cache_dir"] == "default"
    with pytest.raises(ValueError, match="cache_dir"):
        set_config(cache_dir=3)
    with pytest.raises(ValueError, match="cache_max_bytes"):
        set_config(cache_max_bytes=-1)


def test_keys_change_with_versions_code_and_structure(monkeypatch):
    key = artifacts.make_key("converted", ("MLP", (6,), 4))
    assert key == artifacts.make_key("converted", ("MLP", (6,), 4))
    assert key != artifacts.make_key("converted", ("MLP", (7,), 4))
    assert key != artifacts.make_key("step", ("MLP", (6,), 4))
    versions = dict(artifacts._versions())
    versions["skl2onnx"] = "0.0.0"  # another release of a package that makes artifacts
    monkeypatch.setattr(artifacts, "_versions", lambda: tuple(versions.items()))
    assert artifacts.make_key("converted", ("MLP", (6,), 4)) != key
    monkeypatch.undo()
    monkeypatch.setattr(artifacts, "code_digest", lambda: "edited")
    assert artifacts.make_key("converted", ("MLP", (6,), 4)) != key


def test_the_size_bound_evicts_the_least_recently_used(tmp_path, monkeypatch):
    monkeypatch.setenv(artifacts.CACHE_ENV, str(tmp_path))
    blob = b"x" * 1000
    with config_context(cache_max_bytes=4000):  # three entries of about 1.2 kB
        for k in range(3):
            artifacts.put(f"test-{k}", artifacts.Artifact({"a": blob}))
            os.utime(tmp_path / f"test-{k}{artifacts.SUFFIX}", (k, k))
        artifacts.clear_memory()
        assert artifacts.get("test-0") is not None  # read: now the most recent
        artifacts.put("test-3", artifacts.Artifact({"a": blob}))
        names = _entries(tmp_path)
    sizes = sum((tmp_path / n).stat().st_size for n in names)
    assert sizes <= 4000 and len(names) == 3
    assert "test-1.artifact" not in names  # the least recently used went first
    assert "test-0.artifact" in names and "test-3.artifact" in names


def test_an_unwritable_folder_warns_once_and_trains(tmp_path, monkeypatch):
    from sklearn.neural_network import MLPRegressor

    from onnxgrad_sklearn import OrtGradientRegressor

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(artifacts.CACHE_ENV, str(blocker / "cache"))
    monkeypatch.setattr(artifacts, "_unwritable", set())
    artifacts.clear_memory()
    rng = np.random.RandomState(0)
    X, y = rng.rand(40, 3), rng.rand(40)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for hidden in (5, 7):  # two structures: two artifacts that cannot be written
            reg = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(hidden,)), max_iter=2)
            reg.set_params(backend="standard").fit(X, y)
            assert np.all(np.isfinite(reg.predict(X)))
    found = [w for w in caught if "cannot be written" in str(w.message)]
    assert len(found) == 1, [str(w.message) for w in caught]
    assert artifacts.CACHE_ENV in str(found[0].message)


def test_a_json_and_onnx_entry_never_pickles(tmp_path):
    cache = tmp_path / "cache"
    _fit_in_process(cache)
    for path in cache.iterdir():
        data = path.read_bytes()
        assert data.startswith(artifacts.MAGIC)
        header = json.loads(data[len(artifacts.MAGIC) : data.index(b"\n", len(artifacts.MAGIC))])
        assert all(part["name"].endswith(".onnx") for part in header["parts"])
        import onnx

        offset = data.index(b"\n", len(artifacts.MAGIC)) + 1
        for part in header["parts"]:  # every blob is an ONNX model
            onnx.load_from_string(data[offset : offset + part["size"]])
            offset += part["size"]


# a binary linear classifier: skl2onnx keeps its weights in node attributes, so that its
# export cannot be given the trained weights as initializers; it is made when asked for
FIT_BINARY = """
import json, pickle, sys, warnings
import numpy as np
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import scale
from sklearn.svm import LinearSVC
from onnxgrad_sklearn import OrtGradientClassifier
warnings.simplefilter("ignore")
X, y = load_breast_cancer(return_X_y=True)
X = scale(X)
out, fitted = {{}}, {{}}
for template in (LogisticRegression(), LinearSVC()):
    clf = OrtGradientClassifier(template, backend={backend!r}).fit(X, y)
    name = type(template).__name__
    fitted[name] = clf
    out[name] = {{
        "coef": clf.estimator_.coef_.ravel().tolist(),
        "decision": clf.decision_function(X).tolist(),
        "pred": clf.predict(X).tolist(),
        "proba": clf.predict_proba(X).tolist() if name == "LogisticRegression" else None,
    }}
out["modules"] = sorted(m for m in ("onnx", "skl2onnx", "onnx_ad") if m in sys.modules)
import onnxruntime
for name, clf in fitted.items():
    copy = pickle.loads(pickle.dumps(clf))  # the deferred export pickles as such
    model = copy.to_onnx()  # made now, with skl2onnx
    session = onnxruntime.InferenceSession(model.SerializeToString())
    label = session.run(None, {{session.get_inputs()[0].name: X.astype(np.float32)}})[0]
    out["onnx_pred_" + name] = label.tolist()
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_binary_linear_classifier_fits_and_predicts_without_skl2onnx(tmp_path, backend):
    def run(cache):
        out = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(FIT_BINARY.format(backend=backend))],
            capture_output=True,
            text=True,
            env=_env(cache),
            check=False,
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    cache = tmp_path / "cache"
    built, loaded = run(cache), run(cache)
    assert "skl2onnx" in built["modules"]
    # from the disk: the fits and their predictions import none of them (the exports,
    # made by to_onnx after the modules were listed, do)
    assert loaded["modules"] == []
    assert any(n.startswith("converted-") for n in _entries(cache))
    for name in ("LogisticRegression", "LinearSVC"):
        assert loaded[name] == built[name]  # bit for bit
        # the export made later predicts what the estimator predicts
        assert loaded["onnx_pred_" + name] == loaded[name]["pred"]
