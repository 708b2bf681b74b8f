"""
A custom loss: log-cosh
=======================

A loss is a small object that writes the ONNX nodes of the loss of each sample
(see :doc:`/extending`). Log-cosh, ``log(cosh(p - y))``, is quadratic near zero and
grows linearly far from it, so a few large errors pull the fit less than with the
squared error. Written with the :class:`~onnxgrad_sklearn.GraphBuilder`, it is one
``Cosh`` and one ``Log`` node.

onnxruntime-training's ``TrainingAgent`` has no gradient for ``Cosh``. With
``backend="auto"`` (the default) the estimator then trains on the standard backend,
whose gradient graphs are made of standard ONNX operators: the fitted ``backend_``
says which one ran.
"""

import matplotlib.pyplot as plt
import numpy as np
from sklearn.linear_model import LinearRegression

from onnxgrad_sklearn import OrtGradientRegressor
from onnxgrad_sklearn.losses import BaseLoss


class LogCosh(BaseLoss):
    """log(cosh(p - y)), summed over the outputs.

    ``cosh`` overflows float32 beyond about 89: fine for residuals of this size; the
    extending page writes a form that never overflows.
    """

    def build(self, g, y_pred, y_true):
        residual = g.sub(y_pred, y_true)
        return g.sum(g.op("Log", g.op("Cosh", residual)), axes=[1])


# %%
# A line with noise, and 10% of the targets shifted far up.
rng = np.random.RandomState(0)
X = rng.uniform(-3, 3, size=(300, 1))
y = 2.0 * X[:, 0] + 1.0 + 0.5 * rng.randn(300)
outliers = rng.rand(300) < 0.1
y[outliers] += rng.uniform(10, 20, size=outliers.sum())

squared = LinearRegression().fit(X, y)
logcosh = OrtGradientRegressor(LinearRegression(), loss=LogCosh()).fit(X, y)
print("backend:", logcosh.backend_)
print(f"squared error: slope {squared.coef_[0]:.3f}, intercept {squared.intercept_:.3f}")
print(
    f"log-cosh:      slope {logcosh.estimator_.coef_[0]:.3f}, "
    f"intercept {logcosh.estimator_.intercept_:.3f}   (true: 2, 1)"
)

# %%
# The two fitted lines.
grid = np.linspace(-3, 3, 100).reshape(-1, 1)
fig, ax = plt.subplots(figsize=(7, 4.5))
ax.scatter(X[~outliers, 0], y[~outliers], s=8, color="0.5", label="points")
ax.scatter(X[outliers, 0], y[outliers], s=12, color="C3", label="shifted points")
ax.plot(grid[:, 0], squared.predict(grid), color="C1", label="squared error")
ax.plot(grid[:, 0], logcosh.predict(grid), color="C0", label="log-cosh (custom loss)")
ax.set_xlabel("x")
ax.set_ylabel("y")
ax.legend(loc="upper left")
ax.set_title(f"LinearRegression template, log-cosh trained on the {logcosh.backend_} backend")
plt.tight_layout()
