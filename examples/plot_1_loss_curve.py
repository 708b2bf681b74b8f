"""
Loss curve of an MLP on the diabetes data
=========================================

An :class:`~onnxgrad_sklearn.OrtGradientRegressor` trains an ``MLPRegressor``
template on onnxruntime, holding out 10% of the rows to stop early.
:func:`~onnxgrad_sklearn.plotting.plot_loss_curve` draws the training loss of each
epoch and the validation score (R2) on a second axis. The same settings on
scikit-learn's own ``MLPRegressor`` give the same curve: same initial weights, same
Adam, same batches.
"""

import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import load_diabetes
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from onnxgrad_sklearn import OrtGradientRegressor
from onnxgrad_sklearn.plotting import plot_loss_curve

X, y = load_diabetes(return_X_y=True)
y = (y - y.mean()) / y.std()  # a target of unit scale trains with the default rate
X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0)

# %%
# The template is a Pipeline: the scaler is fitted on ``X`` and frozen, the MLP trains.
settings = dict(
    learning_rate_init=0.003,
    alpha=1.0,
    max_iter=200,
    early_stopping=True,
    validation_fraction=0.1,
    n_iter_no_change=10,
    random_state=0,
)
template = make_pipeline(StandardScaler(), MLPRegressor(hidden_layer_sizes=(64,)))
reg = OrtGradientRegressor(template, **settings).fit(X_train, y_train)
print(
    f"{reg.n_iter_} epochs on the {reg.backend_} backend, test R2 {reg.score(X_test, y_test):.3f}"
)

# %%
# The loss per epoch, and the score on the held-out rows.
ax = plot_loss_curve(reg)
plt.tight_layout()

# %%
# scikit-learn's MLPRegressor with the same settings.
sk = make_pipeline(StandardScaler(), MLPRegressor(hidden_layer_sizes=(64,), **settings))
sk.fit(X_train, y_train)
mlp = sk[-1]
print(f"scikit-learn: {mlp.n_iter_} epochs, test R2 {sk.score(X_test, y_test):.3f}")
n = min(len(reg.validation_scores_), len(mlp.validation_scores_))
gap = np.max(np.abs(np.subtract(reg.validation_scores_[:n], mlp.validation_scores_[:n])))
print(f"largest difference of the validation scores, epoch by epoch: {gap:.1e}")
