"""
Fine-tuning a fitted LogisticRegression with class weights
==========================================================

A fitted template is the starting point of the training: its weights are
fine-tuned, not drawn again. Here a ``LogisticRegression`` fitted by scikit-learn on
an imbalanced problem (10% positives) is fine-tuned by an
:class:`~onnxgrad_sklearn.OrtGradientClassifier` with ``class_weight="balanced"``:
the rare class now weighs as much as the common one in the loss, which moves the
decision boundary towards the common class and raises the recall of the rare one.

The template's penalty ``C=1.0`` carries over (``alpha="auto"`` makes it
``alpha=1 / C``), and the linear template trains with full-batch L-BFGS by default,
so the fine-tuned model reaches the coefficients of scikit-learn's own
``LogisticRegression(class_weight="balanced")``.
"""

import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import make_blobs
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import balanced_accuracy_score, recall_score
from sklearn.model_selection import train_test_split

from onnxgrad_sklearn import OrtGradientClassifier

# Two overlapping clouds of points, 1800 of class 0 and 200 of class 1.
X, y = make_blobs(
    n_samples=[1800, 200], centers=[[0, 0], [2.5, 1.5]], cluster_std=1.0, random_state=0
)
X_train, X_test, y_train, y_test = train_test_split(X, y, stratify=y, random_state=0)

original = LogisticRegression().fit(X_train, y_train)
tuned = OrtGradientClassifier(original, class_weight="balanced").fit(X_train, y_train)
reference = LogisticRegression(class_weight="balanced").fit(X_train, y_train)

# %%
# Scores on the test rows. Accuracy rewards predicting the common class; the balanced
# accuracy and the recall of the rare class show what the class weights change.
for name, model in [("original", original), ("fine-tuned", tuned)]:
    pred = model.predict(X_test)
    print(
        f"{name:>10}: accuracy {model.score(X_test, y_test):.3f}, "
        f"balanced accuracy {balanced_accuracy_score(y_test, pred):.3f}, "
        f"recall of class 1 {recall_score(y_test, pred):.3f}"
    )

# %%
# The coefficients. ``tuned.estimator_`` is a LogisticRegression holding the trained
# weights; they match scikit-learn's fit with the same class weights.
print("original   ", original.coef_.ravel(), original.intercept_)
print("fine-tuned ", tuned.estimator_.coef_.ravel(), tuned.estimator_.intercept_)
print("reference  ", reference.coef_.ravel(), reference.intercept_)

# %%
# The two decision boundaries on the test rows.
xx, yy = np.meshgrid(
    np.linspace(X[:, 0].min() - 0.5, X[:, 0].max() + 0.5, 300),
    np.linspace(X[:, 1].min() - 0.5, X[:, 1].max() + 0.5, 300),
)
grid = np.c_[xx.ravel(), yy.ravel()]
fig, ax = plt.subplots(figsize=(7, 5))
ax.scatter(X_test[:, 0], X_test[:, 1], c=y_test, cmap="coolwarm", s=8, alpha=0.7)
for model, color, label in [(original, "k", "original"), (tuned, "C2", "fine-tuned, balanced")]:
    z = model.decision_function(grid).reshape(xx.shape)
    ax.contour(xx, yy, z, levels=[0], colors=color)
    ax.plot([], [], color=color, label=label)  # a legend entry for the contour
ax.legend(loc="upper right")
ax.set_title("Decision boundary before and after fine-tuning")
plt.tight_layout()
