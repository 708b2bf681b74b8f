"""OrtGradientClassifier: MLPClassifier's numbers, log-loss gradients, labels, exports."""

import copy
import warnings

import numpy as np
import onnxruntime
import pytest
from _helpers import rel_error
from sklearn.datasets import load_breast_cancer, load_digits, make_classification
from sklearn.exceptions import ConvergenceWarning, DataConversionWarning
from sklearn.linear_model import LogisticRegression, SGDClassifier
from sklearn.metrics import recall_score
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import MinMaxScaler, StandardScaler
from sklearn.tree import DecisionTreeClassifier

from onnxgrad_sklearn import OrtGradientClassifier
from onnxgrad_sklearn.templates import final_estimator

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


def _blobs(n_classes, n=150, seed=0):
    X, y = make_classification(
        n_samples=n,
        n_features=6,
        n_informative=4,
        n_redundant=0,
        n_classes=n_classes,
        n_clusters_per_class=1,
        class_sep=1.0,
        random_state=seed,
    )
    return X.astype(np.float32).astype(np.float64), y


SOLVERS = {
    "sgd": ("sgd", dict(solver="sgd", momentum=0.0)),
    "nesterov": ("nesterov", dict(solver="sgd", momentum=0.9, nesterovs_momentum=True)),
    "adam": ("adam", dict(solver="adam")),
}


