"""How ``X`` reaches a template's graph: one interface, an implementation per kind of template.

A scikit-learn template's graph takes 2-D float rows (dense or sparse; a DataFrame's
columns through the template's head); an ONNX template's graph takes its input's rank
and element type, after the steps of a Pipeline in front of it, which scikit-learn
runs. The fit, its validation set, the predictions and a dask cluster's placement
reach the graph through the object :func:`template_input` gives for the template:
nothing else in the library tests which kind of template it has (the command line
does, for the flags it takes with an ONNX model).
"""

from __future__ import annotations

import copy

import numpy as np
from sklearn.base import is_classifier
from sklearn.utils.validation import validate_data

from ._data import as_rows
from ._frames import validate_fit_data, validate_validation_data
from .onnx_template import TemplateSpec, conform_input, input_spec, validate_onnx_input
from .templates import unfitted_head_steps

__all__ = ["ArrayInput", "OnnxInput", "TemplateInput", "template_input"]


class TemplateInput:
    """What a template's graph takes, and how ``X`` is checked and brought to it.

    Each method raises a ``ValueError`` naming what is wrong with ``X`` before
    anything reaches the runtime.
    """

    def fit(self, est, template, X, y, first_call: bool, dtype):
        """Check the training rows ``X`` and ``y`` of a fit of ``template``.

        Returns ``(X, y, dtype)``: ``X`` as the graph takes it (in ``dtype`` where
        the graph's float type follows the data's), ``y`` checked for its length,
        and the float type of the fit (``dtype``, or the one ``X`` decides when
        ``dtype`` is None).
        """
        raise NotImplementedError

    def validation(self, est, template, X_val, dtype):
        """``X_val`` checked against the fit's training rows, as the graph takes it."""
        raise NotImplementedError

    def predict(self, est, X, dtype):
        """``X`` given to a fitted estimator's predictions, as its graph takes it."""
        raise NotImplementedError

    def export_warning(self, template) -> str | None:
        """What the exported graph does not take of ``template`` (None: all of it)."""
        return None

    def cluster_refusal(self) -> str | None:
        """Why a dask collection's rows train where their batches are rather than on
        the cluster's workers (None: they train on the workers)."""
        return None


class ArrayInput(TemplateInput):
    """A scikit-learn template: 2-D float rows, dense or sparse, or a DataFrame whose
    columns the template's head takes by name (:mod:`onnxgrad_sklearn._frames`)."""

    def fit(self, est, template, X, y, first_call, dtype):
        X, y = validate_fit_data(
            est,
            X,
            y,
            reset=first_call,
            accept_sparse=["csr", "csc"],
            multi_output=True,
            dtype=[np.float64, np.float32] if dtype is None else [np.float32, np.float64],
            y_numeric=not is_classifier(est),
        )
        return X, y, dtype

    def validation(self, est, template, X_val, dtype):
        return validate_validation_data(est, X_val, dtype)

    def predict(self, est, X, dtype):
        X = validate_data(
            est, X, reset=False, accept_sparse=["csr", "csc"], dtype=[np.float32, np.float64]
        )
        return as_rows(X, dtype)


class OnnxInput(TemplateInput):
    """An ONNX template (:class:`~onnxgrad_sklearn.OnnxTemplate`): ``X`` of its input's
    rank, declared dimensions and element type; the steps of a Pipeline in front of it
    are fitted on a first fit (when they are not) and run by scikit-learn.

    Parameters
    ----------
    spec : TemplateSpec
        The model's data input (:func:`~onnxgrad_sklearn.onnx_template.input_spec`).
    """

    def __init__(self, spec: TemplateSpec):
        self.spec = spec

    def fit(self, est, template, X, y, first_call, dtype):
        X, y = validate_onnx_input(est, X, y, self.spec, first_call)
        if hasattr(template, "steps"):
            X = self._head_output(est, template, X, y, first_call)
        dtype = self.spec.float_type if dtype is None else dtype
        return conform_input(X, self.spec, dtype), y, dtype

    def validation(self, est, template, X_val, dtype):
        X_val = validate_onnx_input(est, X_val, None, self.spec, False, "X_val")[0]
        if hasattr(template, "steps"):
            X_val = fitted_head(est).transform(X_val)
        return conform_input(X_val, self.spec, dtype, "X_val")

    def predict(self, est, X, dtype):
        X = validate_onnx_input(est, X, None, self.spec, False)[0]
        if hasattr(est.estimator_, "steps"):  # the steps in front, run by scikit-learn
            X = est.estimator_[:-1].transform(X)
        return conform_input(X, self.spec, dtype)

    def export_warning(self, template):
        if not hasattr(template, "steps"):
            return None
        steps = [name for name, _ in template.steps[:-1]]
        return (
            f"The exported model is the ONNX template's graph: it takes the output of "
            f"the Pipeline's steps in front of it {steps}, which predict runs in "
            "scikit-learn. Apply them before feeding the exported model."
        )

    def cluster_refusal(self):
        return "the template is an ONNX model (OnnxTemplate), trained where its batches are"

    @staticmethod
    def _head_output(est, template, X, y, first_call):
        """``X`` through the steps in front of the template: fitted here on a first fit
        when they are not, and kept (``est._fitted_head``) for ``initialize``."""
        if first_call:
            head = copy.deepcopy(template[:-1])
            Xt = head.fit_transform(X, y) if unfitted_head_steps(template) else head.transform(X)
            est._fitted_head = head  # estimator_ is the Pipeline of these steps (initialize)
            return Xt
        return fitted_head(est).transform(X)


def fitted_head(est):
    """The fitted steps in front of an ONNX template: of this fit, or of the fitted model."""
    head = est.__dict__.get("_fitted_head")
    return est.estimator_[:-1] if head is None else head


def template_input(template) -> TemplateInput:
    """The input interface of ``template`` (a scikit-learn model, an ONNX template, or a
    Pipeline ending in either)."""
    spec = input_spec(template)
    return ArrayInput() if spec is None else OnnxInput(spec)
