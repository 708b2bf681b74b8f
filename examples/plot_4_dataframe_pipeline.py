"""
A Pipeline trained on a DataFrame, exported to ONNX with its raw columns
========================================================================

The template is a ``Pipeline`` whose head is a ``ColumnTransformer``: a
``StandardScaler`` on the numeric columns, selected by name, and a ``OneHotEncoder`` on
a text column; an ``MLPRegressor`` follows. The training data is a pandas DataFrame:
the diabetes data, with its ``sex`` column written as the text ``"F"`` / ``"M"``. The
head is fitted on the frame and frozen, the MLP trains on onnxruntime, and the fitted
estimator keeps the column names (``feature_names_in_``) as scikit-learn does.

:meth:`~onnxgrad_sklearn.OrtGradientRegressor.to_onnx` gives one ONNX graph of the
whole pipeline, encoder and scaler included, with one input per raw column named after
it (skl2onnx's convention): float columns as ``tensor(float)``, the text column as
``tensor(string)``. A plain ``onnxruntime.InferenceSession`` of that file, fed the
columns of the frame, gives the predictions of ``predict``.
"""

import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import onnx
import onnxruntime
from sklearn.compose import ColumnTransformer
from sklearn.datasets import load_diabetes
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPRegressor
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

from onnxgrad_sklearn import OrtGradientRegressor

frame = load_diabetes(as_frame=True, scaled=False).frame
frame["sex"] = np.where(frame["sex"] == 1, "F", "M")
X = frame.drop(columns="target")
y = (frame["target"] - frame["target"].mean()) / frame["target"].std()
X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0)
print(X_train.head())

# %%
# Train the pipeline on the frame.
numeric = [c for c in X.columns if c != "sex"]
head = ColumnTransformer([("num", StandardScaler(), numeric), ("sex", OneHotEncoder(), ["sex"])])
template = Pipeline([("prep", head), ("mlp", MLPRegressor(hidden_layer_sizes=(32,)))])
reg = OrtGradientRegressor(
    template,
    learning_rate_init=0.003,
    alpha=1.0,
    max_iter=200,
    early_stopping=True,
    n_iter_no_change=10,
    random_state=0,
).fit(X_train, y_train)
print("columns:", list(reg.feature_names_in_))
print(f"{reg.n_iter_} epochs, test R2: {reg.score(X_test, y_test):.3f}")
print("trained estimator:", reg.estimator_)

# %%
# Export, save, and run the file with onnxruntime alone: one input per column.
path = Path(tempfile.mkdtemp()) / "diabetes_pipeline.onnx"
onnx.save(reg.to_onnx(), path)
session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
print("inputs:", [(i.name, i.type, i.shape) for i in session.get_inputs()])
feeds = {
    c: X_test[[c]].to_numpy(dtype=object if c == "sex" else np.float32) for c in X_test.columns
}
(onnx_pred,) = session.run(None, feeds)
print("largest difference to predict:", np.max(np.abs(onnx_pred.ravel() - reg.predict(X_test))))

# %%
# The predictions of the ONNX file against the targets of the test rows.
fig, ax = plt.subplots(figsize=(5, 5))
ax.scatter(y_test, onnx_pred.ravel(), s=10)
ax.plot([-2.5, 3], [-2.5, 3], "k--", lw=1)
ax.set_xlabel("target (scaled)")
ax.set_ylabel("prediction of the ONNX file")
ax.set_title("diabetes_pipeline.onnx on the test rows")
plt.tight_layout()
