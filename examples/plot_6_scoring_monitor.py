"""
Scores per epoch with scikit-learn's ScoringMonitor
===================================================

With scikit-learn 1.9, :meth:`~onnxgrad_sklearn.OrtGradientRegressor.set_callbacks`
takes scikit-learn's callbacks. Each epoch is a task, and ``ScoringMonitor`` scores the
estimator as it is at the end of each one (a copy holding that epoch's weights) on
the training data. Meanwhile early stopping watches a validation set given to ``fit``
(``X_val``, ``y_val``, as HistGradientBoosting takes it) and keeps the weights of its
best epoch. The monitor's row for the whole fit scores those kept weights.
"""

import matplotlib.pyplot as plt
import numpy as np
from sklearn.callback import ScoringMonitor
from sklearn.datasets import load_diabetes
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from onnxgrad_sklearn import OrtGradientRegressor

X, y = load_diabetes(return_X_y=True)
y = (y - y.mean()) / y.std()  # a target of unit scale trains with the default rate
X_train, X_val, y_train, y_val = train_test_split(X, y, test_size=0.25, random_state=0)

# %%
# Two scores per epoch on the training rows; the validation rows decide when to stop.
monitor = ScoringMonitor(scoring=["r2", "neg_mean_absolute_error"])
reg = OrtGradientRegressor(
    make_pipeline(StandardScaler(), MLPRegressor(hidden_layer_sizes=(64,))),
    learning_rate_init=0.001,
    alpha=1.0,
    max_iter=300,
    early_stopping=True,
    n_iter_no_change=20,
    random_state=0,
)
reg.set_callbacks(monitor).fit(X_train, y_train, X_val=X_val, y_val=y_val)

log = monitor.get_logs().data_as_pandas
epochs = log[log["task_name"] == "epoch"]
whole = log[log["task_name"] == "fit"].iloc[0]
kept = int(np.argmax(reg.validation_scores_)) + 1
print(f"{len(epochs)} epoch rows and one for the fit ({reg.n_iter_} epochs run)")
print(
    f"kept epoch {kept}: training R2 {whole['r2']:.4f} in the fit's row, "
    f"{epochs['r2'].iloc[kept - 1]:.4f} in the epoch's row, "
    f"{reg.score(X_train, y_train):.4f} from reg.score"
)
print(
    f"validation R2 of the kept weights: {reg.score(X_val, y_val):.4f} "
    f"(best_validation_score_ {reg.best_validation_score_:.4f})"
)

# %%
# The monitor's log, epoch by epoch, with the validation score early stopping
# recorded (``validation_scores_``) and the epoch whose weights are kept.
number = epochs["task_id"] + 1
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
left.plot(number, epochs["r2"], label="training (ScoringMonitor)")
left.plot(number, reg.validation_scores_, label="validation (validation_scores_)")
left.set(xlabel="epoch", ylabel="R2", title="R2 per epoch")
right.plot(number, -epochs["neg_mean_absolute_error"], label="training (ScoringMonitor)")
right.set(xlabel="epoch", ylabel="mean absolute error", title="MAE per epoch")
for ax in (left, right):
    ax.axvline(kept, color="gray", linestyle=":", label=f"kept epoch ({kept})")
    ax.legend()
plt.tight_layout()
