"""DataFrames end to end: a ColumnTransformer head on raw columns, one ONNX input per column."""

import pickle
import warnings

import numpy as np
import onnxruntime
import pytest
from sklearn.base import clone
from sklearn.compose import ColumnTransformer
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression, SGDRegressor
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder, OrdinalEncoder, StandardScaler

from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor

pd = pytest.importorskip("pandas")

COLUMNS = ["city", "size", "area", "rooms", "age"]
ONNX_TYPES = {
    "float32": [
        "tensor(string)",
        "tensor(string)",
        "tensor(float)",
        "tensor(int64)",
        "tensor(float)",
    ],
    "float64": [
        "tensor(string)",
        "tensor(string)",
        "tensor(double)",
        "tensor(int64)",
        "tensor(double)",
    ],
}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        yield


def _frame(n=240, seed=0):
    rng = np.random.RandomState(seed)
    frame = pd.DataFrame(
        {
            "city": rng.choice(["lille", "paris", "lyon"], n),
            "size": rng.choice(["s", "m", "l"], n),
            "area": rng.uniform(20, 120, n),
            "rooms": rng.randint(1, 6, n),
            "age": rng.rand(n),
        }
    )
    y = frame.area / 50 + frame.rooms / 3 + (frame.city == "paris") - (frame["size"] == "s")
    return frame, y.to_numpy() + 0.1 * rng.randn(n)


def _head():
    return ColumnTransformer(
        [
            ("onehot", OneHotEncoder(handle_unknown="ignore"), ["city"]),
            ("ordinal", OrdinalEncoder(), ["size"]),
            ("scale", StandardScaler(), ["area"]),
            ("keep", "passthrough", ["rooms", "age"]),
        ]
    )


def _onnx_run(model, frame, dtype):
    """Run an exported model with onnxruntime alone on the frame's raw columns."""
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    feed = {}
    for i in session.get_inputs():
        column = frame[i.name]
        if i.type == "tensor(string)":
            feed[i.name] = column.to_numpy(dtype=object).reshape(-1, 1)
        elif i.type == "tensor(int64)":
            feed[i.name] = column.to_numpy(dtype=np.int64).reshape(-1, 1)
        else:
            feed[i.name] = column.to_numpy(dtype=dtype).reshape(-1, 1)
    return session, session.run(None, feed)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_regressor_on_raw_columns_exports_one_input_per_column(dtype):
    frame, y = _frame()
    template = Pipeline([("prep", _head()), ("mlp", MLPRegressor(hidden_layer_sizes=(8,)))])
    reg = OrtGradientRegressor(
        template,
        optimizer="adam",
        learning_rate_init=0.01,
        max_iter=30,
        random_state=0,
        dtype=dtype,
    ).fit(frame, y)
    assert list(reg.feature_names_in_) == COLUMNS and reg.n_features_in_ == 5
    assert not hasattr(template[0], "transformers_")  # the template is not modified
    assert reg.score(frame, y) > 0.8

    model = reg.to_onnx()
    session, (onnx_pred,) = _onnx_run(model, frame, dtype)
    assert [i.name for i in session.get_inputs()] == COLUMNS
    assert [i.type for i in session.get_inputs()] == ONNX_TYPES[dtype]
    assert all(i.shape[1] == 1 for i in session.get_inputs())
    pred = reg.predict(frame)
    tol = 1e-6 if dtype == "float32" else 1e-13
    np.testing.assert_allclose(onnx_pred.ravel(), pred, rtol=tol, atol=tol)
    # the head in scikit-learn and the trained weights give the same predictions
    np.testing.assert_allclose(reg.estimator_.predict(frame), pred, rtol=10 * tol, atol=10 * tol)
    assert list(reg.estimator_.named_steps) == ["prep", "mlp"]


def test_trains_the_final_model_on_the_head_output():
    """The frozen head's output is what the final model trains on: the same weights as
    the final model alone on the head's output, from the same seed."""
    frame, y = _frame()
    params = dict(optimizer="adam", learning_rate_init=0.01, max_iter=5, random_state=3)
    mlp = MLPRegressor(hidden_layer_sizes=(6,))
    on_frame = OrtGradientRegressor(Pipeline([("prep", _head()), ("mlp", mlp)]), **params)
    on_frame.fit(frame, y)
    Xt = _head().fit_transform(frame)
    alone = OrtGradientRegressor(clone(mlp), **params).fit(Xt, y)
    for a, b in zip(on_frame.estimator_[-1].coefs_, alone.estimator_.coefs_):
        np.testing.assert_array_equal(a, b)
    assert on_frame.loss_curve_ == alone.loss_curve_


