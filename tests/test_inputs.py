"""The input interface (onnxgrad_sklearn._inputs): one object per kind of template brings
X to the graph for the fit, the validation set and the predictions."""

from __future__ import annotations

import warnings

import numpy as np
import onnxruntime
import pytest
import scipy.sparse as sp
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_diabetes
from sklearn.neural_network import MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer, StandardScaler

from onnxgrad_sklearn import OnnxTemplate, OrtGradientRegressor
from onnxgrad_sklearn._inputs import ArrayInput, OnnxInput, template_input


def _image_model():
    """y = sum over (channel, height, width) of X * W, for X of shape (n, 2, 3, 3)."""
    W = numpy_helper.from_array(np.random.RandomState(0).randn(1, 2, 3, 3).astype(np.float32), "W")
    nodes = [
        helper.make_node("Mul", ["X", "W"], ["xw"]),
        helper.make_node("ReduceSum", ["xw", "axes"], ["y"], keepdims=0),
    ]
    axes = numpy_helper.from_array(np.array([1, 2, 3], np.int64), "axes")
    graph = helper.make_graph(
        nodes,
        "images",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 2, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
        [W, axes],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _images(n=40):
    rng = np.random.RandomState(1)
    X = rng.rand(n, 2, 3, 3)
    return X, X.sum(axis=(1, 2, 3)) + rng.randn(n) * 0.01


def test_each_kind_of_template_has_its_input():
    assert isinstance(template_input(MLPRegressor()), ArrayInput)
    assert isinstance(template_input(make_pipeline(StandardScaler(), MLPRegressor())), ArrayInput)
    onnx_input = template_input(OnnxTemplate(_image_model()))
    assert isinstance(onnx_input, OnnxInput)
    assert onnx_input.spec.float_type == "float32"
    head = make_pipeline(FunctionTransformer(), OnnxTemplate(_image_model()))
    assert isinstance(template_input(head), OnnxInput)


def test_onnx_input_takes_the_models_rank_and_type():
    template = OnnxTemplate(_image_model())
    est = OrtGradientRegressor(template)
    X, y = _images()
    Xc, yc, dtype = template_input(template).fit(est, template, X, y, True, None)
    assert Xc.dtype == np.float32 and Xc.shape == (40, 2, 3, 3) and dtype == "float32"
    np.testing.assert_array_equal(Xc, X.astype(np.float32))
    with pytest.raises(ValueError, match="X"):  # one dimension too few, before the runtime
        template_input(template).fit(est, template, X[:, 0], y, True, None)
    with pytest.raises(ValueError, match="X_val"):
        template_input(template).validation(est, template, X[:, :, :2], np.float32)


def test_array_input_keeps_sparse_rows_sparse():
    X, y = load_diabetes(return_X_y=True)
    template = MLPRegressor()
    est = OrtGradientRegressor(template)
    Xs = sp.csr_matrix(np.where(X > 0, X, 0.0))
    Xc, yc, dtype = template_input(template).fit(est, template, Xs, y, True, None)
    assert sp.issparse(Xc) and dtype is None
    np.testing.assert_array_equal(yc, y)


@pytest.mark.parametrize("kind", ["scikit-learn", "onnx"])
def test_fit_validation_and_predict_go_through_the_same_input(kind):
    if kind == "onnx":
        X, y = _images()
        template = OnnxTemplate(_image_model())
    else:
        X, y = load_diabetes(return_X_y=True)
        template = MLPRegressor(hidden_layer_sizes=(8,))
    est = OrtGradientRegressor(
        template, max_iter=3, random_state=0, early_stopping=True, n_iter_no_change=10
    )
    est.fit(X[:30], y[:30], X_val=X[30:], y_val=y[30:])
    assert len(est.validation_scores_) == 3  # X_val reached the graph at each epoch
    # what the interface gives is what the exported graph takes: its predictions
    rows = template_input(est.estimator_).predict(est, X, est._converted.dtype)
    assert rows.dtype == np.float32 and rows.shape[0] == len(X)
    session = onnxruntime.InferenceSession(
        est.to_onnx().SerializeToString(), providers=["CPUExecutionProvider"]
    )
    exported = session.run(None, {session.get_inputs()[0].name: rows})[0]
    np.testing.assert_allclose(np.ravel(exported), est.predict(X), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError):
        est.predict(X[:, :1])  # a column (scikit-learn) or a dimension (ONNX) short


def test_export_warns_about_the_steps_in_front_of_an_onnx_template():
    X, y = _images()
    flatten = FunctionTransformer(lambda Z: Z.reshape(len(Z), 2, 3, 3))
    pipe = make_pipeline(flatten, OnnxTemplate(_image_model()))
    est = OrtGradientRegressor(pipe, max_iter=2).fit(X.reshape(len(X), -1), y)
    assert est.predict(X.reshape(len(X), -1)).shape == (len(X),)
    with pytest.warns(UserWarning, match="functiontransformer"):
        est.to_onnx()
    plain = OrtGradientRegressor(OnnxTemplate(_image_model()), max_iter=2).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain.to_onnx()
    assert template_input(MLPRegressor()).export_warning(MLPRegressor()) is None
