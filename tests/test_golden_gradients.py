"""Golden gradients: the standard backend reproduces the TrainingAgent's, tensor by tensor.

``tests/data/golden_gradients.npz`` (made by ``tests/data/make_golden_gradients.py``
with onnxruntime-training 1.19.2 on Python 3.11) holds, for every template kind x
loss, a training graph, one batch, and the loss and gradients the TrainingAgent
gave. The standard backend (onnx-ad's gradient graph and the package's passes,
on whatever onnxruntime is installed) must give each gradient within
``1e-6 * max|reference|`` (two measured exceptions in ``TOLERANCE``), and
within 1e-5 of the float64 gradient also stored, which is checked against central finite
differences: a change in onnx-ad or in the passes shows here.
"""

import os

import numpy as np
import onnx
import pytest
from _golden import float64_loss
from onnx import numpy_helper

from onnxgrad_sklearn.backends import build_plan
from onnxgrad_sklearn.backends.standard import StandardBackend
from onnxgrad_sklearn.optim import SGD

PATH = os.path.join(os.path.dirname(__file__), "data", "golden_gradients.npz")
GOLDEN = np.load(PATH)
CASES = sorted({key.split("/")[0] for key in GOLDEN.files})


def _case(name):
    model = onnx.load_from_string(GOLDEN[f"{name}/model"].tobytes())
    names = [str(n) for n in GOLDEN[f"{name}/weight_names"]]
    grads = [GOLDEN[f"{name}/grad_{i}"] for i in range(len(names))]
    batch = GOLDEN[f"{name}/X"], GOLDEN[f"{name}/y"], GOLDEN[f"{name}/sw"]
    return model, names, batch, float(GOLDEN[f"{name}/loss"]), grads


def _standard(model, names):
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    start = [inits[n] for n in names]
    shapes = [w.shape for w in start]
    plan = build_plan("standard", model, None, names, shapes, SGD(), "cpu")
    return StandardBackend(
        plan=plan, output_name=None, weight_names=names, start=start, optimizer=SGD()
    )


def test_every_kind_of_template_and_loss_has_a_golden_case():
    assert len(CASES) == 18
    for activation in ("relu", "tanh", "logistic"):
        for loss in ("squared", "huber", "absolute", "quantile"):
            assert f"mlp_{activation}_{loss}" in CASES
    for name in ("linear_elastic_net", "scaler_mlp", "mlp_classifier_2", "mlp_classifier_3"):
        assert name in CASES


#: Tensor-wise tolerance against the TrainingAgent: 1e-6, except two logistic MLPs
#: whose output-layer gradients are sums of 64 terms that mostly cancel (|sum| about
#: 1% of sum |terms|): the two backends multiply in different orders, and both are
#: within 2.5e-6 of the float64 gradient (agent 2e-7 to 1.2e-6, standard up to 2.4e-6).
TOLERANCE = {"mlp_logistic_absolute": 3e-6, "mlp_logistic_huber": 3e-6}


@pytest.mark.parametrize("name", CASES)
def test_standard_backend_reproduces_the_agent_gradients(name):
    model, names, batch, loss, expected = _case(name)
    exact = [GOLDEN[f"{name}/grad64_{i}"] for i in range(len(names))]
    got_loss, grads = _standard(model, names).loss_and_gradients(*batch)
    assert got_loss == pytest.approx(loss, rel=1e-6)
    assert len(grads) == len(expected)
    for weight, got, ref, ref64 in zip(names, grads, expected, exact):
        assert got.shape == ref.shape, weight
        assert np.abs(ref).max() > 0, weight  # a tensor that says something
        bound = TOLERANCE.get(name, 1e-6) * np.abs(ref).max()
        assert np.abs(got - ref).max() <= bound, (weight, np.abs(got - ref).max(), bound)
        # and within float32 rounding of the exact gradient
        assert np.abs(got - ref64).max() <= 1e-5 * np.abs(ref64).max(), weight


@pytest.mark.parametrize("name", CASES)
def test_fused_step_applies_the_golden_gradients(name):
    # One SGD step of the fused graph moves each weight by -lr * the gradient.
    model, names, batch, loss, expected = _case(name)
    backend = _standard(model, names)
    before = backend.get_weights()
    assert backend.train_batch(*batch, 0.5) == pytest.approx(loss, rel=1e-6)
    for w0, w1, ref in zip(before, backend.get_weights(), expected):
        step = (w0.astype(np.float64) - w1) / 0.5
        # float32 rounding of w - lr * g, relative to the weights
        atol = 1e-6 * np.abs(ref).max() + 4e-7 * np.abs(w0).max() / 0.5
        np.testing.assert_allclose(step, ref, rtol=1e-5, atol=atol)


@pytest.mark.parametrize("name", CASES)
def test_float64_references_match_central_differences(name):
    model, names, batch, _, _ = _case(name)
    exact = [GOLDEN[f"{name}/grad64_{i}"] for i in range(len(names))]
    loss = float64_loss(model, names, batch)
    inits = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}
    weights = [inits[n] for n in names]
    rng = np.random.RandomState(0)
    h = 1e-6
    for k, ref in enumerate(exact):
        for j in rng.choice(ref.size, size=min(4, ref.size), replace=False):
            up = [w.copy() for w in weights]
            down = [w.copy() for w in weights]
            up[k].ravel()[j] += h
            down[k].ravel()[j] -= h
            numeric = (loss(up) - loss(down)) / (2 * h)
            # kinks (relu, abs, quantile) are met with probability ~0 at random weights
            assert numeric == pytest.approx(ref.ravel()[j], rel=1e-5, abs=1e-8), names[k]
