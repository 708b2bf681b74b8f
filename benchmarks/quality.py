"""5-fold scores with default parameters on scikit-learn's bundled data sets.

Each row compares an estimator of this package, with default parameters and a
template, against the template fitted by scikit-learn itself, on the same folds.
Run ``python benchmarks/quality.py`` to print the Markdown table of docs/templates.md.
"""

from __future__ import annotations

import argparse
import time
import warnings

from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits, load_iris, load_wine
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import (
    LinearRegression,
    LogisticRegression,
    Perceptron,
    Ridge,
    SGDClassifier,
    SGDRegressor,
)
from sklearn.model_selection import KFold, StratifiedKFold, cross_val_score
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor


def datasets():
    """(name, X, y, task) of the bundled data sets; diabetes with a standardised target."""
    X, y = load_diabetes(return_X_y=True)
    yield "diabetes (scaled y)", X, (y - y.mean()) / y.std(), "regression"
    for name, loader in [
        ("breast cancer", load_breast_cancer),
        ("digits", load_digits),
        ("wine", load_wine),
        ("iris", load_iris),
    ]:
        X, y = loader(return_X_y=True)
        yield name, X, y, "classification"


TEMPLATES = {
    "regression": [LinearRegression, Ridge, SGDRegressor, MLPRegressor],
    "classification": [LogisticRegression, SGDClassifier, Perceptron, MLPClassifier],
}


def rows(folds: int = 5, datasets_wanted=None):
    """Yield (data set, template, ours, scikit-learn's, seconds ours, seconds theirs)."""
    for name, X, y, task in datasets():
        if datasets_wanted and name not in datasets_wanted:
            continue
        if task == "regression":
            cv, ours_cls = KFold(folds, shuffle=True, random_state=0), OrtGradientRegressor
        else:
            cv, ours_cls = (
                StratifiedKFold(folds, shuffle=True, random_state=0),
                OrtGradientClassifier,
            )
        for template in TEMPLATES[task]:
            kwargs = {"random_state": 0} if "MLP" in template.__name__ else {}
            scores = []
            for est in (
                ours_cls(make_pipeline(StandardScaler(), template(**kwargs)), random_state=0),
                make_pipeline(StandardScaler(), template(**kwargs)),
            ):
                start = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", ConvergenceWarning)
                    warnings.simplefilter("ignore", UserWarning)  # template random_state
                    score = cross_val_score(est, X, y, cv=cv).mean()
                scores.append((score, time.perf_counter() - start))
            yield name, template.__name__, scores[0][0], scores[1][0], scores[0][1], scores[1][1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folds", type=int, default=5)
    args = parser.parse_args()
    print(
        "| data set | template | onnxgrad_sklearn | scikit-learn | difference "
        "| time (s), ours / scikit-learn |"
    )
    print("|---|---|---|---|---|---|")
    for name, template, ours, theirs, t_ours, t_theirs in rows(args.folds):
        print(
            f"| {name} | {template} | {ours:.4f} | {theirs:.4f} | {ours - theirs:+.4f} | "
            f"{t_ours:.1f} / {t_theirs:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
