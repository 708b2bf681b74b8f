"""The fitted model of an estimator: its trained weights stored, the exported model,
the inference sessions and running them.

A fit's trained values go into the converted graph (``ConvertedTemplate.values``) and
into ``estimator_`` (:func:`store_weights`); what ``to_onnx`` returns and ``predict``
runs is then the trained graph itself or, for a template trained through another view
(a classifier, a GLM), the template's own graph given the trained weights
(:func:`export`). The sessions are made once after each fit and after unpickling
(:func:`make_sessions`), so that predicting never changes the estimator.
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.utils.validation import check_is_fitted

from ._data import run_by_chunks
from ._frames import join_head, run_raw
from ._inputs import template_input
from .runtime import (
    SESSIONS,
    device_to_providers,
    intra_op_threads,
    make_session,
    options_key,
    session_options,
    session_providers,
)
from .templates import (
    ConvertedTemplate,
    convert_template,
    export_model,
    final_estimator,
    trained_view,
)


class _Deferred:
    """The exported model of a fit, made when first needed (``_model.export``)."""

    def __repr__(self):
        return "DEFERRED"

    def __reduce__(self):  # pickled as the module's one instance
        return "DEFERRED"


#: The exported model made when first needed: a fit that needs onnx or skl2onnx to
#: make it (``_model.export``) leaves it to ``to_onnx`` or to a prediction
#: from the exported graph.
DEFERRED = _Deferred()


def export(est, now=False, defer=False):
    """What ``to_onnx`` returns and ``predict`` runs, set after each fit.

    The trained graph itself, or for a template trained through another view
    (a classifier, a GLM) the template's own graph: converted once per
    template (an artifact, :func:`~onnxgrad_sklearn.templates.convert_template`),
    then given the trained weights. Either is a :class:`ConvertedTemplate`
    holding them, whose ONNX model is made when first asked for (its session
    needs none: :meth:`ConvertedTemplate.session`).

    A graph whose weights cannot be located (binary LogisticRegression and
    LinearSVC keep them in node attributes) is converted by skl2onnx with the
    trained weights, and after a fit on raw DataFrame columns the final model's
    graph gets the head's graph joined in front of it (one input per column):
    ONNX models, made with onnx. Unless ``now``, those are :data:`DEFERRED`,
    made by the first use that needs them (:func:`export_now`: ``to_onnx``, a
    prediction from the exported graph); a classifier's predictions come from
    the trained graph, so that a fit and its predictions import neither onnx
    nor skl2onnx. ``defer``: the template's own graph (converted now, once per fit)
    is given its weights by its first use (a callback's ``fitted_estimator``, whose
    classifier predicts from the trained graph).
    """
    exported = exported_estimator(est)
    if trained_view(exported) is exported:
        return _joined(est, est._converted, now)
    located = est.__dict__.get("_export_converted")
    if located is None:
        try:
            located = convert_template(exported, export_inputs(est), est._converted.dtype)
        except ValueError:
            if not now:
                return DEFERRED
            model = export_model(exported, export_inputs(est), est._converted.dtype)
            return join_head(est, model)
        est._export_converted = located
    if defer:
        return DEFERRED
    values = located.values_from(final_estimator(exported))
    return _joined(est, located.copy(values=values), now)


def _joined(est, converted, now=False):
    """``converted``, or after a fit on raw columns its model with the head joined
    (:data:`DEFERRED` unless ``now``)."""
    if "_raw_columns" in est.__dict__:
        return join_head(est, converted.model) if now else DEFERRED
    return converted


def export_now(est):
    """The exported model, made now if it was :data:`DEFERRED`."""
    model = est._export_model
    if model is DEFERRED:
        model = est._export_model = export(est, now=True)
    return model


def exported_estimator(est):
    """What skl2onnx converts: ``estimator_``, or after a fit on raw DataFrame
    columns its final model (the head, converted on its own, is joined to it)."""
    if "_raw_columns" in est.__dict__:
        return final_estimator(est.estimator_)
    return est.estimator_


def export_inputs(est):
    """Width of the exported graph's input ``X``: the features, or the head's output."""
    if "_raw_columns" in est.__dict__:
        return est._converted.input_width
    return est.n_features_in_


def release_trained_values(est, engine):
    """While a large model (``engine.large``) trains, ``estimator_`` and the ONNX
    model hold no trained values.

    The engine holds them; the values there before are two copies of the weights
    that the end of the fit (``_store_weights``, also after an error) replaces. A
    ``predict`` or ``to_onnx`` from another thread meanwhile gets a clear error.
    """
    if not engine.large:
        return
    conv = est._converted
    final = final_estimator(est.estimator_)
    trained = est._trained_indices()
    for k in trained:
        old = conv.params[k].get(final)
        placeholder = np.broadcast_to(np.array(np.nan, dtype=old.dtype), old.shape)
        conv.params[k].set(final, placeholder)  # no memory: one NaN, read-only
    conv.values = [None if k in trained else v for k, v in enumerate(conv.values)]
    if hasattr(final, "_best_coefs"):
        # views of the previous fit's weights (store_weights): one more copy otherwise;
        # store_weights makes them views of the trained weights again
        final._best_coefs = [c.view() for c in final.coefs_]
        final._best_intercepts = [i.view() for i in final.intercepts_]
    est._export_model = None


def check_weights_stored(est, what):
    if est.__dict__.get("_export_model", True) is None:
        raise RuntimeError(
            f"{type(est).__name__}.{what} was called while a fit of this estimator "
            "is training (in another thread): its weights are in the training "
            f"engine until the fit returns. Call {what} after fit returns."
        )


def store_weights(est, trained, sessions=True, statistics=None):
    """Store the trained weights ``trained`` into the converted graph and ``estimator_``,
    then make the exported model and (with ``sessions``) the inference sessions: a
    callback's ``fitted_estimator`` leaves them, and an exported model other than the
    trained graph (:func:`export`'s ``defer``), to their first use. ``statistics``:
    the running statistics of BatchNormalization trained in training mode, by name."""
    # No session of the previous model is left when the new one is made (a copy of
    # the weights each); predict makes them again should this not reach its end.
    est._session = est._logit_session = None
    conv = est._converted
    indices = est._trained_indices()
    values = conv.initializer_values(skip=set(indices))
    for k, w in zip(indices, trained):
        values[k] = w
    for k, name in enumerate(conv.initializer_names):
        if statistics and name in statistics:
            values[k] = statistics[name]
    conv.values = values  # the ONNX model is made from them when asked for
    final = final_estimator(est.estimator_)
    conv.write_back(final, values)
    if hasattr(final, "loss_curve_"):  # an MLP: its own counters follow the training
        final.n_iter_, final.t_ = est.n_iter_, est.t_
        final.loss_curve_ = list(final.loss_curve_) + est.loss_curve_[-est.n_iter_ :]
        if hasattr(final, "_best_coefs"):
            # the best weights are the trained ones (early stopping went back to
            # them), as MLPRegressor leaves them after early stopping; views, so
            # that the initial weights are not kept for the estimator's life
            final._best_coefs = [c.view() for c in final.coefs_]
            final._best_intercepts = [i.view() for i in final.intercepts_]
    est._export_model = export(est, defer=not sessions)
    if sessions:
        make_sessions(est)


def make_sessions(est):
    """Create the inference session ``est`` predicts with, after each fit (and after
    unpickling): the trained graph's for a classifier (its predictions come from the
    logits), the exported model's for a regressor; one session where they are the same
    graph.

    The other one is made when first needed (:func:`trained_session`,
    :func:`export_session`), as a :data:`DEFERRED` exported model's: a classifier's
    exported model (its label and probability outputs) serves only modified Huber's
    probabilities, and its session cost ``LogisticRegression`` on iris a fifth of its
    fit and score (8.0 -> 6.4 ms).
    """
    # The previous fit's sessions go first: each holds a copy of the weights.
    est._session = est._logit_session = None
    exported = est._export_model
    if exported is est._converted:
        est._session = est._logit_session = new_session(est, est._converted)
    elif est._predicts_from_trained_graph:
        est._logit_session = new_session(est, est._converted)
    elif exported is not DEFERRED:
        est._session = new_session(est, exported)


def new_session(est, model):
    """An inference session of ``model`` (a :class:`ConvertedTemplate`: its
    skeleton's bytes, the weights given as initializers; or an ONNX model) on the
    estimator's device, with the threads of where it is made (a worker after
    unpickling)."""
    try:
        device_to_providers(est.device)
        # the device index and TF32 (off unless set_config(allow_tf32=True)), as training
        providers, provider_options = session_providers(est.device)
    except ValueError as exc:  # fitted on a GPU, loaded where there is none
        if not str(est.device).lower().startswith("cuda"):
            raise
        warnings.warn(
            f"This model was fitted with device={est.device!r}, which is not available "
            f"here ({exc}): it predicts on the CPU. Set device='cpu' before "
            "continuing its training here.",
            UserWarning,
            stacklevel=4,
        )
        providers, provider_options = ["CPUExecutionProvider"], [{}]
    options = session_options(intra_op_threads(getattr(est, "n_jobs", None)), spinning=False)
    if isinstance(model, ConvertedTemplate):  # options of its own: it adds initializers
        return model.session(options, providers, provider_options)
    return make_session(
        model.SerializeToString(), options, providers, provider_options, strict=False
    )


class FedSession:
    """The process's session of a trained graph whose parameters are inputs, fed the
    values of one copy of the model.

    A callback's ``fitted_estimator`` (a copy of the estimator at the end of an epoch
    or L-BFGS iteration) predicts through it: a session made per epoch, then freed,
    cost 1.5 to 3 ms an epoch beside 0.2 ms for the prediction (iris); this one is
    made once per graph and thread count
    (:data:`~onnxgrad_sklearn.runtime.SESSIONS`). Its parameters are not constants,
    so that onnxruntime does not pre-pack them: predictions can differ from the fitted
    estimator's in the last bits of float32 (7e-7 on an MLP of scikit-learn's
    diabetes data), as any two runtimes' do. Runs as an ``InferenceSession`` does
    (``run``, ``get_inputs``, ``get_outputs``); CPU only.

    Parameters
    ----------
    converted : ConvertedTemplate
        The copy's trained graph and values.
    threads : int
        Threads of the session (``intra_op_num_threads``).
    """

    #: ``(id of a skeleton, threads)`` -> ``(skeleton, key, weights, options)``: the
    #: pool's key of the copies of one fit (which share their skeleton), worked out once.
    _keys: dict = {}

    def __init__(self, converted: ConvertedTemplate, threads: int):
        self._converted, self._threads = converted, threads
        self._session = self._feeds = None

    def _key(self):
        conv = self._converted
        found = FedSession._keys.get((id(conv.skeleton), self._threads))
        if found is not None and found[0] is conv.skeleton:
            return found[1:]
        import hashlib

        options = session_options(self._threads, spinning=False)
        digest = hashlib.sha256(conv.skeleton).hexdigest()
        names = tuple(conv.initializer_names)
        key = ("fed", digest, names, options_key(options, ["CPUExecutionProvider"]))
        weights = sum(int(np.prod(d)) for d in conv.dims)
        if len(FedSession._keys) >= 16:  # the last fits' only
            FedSession._keys.clear()
        found = (conv.skeleton, key, weights, options)
        FedSession._keys[(id(conv.skeleton), self._threads)] = found
        return found[1:]

    def _made(self):
        if self._session is None:
            conv = self._converted
            key, weights, options = self._key()

            def make():
                from ._passes import initializers_as_inputs

                graph = initializers_as_inputs(conv.with_values(None), conv.initializer_names)
                return make_session(
                    graph.SerializeToString(), options, ["CPUExecutionProvider"], strict=False
                )

            self._session = SESSIONS.shared(key, make, weights)
            self._feeds = {
                n: np.ascontiguousarray(v) for n, v in zip(conv.initializer_names, conv.values)
            }
        return self._session

    @property
    def _onnxgrad_io(self):
        """The names ``_data.run_by_chunks`` reads: those of the process's session."""
        return getattr(self._made(), "_onnxgrad_io", None)

    @_onnxgrad_io.setter
    def _onnxgrad_io(self, names):
        self._made()._onnxgrad_io = names

    def run(self, output_names, input_feed, run_options=None):
        """``InferenceSession.run`` with the parameters' values added to ``input_feed``."""
        session = self._made()
        return session.run(output_names, {**input_feed, **self._feeds}, run_options)

    def get_inputs(self):
        """The graph's inputs: the data's first, then the parameters'."""
        return self._made().get_inputs()

    def get_outputs(self):
        """The graph's outputs."""
        return self._made().get_outputs()


