import io
import os
import pickle
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from _helpers import CLI_FEATURES, write_cli_tables
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import mean_absolute_error, r2_score
from sklearn.neural_network import MLPRegressor

from onnxgrad_sklearn.cli import build_parser, infer_task, main

pd = pytest.importorskip("pandas")

ROOT = Path(__file__).resolve().parents[1]
FEATURES = CLI_FEATURES
FIT_FLAGS = [
    "--data",
    "--target",
    "--model",
    "--init",
    "--trust",
    "--hidden",
    "--trainable",
    "--frozen",
    "--output",
    "--task",
    "--loss",
    "--quantile",
    "--epsilon",
    "--no-scale-target",
    "--optimizer",
    "--learning-rate",
    "--batch-size",
    "--epochs",
    "--alpha",
    "--dtype",
    "--random-state",
    "--test-size",
    "--out",
    "--plot",
    "--verbose",
    "--quiet",
]


def _command():
    """The installed console script next to this interpreter, else ``python -m``."""
    script = shutil.which("onnxgrad-sklearn", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "onnxgrad_sklearn.cli"]


def run_cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="100")
    return subprocess.run(
        [*_command(), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def run_main(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _metric(out, name):
    """The values of one row of the metrics table (train, then test if any)."""
    match = re.search(rf"^{re.escape(name)}((?:[ ]+\S+)+)[ ]*$", out, flags=re.MULTILINE)
    assert match, f"no {name!r} row in:\n{out}"
    return [float(v) for v in match.group(1).split()]


def _one_error_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("onnxgrad-sklearn: error: ")
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    X, frame, rng = write_cli_tables(folder)
    text = frame.copy()
    text.insert(1, "city", rng.choice(["Paris", "Rome"], 200))
    text.to_csv(folder / "text.csv", index=False)
    return folder


# subprocesses: the command as users run it ------------------------------------
@pytest.mark.slow
def test_fit_regression_writes_onnx_png_and_metrics(data):
    pytest.importorskip("matplotlib")  # the PNG
    result = run_cli(
        "fit",
        "--data",
        "reg.csv",
        "--target",
        "price",
        "--hidden",
        "16,8",
        "--learning-rate",
        "0.02",
        "--epochs",
        "40",
        "--random-state",
        "0",
        "--out",
        "out/price.onnx",
        cwd=data,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    # the progress bar (tqdm, unit "epoch") goes to stderr by default
    assert re.search(r"epoch/s|s/epoch", result.stderr), result.stderr
    assert "40/40" in result.stderr
    out = result.stdout
    assert "task: regression (auto)" in out
    assert "MLPRegressor(hidden_layer_sizes=(16, 8))" in out
    assert "160 training rows, 40 test rows" in out
    r2_train, r2_test = _metric(out, "R2")
    mae_train, mae_test = _metric(out, "MAE")
    assert 0.8 < r2_train <= 1 and 0.7 < r2_test <= 1, out
    assert 0 < mae_train < 1 and 0 < mae_test < 1.5, out

    onnx_path = data / "out" / "price.onnx"
    png_path = data / "out" / "price.png"
    assert f"ONNX model written to {onnx_path}" in out
    assert f"loss curve written to {png_path}" in out
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sess = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["X"]
    X = pd.read_csv(data / "reg.csv")[FEATURES].to_numpy(np.float32)
    (pred,) = sess.run(None, {"X": X[:7]})
    assert pred.shape == (7, 1)
    assert np.all(np.isfinite(pred))


@pytest.mark.slow
def test_fit_classification_with_string_labels(data):
    result = run_cli(
        "fit",
        "--data",
        "cls.csv",
        "--target",
        "kind",
        "--learning-rate",
        "0.02",
        "--epochs",
        "25",
        "--random-state",
        "0",
        "--out",
        "kind.onnx",
        "--quiet",
        cwd=data,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "task: classification (auto), 3 classes: 'cat', 'dog', 'fish'" in out
    acc_train, acc_test = _metric(out, "accuracy")
    loss_train, loss_test = _metric(out, "log-loss")
    assert 0.85 <= acc_train <= 1 and 0.8 <= acc_test <= 1, out
    assert 0 < loss_train < 0.7 and 0 < loss_test < 0.8, out
    assert "epoch" not in result.stderr  # --quiet: no progress bar
    sess = onnxruntime.InferenceSession(str(data / "kind.onnx"), providers=["CPUExecutionProvider"])
    X = pd.read_csv(data / "cls.csv")[FEATURES].to_numpy(np.float32)
    labels, proba = sess.run(None, {"X": X[:5]})
    assert set(labels) <= {"cat", "dog", "fish"}
    assert proba.shape == (5, 3)


def test_bad_flag_is_one_line_exit_2(data):
    result = run_cli("fit", "--data", "reg.csv", "--target", "price", "--epoch", "x", cwd=data)
    assert result.returncode == 2
    line = _one_error_line(result.stderr)
    assert "--epoch" in line or "--epochs" in line
    assert result.stdout == ""


def test_missing_file_is_one_line_exit_2(data):
    result = run_cli("fit", "--data", "nowhere.csv", "--target", "price", cwd=data)
    assert result.returncode == 2
    assert (
        _one_error_line(result.stderr)
        == "onnxgrad-sklearn: error: data file not found: nowhere.csv"
    )


@pytest.mark.slow
def test_fine_tune_pickled_mlp(data):
    frame = pd.read_csv(data / "reg.csv")
    X, y = frame[FEATURES].to_numpy(), frame["price"].to_numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp = MLPRegressor(hidden_layer_sizes=(8,), max_iter=30, random_state=0).fit(X, y)
    with open(data / "mlp.pkl", "wb") as f:
        pickle.dump(mlp, f)
    result = run_cli(
        "fit",
        "--data",
        "reg.csv",
        "--target",
        "price",
        "--init",
        "mlp.pkl",
        "--epochs",
        "5",
        "--test-size",
        "0",
        "--random-state",
        "0",
        "--out",
        "tuned.onnx",
        "--quiet",
        cwd=data,
    )
    assert result.returncode == 0, result.stderr
    assert "MLPRegressor(hidden_layer_sizes=(8,)), fine-tuned from mlp.pkl" in result.stdout
    # with --test-size 0 the printed train metrics are those of the written file on all rows
    sess = onnxruntime.InferenceSession(
        str(data / "tuned.onnx"), providers=["CPUExecutionProvider"]
    )
    pred = sess.run(None, {"X": X.astype(np.float32)})[0].ravel()
    (r2,) = _metric(result.stdout, "R2")
    (mae,) = _metric(result.stdout, "MAE")
    assert r2 == pytest.approx(r2_score(y, pred), abs=1e-4)
    assert mae == pytest.approx(mean_absolute_error(y, pred), rel=1e-4)
    # and they differ from the pickled model's: its weights were trained further
    assert mae != pytest.approx(mean_absolute_error(y, mlp.predict(X)), rel=1e-3)


# save, fine-tune and predict (subprocesses) -----------------------------------
def _onnx_predict(path, X):
    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {"X": np.asarray(X, dtype=np.float32)})


def _load_skops(path):
    sio = pytest.importorskip("skops.io")
    import onnxgrad_sklearn

    return sio.load(path, trusted=onnxgrad_sklearn.SKOPS_TRUSTED_TYPES)


@pytest.fixture(scope="module")
def saved(data):
    """One regression fit (target scaled, the default), its ONNX and .skops files."""
    pytest.importorskip("skops")
    result = run_cli(
        "fit",
        "--data",
        "reg.csv",
        "--target",
        "price",
        "--hidden",
        "8",
        "--learning-rate",
        "0.02",
        "--batch-size",
        "32",
        "--epochs",
        "20",
        "--random-state",
        "0",
        "--out",
        "saved/price.onnx",
        "--quiet",
        cwd=data,
    )
    assert result.returncode == 0, result.stderr
    return data / "saved", result.stdout


def test_fit_saves_estimator_with_target_scaling(data, saved):
    folder, out = saved
    frame = pd.read_csv(data / "reg.csv")
    y = frame["price"].to_numpy()
    assert "target: standardised for training" in out
    assert f"estimator written to {folder / 'price.skops'}" in out
    model = _load_skops(folder / "price.skops")
    from sklearn.compose import TransformedTargetRegressor

    from onnxgrad_sklearn import OrtGradientRegressor

    assert isinstance(model, TransformedTargetRegressor)
    assert isinstance(model.regressor_, OrtGradientRegressor)
    assert list(model.feature_names_in_) == FEATURES
    # the scaler is of the training rows, so close to, not equal to, all rows'
    assert model.transformer_.mean_[0] == pytest.approx(y.mean(), abs=0.3)
    assert model.transformer_.scale_[0] == pytest.approx(y.std(), rel=0.1)
    # the ONNX model takes raw columns and returns raw targets, as the estimator does
    pred = model.predict(frame[FEATURES])
    (onnx_pred,) = _onnx_predict(folder / "price.onnx", frame[FEATURES])
    np.testing.assert_allclose(onnx_pred.ravel(), pred, rtol=1e-5, atol=1e-5)
    assert r2_score(y, pred) > 0.8
    # and the inner model predicts the standardised target
    inner = model.regressor_.predict(frame[FEATURES])
    assert abs(inner.mean()) < 0.3 and 0.7 < inner.std() < 1.3
    import onnx

    meta = {p.key: p.value for p in onnx.load(folder / "price.onnx").metadata_props}
    assert meta["feature_names"] == "a,b,c,d"
    assert meta["target"] == "price"
    assert [o.name for o in onnx.load(folder / "price.onnx").graph.output] == ["variable"]


@pytest.mark.slow
def test_predict_from_onnx_and_skops_by_column_name(data, saved):
    folder, _ = saved
    frame = pd.read_csv(data / "reg.csv")
    # columns in another order, the target and an unknown column present: taken by name
    shuffled = frame[["price", "d", "b", "a", "c"]].assign(note="x")
    shuffled.to_csv(data / "shuffled.csv", index=False)
    expected = _load_skops(folder / "price.skops").predict(frame[FEATURES])
    predictions = {}
    for name in ("price.onnx", "price.skops"):
        result = run_cli(
            "predict",
            "--model",
            f"saved/{name}",
            "--data",
            "shuffled.csv",
            "--out",
            f"pred_{name}.csv",
            cwd=data,
        )
        assert result.returncode == 0, result.stderr
        assert "predictions of 200 rows written to" in result.stdout
        table = pd.read_csv(data / f"pred_{name}.csv")
        assert list(table.columns) == ["prediction"]
        predictions[name] = table["prediction"].to_numpy()
        np.testing.assert_allclose(predictions[name], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        predictions["price.onnx"], predictions["price.skops"], rtol=1e-5, atol=1e-5
    )


def test_predict_missing_column_is_one_line_exit_2(data, saved):
    pd.read_csv(data / "reg.csv").drop(columns=["b"]).to_csv(data / "no_b.csv", index=False)
    result = run_cli("predict", "--model", "saved/price.onnx", "--data", "no_b.csv", cwd=data)
    assert result.returncode == 2
    line = _one_error_line(result.stderr)
    assert "feature column 'b' is missing from no_b.csv" in line
    assert "'a', 'b', 'c', 'd'" in line
    assert result.stdout == ""


@pytest.mark.slow
def test_fine_tune_saved_estimator_with_init(data, saved):
    folder, _ = saved
    result = run_cli(
        "fit",
        "--data",
        "reg.csv",
        "--target",
        "price",
        "--init",
        "saved/price.skops",
        "--learning-rate",
        "1e-7",
        "--epochs",
        "1",
        "--test-size",
        "0",
        "--out",
        "tuned/price.onnx",
        "--quiet",
        cwd=data,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "fine-tuned from saved/price.skops" in out
    assert "target: the --init model's scaling" in out
    X = pd.read_csv(data / "reg.csv")[FEATURES]
    (before,) = _onnx_predict(folder / "price.onnx", X)
    (after,) = _onnx_predict(data / "tuned" / "price.onnx", X)
    # one epoch at a tiny rate starts from the saved weights and scaling: nearly the same
    assert 0 < np.max(np.abs(after - before)) < 1e-3
    tuned = _load_skops(data / "tuned" / "price.skops")
    np.testing.assert_allclose(tuned.predict(X), after.ravel(), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_quantile_flag_moves_the_share_below(data):
    # a noisy target, so that its quantiles are far apart
    rng = np.random.RandomState(1)
    X = rng.randn(400, 2)
    frame = pd.DataFrame(X, columns=["a", "b"]).assign(y=X @ [1.0, -0.5] + rng.randn(400))
    frame.to_csv(data / "noisy.csv", index=False)
    shares = {}
    for q in (0.1, 0.9):
        result = run_cli(
            "fit",
            "--data",
            "noisy.csv",
            "--target",
            "y",
            "--model",
            "linear",
            "--quantile",
            q,
            "--learning-rate",
            "0.01",
            "--batch-size",
            "32",
            "--epochs",
            "30",
            "--test-size",
            "0",
            "--random-state",
            "0",
            "--out",
            f"q{q}.onnx",
            "--quiet",
            cwd=data,
        )
        assert result.returncode == 0, result.stderr
        assert f"loss quantile (quantile={q})" in result.stdout
        (pred,) = _onnx_predict(data / f"q{q}.onnx", X)
        shares[q] = np.mean(frame["y"].to_numpy() < pred.ravel())
    assert shares[0.1] == pytest.approx(0.1, abs=0.04), shares
    assert shares[0.9] == pytest.approx(0.9, abs=0.04), shares


# in-process: the same main() without the start-up cost -----------------------
def test_help_documents_every_flag(capsys):
    code, out, err = run_main(capsys, "fit", "--help")
    assert code == 0
    for flag in FIT_FLAGS:
        assert flag in out, flag
    assert "at most 20 distinct values" in " ".join(out.split())  # the --task auto rule
    fit_parser = build_parser()._subparsers._group_actions[0].choices["fit"]
    for action in fit_parser._actions:
        assert action.help, action.option_strings
    assert {s for a in fit_parser._actions for s in a.option_strings} == {
        "-h",
        "--help",
        *FIT_FLAGS,
    }


def test_missing_target_column(data, capsys):
    code, out, err = run_main(capsys, "fit", "--data", data / "reg.csv", "--target", "prize")
    assert code == 2
    line = _one_error_line(err)
    assert "target column 'prize' not found" in line
    assert "did you mean 'price'?" in line


def _onnx_run_columns(path, frame):
    """Run an ONNX model of one input per column on the raw columns of ``frame``."""
    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {}
    for i in sess.get_inputs():
        column = frame[i.name]
        if i.type == "tensor(string)":
            feed[i.name] = column.astype(str).to_numpy(dtype=object).reshape(-1, 1)
        else:
            dtype = np.float64 if i.type == "tensor(double)" else np.float32
            feed[i.name] = column.to_numpy(dtype=dtype).reshape(-1, 1)
    return sess, sess.run(None, feed)


@pytest.fixture(scope="module")
def text_data(data):
    """A CSV whose target depends on a text column, 'city', as much as on the numbers."""
    rng = np.random.RandomState(1)
    X = rng.randn(300, 2)
    city = rng.choice(["Paris", "Rome", "Oslo"], 300)
    frame = pd.DataFrame({"a": X[:, 0], "city": city, "b": X[:, 1]})
    frame["price"] = X @ [1.0, -1.0] + 3.0 * (city == "Paris") - 2.0 * (city == "Oslo")
    frame["kind"] = np.where(frame.price > frame.price.median(), "dear", "cheap")
    frame.drop(columns="kind").to_csv(data / "text_price.csv", index=False)
    frame.drop(columns="price").to_csv(data / "text_kind.csv", index=False)
    # another order, the target, an unknown column, and a city unseen in training
    new = frame[["price", "b", "city", "a"]].assign(note="x")
    new.loc[:4, "city"] = "Lima"
    new.to_csv(data / "text_new.csv", index=False)
    return frame


@pytest.mark.slow
def test_text_columns_one_hot_encoded_inside_the_model(data, text_data):
    """fit encodes 'city' in the model, the ONNX model takes the raw columns by name,
    predict gives the same from the ONNX file and from the saved estimator, and a
    fine-tuned model keeps the encoding."""
    pytest.importorskip("skops")
    result = run_cli(
        "fit",
        "--data",
        "text_price.csv",
        "--target",
        "price",
        "--learning-rate",
        "0.01",
        "--epochs",
        "40",
        "--random-state",
        "0",
        "--out",
        "text/price.onnx",
        "--quiet",
        cwd=data,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "text columns one-hot encoded in the model: 'city'" in out
    assert "3 inputs of shape (n, 1), one per column: 'a': float32, 'city': string" in out
    # without the city the best R2 is about 0.4: the model uses the encoded column
    assert _metric(out, "R2")[1] > 0.9
    model = _load_skops(data / "text" / "price.skops")
    assert list(model.feature_names_in_) == ["a", "city", "b"]
    X = text_data[["a", "city", "b"]]
    sess, (onnx_pred,) = _onnx_run_columns(data / "text" / "price.onnx", X)
    assert [(i.name, i.type) for i in sess.get_inputs()] == [
        ("a", "tensor(float)"),
        ("city", "tensor(string)"),
        ("b", "tensor(float)"),
    ]
    np.testing.assert_allclose(onnx_pred.ravel(), model.predict(X), rtol=1e-5, atol=1e-5)

    predictions = {}
    for name in ("price.onnx", "price.skops"):
        result = run_cli("predict", "--model", f"text/{name}", "--data", "text_new.csv", cwd=data)
        assert result.returncode == 0, result.stderr
        predictions[name] = pd.read_csv(io.StringIO(result.stdout))["prediction"].to_numpy()
    new = pd.read_csv(data / "text_new.csv")
    expected = model.predict(new[["a", "city", "b"]])
    for name, pred in predictions.items():
        np.testing.assert_allclose(pred, expected, rtol=1e-5, atol=1e-5, err_msg=name)
    # the unseen city 'Lima' is encoded as no known city: between Oslo's and Paris's
    lima = new.assign(city="Lima")[["a", "city", "b"]].iloc[:5]
    paris, oslo = lima.assign(city="Paris"), lima.assign(city="Oslo")
    assert np.all(model.predict(oslo) < predictions["price.onnx"][:5])
    assert np.all(predictions["price.onnx"][:5] < model.predict(paris))

    result = run_cli(
        "fit",
        "--data",
        "text_price.csv",
        "--target",
        "price",
        "--init",
        "text/price.skops",
        "--learning-rate",
        "1e-7",
        "--epochs",
        "1",
        "--test-size",
        "0",
        "--out",
        "text/tuned.onnx",
        "--quiet",
        cwd=data,
    )
    assert result.returncode == 0, result.stderr
    _, (tuned,) = _onnx_run_columns(data / "text" / "tuned.onnx", X)
    assert 0 < np.max(np.abs(tuned - onnx_pred)) < 1e-3


@pytest.mark.slow
def test_text_columns_classifier_in_float64(data, text_data):
    pytest.importorskip("skops")
    result = run_cli(
        "fit",
        "--data",
        "text_kind.csv",
        "--target",
        "kind",
        "--model",
        "linear",
        "--dtype",
        "float64",
        "--learning-rate",
        "0.05",
        "--epochs",
        "50",
        "--random-state",
        "0",
        "--out",
        "text/kind.onnx",
        "--quiet",
        cwd=data,
    )
    assert result.returncode == 0, result.stderr
    assert "'a': float64, 'city': string, 'b': float64" in result.stdout
    assert _metric(result.stdout, "accuracy")[1] > 0.9
    model = _load_skops(data / "text" / "kind.skops")
    assert model.estimator_[-1].coef_.dtype == np.float64
    X = text_data[["a", "city", "b"]]
    _, (labels, proba) = _onnx_run_columns(data / "text" / "kind.onnx", X)
    np.testing.assert_allclose(proba, model.predict_proba(X), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(labels.ravel(), model.predict(X))
    tables = {}
    for name in ("kind.onnx", "kind.skops"):
        result = run_cli("predict", "--model", f"text/{name}", "--data", "text_new.csv", cwd=data)
        assert result.returncode == 0, result.stderr
        tables[name] = pd.read_csv(io.StringIO(result.stdout))
        assert list(tables[name].columns) == ["prediction", "proba_cheap", "proba_dear"]
    pd.testing.assert_frame_equal(tables["kind.onnx"], tables["kind.skops"], rtol=1e-12)


def test_missing_text_values_are_refused(data, text_data, capsys):
    missing = text_data.drop(columns="kind").assign(city=text_data.city.where(text_data.index > 2))
    missing.to_csv(data / "text_missing.csv", index=False)
    code, out, err = run_main(
        capsys, "fit", "--data", data / "text_missing.csv", "--target", "price"
    )
    assert code == 2
    assert "feature column 'city' has 3 missing values" in _one_error_line(err)


def test_unreadable_csv(tmp_path, capsys):
    path = tmp_path / "broken.csv"
    path.write_bytes(b'a,b\n1,2\n"open quote\n')
    code, out, err = run_main(capsys, "fit", "--data", path, "--target", "a")
    assert code == 2
    assert f"cannot read CSV file {path}" in _one_error_line(err)


def test_missing_feature_values(tmp_path, capsys):
    path = tmp_path / "holes.csv"
    path.write_text("a,b,price\n1,,3\n2,5,6\n3,4,\n")
    code, out, err = run_main(capsys, "fit", "--data", path, "--target", "price")
    assert code == 2
    assert "feature column 'b' has 1 missing values" in _one_error_line(err)


def test_loss_must_match_task(data, capsys):
    argv = ["fit", "--data", data / "reg.csv", "--target", "price", "--loss", "log_loss"]
    code, out, err = run_main(capsys, *argv)
    assert code == 2
    assert "--loss log_loss does not apply to regression" in _one_error_line(err)


def test_skops_untrusted_types_are_refused(data, tmp_path, capsys):
    sio = pytest.importorskip("skops.io")
    frame = pd.read_csv(data / "reg.csv")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp = MLPRegressor(hidden_layer_sizes=(4,), max_iter=3).fit(
            frame[FEATURES].to_numpy(), frame["price"]
        )
    path = tmp_path / "mlp.skops"
    sio.dump(mlp, path)
    untrusted = sio.get_untrusted_types(file=path)
    assert untrusted  # the MLP's optimizer state is not trusted by default
    argv = ["fit", "--data", data / "reg.csv", "--target", "price", "--init", path]
    argv += ["--epochs", "2", "--quiet", "--out", tmp_path / "m.onnx"]
    code, out, err = run_main(capsys, *argv)
    assert code == 2
    line = _one_error_line(err)
    assert "--trust" in line and untrusted[0] in line
    assert not (tmp_path / "m.onnx").exists()
    code, out, err = run_main(capsys, *argv, "--trust")
    assert code == 0, err
    assert "fine-tuned from" in out and (tmp_path / "m.onnx").exists()


def test_png_skipped_without_matplotlib(data, tmp_path, capsys, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)  # an import of any of them now fails
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    argv = ["fit", "--data", data / "reg.csv", "--target", "price", "--model", "linear"]
    argv += ["--epochs", "2", "--quiet", "--out", tmp_path / "lin.onnx"]
    code, out, err = run_main(capsys, *argv)
    assert code == 0, err
    assert (tmp_path / "lin.onnx").exists()
    assert not (tmp_path / "lin.png").exists()
    assert "loss-curve PNG skipped: matplotlib is not installed" in err
    assert "pip install matplotlib" in err
    assert "loss curve written" not in out


def test_demo_command_writes_onnx_and_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")  # the PNG
    code, out, err = run_main(capsys, "demo", "--epochs", "2", "--out", tmp_path)
    assert code == 0, err
    png = tmp_path / "diabetes_mlp.png"
    assert f"loss curve written to {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "diabetes_mlp.onnx").exists()


def test_demo_skips_png_without_matplotlib(tmp_path, capsys, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out, err = run_main(capsys, "demo", "--epochs", "1", "--out", tmp_path)
    assert code == 0, err
    assert "loss-curve PNG skipped: matplotlib is not installed" in out
    assert (tmp_path / "diabetes_mlp.onnx").exists()
    assert not (tmp_path / "diabetes_mlp.png").exists()


def test_predict_help_documents_every_flag(capsys):
    code, out, err = run_main(capsys, "predict", "--help")
    assert code == 0
    for flag in ("--model", "--data", "--out", "--trust"):
        assert flag in out, flag
    assert "by name" in out and "proba_CLASS" in " ".join(out.split())


def test_classifier_predict_from_onnx_and_skops(data, tmp_path, capsys):
    pytest.importorskip("skops")
    argv = ["fit", "--data", data / "cls.csv", "--target", "kind", "--model", "linear"]
    argv += ["--learning-rate", "0.05", "--epochs", "5", "--random-state", "0", "--quiet"]
    code, out, err = run_main(capsys, *argv, "--out", tmp_path / "kind.onnx")
    assert code == 0, err
    assert "target:" not in out  # labels are never scaled
    tables = {}
    for name in ("kind.onnx", "kind.skops"):
        path = tmp_path / f"pred_{name}.csv"
        code, out, err = run_main(
            capsys, "predict", "--model", tmp_path / name, "--data", data / "cls.csv", "--out", path
        )
        assert code == 0, err
        tables[name] = pd.read_csv(path)
    onnx_table, skops_table = tables["kind.onnx"], tables["kind.skops"]
    assert list(onnx_table.columns) == ["prediction", "proba_cat", "proba_dog", "proba_fish"]
    assert list(skops_table.columns) == list(onnx_table.columns)
    assert (onnx_table["prediction"] == skops_table["prediction"]).all()
    proba = onnx_table.iloc[:, 1:].to_numpy()
    np.testing.assert_allclose(proba, skops_table.iloc[:, 1:].to_numpy(), atol=1e-5)
    np.testing.assert_allclose(proba.sum(axis=1), 1, atol=1e-5)
    # without --out the CSV goes to the standard output
    code, out, err = run_main(
        capsys, "predict", "--model", tmp_path / "kind.onnx", "--data", data / "cls.csv"
    )
    assert code == 0, err
    assert out.splitlines()[0] == "prediction,proba_cat,proba_dog,proba_fish"
    assert len(out.splitlines()) == 201


def test_no_scale_target(data, tmp_path, capsys):
    import onnx

    argv = ["fit", "--data", data / "reg.csv", "--target", "price", "--model", "linear"]
    argv += ["--epochs", "3", "--quiet", "--no-scale-target", "--out", tmp_path / "raw.onnx"]
    code, out, err = run_main(capsys, *argv)
    assert code == 0, err
    assert "target: raw (--no-scale-target)" in out
    model = onnx.load(tmp_path / "raw.onnx")
    meta = {p.key: p.value for p in model.metadata_props}
    assert "target_scaling" not in meta and meta["feature_names"] == "a,b,c,d"
    assert not any(node.op_type == "Add" and "target" in node.name for node in model.graph.node)


def test_deprecated_model_path_is_read_as_init(data, tmp_path, capsys):
    from sklearn.linear_model import LinearRegression

    frame = pd.read_csv(data / "reg.csv")
    with open(tmp_path / "lin.pkl", "wb") as f:
        pickle.dump(LinearRegression().fit(frame[FEATURES].to_numpy(), frame["price"]), f)
    argv = ["fit", "--data", data / "reg.csv", "--target", "price", "--model", tmp_path / "lin.pkl"]
    code, out, err = run_main(
        capsys, *argv, "--epochs", "1", "--quiet", "--out", tmp_path / "l.onnx"
    )
    assert code == 0, err
    assert f"--model PATH is deprecated, use --init {tmp_path / 'lin.pkl'}" in err
    assert "fine-tuned from" in out
    assert "target: raw (the fitted --init model predicts raw targets)" in out


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--model", "forest"], "--model takes mlp or linear, got 'forest'"),
        (["--model", "mlp", "--init", "x.skops"], "give one of them"),
        (["--loss", "huber", "--quantile", "0.3"], "--quantile applies to --loss quantile only"),
        (["--loss", "quantile", "--epsilon", "0.3"], "--epsilon applies to --loss huber only"),
        (["--quantile", "0.3", "--epsilon", "0.3"], "set different losses"),
    ],
)
def test_bad_flag_combinations(data, capsys, flags, message):
    code, out, err = run_main(
        capsys, "fit", "--data", data / "reg.csv", "--target", "price", *flags
    )
    assert code == 2
    assert message in _one_error_line(err)


def test_quantile_out_of_range_is_refused(data, capsys):
    argv = ["fit", "--data", data / "reg.csv", "--target", "price", "--quantile", "1.5"]
    code, out, err = run_main(capsys, *argv)
    assert code == 2
    assert "expected a number in (0, 1), got '1.5'" in _one_error_line(err)


@pytest.mark.parametrize(
    "values, task",
    [
        (["a", "b", "a"], "classification"),
        ([True, False, True], "classification"),
        ([0, 1, 2, 1], "classification"),
        ([0.0, 1.0, 2.0], "classification"),
        (list(range(20)), "classification"),
        (list(range(21)), "regression"),
        ([0.5, 1.0, 2.0], "regression"),
    ],
)
def test_infer_task(values, task):
    assert infer_task(values) == task


def test_linear_model_with_a_log_link_loss_is_the_glm_and_predicts_means(tmp_path, capsys):
    rng = np.random.RandomState(0)
    X = rng.rand(300, 4)
    frame = pd.DataFrame(X, columns=FEATURES)
    frame["count"] = rng.poisson(np.exp(1.0 + X @ np.array([0.5, -0.5, 0.3, 0.0])))
    frame.to_csv(tmp_path / "counts.csv", index=False)
    argv = ["fit", "--data", tmp_path / "counts.csv", "--target", "count", "--model", "linear"]
    argv += ["--task", "regression", "--loss", "poisson", "--optimizer", "lbfgs", "--alpha", "0"]
    argv += ["--test-size", "0"]
    code, out, err = run_main(capsys, *argv, "--quiet", "--out", tmp_path / "glm.onnx")
    assert code == 0, err
    assert "PoissonRegressor" in out
    session = onnxruntime.InferenceSession(str(tmp_path / "glm.onnx"))
    feed = {session.get_inputs()[0].name: frame[FEATURES].to_numpy(np.float32)}
    pred = session.run(None, feed)[0].ravel()
    from sklearn.linear_model import PoissonRegressor

    ref = PoissonRegressor(alpha=0.0, tol=1e-10, max_iter=1000).fit(X, frame["count"])
    # the means exp(eta), not eta (LinearRegression would have predicted the log)
    np.testing.assert_allclose(pred, ref.predict(X), rtol=5e-3)