@pytest.mark.parametrize("final", [MLPClassifier(hidden_layer_sizes=(8,)), LogisticRegression()])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_classifier_on_raw_columns_probabilities_equal_the_onnx_ones(final, dtype):
    frame, y = _frame()
    labels = np.where(y > np.median(y), "high", "low").astype(object)
    labels[frame.city == "lyon"] = "lyon"
    clf = OrtGradientClassifier(
        Pipeline([("prep", _head()), ("model", final)]),
        optimizer="adam",
        learning_rate_init=0.05,
        max_iter=40,
        random_state=0,
        dtype=dtype,
    ).fit(frame, labels)
    assert list(clf.classes_) == ["high", "low", "lyon"]
    assert clf.score(frame, labels) > 0.8
    session, (onnx_labels, onnx_proba) = _onnx_run(clf.to_onnx(), frame, dtype)
    assert [i.name for i in session.get_inputs()] == COLUMNS
    # predict_proba: the head in scikit-learn, then the trained graph's logits
    tol = 1e-6 if dtype == "float32" else 1e-13
    np.testing.assert_allclose(onnx_proba, clf.predict_proba(frame), rtol=tol, atol=tol)
    np.testing.assert_array_equal(onnx_labels.ravel(), clf.predict(frame))
    np.testing.assert_allclose(
        clf.estimator_.predict_proba(frame), clf.predict_proba(frame), atol=tol
    )


def test_partial_fit_on_frames_with_a_fitted_head():
    frame, y = _frame(300)
    head = _head().fit(frame)
    template = Pipeline([("prep", head), ("sgd", SGDRegressor())])
    params = dict(optimizer="adam", learning_rate_init=0.01, random_state=0)
    reg = OrtGradientRegressor(template, **params)
    ref = OrtGradientRegressor(SGDRegressor(), **params)
    for rows in (slice(0, 100), slice(100, 200), slice(200, 300)):
        reg.partial_fit(frame[rows], y[rows])
        ref.partial_fit(head.transform(frame[rows]), y[rows])
    np.testing.assert_array_equal(reg.estimator_[-1].coef_, ref.estimator_.coef_)
    np.testing.assert_array_equal(reg.estimator_[-1].intercept_, ref.estimator_.intercept_)
    _, (onnx_pred,) = _onnx_run(reg.to_onnx(), frame, np.float32)
    np.testing.assert_allclose(onnx_pred.ravel(), reg.predict(frame), rtol=1e-6)
    # an unfitted head would see the first chunk only
    with pytest.raises(ValueError, match="partial_fit cannot fit the preprocessing"):
        OrtGradientRegressor(Pipeline([("prep", _head()), ("sgd", SGDRegressor())])).partial_fit(
            frame, y
        )


def test_inputs_that_are_not_the_fitted_frame_are_refused():
    frame, y = _frame()
    reg = OrtGradientRegressor(
        Pipeline([("prep", _head()), ("sgd", SGDRegressor())]), optimizer="adam", max_iter=3
    ).fit(frame, y)
    before = reg.predict(frame)
    with pytest.raises(ValueError, match="pass a DataFrame with these columns"):
        reg.predict(frame.to_numpy())
    with pytest.raises(ValueError, match="feature names"):
        reg.predict(frame[COLUMNS[::-1]])
    with pytest.raises(ValueError, match="feature names"):
        reg.predict(frame.drop(columns="age"))
    np.testing.assert_array_equal(reg.predict(frame), before)
    with pytest.raises(ValueError, match="string column names"):
        OrtGradientRegressor(
            Pipeline(
                [("prep", ColumnTransformer([("s", StandardScaler(), [0])])), ("m", SGDRegressor())]
            )
        ).fit(frame[["area"]].set_axis([0], axis=1), y)


