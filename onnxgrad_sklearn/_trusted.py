"""The types of this package that a fitted estimator's skops file holds."""

from . import families, losses, onnx_template, optim, templates
from .classifier import OrtGradientClassifier
from .regressor import OrtGradientRegressor


def _trusted_types():
    def name(cls):
        return f"{cls.__module__}.{cls.__qualname__}"

    fixed = [
        OrtGradientClassifier,
        OrtGradientRegressor,
        templates.ConvertedTemplate,
        families.ParamRef,
        onnx_template.OnnxTemplate,
        optim.LearningRateSchedule,
        losses.OneVsRestLogLoss,
    ]
    registered = [*optim._OPTIMIZERS.values(), *losses._LOSSES.values()]
    names = [name(cls) for cls in fixed + registered]
    # fitted before the model families had their own module
    names.append("onnxgrad_sklearn.templates.ParamRef")
    # fitted before the converted graph had its own module
    names.append("onnxgrad_sklearn.templates.ConvertedTemplate")
    return sorted(set(names))


#: Types to pass as ``trusted`` to ``skops.io.load`` for a fitted estimator of
#: this package (besides scikit-learn's own, which skops trusts by default).
SKOPS_TRUSTED_TYPES = _trusted_types()
