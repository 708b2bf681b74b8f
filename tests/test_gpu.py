"""The CUDA path: runs only where a CUDA build of onnxruntime and a GPU exist.

The standard backend runs on CUDA with onnxruntime-gpu; the TrainingAgent with
onnxruntime-training's CUDA build. Without a CUDA provider every test here but
the last skips: the device code of the standard backend is run on the CPU by
tests/test_device_buffers.py.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from _helpers import BACKENDS
from onnx import TensorProto, helper

from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor, _model, config_context
from onnxgrad_sklearn.backends.buffers import DeviceBuffers
from onnxgrad_sklearn.runtime import bindings, make_session, session_providers

HAS_CUDA = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
needs_cuda = pytest.mark.skipif(
    not HAS_CUDA,
    reason="the installed onnxruntime has no CUDA provider (the CPU build): install "
    "onnxruntime-gpu in its place (see benchmarks/gpu_device.sh)",
)
ROOT = Path(__file__).resolve().parent.parent


def _data():
    rng = np.random.RandomState(0)
    X = rng.randn(500, 8)
    return X, X[:, 0] - X[:, 1] ** 2


PARAMS = dict(
    optimizer="adam",
    learning_rate_init=0.01,
    max_iter=5,
    batch_size=50,
    random_state=0,
    shuffle=False,
)


@needs_cuda
@pytest.mark.parametrize("backend", BACKENDS)
def test_cuda_training_matches_cpu_training(backend):
    X, y = _data()
    cpu = OrtGradientRegressor(backend=backend, **PARAMS).fit(X, y)
    gpu = OrtGradientRegressor(device="cuda", backend=backend, **PARAMS).fit(X, y)
    assert gpu.backend_ == backend
    np.testing.assert_allclose(gpu.loss_curve_, cpu.loss_curve_, rtol=1e-3)
    np.testing.assert_allclose(gpu.predict(X), cpu.predict(X), rtol=1e-3, atol=1e-4)
    clf = OrtGradientClassifier(device="cuda:0", backend=backend, **PARAMS).fit(X, y > 0)
    assert clf.score(X, y > 0) > 0.7


@needs_cuda
@pytest.mark.parametrize("optimizer", ["adam", "nesterov", "sgd"])
def test_standard_backend_on_cuda_undo_restore_and_gradients(optimizer):
    X, y = _data()
    params = dict(PARAMS, optimizer=optimizer, backend="standard")
    cpu = OrtGradientRegressor(**params).fit(X, y)
    gpu = OrtGradientRegressor(device="cuda", **params).fit(X, y)
    backend = gpu._engine._backend
    assert backend.device_buffers
    names = {v.device_name().lower() for p in backend._buffers.vectors for v in p}
    assert names <= {"cuda", "gpu"}, names
    np.testing.assert_allclose(gpu.loss_curve_, cpu.loss_curve_, rtol=1e-3)
    engine = gpu._engine
    X32 = X[:50].astype(np.float32)
    y32 = y[:50, None].astype(np.float32)
    sw = np.ones(50, np.float32)
    loss, grads = engine.loss_and_gradients(X32, y32, sw)
    cpu_loss, cpu_grads = cpu._engine.loss_and_gradients(X32, y32, sw)
    assert loss == pytest.approx(cpu_loss, rel=1e-3)
    for g, c in zip(grads, cpu_grads):
        np.testing.assert_allclose(g, c, rtol=1e-2, atol=1e-4)
    saved, weights = engine.checkpoint(), engine.get_weights()
    engine.train_batch(X32, y32, sw, 0.01)
    engine.undo_last_step()
    for a, b in zip(weights, engine.get_weights()):
        np.testing.assert_array_equal(a, b)
    engine.train_batch(X32, y32, sw, 0.01)
    engine.restore(saved)
    for a, b in zip(weights, engine.get_weights()):
        np.testing.assert_array_equal(a, b)
    engine.set_weights([w * 0 for w in weights])
    assert not any(w.any() for w in engine.get_weights())


@needs_cuda
def test_device_buffers_on_cuda_are_bound_by_address_in_place():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 1])
    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "neg", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    providers, options = session_providers("cuda")
    session = make_session(model, None, providers, options)
    b = DeviceBuffers([(5, 3), (3, 1)], n_state=0, n_sets=2, device="cuda")
    assert b.vectors[0][0].data_ptr() % 256 == 0
    b.write(0, [np.ones((5, 3)), [[1.0], [2.0], [3.0]]])
    binding = bindings().SessionIOBinding(session._sess)
    b.bind(binding, "x", 0, 0, 1)
    b.bind(binding, "y", 1, 0, 1, output=True)
    session._sess.run_with_iobinding(binding, onnxruntime.RunOptions())
    binding.synchronize_outputs()
    b.current = 1
    np.testing.assert_array_equal(b.read(0)[1], [[-1.0], [-2.0], [-3.0]])
    assert not b.read(0)[0].any()


@needs_cuda
@pytest.mark.parametrize("allow_tf32", [False, True])
def test_every_cuda_session_of_the_standard_backend_has_use_tf32_as_set(allow_tf32):
    X, y = _data()
    with config_context(allow_tf32=allow_tf32):
        est = OrtGradientRegressor(device="cuda", backend="standard", **PARAMS).fit(X, y)
    backend = est._engine._backend
    backend.loss(X[:10], y[:10], None)
    backend.predict(X[:10])
    sessions = [run.session for runs in backend._steps.values() for run in runs.values()]
    sessions += [backend._forward, backend._predict]
    for session in sessions:
        options = session.get_provider_options()["CUDAExecutionProvider"]
        assert options["use_tf32"] == ("1" if allow_tf32 else "0")
        assert options["device_id"] == "0"


@needs_cuda
def test_gpu_check_script_passes():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--rows", "5000"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "largest relative gap" in out.stdout
    assert "tf32" in out.stdout


def test_gpu_check_script_explains_a_missing_cuda_build():
    if HAS_CUDA:
        pytest.skip("the CUDA build is installed")
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0
    assert "no CUDA provider" in out.stdout


def _fake_wheel(path, version, tag, size):
    """A wheel of ``size`` random bytes, stored (not compressed): several pieces when split."""
    import zipfile

    rng = np.random.RandomState(0)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("onnxruntime/blob.bin", rng.bytes(size))
        z.writestr(
            f"onnxruntime_gpu-{version}.dist-info/WHEEL",
            f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n",
        )
    return path


def _needs_bash_and_split():
    import shutil

    if shutil.which("split") is None or shutil.which("bash") is None:
        pytest.skip("needs bash and split")


def _bash_script(name, *args, **env):
    """Run ``benchmarks/<name>`` with bash (the interpreter: this one)."""
    return subprocess.run(
        ["bash", str(ROOT / "benchmarks" / name), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": sys.executable, **env},
    )


@pytest.mark.skipif(sys.platform == "win32", reason="a bash script")
@pytest.mark.parametrize("prefix", ["onnxruntime_gpu-1.30.0-cp312-cp312-linux_x86_64.whl.", "x"])
def test_gpu_device_script_joins_a_split_wheel_and_names_it(tmp_path, prefix):
    _needs_bash_and_split()
    wheel = _fake_wheel(tmp_path / "built.whl", "1.30.0", "cp312-cp312-linux_x86_64", 400_000)
    pieces = tmp_path / "wheels"
    pieces.mkdir()
    subprocess.run(["split", "-b", "100K", str(wheel), str(pieces / prefix)], check=True)
    assert len(list(pieces.iterdir())) == 4
    (pieces / "skl2onnx-1.20.0-py2.py3-none-any.whl").write_bytes(b"")  # left alone
    out = _bash_script("gpu_device.sh", pieces, JOIN_ONLY="1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "joining 4 pieces" in out.stdout
    assert "wheel: onnxruntime_gpu-1.30.0-cp312-cp312-linux_x86_64.whl" in out.stdout


@pytest.mark.skipif(sys.platform == "win32", reason="bash scripts")
def test_gpu_wheels_one_piece_per_folder_join_again_on_the_device_side(tmp_path):
    _needs_bash_and_split()
    name = "onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_27_x86_64.whl"
    wheel = _fake_wheel(tmp_path / name, "1.31.1", "cp312-cp312-manylinux_2_27_x86_64", 1_100_000)
    out_dir = tmp_path / "gpu_wheels"
    made = _bash_script("gpu_wheels.sh", out_dir, WHEEL=str(wheel), PIECE_SIZE="100K")
    assert made.returncode == 0, made.stdout + made.stderr
    n = -(-wheel.stat().st_size // 102_400)  # 11 pieces: p10 and p11 sort before p2
    folders = sorted(p.name for p in out_dir.iterdir())
    assert n > 10 and folders == sorted(["small"] + [f"p{k}" for k in range(1, n + 1)])
    assert all(len(list((out_dir / f).iterdir())) == 1 for f in folders if f != "small")
    joined = _bash_script("gpu_device.sh", out_dir, JOIN_ONLY="1")
    assert joined.returncode == 0, joined.stdout + joined.stderr
    assert f"joining {n} pieces" in joined.stdout
    assert f"wheel: {name}" in joined.stdout


def _recording_sessions(monkeypatch):
    """Record the providers and options of every InferenceSession; run them on the CPU."""
    made = []
    real = onnxruntime.InferenceSession

    def record(model, sess_options=None, providers=None, provider_options=None, **kwargs):
        made.append((list(providers or []), provider_options))
        return real(model, sess_options=sess_options, providers=["CPUExecutionProvider"])

    monkeypatch.setattr(onnxruntime, "InferenceSession", record)
    return made


@pytest.mark.parametrize("allow_tf32", [False, True])
def test_prediction_sessions_of_a_cuda_fit_get_its_device_index_and_tf32(monkeypatch, allow_tf32):
    """Simulated: a model fitted on cuda:1 predicts there with the same options as training."""
    X = np.random.RandomState(0).randn(40, 3)
    est = OrtGradientRegressor(max_iter=2).fit(X, X[:, 0])
    est.device = "cuda:1"  # as if fitted there
    monkeypatch.setattr("onnxgrad_sklearn._model.device_to_providers", lambda device: (None, 1))
    made = _recording_sessions(monkeypatch)
    with config_context(allow_tf32=allow_tf32):
        _model.make_sessions(est)
    cuda = {"device_id": "1", "use_tf32": "1" if allow_tf32 else "0"}
    assert made and all(p[0] == "CUDAExecutionProvider" for p, _ in made)
    assert all(options == [cuda, {}] for _, options in made)


def test_changing_allow_tf32_between_fits_builds_new_sessions():
    X = np.random.RandomState(0).randn(40, 3)
    est = OrtGradientRegressor(max_iter=2, warm_start=True).fit(X, X[:, 0])
    first = est._engine
    est.fit(X, X[:, 0])
    assert est._engine is first  # same settings: the engine is kept
    with config_context(allow_tf32=True):
        est.fit(X, X[:, 0])
    assert est._engine is not first