def test_saved_and_reexported_in_the_other_dtype():
    skops_io = pytest.importorskip("skops.io")
    from onnxgrad_sklearn import SKOPS_TRUSTED_TYPES

    frame, y = _frame()
    reg = OrtGradientRegressor(
        Pipeline([("prep", _head()), ("mlp", MLPRegressor(hidden_layer_sizes=(4,)))]),
        optimizer="adam",
        max_iter=5,
        random_state=0,
    ).fit(frame, y)
    pred = reg.predict(frame)
    again = pickle.loads(pickle.dumps(reg))
    np.testing.assert_array_equal(again.predict(frame), pred)
    loaded = skops_io.loads(skops_io.dumps(reg), trusted=SKOPS_TRUSTED_TYPES)
    np.testing.assert_array_equal(loaded.predict(frame), pred)
    session, (double_pred,) = _onnx_run(reg.to_onnx(dtype="float64"), frame, np.float64)
    assert [i.type for i in session.get_inputs()] == ONNX_TYPES["float64"]
    np.testing.assert_allclose(double_pred.ravel(), pred, rtol=1e-5, atol=1e-6)


def test_numeric_frame_through_a_scaler_keeps_the_one_matrix_input():
    frame, y = _frame()
    numeric = frame[["area", "rooms", "age"]]
    reg = OrtGradientRegressor(
        Pipeline([("scale", StandardScaler()), ("sgd", SGDRegressor())]), max_iter=3
    ).fit(numeric, y)
    assert [i.name for i in reg.to_onnx().graph.input] == ["X"]
    assert list(reg.feature_names_in_) == ["area", "rooms", "age"]


def test_a_sparse_head_output_trains_as_the_final_model_on_it():
    """A ColumnTransformer whose output is sparse: the final model trains on the CSR
    matrix (densified one batch at a time), as it would alone on it."""
    frame, y = _frame()
    frame = frame.assign(code=np.char.add("c", (np.arange(len(frame)) % 40).astype(str)))
    head = ColumnTransformer(
        [("onehot", OneHotEncoder(handle_unknown="ignore"), ["city", "code"])],
        remainder="drop",
        sparse_threshold=1.0,
    )
    params = dict(optimizer="adam", learning_rate_init=0.01, max_iter=5, random_state=0)
    reg = OrtGradientRegressor(Pipeline([("prep", head), ("sgd", SGDRegressor())]), **params)
    reg.fit(frame, y)
    Xt = clone(head).fit_transform(frame)
    assert Xt.format == "csr" and Xt.shape[1] == 43
    alone = OrtGradientRegressor(SGDRegressor(), **params).fit(Xt, y)
    np.testing.assert_array_equal(reg.estimator_[-1].coef_, alone.estimator_.coef_)
    _, (onnx_pred,) = _onnx_run(reg.to_onnx(), frame, np.float32)
    np.testing.assert_allclose(onnx_pred.ravel(), reg.predict(frame), rtol=1e-6, atol=1e-6)
    assert [i.name for i in reg.to_onnx().graph.input] == COLUMNS + ["code"]


def test_missing_values_in_text_columns_are_encoded_as_scikit_learn_encodes_them():
    frame, y = _frame()
    frame["city"] = frame["city"].astype(object)  # "size" keeps pandas' own text dtype
    frame.loc[::9, "city"] = np.nan
    frame.loc[4, "city"] = None
    frame.loc[::7, "size"] = np.nan
    missing = frame["city"].isna().to_numpy()
    y = y + 2.0 * missing
    head = ColumnTransformer(
        [
            ("onehot", OneHotEncoder(handle_unknown="ignore"), ["city"]),
            ("ordinal", OrdinalEncoder(encoded_missing_value=-1), ["size"]),
            ("scale", StandardScaler(), ["area"]),
            ("keep", "passthrough", ["rooms", "age"]),
        ]
    )
    template = Pipeline([("prep", head), ("mlp", MLPRegressor(hidden_layer_sizes=(8,)))])
    reg = OrtGradientRegressor(template, max_iter=30, random_state=0).fit(frame, y)
    categories = reg.estimator_[0].named_transformers_["onehot"].categories_[0]
    assert pd.isna(categories[-1])  # scikit-learn's category of its own for missing values
    predicted = reg.predict(frame)
    np.testing.assert_allclose(predicted, reg.estimator_.predict(frame), rtol=1e-5, atol=1e-5)
    _, (exported,) = _onnx_run(reg.to_onnx(), frame, np.float32)
    np.testing.assert_allclose(exported.ravel(), predicted, rtol=1e-5, atol=1e-5)
    # a missing city is its category, not an unknown one (which one-hot encodes as zeros)
    unknown = frame.copy()
    unknown.loc[missing, "city"] = "rennes"
    assert np.abs(reg.predict(unknown)[missing] - predicted[missing]).min() > 1e-3
