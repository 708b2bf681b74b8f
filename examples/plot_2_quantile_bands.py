"""
Quantile bands with the pinball loss
====================================

The quantile (pinball) loss trains a model to predict a quantile of the target
instead of its mean. Here an MLP learns the 10%, 50% and 90% quantiles of a noisy 1-D
problem whose noise grows with ``x``: one :class:`~onnxgrad_sklearn.OrtGradientRegressor`
per quantile, with ``loss=Quantile(q)``. On the training points, the fraction below
each curve is the quantile asked for; on new points it is close to it.

A ``QuantileRegressor(quantile=q)`` template trains the same loss on a linear model
(its own objective, with ``loss="auto"``); an MLP gives curved bands.
"""

import matplotlib.pyplot as plt
import numpy as np
from sklearn.neural_network import MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from onnxgrad_sklearn import OrtGradientRegressor
from onnxgrad_sklearn.losses import Quantile

rng = np.random.RandomState(0)


def make_data(n):
    x = rng.uniform(0, 10, size=n)
    y = x * np.sin(x) + (0.2 + 0.3 * x) * rng.randn(n)
    return x.reshape(-1, 1), y


X_train, y_train = make_data(2000)
X_test, y_test = make_data(2000)

# %%
# One model per quantile. ``learning_rate="adaptive"`` divides the rate by 5 each
# time the training loss stops improving, which lets the pinball loss (whose gradient
# does not shrink near the optimum) settle.
models = {}
for q in (0.1, 0.5, 0.9):
    models[q] = OrtGradientRegressor(
        make_pipeline(StandardScaler(), MLPRegressor(hidden_layer_sizes=(64, 64))),
        loss=Quantile(quantile=q),
        optimizer="adam",
        learning_rate_init=0.01,
        learning_rate="adaptive",
        batch_size=128,
        max_iter=200,
        random_state=0,
    ).fit(X_train, y_train)

for q, model in models.items():
    train = np.mean(y_train < model.predict(X_train))
    test = np.mean(y_test < model.predict(X_test))
    print(
        f"quantile {q:.1f}: {train:.1%} of the training points below, {test:.1%} of the test points"
    )

# %%
# The band between the 10% and 90% curves, on the test points.
grid = np.linspace(0, 10, 300).reshape(-1, 1)
low, mid, high = (models[q].predict(grid) for q in (0.1, 0.5, 0.9))
fig, ax = plt.subplots(figsize=(7, 4.5))
ax.scatter(X_test[:, 0], y_test, s=4, color="0.6", label="test points")
ax.fill_between(grid[:, 0], low, high, color="C0", alpha=0.25, label="10% to 90%")
ax.plot(grid[:, 0], mid, color="C0", label="median")
ax.plot(grid[:, 0], grid[:, 0] * np.sin(grid[:, 0]), "k--", lw=1, label="x sin(x)")
ax.set_xlabel("x")
ax.set_ylabel("y")
ax.legend(loc="upper left")
ax.set_title("MLP trained with Quantile(q), q = 0.1, 0.5, 0.9")
plt.tight_layout()