def fed_sessions(est) -> dict:
    """The sessions of a callback's ``fitted_estimator``: ``{"_logit_session": ...}``
    and ``"_session"`` where the exported model is the trained graph; none (sessions
    of its own, made when it first predicts) on a GPU, for a fit on a DataFrame's raw
    columns, or where the values are not all in memory."""
    conv = est._converted
    device = str(getattr(est, "device", "cpu") or "cpu").lower()
    if (
        not device.startswith("cpu")
        or "_raw_columns" in est.__dict__
        or any(v is None for v in conv.values)
    ):
        return {}
    fed = FedSession(conv, intra_op_threads(getattr(est, "n_jobs", None)))
    found = {"_logit_session": fed}
    if est.__dict__.get("_export_model") is conv:
        found["_session"] = fed
    return found


def export_session(est):
    """The session of the exported model (the model made now if it was deferred)."""
    session = est.__dict__.get("_session")
    if session is None:
        exported = export_now(est)
        if exported is est._converted:  # the trained graph itself: one session
            session = trained_session(est)
        else:
            session = new_session(est, exported)
        est._session = session
    return session


def trained_session(est):
    """The session of the trained graph, made now if there is none: a callback's
    ``fitted_estimator`` makes only the sessions its predictions use (a
    classifier's, the trained graph's), when they first need it."""
    session = est.__dict__.get("_logit_session")
    if session is None:
        session = est._logit_session = new_session(est, est._converted)
    return session


def run_onnx(est, X, trained_graph=False):
    """Run the exported model (or the trained graph) on X; return its outputs by name."""
    if "_converted" not in est.__dict__:
        check_is_fitted(est)  # not fitted: scikit-learn's error
    check_weights_stored(est, "predict")
    if "_raw_columns" in est.__dict__:  # fitted on a DataFrame's raw columns
        session = trained_session(est) if trained_graph else export_session(est)
        return run_raw(est, X, session, trained_graph)
    X = template_input(est.estimator_).predict(est, X, est._converted.dtype)
    # made here after a fit that stopped while storing, and for a callback's
    # fitted_estimator (the sessions it predicts with, when it first predicts)
    session = trained_session(est) if trained_graph else export_session(est)
    return run_by_chunks(session, X)
