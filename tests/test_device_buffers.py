"""The CUDA code path of the standard backend, run on the CPU.

On CUDA the standard backend keeps the weights and the optimizer state in
runtime memory on the device (``backends.buffers.DeviceBuffers``), binds each weight by
address (the vector's ``data_ptr()`` plus an offset) and binds everything a step
reads anew at every call. ``standard.DEVICE_BUFFERS_ON_CPU`` runs that very code
on CPU memory: these tests check it against the CPU path (numpy buffers), and the
provider options every CUDA session would get, without a GPU.
"""

import pickle
import warnings

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier, MLPRegressor

from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor, config_context, runtime
from onnxgrad_sklearn import backends as backends_module
from onnxgrad_sklearn.backends import base as backends_base
from onnxgrad_sklearn.backends import standard
from onnxgrad_sklearn.backends.buffers import ALIGNMENT, DeviceBuffers, DoubleBuffers
from onnxgrad_sklearn.optim import Nesterov
from onnxgrad_sklearn.runtime import bindings, ort_device, session_providers

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


class _PerTensorNesterov(Nesterov):
    elementwise = False


def _data(n=150, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.randn(n, 5)
    return X, X[:, 0] - X[:, 1] ** 2 + 0.1 * rng.randn(n)


def _fit(monkeypatch, device_buffers, make, X, y):
    monkeypatch.setattr(standard, "DEVICE_BUFFERS_ON_CPU", device_buffers)
    est = make().fit(X, y)
    assert est.backend_ == "standard"
    assert est._engine._backend.device_buffers is device_buffers
    return est


def _assert_same(a, b):
    """The same fit within 1e-7 relative, mostly bit for bit.

    Not always bit for bit: onnxruntime's float32 Sqrt on the CPU rounds a value
    differently in its vectorized loop and in its scalar tail (measured: 1 ulp),
    and an aligned weight sits elsewhere in the vector than in numpy's buffers.
    """
    np.testing.assert_allclose(a.loss_curve_, b.loss_curve_, rtol=1e-7, atol=0)
    wa, wb = a._engine.get_weights(), b._engine.get_weights()
    for x, z in zip(wa, wb):
        np.testing.assert_allclose(x, z, rtol=1e-7, atol=0)
    sa, sb = a._engine.get_state(), b._engine.get_state()
    assert sa["step"] == sb["step"]
    for x, z in zip(sa["state"], sb["state"]):
        for u, v in zip(x, z):
            np.testing.assert_allclose(u, v, rtol=1e-7, atol=0)


# the buffers -----------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_device_buffers_align_each_weight_and_copy_through_the_host(dtype):
    shapes = [(5, 3), (3,), (3, 1), (1,)]
    b = DeviceBuffers(shapes, n_state=2, n_sets=3, dtype=dtype)
    step = ALIGNMENT // np.dtype(dtype).itemsize
    assert all(o % step == 0 for o in b.offsets)
    assert [o + n + p for o, n, p in zip(b.offsets, b.sizes, b.pads)] == [
        *b.offsets[1:],
        b.size,
    ]
    for vectors in b.vectors:
        for v in vectors:
            # onnxruntime's CPU allocator aligns to 64 bytes (cudaMalloc to 256)
            assert v.shape() == [b.size] and v.data_ptr() % 64 == 0
            np.testing.assert_array_equal(v.numpy(), 0)  # padding included
    rng = np.random.RandomState(0)
    arrays = [rng.randn(*s).astype(dtype) for s in shapes]
    b.write(0, arrays)
    b.write(2, arrays[2:], start=2)
    for got, want in zip(b.read(0), arrays):
        assert got.dtype == dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert all(not r.any() for r in b.read(2)[:2])
    np.testing.assert_array_equal(b.read(2)[3], arrays[3])
    saved = b.copy()
    b.write(0, [np.zeros(s, dtype) for s in shapes])
    b.current = 1
    b.load(saved)  # into another set
    for got, want in zip(b.read(0), arrays):
        np.testing.assert_array_equal(got, want)
    assert not any(r.any() for r in b.read(0, parity=0))
    # reading gives copies: the buffers do not change with them
    b.read(0)[0][...] = 7
    np.testing.assert_array_equal(b.read(0)[0], arrays[0])


def test_a_view_bound_by_address_is_read_and_written_in_place():
    """bind_input/bind_output with (OrtDevice, element type, shape, data_ptr + offset)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 1])
    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "neg", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    b = DeviceBuffers([(5, 3), (3, 1), (2,)], n_state=0, n_sets=2)
    b.write(0, [np.ones((5, 3)), [[1.0], [2.0], [3.0]], [4.0, 5.0]])
    binding = bindings().SessionIOBinding(session._sess)
    b.bind(binding, "x", 0, 0, 1)
    b.bind(binding, "y", 1, 0, 1, output=True)
    session._sess.run_with_iobinding(binding, onnxruntime.RunOptions())
    b.current = 1
    written = b.read(0)
    np.testing.assert_array_equal(written[1], [[-1.0], [-2.0], [-3.0]])
    assert not written[0].any() and not written[2].any()  # its neighbours untouched
    assert not b.host(0)[b.offsets[1] + 3 :].any()  # nor the padding


def test_both_buffer_kinds_have_the_same_interface():
    shapes = [(2, 3), (3,)]
    kinds = [DoubleBuffers(shapes, 1, n_sets=3), DeviceBuffers(shapes, 1, n_sets=3)]
    values = [np.arange(6.0).reshape(2, 3), np.array([1.0, 2.0, 3.0])]
    for b in kinds:
        b.write(0, values)
        b.write(1, [v * 2 for v in values])
        assert len(b.pads) == len(shapes)
    for k in (0, 1):
        for x, z in zip(kinds[0].read(k), kinds[1].read(k)):
            np.testing.assert_array_equal(x, z)


# fits through the device code -------------------------------------------------
@pytest.mark.parametrize("optimizer", ["adam", "nesterov", "sgd", _PerTensorNesterov(0.9)])
def test_a_cpu_fit_through_the_device_buffers_gives_the_same_weights(monkeypatch, optimizer):
    X, y = _data()

    def make():
        return OrtGradientRegressor(
            MLPRegressor(hidden_layer_sizes=(13, 5)),
            optimizer=optimizer,
            max_iter=4,
            batch_size=32,  # 150 rows: a last batch of 22, a second step graph
            random_state=0,
            backend="standard",
        )

    a = _fit(monkeypatch, False, make, X, y)
    b = _fit(monkeypatch, True, make, X, y)
    _assert_same(a, b)
    np.testing.assert_allclose(a.predict(X), b.predict(X), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(a._engine.predict(X), b._engine.predict(X), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "model, classes",
    [(MLPClassifier(hidden_layer_sizes=(7,)), 3), (LogisticRegression(), 2)],
)
def test_classifiers_and_float64_through_the_device_buffers(monkeypatch, model, classes, dtype):
    X, y = _data()
    labels = np.digitize(y, np.quantile(y, np.linspace(0, 1, classes + 1)[1:-1]))

    def make():
        return OrtGradientClassifier(
            model,
            optimizer="adam",
            max_iter=3,
            batch_size=40,
            random_state=0,
            backend="standard",
            dtype=dtype,
        )

    a = _fit(monkeypatch, False, make, X, labels)
    b = _fit(monkeypatch, True, make, X, labels)
    _assert_same(a, b)
    np.testing.assert_allclose(a.predict_proba(X), b.predict_proba(X), rtol=1e-6, atol=1e-9)


def _engines(monkeypatch, optimizer):
    X, y = _data(96)
    engines = []
    for flag in (False, True):
        est = _fit(
            monkeypatch,
            flag,
            lambda: OrtGradientRegressor(
                MLPRegressor(hidden_layer_sizes=(6,)),
                optimizer=optimizer,
                max_iter=1,
                batch_size=16,
                random_state=0,
                backend="standard",
            ),
            X,
            y,
        )
        engines.append(est._engine)
    X = X.astype(np.float32)
    y2d = y.reshape(-1, 1).astype(np.float32)
    sw = np.linspace(0.5, 1.5, len(X)).astype(np.float32)
    return engines, [(X[i : i + 32], y2d[i : i + 32], sw[i : i + 32]) for i in (0, 32, 64)]


@pytest.mark.parametrize("optimizer", [Nesterov(0.9), "adam", _PerTensorNesterov(0.9)])
def test_every_backend_method_agrees_with_the_cpu_path(monkeypatch, optimizer):
    (cpu, dev), batches = _engines(monkeypatch, optimizer)

    def same(f):
        a, b = f(cpu), f(dev)  # within 1e-7 relative: see _assert_same
        if isinstance(a, float):
            assert a == pytest.approx(b, rel=1e-7)
            return
        assert len(a) == len(b)
        for x, z in zip(a, b):
            np.testing.assert_allclose(x, z, rtol=1e-7, atol=1e-12)

    def both(method, *args):
        return getattr(cpu, method)(*args), getattr(dev, method)(*args)

    same(lambda e: e.get_weights())
    for batch in batches:
        la, lb = both("train_batch", *batch, 0.01)
        assert la == pytest.approx(lb, rel=1e-7)
    same(lambda e: e.get_weights())
    same(lambda e: [s for st in e.get_state()["state"] for s in st])
    same(lambda e: e.loss(*batches[1]))
    same(lambda e: e.loss_and_gradients(*batches[2])[1])
    la, lb = both("loss_and_gradients", *batches[2])
    assert la[0] == pytest.approx(lb[0], rel=1e-7)
    same(lambda e: e.predict(batches[0][0]))
    # undo, checkpoint and restore, set_weights, a non-finite batch
    weights = dev.get_weights()
    both("train_batch", *batches[0], 0.02)
    both("undo_last_step")
    same(lambda e: e.get_weights())
    for x, z in zip(weights, dev.get_weights()):
        np.testing.assert_array_equal(x, z)
    saved = both("checkpoint")
    for batch in batches * 2:
        both("train_batch", *batch, 0.01)
    cpu.restore(saved[0])
    dev.restore(saved[1])
    same(lambda e: e.get_weights())
    same(lambda e: [s for st in e.get_state()["state"] for s in st])
    new = [w * 0.5 for w in weights]
    both("set_weights", new)
    same(lambda e: e.get_weights())
    both("train_batch", *batches[1], 0.01)  # reads the weights just set
    same(lambda e: e.get_weights())
    X, y, sw = batches[0]
    bad = X.copy()
    bad[0, 0] = np.nan
    before = dev.get_weights()
    assert not np.isfinite(dev.train_batch(bad, y, sw, 0.01))
    for x, z in zip(before, dev.get_weights()):
        np.testing.assert_array_equal(x, z)
    assert not dev.is_finite(bad, y, sw) and dev.is_finite(X, y, sw)
    # the state moves between engines of either kind (pickling)
    state = pickle.loads(pickle.dumps(dev.get_state()))
    cpu.set_state(state)
    same(lambda e: [s for st in e.get_state()["state"] for s in st])
    dev.reset_optimizer()
    assert dev.step == 0 and not any(s.any() for st in dev.get_state()["state"] for s in st)
    # OrtValue views of the weights (copies on the device path)
    for x, z in zip(cpu._backend.weights, dev._backend.weights):
        np.testing.assert_array_equal(x.numpy(), z.numpy())


def test_the_padding_is_covered_by_the_flat_update_graph(monkeypatch):
    (_, dev), batches = _engines(monkeypatch, "adam")
    backend = dev._backend
    assert any(backend._buffers.pads)
    for batch in batches:
        dev.train_batch(*batch, 0.01)
    b = backend._buffers
    for k in range(1 + b.n_state):
        vector = b.host(k)
        for o, n, p in zip(b.offsets, b.sizes, b.pads):
            assert not vector[o + n : o + n + p].any()
    graph, flat = standard.step_graph(
        backend.training_model,
        backend.weight_names,
        backend.shapes,
        backend.optimizer,
        32,
        1,
        pads=b.pads,
    )
    assert flat
    sizes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.graph.input}
    assert sizes[standard.UPDATE + "param"] == [b.size]
    onnx.checker.check_model(graph)


# provider options, as CUDA would get them ---------------------------------------
def test_session_providers_for_cuda_devices():
    assert session_providers("cpu") == (["CPUExecutionProvider"], [{}])
    providers, options = session_providers("cuda:1")
    assert providers == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert options == [{"device_id": "1", "use_tf32": "0"}, {}]
    assert session_providers("CUDA:1", allow_tf32=True)[1][0] == {"device_id": "1", "use_tf32": "1"}
    assert session_providers("cuda")[1][0]["device_id"] == "0"
    with config_context(allow_tf32=True):
        assert session_providers("cuda:1")[1][0]["use_tf32"] == "1"
        assert session_providers("cuda:1", allow_tf32=False)[1][0]["use_tf32"] == "0"
    assert session_providers("cuda:1")[1][0]["use_tf32"] == "0"
    with pytest.raises(ValueError, match="device='cuda:x' is not valid"):
        session_providers("cuda:x")


def test_ort_device_of_cuda_is_made_as_onnxruntime_makes_it():
    device = ort_device("CUDAExecutionProvider", 1)
    expected = onnxruntime.OrtDevice.make("cuda", 1)._get_c_device()
    assert (device.device_type(), device.device_id()) == (expected.device_type(), 1)
    assert device.device_type() == bindings().OrtDevice.cuda()
    cpu = ort_device("CPUExecutionProvider", 3)
    assert (cpu.device_type(), cpu.device_id()) == (bindings().OrtDevice.cpu(), 0)


@pytest.fixture
def simulated_cuda(monkeypatch):
    """``device="cuda:1"`` as far as the package can tell, on CPU memory and CPU sessions.

    The runtime reports a CUDA provider and no training bindings (as
    onnxruntime-gpu would), the standard backend's buffers are CPU
    runtime memory, and every session it makes is recorded (providers and their
    options) then created on the CPU.
    """
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("a CUDA build is installed: tests/test_gpu.py runs the real thing")
    available = onnxruntime.get_available_providers()
    monkeypatch.setattr(
        onnxruntime, "get_available_providers", lambda: ["CUDAExecutionProvider", *available]
    )
    monkeypatch.setattr(backends_module, "agent_available", lambda: False)  # onnxruntime-gpu
    real_buffers, real_session = standard.DeviceBuffers, backends_base.make_session
    made = []

    def buffers(*args, device, **kwargs):
        assert device == "cuda:1"
        return real_buffers(*args, device="cpu", **kwargs)

    def session(model, options, providers, provider_options=None, **kwargs):
        made.append((list(providers), provider_options))
        return real_session(model, options, ["CPUExecutionProvider"], [{}], **kwargs)

    monkeypatch.setattr(standard, "DeviceBuffers", buffers)
    monkeypatch.setattr(backends_base, "make_session", session)  # shared_session calls it
    runtime.SESSIONS.clear()  # none made by an earlier test: each is recorded
    return made


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider'")
@pytest.mark.parametrize("allow_tf32", [False, True])
def test_every_standard_session_on_cuda_gets_the_device_and_use_tf32(simulated_cuda, allow_tf32):
    X, y = _data()
    est = OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(6,)),
        max_iter=3,
        batch_size=32,
        random_state=0,
        device="cuda:1",
        early_stopping=True,  # predicts with the backend's session during the fit
    )
    with config_context(allow_tf32=allow_tf32):
        est.fit(X, y)
    assert est.backend_ == "standard"  # auto: no TrainingAgent on CUDA here
    backend = est._engine._backend
    assert backend.device_buffers
    backend.loss(X[:8], y[:8], None)
    backend.loss_and_gradients(X[:8], y[:8], None)  # after the context: read at fit time
    expected = (
        ["CUDAExecutionProvider", "CPUExecutionProvider"],
        [{"device_id": "1", "use_tf32": "1" if allow_tf32 else "0"}, {}],
    )
    assert len(simulated_cuda) >= 4  # the step (short batches padded), predict, loss, gradients
    assert all(made == expected for made in simulated_cuda)


def test_a_model_fitted_on_cuda_by_the_standard_backend_predicts_on_the_cpu(
    simulated_cuda, monkeypatch
):
    X, y = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("ignore", UserWarning)  # onnxruntime: no CUDA provider here
        est = OrtGradientRegressor(max_iter=2, random_state=0, device="cuda:1").fit(X, y)
    expected = est._engine.predict(X)
    data = pickle.dumps(est)
    monkeypatch.undo()  # a machine without a GPU
    with pytest.warns(UserWarning, match=r"fitted with device='cuda:1'.*predicts on the CPU"):
        loaded = pickle.loads(data)
    np.testing.assert_allclose(loaded.predict(X), expected.ravel(), rtol=1e-6, atol=1e-6)
