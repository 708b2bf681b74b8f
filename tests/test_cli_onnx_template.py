"""The command line with an ONNX model as the template: ``fit --model PATH.onnx``
(--trainable, --frozen, --output), the files it writes and ``predict`` on them."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import onnx
import onnxruntime
import pytest
from _helpers import CLI_CLASSES, CLI_FEATURES, write_cli_tables
from onnx import TensorProto, helper, numpy_helper

from onnxgrad_sklearn import OnnxTemplate, OrtGradientClassifier, OrtGradientRegressor
from onnxgrad_sklearn.cli import main

pd = pytest.importorskip("pandas")

pytestmark = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::sklearn.exceptions.ConvergenceWarning"
)

FEATURES, CLASSES = CLI_FEATURES, CLI_CLASSES


# helpers ----------------------------------------------------------------------
def run_main(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _one_error_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("onnxgrad-sklearn: error: ")
    return lines[0]


def _load_skops(path):
    sio = pytest.importorskip("skops.io")
    from onnxgrad_sklearn._cli.common import trusted_types

    return sio.load(path, trusted=trusted_types())


def _run_onnx(path, X, input_name="features", output=None):
    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outputs = sess.run(None if output is None else [output], {input_name: X})
    return outputs[0]


def _init(model, name):
    return next(numpy_helper.to_array(i) for i in model.graph.initializer if i.name == name)


def _raw(model, name):
    return next(i.raw_data for i in model.graph.initializer if i.name == name)


def _model(nodes, inputs, outputs, inits):
    graph = helper.make_graph(nodes, "model", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def linear_model(n_in=4, dtype=np.float32, second_output=False):
    """y = features @ W + b (W small and random, b zero), with onnx.helper."""
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    rng = np.random.RandomState(1)
    inits = [
        numpy_helper.from_array((0.1 * rng.randn(n_in, 1)).astype(dtype), "W"),
        numpy_helper.from_array(np.zeros(1, dtype), "b"),
    ]
    nodes = [
        helper.make_node("MatMul", ["features", "W"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", elem, ["n", 1])]
    if second_output:  # a first output that is not the prediction
        nodes.append(helper.make_node("Neg", ["y"], ["neg"]))
        outputs.insert(0, helper.make_tensor_value_info("neg", elem, ["n", 1]))
    inputs = [helper.make_tensor_value_info("features", elem, ["n", n_in])]
    return _model(nodes, inputs, outputs, inits)


def mlp_model(n_in=4, hidden=8, n_out=3, activation="Softmax"):
    """A 2-layer MLP: Relu(features @ W1 + b1) @ W2 + b2, then ``activation``."""
    rng = np.random.RandomState(2)
    inits = [
        numpy_helper.from_array((0.5 * rng.randn(n_in, hidden)).astype(np.float32), "W1"),
        numpy_helper.from_array(np.zeros(hidden, np.float32), "b1"),
        numpy_helper.from_array((0.5 * rng.randn(hidden, n_out)).astype(np.float32), "W2"),
        numpy_helper.from_array(np.zeros(n_out, np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("MatMul", ["features", "W1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h"]),
        helper.make_node("MatMul", ["h", "W2"], ["z0"]),
        helper.make_node("Add", ["z0", "b2"], ["logits"]),
    ]
    out = "logits"
    if activation is not None:
        nodes.append(helper.make_node(activation, ["logits"], ["proba"], axis=-1))
        out = "proba"
    inputs = [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["n", n_in])]
    outputs = [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["n", n_out])]
    return _model(nodes, inputs, outputs, inits)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli_onnx")
    X, _, _ = write_cli_tables(folder, offset=3.0)
    binary = pd.DataFrame(X, columns=FEATURES)
    binary["sold"] = (X[:, 0] - X[:, 1] > 0).astype(int)
    binary.to_csv(folder / "bin.csv", index=False)
    onnx.save(linear_model(), folder / "lin.onnx")
    onnx.save(linear_model(n_in=3), folder / "lin3.onnx")
    onnx.save(linear_model(second_output=True), folder / "two.onnx")
    onnx.save(linear_model(dtype=np.float64), folder / "lin64.onnx")
    onnx.save(mlp_model(), folder / "mlp.onnx")
    onnx.save(mlp_model(n_out=1, activation=None), folder / "logit.onnx")
    return folder


REG = [
    "--target",
    "price",
    "--learning-rate",
    "0.05",
    "--batch-size",
    "20",
    "--random-state",
    "0",
    "--quiet",
]


@pytest.fixture(scope="module")
def fitted(data):
    """One regression fit of lin.onnx on all the rows, its files and printed text."""
    pytest.importorskip("skops")
    out, err = io.StringIO(), io.StringIO()
    argv = ["fit", "--data", data / "reg.csv", *REG, "--model", data / "lin.onnx"]
    argv += ["--epochs", "20", "--test-size", "0", "--out", data / "fit" / "lin.onnx"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])  # capsys is not there for a module fixture
    assert code == 0, err.getvalue()
    return data / "fit", out.getvalue()


# regression -------------------------------------------------------------------
def test_fit_trains_the_onnx_model_as_the_library_does(data, fitted):
    folder, out = fitted
    frame = pd.read_csv(data / "reg.csv")
    X, y = frame[FEATURES], frame["price"].to_numpy()
    assert "model: OnnxTemplate of" in out and "no StandardScaler in front" in out
    assert "input 'features' of shape (n, 4), float32; output 'y'" in out
    assert "target: raw (an ONNX model is trained as it is" in out
    est = _load_skops(folder / "lin.skops")
    assert type(est) is OrtGradientRegressor  # no TransformedTargetRegressor: raw target
    assert isinstance(est.estimator_, OnnxTemplate)
    assert list(est.feature_names_in_) == FEATURES
    # the same fit in Python: the CLI adds nothing (no scaler, no target scaling)
    original = onnx.load(data / "lin.onnx")
    same = OrtGradientRegressor(
        OnnxTemplate(original), loss="squared_error", optimizer="adam",
        learning_rate="constant", learning_rate_init=0.05, batch_size=20, max_iter=20,
        alpha=0.0001, random_state=0, dtype="float32",
    ).fit(X, y)  # fmt: skip
    np.testing.assert_allclose(est.predict(X), same.predict(X), rtol=1e-6, atol=1e-6)
    # the written ONNX is the user's graph, holding the trained weights
    written = onnx.load(folder / "lin.onnx")
    assert [i.name for i in written.graph.input] == ["features"]
    assert [o.name for o in written.graph.output] == ["y"]
    assert [n.op_type for n in written.graph.node] == ["MatMul", "Add"]
    np.testing.assert_array_equal(_init(written, "W"), est.estimator_.weights_["W"])
    assert not np.allclose(_init(written, "W"), _init(original, "W"), atol=0.1)
    pred = _run_onnx(folder / "lin.onnx", X.to_numpy(np.float32))
    np.testing.assert_allclose(pred.ravel(), est.predict(X), rtol=1e-6, atol=1e-6)
    assert np.abs(pred.ravel() - y).mean() < 0.5 * np.abs(y - y.mean()).mean()
    meta = {p.key: p.value for p in written.metadata_props}
    assert meta["feature_names"] == "a,b,c,d" and meta["prediction_output"] == "y"
    assert "target_scaling" not in meta and "output_activation" not in meta


def test_predict_feeds_the_models_own_input(data, fitted, capsys):
    folder, _ = fitted
    frame = pd.read_csv(data / "reg.csv")
    # columns in another order, the target and an unknown column present: taken by name
    frame[["price", "d", "b", "a", "c"]].assign(note="x").to_csv(data / "shuffled.csv", index=False)
    expected = _load_skops(folder / "lin.skops").predict(frame[FEATURES])
    for name in ("lin.onnx", "lin.skops"):  # the .skops file without --trust
        path = data / f"pred_{name}.csv"
        argv = ["predict", "--model", folder / name, "--data", data / "shuffled.csv"]
        code, out, err = run_main(capsys, *argv, "--out", path)
        assert code == 0, err
        table = pd.read_csv(path)
        assert list(table.columns) == ["prediction"]
        np.testing.assert_allclose(table["prediction"], expected, rtol=1e-6, atol=1e-6)


def test_frozen_weights_come_back_bit_for_bit(data, tmp_path, capsys):
    argv = ["fit", "--data", data / "reg.csv", *REG, "--model", data / "lin.onnx"]
    code, out, err = run_main(
        capsys, *argv, "--epochs", "5", "--frozen", "W", "--out", tmp_path / "f.onnx"
    )
    assert code == 0, err
    assert "trains 1 of its 2 floating-point initializers: 'b'; kept as they are: 'W'" in out
    original, written = onnx.load(data / "lin.onnx"), onnx.load(tmp_path / "f.onnx")
    assert _raw(written, "W") == _raw(original, "W")
    assert _init(written, "b")[0] > 1.0  # b trained towards the intercept, 3
    # --trainable b trains the same set
    code, out, err = run_main(
        capsys, *argv, "--epochs", "5", "--trainable", "b", "--out", tmp_path / "t.onnx"
    )
    assert code == 0, err
    trained = onnx.load(tmp_path / "t.onnx")
    assert _raw(trained, "W") == _raw(original, "W")
    np.testing.assert_array_equal(_init(trained, "b"), _init(written, "b"))


def test_output_names_the_prediction_among_the_outputs(data, tmp_path, capsys):
    argv = ["fit", "--data", data / "reg.csv", *REG, "--model", data / "two.onnx"]
    code, out, err = run_main(
        capsys, *argv, "--epochs", "10", "--output", "y", "--out", tmp_path / "two.onnx"
    )
    assert code == 0, err
    written = onnx.load(tmp_path / "two.onnx")
    assert [o.name for o in written.graph.output] == ["neg", "y"]  # all kept
    est = _load_skops(tmp_path / "two.skops")
    frame = pd.read_csv(data / "reg.csv")
    code, out, err = run_main(
        capsys, "predict", "--model", tmp_path / "two.onnx", "--data", data / "reg.csv"
    )
    assert code == 0, err
    predicted = pd.read_csv(io.StringIO(out))["prediction"].to_numpy()
    np.testing.assert_allclose(predicted, est.predict(frame[FEATURES]), rtol=1e-6, atol=1e-6)
    neg = _run_onnx(tmp_path / "two.onnx", frame[FEATURES].to_numpy(np.float32), output="neg")
    np.testing.assert_allclose(neg.ravel(), -predicted, rtol=1e-6)


def test_float64_model_trains_and_is_written_in_float64(data, tmp_path, capsys):
    argv = ["fit", "--data", data / "reg.csv", *REG, "--model", data / "lin64.onnx"]
    code, out, err = run_main(capsys, *argv, "--epochs", "3", "--out", tmp_path / "d.onnx")
    assert code == 0, err
    assert out.splitlines()[2].endswith(", float64")  # the model's own type by default
    written = onnx.load(tmp_path / "d.onnx")
    assert written.graph.input[0].type.tensor_type.elem_type == TensorProto.DOUBLE
    assert _init(written, "W").dtype == np.float64


def test_fine_tune_with_init_starts_from_the_trained_weights(data, fitted, tmp_path, capsys):
    folder, _ = fitted
    before = onnx.load(folder / "lin.onnx")
    argv = ["fit", "--data", data / "reg.csv", "--target", "price", "--init"]
    argv += [folder / "lin.skops", "--epochs", "1", "--learning-rate", "1e-9", "--quiet"]
    code, out, err = run_main(capsys, *argv, "--frozen", "b", "--out", tmp_path / "ft.onnx")
    assert code == 0, err
    assert "fine-tuned from" in out
    after = onnx.load(tmp_path / "ft.onnx")
    assert _raw(after, "b") == _raw(before, "b")  # --frozen b given to the --init model
    # from the trained weights (a step of 1e-9), not from lin.onnx's own
    np.testing.assert_allclose(_init(after, "W"), _init(before, "W"), atol=1e-6)


def test_a_written_model_trained_again_keeps_one_metadata_entry_per_key(
    data, fitted, tmp_path, capsys
):
    folder, _ = fitted
    argv = ["fit", "--data", data / "reg.csv", *REG, "--model", folder / "lin.onnx"]
    code, out, err = run_main(capsys, *argv, "--epochs", "2", "--out", tmp_path / "a.onnx")
    assert code == 0, err
    keys = [p.key for p in onnx.load(tmp_path / "a.onnx").metadata_props]
    assert sorted(keys) == sorted(set(keys)) and "feature_names" in keys


# classification ---------------------------------------------------------------
@pytest.mark.parametrize(
    "csv, target, model, classes",
    [("cls.csv", "kind", "mlp.onnx", CLASSES), ("bin.csv", "sold", "logit.onnx", [0, 1])],
)
def test_classifier_written_model_and_predict(data, tmp_path, capsys, csv, target, model, classes):
    argv = ["fit", "--data", data / csv, "--target", target, "--model", data / model]
    argv += ["--epochs", "30", "--learning-rate", "0.02", "--random-state", "0", "--quiet"]
    code, out, err = run_main(capsys, *argv, "--out", tmp_path / "c.onnx")
    assert code == 0, err
    assert "task: classification (auto)" in out and "target:" not in out
    est = _load_skops(tmp_path / "c.skops")
    assert type(est) is OrtGradientClassifier and list(est.classes_) == classes
    frame = pd.read_csv(data / csv)
    X, y = frame[FEATURES], frame[target].to_numpy()
    assert (est.predict(X) == y).mean() > 0.8
    # the written model's output: the Softmax's probabilities, or the one logit
    out_value = _run_onnx(tmp_path / "c.onnx", X.to_numpy(np.float32))
    if model == "mlp.onnx":
        np.testing.assert_allclose(out_value, est.predict_proba(X), atol=1e-5)
    else:
        np.testing.assert_allclose(out_value.ravel(), est.decision_function(X), atol=1e-5)
    path = tmp_path / "pred.csv"
    argv = ["predict", "--model", tmp_path / "c.onnx", "--data", data / csv, "--out", path]
    code, out, err = run_main(capsys, *argv)
    assert code == 0, err
    table = pd.read_csv(path)
    assert list(table.columns) == ["prediction"] + [f"proba_{c}" for c in classes]
    assert (table["prediction"].to_numpy() == est.predict(X)).all()
    np.testing.assert_allclose(table.iloc[:, 1:].to_numpy(), est.predict_proba(X), atol=1e-5)


# refusals ---------------------------------------------------------------------
def test_input_width_differs_from_the_feature_columns(data, tmp_path, capsys):
    argv = ["fit", "--data", data / "reg.csv", "--target", "price"]
    code, out, err = run_main(
        capsys, *argv, "--model", data / "lin3.onnx", "--out", tmp_path / "w.onnx"
    )
    assert code == 2
    line = _one_error_line(err)
    assert "takes 3 features (its input 'features' is (n, 3))" in line
    assert "has 4 feature columns" in line
    assert out == "" and not (tmp_path / "w.onnx").exists()  # refused before training


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--model", "lin.onnx", "--hidden", "8"], "--hidden applies to --model mlp only, not"),
        (["--model", "mlp", "--frozen", "W"], "--frozen applies to an ONNX model"),
        (["--model", "linear", "--output", "y"], "--output applies to an ONNX model"),
        (["--model", "lin.onnx", "--init", "x.skops"], "give one of them"),
        (["--model", "lin.onnx", "--frozen", "Q*"], "--frozen 'Q*' matches no floating-point"),
        (["--model", "lin.onnx", "--output", "z"], "--output 'z' is not an output"),
        (["--model", "nowhere.onnx"], "ONNX model file not found: nowhere.onnx"),
        (["--model", "reg.csv.onnx"], "ONNX model file not found"),
        (["--model", "forest"], "or the path of an ONNX model to train, ending with .onnx"),
    ],
)
def test_bad_flags(data, capsys, monkeypatch, flags, message):
    monkeypatch.chdir(data)
    code, out, err = run_main(capsys, "fit", "--data", "reg.csv", "--target", "price", *flags)
    assert code == 2
    assert message in _one_error_line(err)


def test_text_columns_and_unreadable_files_are_refused(data, tmp_path, capsys):
    frame = pd.read_csv(data / "reg.csv").drop(columns="d")
    frame.insert(0, "city", np.where(frame["a"] > 0, "Paris", "Rome"))
    frame.to_csv(tmp_path / "text.csv", index=False)
    argv = ["fit", "--data", tmp_path / "text.csv", "--target", "price"]
    code, out, err = run_main(capsys, *argv, "--model", data / "lin.onnx")
    assert code == 2
    assert "the feature columns 'city' are text" in _one_error_line(err)
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    argv = ["fit", "--data", data / "reg.csv", "--target", "price"]
    code, out, err = run_main(capsys, *argv, "--model", tmp_path / "junk.onnx")
    assert code == 2
    assert "cannot read the ONNX model in" in _one_error_line(err)


def test_help_documents_the_onnx_template(capsys):
    code, out, err = run_main(capsys, "fit", "--help")
    assert code == 0
    text = " ".join(out.split())
    assert "mlp|linear|PATH.onnx" in text
    assert "no StandardScaler in front" in text
    for flag in ("--trainable PATTERN", "--frozen PATTERN", "--output NAME"):
        assert flag in text, flag
