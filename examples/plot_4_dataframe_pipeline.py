"""
A Pipeline trained on a DataFrame, exported to ONNX
===================================================

A ``Pipeline`` of a ``StandardScaler`` and an ``MLPRegressor`` is the template; the
training data is a pandas DataFrame (the diabetes data, ten numeric columns). The scaler
is fitted on the frame and frozen, the MLP trains on onnxruntime. The fitted estimator
keeps the column names (``feature_names_in_``) as scikit-learn does, and
:meth:`~onnxgrad_sklearn.OrtGradientRegressor.to_onnx` gives one ONNX graph of the
whole pipeline, scaler included. A plain ``onnxruntime.InferenceSession`` of that
file gives the predictions of ``predict``.

The columns here are all numeric: the ONNX graph takes one float32 matrix ``X``, its
columns in the order of the frame's. With string columns one-hot encoded inside the
model (a ``ColumnTransformer`` with a ``OneHotEncoder`` in front of the MLP), the graph
takes one input per raw column instead, named after it (see the user guide's
"DataFrames and their raw columns").
"""

import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import onnx
import onnxruntime
from sklearn.datasets import load_diabetes
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPRegressor
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from onnxgrad_sklearn import OrtGradientRegressor

frame = load_diabetes(as_frame=True, scaled=False).frame
X = frame.drop(columns="target")
y = (frame["target"] - frame["target"].mean()) / frame["target"].std()
X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0)
print(X_train.head())

# %%
# Train the pipeline on the frame.
template = Pipeline([("scale", StandardScaler()), ("mlp", MLPRegressor(hidden_layer_sizes=(32,)))])
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
# Export, save, and run the file with onnxruntime alone.
path = Path(tempfile.mkdtemp()) / "diabetes_pipeline.onnx"
onnx.save(reg.to_onnx(), path)
session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
print("inputs:", [(i.name, i.type, i.shape) for i in session.get_inputs()])
(onnx_pred,) = session.run(None, {"X": X_test.to_numpy(dtype=np.float32)})
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
