"""What ``import onnxgrad_sklearn`` loads: onnx, skl2onnx and onnxruntime come on first use."""

import json
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from sklearn.neural_network import MLPRegressor

from onnxgrad_sklearn import OrtGradientRegressor

HEAVY = ("onnx", "skl2onnx", "onnxruntime", "onnx_ad", "torch")


def _run(code: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_loads_no_onnx_module_and_a_fit_then_loads_them():
    result = _run(
        f"""
        import json, os, sys, warnings
        os.environ["ONNXGRAD_SKLEARN_CACHE_DIR"] = ""  # nothing cached: skl2onnx converts
        import numpy as np
        import onnxgrad_sklearn
        from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor
        from sklearn.base import clone
        from sklearn.utils import get_tags

        heavy = {HEAVY!r}
        reg = OrtGradientRegressor(max_iter=2, random_state=0)
        # what needs no runtime: parameters, tags, clone, the skops trusted types
        clone(reg).get_params(), get_tags(reg), get_tags(OrtGradientClassifier())
        trusted = len(onnxgrad_sklearn.SKOPS_TRUSTED_TYPES)
        after_import = [m for m in heavy if m in sys.modules]
        X = np.random.RandomState(0).rand(40, 3).astype(np.float32)
        y = X @ np.array([1.0, -2.0, 0.5], dtype=np.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pred = reg.fit(X, y).predict(X[:2])
        after_fit = [m for m in ("onnx", "skl2onnx", "onnxruntime") if m in sys.modules]
        print(json.dumps({{"after_import": after_import, "after_fit": after_fit,
                           "trusted": trusted, "pred": pred.tolist()}}))
        """
    )
    assert result["after_import"] == []
    assert result["after_fit"] == ["onnx", "skl2onnx", "onnxruntime"]
    assert result["trusted"] > 10
    assert np.all(np.isfinite(result["pred"])) and len(result["pred"]) == 2


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_unpickling_in_a_fresh_process_imports_the_runtime_and_predicts(tmp_path):
    rng = np.random.RandomState(0)
    X = rng.rand(60, 3).astype(np.float32)
    y = X.sum(axis=1)
    reg = OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(5,)), max_iter=3, random_state=0
    ).fit(X, y)
    path = tmp_path / "reg.pkl"
    path.write_bytes(pickle.dumps(reg))
    np.save(tmp_path / "X.npy", X[:4])
    result = _run(
        f"""
        import json, pickle, sys
        import numpy as np
        import onnxgrad_sklearn
        before = "onnxruntime" in sys.modules
        reg = pickle.loads(open({str(path)!r}, "rb").read())
        pred = reg.predict(np.load({str(tmp_path / "X.npy")!r}))
        print(json.dumps({{"before": before, "pred": pred.tolist()}}))
        """
    )
    assert result["before"] is False
    np.testing.assert_allclose(result["pred"], reg.predict(X[:4]), rtol=1e-6)


def test_lazy_stand_in_imports_on_first_attribute():
    from onnxgrad_sklearn._lazy import lazy

    math_stand_in = lazy("math")
    assert "not imported yet" in repr(math_stand_in)
    assert math_stand_in.sqrt(9.0) == 3.0
    fraction = lazy("fractions", "Fraction")
    assert fraction(1, 2) + fraction(1, 2) == 1
    assert isinstance(fraction(3, 4), fraction)
    assert not isinstance(0.75, fraction)