@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_weights_and_loss_curve_match_mlpclassifier(name, n_classes):
    X, y = _blobs(n_classes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp = MLPClassifier(hidden_layer_sizes=(10,), max_iter=3, random_state=0).fit(X, y)
    optimizer, sk_params = SOLVERS[name]
    common = dict(
        batch_size=32,
        shuffle=False,
        alpha=1e-4,
        max_iter=5,
        tol=0.0,
        n_iter_no_change=1000,
        learning_rate_init=0.02,
    )
    ref = copy.deepcopy(mlp).set_params(warm_start=True, **sk_params, **common)
    ours = OrtGradientClassifier(mlp, optimizer=optimizer, **common)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ref.fit(X, y)
        ours.fit(X, y)
    trained = ours.estimator_
    assert rel_error(ref.coefs_[0], mlp.coefs_[0]) > 1e-3
    for a, b in zip(trained.coefs_ + trained.intercepts_, ref.coefs_ + ref.intercepts_):
        assert rel_error(a, b) < 1e-4
    np.testing.assert_allclose(ours.loss_curve_, ref.loss_curve_[-5:], rtol=1e-4)


TEMPLATES = {
    "LogisticRegression-2": (LogisticRegression, 2),
    "LogisticRegression-3": (LogisticRegression, 3),
    "SGDClassifier-2": (lambda: SGDClassifier(loss="log_loss"), 2),
    "SGDClassifier-3": (lambda: SGDClassifier(loss="log_loss"), 3),
    "MLP-relu-2": (lambda: MLPClassifier(hidden_layer_sizes=(7, 5)), 2),
    "MLP-relu-3": (lambda: MLPClassifier(hidden_layer_sizes=(7,)), 3),
    "MLP-tanh-3": (lambda: MLPClassifier(hidden_layer_sizes=(6,), activation="tanh"), 3),
    "MLP-logistic-2": (lambda: MLPClassifier(hidden_layer_sizes=(6,), activation="logistic"), 2),
    "MLP-identity-3": (lambda: MLPClassifier(hidden_layer_sizes=(6,), activation="identity"), 3),
    "Pipeline-LR-3": (lambda: make_pipeline(StandardScaler(), LogisticRegression()), 3),
    "Pipeline-MLP-2": (lambda: make_pipeline(MinMaxScaler(), MLPClassifier((5,))), 2),
}


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_log_loss_gradients_match_finite_differences(name):
    make, n_classes = TEMPLATES[name]
    X, y = _blobs(n_classes, n=60, seed=1)
    sw = np.random.RandomState(0).uniform(0.5, 2.0, len(y))
    alpha = 0.1
    clf = OrtGradientClassifier(
        make(),
        optimizer="adam",
        learning_rate_init=0.05,
        max_iter=2,
        alpha=alpha,
        random_state=0,
    ).fit(X, y)
    conv = clf._converted
    onehot = np.eye(n_classes)[y]
    loss, grads = clf._engine.loss_and_gradients(X, onehot, sw)
    values = [v.astype(np.float64) for v in conv.initializer_values()]
    trained = [k for k, p in enumerate(conv.params) if p.trainable]
    penalized = [k for k in trained if conv.params[k].penalized]
    est = copy.deepcopy(clf.estimator_)
    for ref in conv.params:  # the reference computes in float64
        ref.set(final_estimator(est), ref.get(final_estimator(est)).astype(np.float64))

    one_vs_rest = name == "SGDClassifier-3"  # probabilities are normalised sigmoids

    def reference(vals):
        conv.write_back(final_estimator(est), vals)
        if one_vs_rest:
            z = est.decision_function(X)
            per_sample = np.sum(np.logaddexp(0, z) - onehot * z, axis=1)
        else:
            per_sample = -np.sum(onehot * np.log(est.predict_proba(X)), axis=1)
        data = np.sum(sw * per_sample) / sw.sum()
        return data + 0.5 * alpha * sum(np.sum(vals[k] ** 2) for k in penalized) / sw.sum()

    assert loss == pytest.approx(reference(values), rel=1e-4)
    rng = np.random.RandomState(1)
    for k, grad in zip(trained, grads):
        flat = values[k].ravel()
        picks = rng.choice(flat.size, size=min(flat.size, 6), replace=False)
        numeric = []
        for j in picks:
            moved = [[v.copy() for v in values] for _ in range(2)]
            moved[0][k].ravel()[j] = flat[j] + 1e-5
            moved[1][k].ravel()[j] = flat[j] - 1e-5
            numeric.append((reference(moved[0]) - reference(moved[1])) / 2e-5)
        assert rel_error(grad.ravel()[picks], numeric) < 1e-3, conv.params[k].label


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_predictions_probabilities_and_onnx_export_agree(name):
    make, n_classes = TEMPLATES[name]
    X, y = _blobs(n_classes)
    clf = OrtGradientClassifier(
        make(),
        optimizer="adam",
        learning_rate_init=0.02,
        batch_size=32,
        max_iter=20,
        random_state=0,
    ).fit(X, y)
    proba = clf.predict_proba(X)
    assert proba.shape == (len(y), n_classes)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(clf.estimator_.predict_proba(X), proba, atol=1e-5)
    sess = onnxruntime.InferenceSession(
        clf.to_onnx().SerializeToString(), providers=["CPUExecutionProvider"]
    )
    label, onnx_proba = sess.run(None, {"X": X.astype(np.float32)})
    np.testing.assert_allclose(onnx_proba, proba, atol=1e-5)
    pred = clf.predict(X)
    np.testing.assert_array_equal(label, pred)
    np.testing.assert_array_equal(clf.estimator_.predict(X), pred)
    np.testing.assert_allclose(np.exp(clf.predict_log_proba(X)), proba, atol=1e-5)
    z = clf.decision_function(X)
    assert z.shape == ((len(y),) if n_classes == 2 else (len(y), n_classes))
    np.testing.assert_array_equal(clf.classes_[clf._logits_to_index(z)], pred)
    assert clf.score(X, y) > 0.8


def _scaled(loader):
    X, y = loader(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0, stratify=y)
    scaler = StandardScaler().fit(X_train)
    return scaler.transform(X_train), scaler.transform(X_test), y_train, y_test


@pytest.mark.parametrize("loader", [load_breast_cancer, load_digits])
def test_accuracy_matches_mlpclassifier(loader):
    X_train, X_test, y_train, y_test = _scaled(loader)
    params = dict(learning_rate_init=0.001, batch_size=64, max_iter=15, random_state=0)
    ours = OrtGradientClassifier(
        MLPClassifier(hidden_layer_sizes=(32,)), optimizer="adam", **params
    ).fit(X_train, y_train)
    ref = MLPClassifier(hidden_layer_sizes=(32,), solver="adam", **params).fit(X_train, y_train)
    assert ref.score(X_test, y_test) > 0.9
    assert abs(ours.score(X_test, y_test) - ref.score(X_test, y_test)) <= 0.02


def test_fine_tuned_logistic_regression_keeps_its_accuracy():
    X_train, X_test, y_train, y_test = _scaled(load_breast_cancer)
    lbfgs = LogisticRegression().fit(X_train, y_train)
    clf = OrtGradientClassifier(
        lbfgs, optimizer="adam", learning_rate_init=0.001, max_iter=20, random_state=0
    ).fit(X_train, y_train)
    assert rel_error(clf.estimator_.coef_, lbfgs.coef_) > 1e-4  # it did train
    assert clf.score(X_test, y_test) >= lbfgs.score(X_test, y_test) - 0.01
    np.testing.assert_array_equal(lbfgs.coef_, LogisticRegression().fit(X_train, y_train).coef_)


def test_balanced_class_weight_raises_minority_recall():
    X, y = make_classification(
        n_samples=1000, n_features=5, weights=[0.9, 0.1], class_sep=0.5, random_state=0
    )
    params = dict(optimizer="adam", learning_rate_init=0.01, max_iter=30, random_state=0)
    plain = OrtGradientClassifier(**params).fit(X, y)
    balanced = OrtGradientClassifier(class_weight="balanced", **params).fit(X, y)
    as_dict = OrtGradientClassifier(class_weight={0: 1.0, 1: 9.0}, **params).fit(X, y)
    recall_plain = recall_score(y, plain.predict(X))
    assert recall_score(y, balanced.predict(X)) > recall_plain + 0.1
    assert recall_score(y, as_dict.predict(X)) > recall_plain + 0.1


def test_sample_weight_two_equals_a_duplicated_row():
    X, y = _blobs(3, n=60)
    sw = np.ones(60)
    sw[[2, 30]] = 2.0
    params = dict(
        optimizer="momentum", learning_rate_init=0.05, shuffle=False, max_iter=5, random_state=0
    )
    template = MLPClassifier(hidden_layer_sizes=(5,))
    weighted = OrtGradientClassifier(template, batch_size=60, **params).fit(X, y, sw)
    duplicated = OrtGradientClassifier(template, batch_size=62, **params).fit(
        np.r_[X, X[[2, 30]]], np.r_[y, y[[2, 30]]]
    )
    for a, b in zip(weighted.estimator_.coefs_, duplicated.estimator_.coefs_):
        assert rel_error(a, b) < 1e-5


@pytest.mark.parametrize(
    "labels", [np.array(["cat", "dog", "eel"]), np.array([3, 7, 11]), np.array([-1, 1])]
)
def test_labels_keep_their_type_and_values(labels):
    X, y = _blobs(len(labels))
    y_labels = labels[y]
    clf = OrtGradientClassifier(
        optimizer="adam", learning_rate_init=0.05, max_iter=20, random_state=0
    ).fit(X, y_labels)
    ref = LogisticRegression().fit(X, y_labels)
    np.testing.assert_array_equal(clf.classes_, ref.classes_)
    pred = clf.predict(X)
    assert pred.dtype == ref.predict(X).dtype
    assert set(pred) <= set(labels)
    assert np.mean(pred == y_labels) > 0.8


def test_fine_tuning_keeps_the_template_classes_and_refuses_unknown_labels():
    X, y = _blobs(3)
    lr = LogisticRegression().fit(X, y)
    only_two = y < 2
    clf = OrtGradientClassifier(lr, max_iter=2).fit(X[only_two], y[only_two])
    np.testing.assert_array_equal(clf.classes_, [0, 1, 2])
    assert clf.predict_proba(X).shape == (len(y), 3)
    with pytest.raises(ValueError, match=r"labels \[5\] that are not among the classes"):
        OrtGradientClassifier(lr, max_iter=2).fit(X, np.where(y == 2, 5, y))


def test_single_class_and_bad_targets_raise_like_scikit_learn():
    X, y = _blobs(2)
    with pytest.raises(ValueError, match="at least 2 classes in the data.*one class: 0"):
        OrtGradientClassifier().fit(X, np.zeros(len(y), dtype=int))
    with pytest.raises(ValueError, match="Unknown label type"):
        OrtGradientClassifier().fit(X, y + 0.5)
    with pytest.raises(ValueError, match="DecisionTreeClassifier.*cannot be trained"):
        OrtGradientClassifier(DecisionTreeClassifier()).fit(X, y)
    with pytest.raises(ValueError, match="SGDClassifier.loss='squared_error'. is not supported"):
        OrtGradientClassifier(SGDClassifier(loss="squared_error")).fit(X, y)


def test_column_vector_y_is_raveled_with_a_warning():
    X, y = _blobs(3)
    params = dict(max_iter=3, random_state=0, shuffle=False)
    with pytest.warns(DataConversionWarning, match="column-vector y"):
        col = OrtGradientClassifier(**params).fit(X, y.reshape(-1, 1))
    flat = OrtGradientClassifier(**params).fit(X, y)
    np.testing.assert_array_equal(col.estimator_.coef_, flat.estimator_.coef_)
    assert col.predict(X).shape == (len(y),)


def test_a_fit_makes_the_session_predict_runs_and_the_exported_models_when_needed():
    """A classifier predicts from its trained graph (the logits): that session is made at
    the end of the fit. Its exported model (LogisticRegression's own graph, with label
    and probability outputs) gets a session only when something runs it: modified
    Huber's probabilities, or a prediction from the exported graph."""
    from onnxgrad_sklearn import _model

    X, y = _blobs(3)
    clf = OrtGradientClassifier(LogisticRegression(), max_iter=20).fit(X, y)
    assert clf._logit_session is not None and clf.__dict__.get("_session") is None
    labels, proba = clf.predict(X), clf.predict_proba(X)
    assert clf.__dict__.get("_session") is None  # neither needed it
    outputs = _model.run_onnx(clf, X)  # the exported graph: its session made now
    assert clf._session is not None and clf._session is not clf._logit_session
    exported_labels, exported_proba = outputs.values()
    np.testing.assert_array_equal(exported_labels, labels)
    np.testing.assert_allclose(exported_proba, proba, rtol=1e-5, atol=1e-6)
    # modified Huber's probabilities come from the exported graph's clipped ones
    huber = OrtGradientClassifier(SGDClassifier(loss="modified_huber"), max_iter=3)
    huber.fit(X, y)
    assert huber.__dict__.get("_session") is None
    proba = huber.predict_proba(X)
    assert huber._session is not None
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(huber.classes_[proba.argmax(axis=1)], huber.predict(X))
