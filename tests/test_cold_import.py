"""A fit imports onnxruntime without ``onnxruntime.training``, ``onnxruntime.tools`` or torch.

The training build's ``import onnxruntime`` imports ``onnxruntime.training`` (and torch
where it is installed) for a build check; ``runtime.bindings()`` leaves that out and
computes the check's results when they are first read. Each test runs fresh processes.
"""

import functools
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

BACKENDS = [
    pytest.param(
        "agent",
        marks=pytest.mark.skipif(
            sys.version_info >= (3, 13), reason="no onnxruntime-training build for Python >= 3.13"
        ),
    ),
    "standard",
]

#: Installed before anything is imported: ``onnxruntime.training`` cannot be imported.
BLOCK_TRAINING = """
import importlib.abc, sys

class _BlockTraining(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "onnxruntime.training" or name.startswith("onnxruntime.training."):
            raise ImportError(f"{name} is blocked by the test")
        return None

sys.meta_path.insert(0, _BlockTraining())
"""

#: What onnxruntime reports about itself, as a JSON-able dict (``onnxruntime`` imported).
REPORT = """
def _report():
    import onnxruntime
    from onnxruntime.capi import onnxruntime_validation as validation

    names = ("has_ortmodule", "package_name", "version", "cuda_version")
    return {
        "version": onnxruntime.__version__,
        "providers": onnxruntime.get_available_providers(),
        "device": onnxruntime.get_device(),
        "validation": {n: getattr(validation, n) for n in names if hasattr(validation, n)},
        "package": {n: getattr(onnxruntime, n) for n in names[1:] if hasattr(onnxruntime, n)},
    }

def _heavy():
    return sorted(
        m for m in sys.modules
        if m.startswith(("torch", "onnxruntime.training", "onnxruntime.tools"))
    )
"""


def _run(code: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@functools.cache
def _plain_import() -> dict:
    """What a plain ``import onnxruntime`` reports in a fresh process."""
    return _run(
        "import json, sys\n"
        + REPORT
        + "import onnxruntime\nprint(json.dumps({'report': _report(), 'heavy': _heavy()}))\n"
    )


@functools.cache
def _fit(backend: str, blocked: bool) -> dict:
    """A small fit and its predictions in a fresh process (``onnxruntime.training`` blocked)."""
    return _run(
        (BLOCK_TRAINING if blocked else "")
        + "import json, sys, warnings\n"
        + REPORT
        + f"""
import numpy as np
from sklearn.neural_network import MLPRegressor
from onnxgrad_sklearn import OrtGradientRegressor

rng = np.random.RandomState(0)
X = rng.rand(60, 3).astype(np.float32)
y = X @ np.array([1.0, -2.0, 0.5], dtype=np.float32) + 0.1 * rng.rand(60).astype(np.float32)
reg = OrtGradientRegressor(
    MLPRegressor(hidden_layer_sizes=(5,)), max_iter=3, random_state=0, backend={backend!r}
)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pred = reg.fit(X, y).predict(X)
heavy = _heavy()  # before the report: reading the build info may import them
import onnxruntime
result = {{
    "pred": pred.tolist(),
    "dtype": str(pred.dtype),
    "heavy": heavy,
    "version": onnxruntime.__version__,
    "providers": onnxruntime.get_available_providers(),
    "device": onnxruntime.get_device(),
    "training_in_sys_modules": "onnxruntime.training" in sys.modules,
}}
print(json.dumps(result))
"""
    )


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fit_imports_neither_onnxruntime_training_nor_torch(backend):
    result = _fit(backend, blocked=False)
    assert result["heavy"] == []
    assert result["training_in_sys_modules"] is False
    assert np.all(np.isfinite(result["pred"])) and len(result["pred"]) == 60
    plain = _plain_import()["report"]
    assert result["version"] == plain["version"]
    assert result["providers"] == plain["providers"]
    assert result["device"] == plain["device"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fit_with_onnxruntime_training_blocked_predicts_bit_for_bit_the_same(backend):
    blocked = _fit(backend, blocked=True)
    normal = _fit(backend, blocked=False)
    assert blocked["heavy"] == [] and blocked["training_in_sys_modules"] is False
    assert blocked["dtype"] == normal["dtype"]
    # JSON writes floats with repr, which reads back exactly
    pred_blocked = np.asarray(blocked["pred"], dtype=blocked["dtype"])
    pred_normal = np.asarray(normal["pred"], dtype=normal["dtype"])
    assert np.array_equal(pred_blocked, pred_normal)
    assert blocked["version"] == normal["version"]


def test_build_info_reads_as_a_plain_import_reports():
    # The build check's results (onnxruntime_validation.has_ortmodule, package_name,
    # version, cuda_version, and their copies in onnxruntime) are computed when read.
    result = _run(
        "import json, sys\n"
        + REPORT
        + """
from onnxgrad_sklearn.runtime import bindings
bindings()
heavy = _heavy()
print(json.dumps({"report": _report(), "heavy": heavy}))
"""
    )
    plain = _plain_import()
    assert result["heavy"] == []
    assert result["report"] == plain["report"]
    if sys.version_info < (3, 13):  # the training build: the check exists and was deferred
        assert set(plain["report"]["validation"]) == {
            "has_ortmodule",
            "package_name",
            "version",
            "cuda_version",
        }


#: ``import onnxruntime.training`` by the user: its outcome, as a JSON-able dict.
USER_IMPORT = """
try:
    import onnxruntime.training as training
except Exception as exc:  # what a plain process gets too, e.g. no torch
    outcome = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
else:
    outcome = {"ok": True, "ortmodule": hasattr(training, "ORTModule"),
               "file": training.__file__}
print(json.dumps(outcome))
"""


@functools.cache
def _user_import(after_bindings: bool) -> dict:
    # onnxruntime imported by the package (bindings) or by a plain import
    package = "from onnxgrad_sklearn.runtime import bindings\nbindings()\n"
    plain = "import onnxruntime\n"
    return _run("import json\n" + (package if after_bindings else plain) + USER_IMPORT)


@pytest.mark.slow
def test_user_import_of_onnxruntime_training_still_works():
    plain = _user_import(after_bindings=False)
    if not plain["ok"]:
        pytest.skip(f"import onnxruntime.training fails in a plain process: {plain['error']}")
    assert _user_import(after_bindings=True) == plain


def test_user_import_of_onnxruntime_training_fails_as_in_a_plain_process():
    plain = _user_import(after_bindings=False)
    if plain["ok"]:
        pytest.skip("import onnxruntime.training works here")
    assert _user_import(after_bindings=True) == plain
