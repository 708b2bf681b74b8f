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
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import mean_absolute_error, r2_score
from sklearn.neural_network import MLPRegressor

from onnxgrad_sklearn.cli import build_parser, infer_task, main

pd = pytest.importorskip("pandas")

ROOT = Path(__file__).resolve().parents[1]
FEATURES = ["a", "b", "c", "d"]
FIT_FLAGS = [
    "--data",
    "--target",
    "--model",
    "--trust",
    "--hidden",
    "--task",
    "--loss",
    "--optimizer",
    "--learning-rate",
    "--batch-size",
    "--epochs",
    "--alpha",
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
    rng = np.random.RandomState(0)
    X = rng.randn(200, 4)
    frame = pd.DataFrame(X, columns=FEATURES)
    frame["price"] = X @ np.array([1.5, -2.0, 0.5, 1.0]) + 0.1 * rng.randn(200)
    frame.to_csv(folder / "reg.csv", index=False)
    kinds = pd.DataFrame(X, columns=FEATURES)
    kinds["kind"] = np.array(["cat", "dog", "fish"])[X[:, :3].argmax(axis=1)]
    kinds.to_csv(folder / "cls.csv", index=False)
    text = frame.copy()
    text.insert(1, "city", rng.choice(["Paris", "Rome"], 200))
    text.to_csv(folder / "text.csv", index=False)
    return folder


# subprocesses: the command as users run it ------------------------------------
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
        "--model",
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


def test_non_numeric_feature_column(data, capsys):
    code, out, err = run_main(capsys, "fit", "--data", data / "text.csv", "--target", "price")
    assert code == 2
    line = _one_error_line(err)
    assert "feature column 'city' is not numeric" in line
    assert "must be numeric" in line and "encode" in line


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
    argv = ["fit", "--data", data / "reg.csv", "--target", "price", "--model", path]
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
