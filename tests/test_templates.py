"""Converted templates: new weights written into a copy of the graph, initial weights."""

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor
from onnxgrad_sklearn._converted import ConvertedTemplate

RNG = np.random.RandomState(0)
X = RNG.randn(80, 4).astype(np.float32)
Y = (X[:, 0] + X[:, 1] ** 2).astype(np.float32)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize(
    "est, y",
    [
        (OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(5, 3))), Y),
        (
            OrtGradientRegressor(
                make_pipeline(StandardScaler(), MLPRegressor(hidden_layer_sizes=(6,)))
            ),
            np.c_[Y, -Y],
        ),
        (OrtGradientClassifier(LogisticRegression()), (Y > 1).astype(int)),
    ],
)
def test_with_values_is_the_model_with_new_initializers(est, y):
    conv = est.set_params(max_iter=1, random_state=0).fit(X, y)._converted
    before = conv.model.SerializeToString()
    values = [RNG.randn(*v.shape).astype(np.float32) for v in conv.initializer_values()]

    reference = onnx.ModelProto()
    reference.CopyFrom(conv.model)
    index = dict(zip(conv.initializer_names, values))
    for init in reference.graph.initializer:
        if init.name in index:
            array = index[init.name].reshape(tuple(init.dims))
            init.CopyFrom(numpy_helper.from_array(array, init.name))

    model = conv.with_values(values)
    assert model.SerializeToString() == reference.SerializeToString()
    assert conv.model.SerializeToString() == before  # the source is left as it was
    with pytest.raises(ValueError, match="has dims"):
        conv.with_values([np.append(values[0], 0.0)] + values[1:])


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_new_mlp_weights_are_float32_draws_of_mlpregressor():
    est = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(7,)), max_iter=1, random_state=3)
    reference = MLPRegressor(hidden_layer_sizes=(7,), max_iter=1, random_state=3)
    reference._random_state = np.random.RandomState(3)
    reference._initialize(Y.reshape(-1, 1), [4, 7, 1], np.float32)
    initial = est.set_params(learning_rate_init=1e-30).fit(X, Y).estimator_
    for mine, theirs in zip(
        initial.coefs_ + initial.intercepts_, reference.coefs_ + reference.intercepts_
    ):
        assert mine.dtype == np.float32
        np.testing.assert_allclose(mine, theirs, rtol=1e-6)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_conversion_keeps_no_copy_of_a_fitted_templates_arrays():
    import copy
    import gc
    import tracemalloc

    from onnxgrad_sklearn.templates import convert_template

    template = MLPRegressor(hidden_layer_sizes=(512, 512), max_iter=2, random_state=0).fit(X, Y)
    before = copy.deepcopy(template)
    weights = sum(c.nbytes for c in template.coefs_)
    convert_template(template, X.shape[1], np.float32)  # imports and caches out of the count
    gc.collect()
    gc.disable()  # what only the garbage collector would free counts too
    try:
        tracemalloc.start()
        conv = convert_template(template, X.shape[1], np.float32)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        gc.enable()
    # a deep copy kept _best_coefs and Adam's two moments (3 x the weights) in
    # skl2onnx's reference cycles; sharing the arrays keeps nothing but the converted
    # template's values (the graph's float32 copy of the parameters)
    assert held - sum(v.nbytes for v in conv.values) < 0.25 * weights
    # and nothing was written into the shared arrays
    pairs = [
        (template.coefs_ + template.intercepts_, before.coefs_ + before.intercepts_),
        (template._best_coefs, before._best_coefs),
        (
            template._optimizer.ms + template._optimizer.vs,
            before._optimizer.ms + before._optimizer.vs,
        ),
    ]
    for mine, theirs in pairs:
        for a, b in zip(mine, theirs):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(
        conv.initializer_values()[0], template.coefs_[0].astype(np.float32)
    )


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_a_converted_templates_copy_is_dataclasses_replace():
    """``ConvertedTemplate.copy`` gives what ``dataclasses.replace`` gives (the same
    fields, the arrays shared, the ONNX model made again from the copy's values)."""
    import dataclasses

    est = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(3,)), max_iter=1).fit(X, Y)
    conv = est._converted
    model = conv.model  # made and kept by the original
    values = [v * 2 for v in conv.values]
    for changes in ({}, {"values": values}):
        copied, replaced = conv.copy(**changes), dataclasses.replace(conv, **changes)
        assert type(copied) is ConvertedTemplate
        for field in dataclasses.fields(conv):
            assert getattr(copied, field.name) is getattr(replaced, field.name)
        assert "_model" not in copied.__dict__
        assert copied.model is not model
        got = {i.name: numpy_helper.to_array(i) for i in copied.model.graph.initializer}
        for name, value in zip(conv.initializer_names, copied.values):
            np.testing.assert_array_equal(got[name], value)
    assert conv.model is model and conv.values is not values


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_a_predict_session_takes_the_values_without_a_copy_of_its_own():
    """The values go to the runtime as they are (no NumPy copy first): onnxruntime
    copies them into the session, so a change made to them afterwards leaves what
    the session predicts as it was (and ``predict`` follows the fit, not later
    in-place edits of ``estimator_``)."""
    import gc
    import tracemalloc

    from onnxgrad_sklearn.runtime import session_options

    est = OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(256, 256)), max_iter=1, random_state=0
    ).fit(X, Y)
    conv = est._converted
    size = sum(v.nbytes for v in conv.values)
    expected = est.predict(X)
    gc.collect()
    tracemalloc.start()
    try:
        session = conv.session(session_options(1, spinning=False), ["CPUExecutionProvider"])
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < size / 10  # a copy made first would be the values' size
    for value in conv.values:
        value *= 2  # in place: the runtime's copy is not changed
    got = session.run(None, {session.get_inputs()[0].name: X})[0]
    np.testing.assert_array_equal(got.ravel(), expected.ravel())
    for value in conv.values:
        value /= 2
