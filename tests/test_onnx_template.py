"""Any ONNX model as a template (OnnxTemplate): fidelity to PyTorch, the export, the
trainable set, the checks of X and of the model."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from sklearn.base import clone
from sklearn.datasets import load_diabetes, load_digits, load_iris
from sklearn.model_selection import GridSearchCV

from onnxgrad_sklearn import OnnxTemplate, OrtGradientClassifier, OrtGradientRegressor
from onnxgrad_sklearn.backends import agent_available

pytestmark = pytest.mark.filterwarnings(
    "ignore::sklearn.exceptions.ConvergenceWarning", "ignore::DeprecationWarning"
)

BACKENDS = ["standard"] + (["agent"] if agent_available() else [])


def _linear_model(n_in=3, n_out=1, dtype=np.float32, second_output=False):
    """y = X @ W + b, made with onnx.helper."""
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    rng = np.random.RandomState(0)
    W = numpy_helper.from_array(rng.randn(n_in, n_out).astype(dtype), "W")
    b = numpy_helper.from_array(rng.randn(n_out).astype(dtype), "b")
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", elem, ["n", n_out])]
    if second_output:
        nodes.append(helper.make_node("Neg", ["y"], ["neg"]))
        outputs.insert(0, helper.make_tensor_value_info("neg", elem, ["n", n_out]))
    graph = helper.make_graph(
        nodes, "linear", [helper.make_tensor_value_info("X", elem, ["n", n_in])], outputs, [W, b]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _diabetes():
    X, y = load_diabetes(return_X_y=True)
    return X.astype(np.float32), ((y - y.mean()) / y.std()).astype(np.float32)


# fidelity to PyTorch ----------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_mlp_regressor_one_epoch_of_sgd_equals_torch(backend):
    torch = pytest.importorskip("torch")
    from _torch_models import export, mlp, train_sgd

    X, y = _diabetes()
    X, y = X[:256], y[:256]
    module = mlp(n_in=10)
    model = export(module, torch.zeros(2, 10))
    reg = OrtGradientRegressor(
        OnnxTemplate(model), optimizer="sgd", learning_rate_init=0.05, batch_size=32,
        shuffle=False, max_iter=1, backend=backend,
    )  # fmt: skip
    reg.fit(X, y)
    expected = train_sgd(module, X, y, "squared_error", 0.05, 32)
    trained = reg.estimator_.weights_
    assert sorted(trained) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(trained[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    with torch.no_grad():
        expected = module(torch.as_tensor(X[:20])).numpy().ravel()
    np.testing.assert_allclose(reg.predict(X[:20]), expected, rtol=1e-4, atol=1e-5)
    # the fitted template runs its own model, holding the trained weights
    np.testing.assert_allclose(
        reg.estimator_.predict(X[:20]).ravel(), expected, rtol=1e-4, atol=1e-5
    )
    assert reg.backend_ == backend


def test_mlp_regressor_float64_equals_torch():
    torch = pytest.importorskip("torch")
    from _torch_models import export, mlp, train_sgd

    X, y = _diabetes()
    X, y = X[:256].astype(np.float64), y[:256].astype(np.float64)
    module = mlp(n_in=10, dtype=torch.float64)
    model = export(module, torch.zeros(2, 10, dtype=torch.float64))
    reg = OrtGradientRegressor(
        OnnxTemplate(model), optimizer="sgd", learning_rate_init=0.05, batch_size=32,
        shuffle=False, max_iter=1, dtype="float64",
    )  # fmt: skip
    reg.fit(X, y)
    assert reg.backend_ == "standard"
    expected = train_sgd(module, X, y, "squared_error", 0.05, 32)
    for name, value in expected.items():
        np.testing.assert_allclose(reg.estimator_.weights_[name], value, rtol=1e-9, atol=1e-12)
    assert reg.estimator_.weights_["0.weight"].dtype == np.float64


def test_float32_model_trained_in_float64_equals_torch_in_float64():
    torch = pytest.importorskip("torch")
    from _torch_models import export, mlp, train_sgd

    X, y = _diabetes()
    X, y = X[:256].astype(np.float64), y[:256].astype(np.float64)
    module = mlp(n_in=10)
    model = export(module, torch.zeros(2, 10))  # float32
    reg = OrtGradientRegressor(
        OnnxTemplate(model), optimizer="sgd", learning_rate_init=0.05, batch_size=32,
        shuffle=False, max_iter=1, dtype="float64",
    )  # fmt: skip
    reg.fit(X, y)
    expected = train_sgd(module.double(), X, y, "squared_error", 0.05, 32)
    for name, value in expected.items():
        np.testing.assert_allclose(reg.estimator_.weights_[name], value, rtol=1e-9, atol=1e-12)
    assert reg.to_onnx().graph.input[0].type.tensor_type.elem_type == TensorProto.DOUBLE
    # the template's own model keeps its type, holding the trained weights
    assert reg.estimator_.to_onnx().graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT


def test_float64_without_kernels_is_refused_before_training():
    torch = pytest.importorskip("torch")
    from _torch_models import SmallCNN, distinct_, export

    model = export(distinct_(SmallCNN().eval()), torch.zeros(2, 1, 8, 8))
    clf = OrtGradientClassifier(OnnxTemplate(model), dtype="float64")
    with pytest.raises(ValueError, match="cannot run this ONNX template in float64.*Conv"):
        clf.fit(np.zeros((30, 1, 8, 8)), np.arange(30) % 3)
    assert not hasattr(clf, "estimator_")


@pytest.mark.parametrize("backend", BACKENDS)
def test_cnn_classifier_one_epoch_of_sgd_equals_torch(backend):
    torch = pytest.importorskip("torch")
    from _torch_models import SmallCNN, distinct_, export, train_sgd

    X, y = load_digits(return_X_y=True)
    X = (X[:256] / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = y[:256] % 3
    module = distinct_(SmallCNN(n_classes=3).eval())
    model = export(module, torch.zeros(2, 1, 8, 8))
    assert "BatchNormalization" in {n.op_type for n in model.graph.node}
    clf = OrtGradientClassifier(
        OnnxTemplate(model), optimizer="sgd", learning_rate_init=0.1, batch_size=32,
        shuffle=False, max_iter=1, backend=backend,
    )  # fmt: skip
    if backend == "agent":  # its gradient of BatchNormalization is wrong: refused
        with pytest.raises(ValueError, match="BatchNormalization is wrong"):
            clf.fit(X, y)
        assert not hasattr(clf, "estimator_")
        clf.set_params(backend="auto")
    clf.fit(X, y)
    module.eval()
    expected = train_sgd(module, X, torch.as_tensor(y), "log_loss", 0.1, 32)
    trained = clf.estimator_.weights_
    assert sorted(trained) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(trained[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    with torch.no_grad():
        proba = torch.softmax(module(torch.as_tensor(X[:20])), dim=1).numpy()
    np.testing.assert_allclose(clf.predict_proba(X[:20]), proba, rtol=1e-4, atol=1e-6)
    assert not hasattr(clf, "n_features_in_")  # X is 4-D


def _text_classifier(torch, rows, **params):
    """An embedding + LayerNorm text classifier exported by PyTorch, token ids and
    labels of ``rows`` rows, and an estimator training it by one epoch of SGD."""
    from _torch_models import TextClassifier, export

    rng = np.random.RandomState(0)
    ids = rng.randint(0, 50, size=(rows, 12)).astype(np.int64)
    y = (ids[:, 0] % 3).astype(np.int64)
    module = TextClassifier(vocabulary=50, dim=8, n_classes=3)
    model = export(module, torch.zeros(2, 12, dtype=torch.int64), input_name="ids")
    clf = OrtGradientClassifier(
        OnnxTemplate(model), optimizer="sgd", learning_rate_init=0.5, batch_size=32,
        shuffle=False, max_iter=1, **params,
    )  # fmt: skip
    return module, ids, y, clf


@pytest.mark.parametrize("backend", BACKENDS)
def test_text_classifier_with_an_embedding_equals_torch(backend):
    torch = pytest.importorskip("torch")
    from _torch_models import train_sgd

    module, ids, y, clf = _text_classifier(torch, 256, backend=backend)
    if backend == "agent":  # its gradient builder fails on this LayerNormalization
        with pytest.raises(ValueError, match="LayerNormalization with one output"):
            clf.fit(ids, y)
        clf.set_params(backend="auto")
    clf.fit(ids, y)
    assert clf.backend_ == "standard"
    expected = train_sgd(module, ids, torch.as_tensor(y), "log_loss", 0.5, 32)
    trained = clf.estimator_.weights_
    assert sorted(trained) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(trained[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    with pytest.raises(ValueError, match="takes int64 values"):
        clf.predict(ids.astype(np.float32))


# the export ---------------------------------------------------------------------
def test_to_onnx_is_the_same_graph_with_the_trained_weights():
    model = _linear_model(second_output=True)
    X = np.random.RandomState(1).randn(200, 3).astype(np.float32)
    y = X @ np.array([1.0, -2.0, 0.5], dtype=np.float32) + 0.3
    reg = OrtGradientRegressor(OnnxTemplate(model, output="y"), learning_rate_init=0.05)
    reg.fit(X, y)
    out = reg.to_onnx()
    assert [i.name for i in out.graph.input] == ["X"]
    assert [o.name for o in out.graph.output] == ["neg", "y"]
    assert [n.op_type for n in out.graph.node] == [n.op_type for n in model.graph.node]
    assert out.opset_import[0].version == 17
    weights = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}
    np.testing.assert_array_equal(weights["W"], reg.estimator_.weights_["W"])
    assert not np.array_equal(weights["W"], numpy_helper.to_array(model.graph.initializer[0]))
    import onnxruntime

    session = onnxruntime.InferenceSession(
        out.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    neg, pred = session.run(None, {"X": X[:10]})
    # the prediction is output "y", the second one, not the first
    np.testing.assert_allclose(reg.predict(X[:10]), pred.ravel(), rtol=1e-6)
    np.testing.assert_allclose(neg, -pred)
    assert reg.score(X, y) > 0.9


def test_frozen_weights_come_back_bit_for_bit():
    model = _linear_model()
    X = np.random.RandomState(1).randn(200, 3).astype(np.float32)
    y = X @ np.array([1.0, -2.0, 0.5], dtype=np.float32) + 0.3
    given = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    reg = OrtGradientRegressor(OnnxTemplate(model, frozen=["W"]), max_iter=3)
    reg.fit(X, y)
    assert list(reg.estimator_.weights_) == ["b"]
    out = {i.name: numpy_helper.to_array(i) for i in reg.to_onnx().graph.initializer}
    np.testing.assert_array_equal(out["W"], given["W"])
    assert out["W"].tobytes() == given["W"].tobytes()
    assert not np.array_equal(out["b"], given["b"])


def test_template_is_not_modified_and_refits_from_its_weights():
    model = _linear_model()
    before = model.SerializeToString()
    X = np.random.RandomState(1).randn(100, 3).astype(np.float32)
    y = X.sum(axis=1)
    template = OnnxTemplate(model)
    reg = OrtGradientRegressor(template, max_iter=2, random_state=0)
    first = reg.fit(X, y).predict(X)
    again = reg.fit(X, y).predict(X)
    assert model.SerializeToString() == before
    np.testing.assert_array_equal(first, again)
    assert "weights_" not in vars(template)


# a scikit-learn object --------------------------------------------------------------
def test_clone_pickle_and_grid_search():
    model = _linear_model()
    X = np.random.RandomState(1).randn(120, 3).astype(np.float32)
    y = X @ np.array([1.0, -2.0, 0.5], dtype=np.float32)
    reg = OrtGradientRegressor(OnnxTemplate(model), max_iter=20, learning_rate_init=0.05)
    cloned = clone(reg)
    assert cloned.estimator.get_params()["model"] is not None
    search = GridSearchCV(reg, {"estimator__frozen": [None, ["b"]]}, cv=2)
    search.fit(X, y)
    assert len(search.cv_results_["params"]) == 2
    fitted = search.best_estimator_
    restored = pickle.loads(pickle.dumps(fitted))
    np.testing.assert_array_equal(restored.predict(X), fitted.predict(X))
    assert copy.deepcopy(fitted).predict(X[:3]).shape == (3,)


def test_model_given_directly_bytes_and_path(tmp_path):
    model = _linear_model()
    X = np.random.RandomState(1).randn(120, 3).astype(np.float32)
    y = X.sum(axis=1)
    path = tmp_path / "linear.onnx"
    onnx.save(model, str(path))
    preds = []
    for given in (model, model.SerializeToString(), str(path), OnnxTemplate(path)):
        reg = OrtGradientRegressor(given, max_iter=2, random_state=0)
        preds.append(reg.fit(X, y).predict(X))
    for p in preds[1:]:
        np.testing.assert_array_equal(p, preds[0])


# the trainable set ------------------------------------------------------------------
def test_trainable_and_frozen_patterns():
    torch = pytest.importorskip("torch")
    from _torch_models import SmallCNN, distinct_, export

    from onnxgrad_sklearn.onnx_template import trainable_names

    model = export(distinct_(SmallCNN().eval()), torch.zeros(2, 1, 8, 8))
    everything = trainable_names(model)
    # running statistics are not weights
    assert "bn.running_mean" not in everything and "bn.running_var" not in everything
    assert {"c1.weight", "c1.bias", "bn.weight", "bn.bias", "fc.weight"} <= set(everything)
    assert trainable_names(model, frozen=["c*", "bn.*"]) == ["fc.weight", "fc.bias"]
    assert trainable_names(model, trainable="fc.*") == ["fc.weight", "fc.bias"]
    with pytest.raises(ValueError, match="'conv9.*' matches no"):
        trainable_names(model, frozen=["conv9.*"])
    with pytest.raises(ValueError, match="no weight to train"):
        trainable_names(model, frozen="*")


# checks -------------------------------------------------------------------------
def test_x_of_another_shape_is_refused_before_training():
    torch = pytest.importorskip("torch")
    from _torch_models import SmallCNN, distinct_, export

    model = export(distinct_(SmallCNN().eval()), torch.zeros(2, 1, 8, 8))
    clf = OrtGradientClassifier(OnnxTemplate(model), max_iter=1)
    y = np.arange(40) % 3
    with pytest.raises(ValueError, match=r"takes \(n_samples, 1, 8, 8\)"):
        clf.fit(np.zeros((40, 64), np.float32), y)
    with pytest.raises(ValueError, match=r"takes \(n_samples, 1, 8, 8\)"):
        clf.fit(np.zeros((40, 1, 9, 8), np.float32), y)
    assert not hasattr(clf, "estimator_")


def test_second_data_input_and_ml_operators_are_refused():
    model = _linear_model()
    model.graph.input.append(helper.make_tensor_value_info("Z", TensorProto.FLOAT, ["n", 3]))
    reg = OrtGradientRegressor(OnnxTemplate(model))
    X, y = np.zeros((10, 3), np.float32), np.zeros(10)
    with pytest.raises(ValueError, match=r"one data input.*\['X', 'Z'\]"):
        reg.fit(X, y)
    from skl2onnx import to_onnx
    from sklearn.linear_model import LinearRegression

    ml = to_onnx(LinearRegression().fit(X + np.arange(3), y), X[:1])
    with pytest.raises(ValueError, match="ai.onnx.ml operators"):
        OrtGradientRegressor(OnnxTemplate(ml)).fit(X, y)


def test_output_width_must_match_y():
    model = _linear_model(n_out=2)
    X = np.zeros((10, 3), np.float32)
    with pytest.raises(ValueError, match="output 'y' gives 2 values per sample"):
        OrtGradientRegressor(OnnxTemplate(model)).fit(X, np.zeros(10))
    y, _ = load_iris(return_X_y=True)
    with pytest.raises(ValueError, match="output 'y' gives 2 values per sample"):
        OrtGradientClassifier(OnnxTemplate(model)).fit(np.zeros((150, 3), np.float32), _)


def test_binary_classifier_with_two_logits():
    X, y = load_iris(return_X_y=True)
    X, y = X[:100, :3].astype(np.float32), y[:100]
    clf = OrtGradientClassifier(OnnxTemplate(_linear_model(n_out=2)), max_iter=50,
                                learning_rate_init=0.05)  # fmt: skip
    clf.fit(X, y)
    assert clf.n_outputs_ == 2
    proba = clf.predict_proba(X)
    assert proba.shape == (100, 2)
    assert clf.score(X, y) > 0.9


# training mode: BatchNormalization and Dropout ----------------------------------------
def _bn_dropout_net(torch, ratio=0.5, seed=0):
    from _torch_models import distinct_

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(seed)
            self.l1 = torch.nn.Linear(10, 16)
            self.bn = torch.nn.BatchNorm1d(16)
            self.dr = torch.nn.Dropout(ratio)
            self.l2 = torch.nn.Linear(16, 1)

        def forward(self, x):
            return self.l2(self.dr(torch.relu(self.bn(self.l1(x)))))

    return distinct_(Net(), seed)


def _training_export(torch, module, example):
    """The training-mode export of a copy (exporting runs the model, which moves its
    running statistics), and the module given the exported values."""
    from _torch_models import export

    model = export(copy.deepcopy(module).train(), example, training=True)
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    with torch.no_grad():
        for name, p in [*module.named_parameters(), *module.named_buffers()]:
            if name in weights:
                p.copy_(torch.as_tensor(weights[name]))
    return model


def test_batchnorm_in_training_mode_equals_torch():
    torch = pytest.importorskip("torch")
    from _torch_models import SmallCNN, distinct_, train_sgd

    X, y = load_digits(return_X_y=True)
    X = (X[:256] / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = y[:256] % 3
    module = distinct_(SmallCNN(n_classes=3))
    model = _training_export(torch, module, torch.zeros(2, 1, 8, 8))
    assert any(n.op_type == "BatchNormalization" and len(n.output) > 1 for n in model.graph.node), (
        "a training-mode export"
    )
    clf = OrtGradientClassifier(
        OnnxTemplate(model), optimizer="sgd", learning_rate_init=0.1, batch_size=32,
        shuffle=False, max_iter=1,
    )  # fmt: skip
    clf.fit(X, y)
    assert clf.backend_ == "standard"
    module.train()
    expected = train_sgd(module, X, torch.as_tensor(y), "log_loss", 0.1, 32)
    trained = clf.estimator_.weights_
    for name, value in expected.items():
        np.testing.assert_allclose(trained[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(
        trained["bn.running_mean"], module.bn.running_mean.numpy(), rtol=1e-4, atol=1e-6
    )
    # ONNX updates with the population variance, torch with the sample variance
    np.testing.assert_allclose(
        trained["bn.running_var"], module.bn.running_var.numpy(), rtol=1e-3, atol=1e-6
    )
    module.eval()
    with torch.no_grad():
        proba = torch.softmax(module(torch.as_tensor(X[:40])), dim=1).numpy()
    np.testing.assert_allclose(clf.predict_proba(X[:40]), proba, atol=1e-3)
    # the export: inference mode, holding the updated running statistics
    out = clf.to_onnx()
    assert all(len(n.output) == 1 for n in out.graph.node if n.op_type == "BatchNormalization")
    exported = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}
    np.testing.assert_array_equal(exported["bn.running_mean"], trained["bn.running_mean"])
    import onnxruntime

    session = onnxruntime.InferenceSession(out.SerializeToString())
    np.testing.assert_allclose(
        session.run(None, {"x": X[:40]})[0], module(torch.as_tensor(X[:40])).detach().numpy(),
        atol=1e-3,
    )  # fmt: skip


def test_batch_statistics_exclude_the_padding_rows():
    torch = pytest.importorskip("torch")
    module = _bn_dropout_net(torch, ratio=0.0)
    model = _training_export(torch, module, torch.zeros(4, 10))
    X, y = _diabetes()
    X, y = X[:72], y[:72]  # batches of 32, 32 and 8 (padded to 32 with rows of weight 0)
    reg = OrtGradientRegressor(
        OnnxTemplate(model), optimizer="sgd", learning_rate_init=0.05, batch_size=32,
        shuffle=False, max_iter=1,
    )  # fmt: skip
    reg.fit(X, y)
    from _torch_models import train_sgd

    module.train()
    expected = train_sgd(module, X, y, "squared_error", 0.05, 32)
    for name, value in expected.items():
        np.testing.assert_allclose(reg.estimator_.weights_[name], value, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(
        reg.estimator_.weights_["bn.running_mean"], module.bn.running_mean.numpy(), rtol=1e-4,
        atol=1e-6,
    )  # fmt: skip


def test_dropout_masks_follow_random_state():
    torch = pytest.importorskip("torch")
    model = _training_export(torch, _bn_dropout_net(torch, ratio=0.5), torch.zeros(4, 10))
    X, y = _diabetes()

    def fit(seed, m=model):
        return OrtGradientRegressor(OnnxTemplate(m), max_iter=5, random_state=seed).fit(X, y)

    first, again, other = fit(0), fit(0), fit(1)
    assert first.loss_curve_ == again.loss_curve_
    for name, value in first.estimator_.weights_.items():
        np.testing.assert_array_equal(value, again.estimator_.weights_[name])
    assert first.loss_curve_ != other.loss_curve_
    # predictions run Dropout in inference mode: deterministic
    np.testing.assert_array_equal(first.predict(X), first.predict(X))
    assert "Dropout" not in {n.op_type for n in first.to_onnx().graph.node}
    # dropping half of the units raises the training loss
    plain = _training_export(torch, _bn_dropout_net(torch, ratio=0.0), torch.zeros(4, 10))
    assert first.loss_curve_[-1] > fit(0, plain).loss_curve_[-1]


def test_training_mode_refusals():
    torch = pytest.importorskip("torch")
    model = _training_export(torch, _bn_dropout_net(torch), torch.zeros(4, 10))
    X, y = _diabetes()
    with pytest.raises(ValueError, match="backend='agent' cannot train Dropout"):
        OrtGradientRegressor(OnnxTemplate(model), backend="agent").fit(X, y)
    reg = OrtGradientRegressor(OnnxTemplate(model), optimizer="lbfgs")
    with pytest.raises(ValueError, match="all the rows at once"):
        reg.fit(X, y)
    assert not hasattr(reg, "estimator_")


def test_checkpoint_carries_statistics_and_masks(tmp_path):
    torch = pytest.importorskip("torch")
    from onnxgrad_sklearn.callbacks import Checkpoint

    model = _training_export(torch, _bn_dropout_net(torch), torch.zeros(4, 10))
    X, y = _diabetes()
    whole = OrtGradientRegressor(OnnxTemplate(model), max_iter=4, random_state=0).fit(X, y)
    from _helpers import QuietCallback

    class Stop(QuietCallback):
        def on_fit_task_end(self, estimator, context):
            if context.task_name == "epoch" and estimator.n_iter_ == 2:
                raise KeyboardInterrupt
            return False

    first = OrtGradientRegressor(OnnxTemplate(model), max_iter=4, random_state=0)
    first.set_callbacks(Checkpoint(tmp_path / "fit.ckpt"), Stop())
    with pytest.raises(KeyboardInterrupt):
        first.fit(X, y)
    resumed = OrtGradientRegressor(OnnxTemplate(model), max_iter=4, random_state=0)
    resumed.set_callbacks(Checkpoint(tmp_path / "fit.ckpt"))
    resumed.fit(X, y)
    assert resumed.loss_curve_ == whole.loss_curve_
    for name, value in whole.estimator_.weights_.items():
        np.testing.assert_array_equal(resumed.estimator_.weights_[name], value, err_msg=name)


# Pipelines ----------------------------------------------------------------------------
def test_pipeline_reshaping_rows_into_images():
    torch = pytest.importorskip("torch")
    from _torch_models import SmallCNN, distinct_, export
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer

    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    model = export(distinct_(SmallCNN(n_classes=10).eval()), torch.zeros(2, 1, 8, 8))
    images = FunctionTransformer(lambda rows: rows.reshape(-1, 1, 8, 8))
    pipe = OrtGradientClassifier(make_pipeline(images, OnnxTemplate(model)), max_iter=3)
    direct = OrtGradientClassifier(OnnxTemplate(model), max_iter=3)
    pipe.fit(X, y)
    direct.fit(X.reshape(-1, 1, 8, 8), y)
    assert pipe.n_features_in_ == 64
    np.testing.assert_array_equal(
        pipe.predict_proba(X), direct.predict_proba(X.reshape(-1, 1, 8, 8))
    )
    with pytest.warns(UserWarning, match="takes the output of the Pipeline's steps"):
        exported = pipe.to_onnx()
    assert exported.graph.input[0].name == "x"


def test_pipeline_with_a_scaler_fits_the_scaler():
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = load_diabetes(return_X_y=True)
    X = X * 100.0
    reg = OrtGradientRegressor(
        make_pipeline(StandardScaler(), OnnxTemplate(_linear_model(n_in=10)))
    )
    reg.fit(X, y)
    scaler = reg.estimator_[0]
    np.testing.assert_allclose(scaler.mean_, X.mean(axis=0))
    W = reg.estimator_[-1].weights_["W"]
    b = reg.estimator_[-1].weights_["b"]
    np.testing.assert_allclose(
        reg.predict(X[:5]), (scaler.transform(X[:5]) @ W + b).ravel(), rtol=1e-5
    )


# the estimators' features on an ONNX template ---------------------------------------
def test_lbfgs_reaches_least_squares_and_sample_weight_counts():
    rng = np.random.RandomState(0)
    X = rng.randn(300, 3).astype(np.float32)
    y = X @ np.array([1.5, -2.0, 0.5]) + 0.3 + 0.1 * rng.randn(300)
    weight = np.where(np.arange(300) < 150, 1.0, 0.0)
    reg = OrtGradientRegressor(OnnxTemplate(_linear_model()), optimizer="lbfgs", dtype="float64")
    reg.fit(X, y, sample_weight=weight)
    A = np.c_[X[:150], np.ones(150)].astype(np.float64)
    expected = np.linalg.lstsq(A, y[:150], rcond=None)[0]
    trained = reg.estimator_.weights_
    np.testing.assert_allclose(trained["W"].ravel(), expected[:3], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(trained["b"], expected[3:], rtol=1e-5, atol=1e-6)


def test_partial_fit_calls_equal_fit_epochs():
    X, y = _diabetes()
    params = dict(shuffle=False, tol=0.0, n_iter_no_change=100, learning_rate_init=0.01)
    fitted = OrtGradientRegressor(OnnxTemplate(_linear_model(n_in=10)), max_iter=3, **params)
    fitted.fit(X, y)
    parts = OrtGradientRegressor(OnnxTemplate(_linear_model(n_in=10)), **params)
    for _ in range(3):
        parts.partial_fit(X, y)
    for name, value in fitted.estimator_.weights_.items():
        np.testing.assert_allclose(parts.estimator_.weights_[name], value, rtol=1e-6)


def test_early_stopping_on_a_validation_set():
    X, y = _diabetes()
    reg = OrtGradientRegressor(
        OnnxTemplate(_linear_model(n_in=10)), early_stopping=True, learning_rate_init=0.01,
        max_iter=50, random_state=0,
    )  # fmt: skip
    reg.fit(X[:300], y[:300], X_val=X[300:], y_val=y[300:])
    assert len(reg.validation_scores_) == reg.n_iter_
    # the weights kept are those of the best validation score
    assert reg.score(X[300:], y[300:]) == pytest.approx(reg.best_validation_score_, rel=1e-5)


def test_text_classifier_float64_equals_torch():
    torch = pytest.importorskip("torch")
    from _torch_models import train_sgd

    module, ids, y, clf = _text_classifier(torch, 128, dtype="float64")
    clf.fit(ids, y)
    expected = train_sgd(module.double(), ids, torch.as_tensor(y), "log_loss", 0.5, 32)
    for name, value in expected.items():
        np.testing.assert_allclose(clf.estimator_.weights_[name], value, rtol=1e-9, atol=1e-12)


def _sigmoid_model(n_in=4, n_out=3):
    model = _linear_model(n_in=n_in, n_out=n_out)
    model.graph.node.append(helper.make_node("Sigmoid", ["y"], ["p"]))
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("p", TensorProto.FLOAT, ["n", n_out]))
    return model


def test_sigmoid_outputs_train_one_vs_rest_as_torch():
    torch = pytest.importorskip("torch")
    X, y = load_iris(return_X_y=True)
    X = ((X - X.mean(0)) / X.std(0)).astype(np.float32)
    model = _sigmoid_model()
    clf = OrtGradientClassifier(
        OnnxTemplate(model), optimizer="sgd", learning_rate_init=0.1, batch_size=30,
        shuffle=False, max_iter=1,
    )  # fmt: skip
    clf.fit(X, y)
    given = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    W = torch.tensor(given["W"], requires_grad=True)
    b = torch.tensor(given["b"], requires_grad=True)
    targets = torch.as_tensor(np.eye(3, dtype=np.float32)[y])
    for start in range(0, 150, 30):
        z = torch.as_tensor(X[start : start + 30]) @ W + b
        loss = (
            torch.nn.functional.binary_cross_entropy_with_logits(
                z, targets[start : start + 30], reduction="none"
            )
            .sum(dim=1)
            .mean()
        )
        W.grad = b.grad = None
        loss.backward()
        with torch.no_grad():
            W -= 0.1 * W.grad
            b -= 0.1 * b.grad
    np.testing.assert_allclose(
        clf.estimator_.weights_["W"], W.detach().numpy(), rtol=1e-4, atol=1e-6
    )
    # probabilities: the sigmoids, normalised (one-vs-rest)
    sig = 1 / (1 + np.exp(-(X @ W.detach().numpy() + b.detach().numpy())))
    np.testing.assert_allclose(clf.predict_proba(X), sig / sig.sum(1, keepdims=True), rtol=1e-4)


def test_multilabel_with_sigmoid_outputs():
    X, y = load_iris(return_X_y=True)
    X = ((X - X.mean(0)) / X.std(0)).astype(np.float32)
    Y = np.c_[y == 0, y == 2, X[:, 0] > 0].astype(int)
    clf = OrtGradientClassifier(OnnxTemplate(_sigmoid_model()), learning_rate_init=0.05)
    clf.fit(X, Y)
    assert clf.predict(X).shape == (150, 3)
    assert clf.score(X, Y) > 0.8  # subset accuracy
    with pytest.raises(ValueError, match="an ONNX template whose output is a Sigmoid"):
        OrtGradientClassifier(OnnxTemplate(_linear_model(n_in=4, n_out=3))).fit(X, Y)


def test_fitted_template_goes_on_from_its_weights_and_skops_round_trip(tmp_path):
    skops = pytest.importorskip("skops.io")
    from onnxgrad_sklearn import SKOPS_TRUSTED_TYPES

    X = np.random.RandomState(0).randn(100, 3).astype(np.float32)
    y = X @ np.array([1.0, -2.0, 0.5])
    for given in (OnnxTemplate(_linear_model()), _linear_model()):
        reg = OrtGradientRegressor(given, max_iter=20, learning_rate_init=0.05).fit(X, y)
        path = tmp_path / "reg.skops"
        skops.dump(reg, path)
        loaded = skops.load(path, trusted=SKOPS_TRUSTED_TYPES)
        np.testing.assert_array_equal(loaded.predict(X), reg.predict(X))
    # the fitted template (estimator_) as a template: fine-tuned from its trained weights
    again = OrtGradientRegressor(reg.estimator_, optimizer="sgd", learning_rate_init=1e-12)
    again.fit(X, y)
    np.testing.assert_allclose(again.predict(X), reg.predict(X), rtol=1e-6)


def test_a_callbacks_fitted_estimator_predicts_with_the_running_statistics():
    torch = pytest.importorskip("torch")
    from _helpers import QuietCallback

    model = _training_export(torch, _bn_dropout_net(torch, ratio=0.0), torch.zeros(4, 10))
    X, y = _diabetes()
    seen = []

    class Record(QuietCallback):
        def on_fit_task_end(self, estimator, context, *, fitted_estimator=None):
            if context.task_name == "epoch":
                seen.append(fitted_estimator.predict(X[:10]))
            return False

    reg = OrtGradientRegressor(OnnxTemplate(model), max_iter=3, random_state=0)
    reg.set_callbacks(Record())
    reg.fit(X, y)
    np.testing.assert_allclose(seen[-1], reg.predict(X[:10]), rtol=1e-6)


def test_early_stopping_keeps_the_best_epochs_running_statistics():
    torch = pytest.importorskip("torch")
    model = _training_export(torch, _bn_dropout_net(torch, ratio=0.0), torch.zeros(4, 10))
    X, y = _diabetes()
    reg = OrtGradientRegressor(
        OnnxTemplate(model), early_stopping=True, n_iter_no_change=3, learning_rate_init=0.05,
        max_iter=40, random_state=0,
    )  # fmt: skip
    reg.fit(X[:300], y[:300], X_val=X[300:], y_val=y[300:])
    assert int(np.argmax(reg.validation_scores_)) < reg.n_iter_ - 1  # it went back
    assert reg.score(X[300:], y[300:]) == pytest.approx(reg.best_validation_score_, rel=1e-5)


def test_dynamo_export_trains_as_torch():
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript", reason="torch's dynamo exporter needs onnxscript")
    from _torch_models import mlp, train_sgd

    X, y = _diabetes()
    X, y = X[:256], y[:256]
    module = mlp(n_in=10)
    program = torch.onnx.export(
        module,
        (torch.zeros(4, 10),),
        dynamo=True,
        input_names=["x"],
        output_names=["out"],
        dynamic_shapes=({0: torch.export.Dim("batch")},),
    )
    reg = OrtGradientRegressor(
        OnnxTemplate(program.model_proto), optimizer="sgd", learning_rate_init=0.05,
        batch_size=32, shuffle=False, max_iter=1,
    )  # fmt: skip
    reg.fit(X, y)
    assert reg.backend_ == "standard"  # backend="auto" on an ONNX template
    expected = train_sgd(module, X, y, "squared_error", 0.05, 32)
    for name, value in expected.items():
        np.testing.assert_allclose(reg.estimator_.weights_[name], value, rtol=1e-4, atol=1e-6)


def test_checkpoint_carries_the_best_epochs_statistics(tmp_path):
    """Early stopping ends on the best epoch's weights and BatchNormalization statistics:
    a fit interrupted after its best epoch and resumed from its Checkpoint file ends
    on the same ones as the fit never interrupted."""
    torch = pytest.importorskip("torch")
    from _helpers import QuietCallback

    from onnxgrad_sklearn.callbacks import Checkpoint

    model = _training_export(torch, _bn_dropout_net(torch, ratio=0.0), torch.zeros(4, 10))
    X, y = _diabetes()
    settings = dict(max_iter=200, random_state=0, early_stopping=True, n_iter_no_change=2, tol=0.0)
    whole = OrtGradientRegressor(OnnxTemplate(model), **settings).fit(X, y)
    best = int(np.argmax(whole.validation_scores_))
    stop_at = best + 2  # after the best epoch, before the end
    assert stop_at < whole.n_iter_  # the fit ends on weights of an earlier epoch

    class Stop(QuietCallback):
        def on_fit_task_end(self, estimator, context):
            if context.task_name == "epoch" and estimator.n_iter_ == stop_at:
                raise KeyboardInterrupt
            return False

    first = OrtGradientRegressor(OnnxTemplate(model), **settings)
    first.set_callbacks(Checkpoint(tmp_path / "fit.ckpt"), Stop())
    with pytest.raises(KeyboardInterrupt):
        first.fit(X, y)
    resumed = OrtGradientRegressor(OnnxTemplate(model), **settings)
    resumed.set_callbacks(Checkpoint(tmp_path / "fit.ckpt")).fit(X, y)
    assert resumed.n_iter_ == whole.n_iter_
    statistics = [n for n in whole.estimator_.weights_ if "running" in n]
    assert statistics  # the BatchNormalization's running mean and variance
    for name, value in whole.estimator_.weights_.items():
        np.testing.assert_array_equal(resumed.estimator_.weights_[name], value, err_msg=name)
