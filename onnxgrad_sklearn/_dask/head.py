"""A template Pipeline's head fitted on a dask cluster, from statistics that merge.

A fit on a cluster never gathers the rows. The steps in front of the final model
that are not fitted yet are fitted where the partitions are, when what they learn
from the data merges across partitions:

- a step with ``partial_fit`` (``StandardScaler``, ``MinMaxScaler``, ``MaxAbsScaler``,
  ``IncrementalPCA``...): its ``partial_fit`` runs on each partition in turn, on the
  partition's worker, the step travelling from one to the next (scikit-learn's own
  incremental statistics);
- ``OneHotEncoder`` and ``OrdinalEncoder``: the categories of each column are found
  on every partition and merged (sorted, as ``fit`` sorts them);
- a ``ColumnTransformer`` of such steps (``"passthrough"`` and ``"drop"`` too), or a
  Pipeline of them.

Any other step that is not fitted (an imputer, a quantile transformer: statistics
that do not merge exactly) is refused with an error that says to fit it first.
Each step sees the partitions as the steps before it transform them.
"""

from __future__ import annotations

import copy

import numpy as np

__all__ = ["fit_head"]

#: Encoders whose fit only finds the categories of each column.
_ENCODERS = ("OneHotEncoder", "OrdinalEncoder")


class _Refused(ValueError):
    pass


def fit_head(client, head, blocks, addresses):
    """A fitted copy of ``head`` (a Pipeline of the steps in front of the final model).

    ``blocks``: futures of the partitions of X, ``addresses``: the worker holding each.
    Steps already fitted are kept as they are.
    """
    from sklearn.pipeline import Pipeline

    from ..templates import is_fitted

    fitted = []
    for name, step in head.steps:
        if step not in (None, "passthrough") and not is_fitted(step):
            before = Pipeline(fitted) if fitted else None
            try:
                step = _fit_step(client, step, before, None, blocks, addresses)
            except _Refused as exc:
                raise ValueError(
                    f"The template's preprocessing step {name!r} is not fitted, and {exc} "
                    "cannot be fitted on a dask cluster (what it learns from the rows does "
                    "not merge across partitions): fit it first (for example on a sample "
                    "of the rows), or fit without a distributed client (the data is then "
                    "computed into memory)."
                ) from None
        fitted.append((name, step))
    out = copy.copy(head)
    out.steps = fitted
    return out


def _fit_step(client, step, before, columns, blocks, addresses):
    """``step`` fitted on the partitions transformed by ``before``, columns ``columns``."""
    from sklearn.compose import ColumnTransformer
    from sklearn.pipeline import Pipeline

    from ..templates import is_fitted

    if step in (None, "passthrough", "drop") or is_fitted(step):
        return step
    if isinstance(step, Pipeline):
        fitted = []
        for name, sub in step.steps:
            inner = _chain(before, columns, Pipeline(fitted) if fitted else None)
            fitted.append((name, _fit_step(client, sub, inner, None, blocks, addresses)))
        out = copy.copy(step)
        out.steps = fitted
        return out
    if isinstance(step, ColumnTransformer):
        return _fit_columns(client, step, _chain(before, columns, None), blocks, addresses)
    if type(step).__name__ in _ENCODERS and type(step).__module__.startswith("sklearn."):
        return _fit_encoder(client, step, before, columns, blocks, addresses)
    if hasattr(step, "partial_fit"):
        step = copy.deepcopy(step)
        for block, address in zip(blocks, addresses):  # one partition after the other
            step = client.submit(
                _partial_fit, step, before, columns, block, workers=[address], pure=False
            )
        return step.result()
    raise _Refused(f"{type(step).__name__}")


def _fit_encoder(client, step, before, columns, blocks, addresses):
    """An encoder fitted with the categories merged from every partition."""
    if getattr(step, "max_categories", None) is not None or getattr(
        step, "min_frequency", None
    ) not in (None, 0):
        raise _Refused(f"{type(step).__name__} with infrequent categories")
    found = client.gather(
        [
            client.submit(_categories, before, columns, block, workers=[a], pure=False)
            for block, a in zip(blocks, addresses)
        ]
    )
    found = [f for f in found if f is not None]
    merged = [np.unique(np.concatenate(per_column)) for per_column in zip(*found)]
    given = step.categories
    if given != "auto":
        return _fit_small(client, step, before, columns, blocks, addresses)
    step = copy.deepcopy(step)
    step.set_params(categories=merged)
    step = _fit_small(client, step, before, columns, blocks, addresses)
    step.set_params(categories=given)  # the template's, categories_ the merged ones
    return step


def _fit_small(client, step, before, columns, blocks, addresses):
    """``step`` fitted on a few rows: for steps whose fit needs only the columns' number
    and types (an encoder with its categories given)."""
    sample = _sample(client, before, columns, blocks, addresses)
    return copy.deepcopy(step).fit(sample)


def _fit_columns(client, ct, before, blocks, addresses):
    """A ColumnTransformer whose transformers are fitted on the cluster, each on its
    columns; assembled by a fit on a few rows, then given the fitted transformers."""
    if ct.remainder not in ("drop", "passthrough"):
        raise _Refused(f"ColumnTransformer with remainder={type(ct.remainder).__name__}")
    fitted = [
        (name, _fit_step(client, trans, before, cols, blocks, addresses), cols)
        for name, trans, cols in ct.transformers
    ]
    out = copy.deepcopy(ct)
    out.set_params(transformers=fitted)
    sample = _sample(client, before, None, blocks, addresses)
    out.fit(sample)  # fitted transformers are cloned and fitted again: put ours back
    by_name = {name: trans for name, trans, _ in fitted}
    out.transformers_ = [
        (name, by_name.get(name, trans) if trans not in ("drop", "passthrough") else trans, cols)
        for name, trans, cols in out.transformers_
    ]
    out.set_params(transformers=ct.transformers)  # the template's parameters
    return out


def _sample(client, before, columns, blocks, addresses, n=2):
    """The first ``n`` rows of the first partition that has rows, as the step sees them."""
    for block, address in zip(blocks, addresses):
        rows = client.submit(_head_rows, before, columns, block, n, workers=[address]).result()
        if rows is not None:
            return rows
    raise ValueError("X has no rows.")


def _chain(before, columns, after):
    """What turns a partition into the input of a step: ``before``, the columns
    ``columns`` of its output, then ``after``."""
    if columns is None and after is None:
        return before
    return _Input(before, columns, after)


class _Input:
    """The input of a step nested in a ColumnTransformer or a Pipeline."""

    def __init__(self, before, columns, after):
        self.before, self.columns, self.after = before, columns, after

    def transform(self, X):
        X = _view(X, self.before, self.columns)
        return X if self.after is None else self.after.transform(X)


def _view(block, before, columns):
    from sklearn.utils._indexing import _safe_indexing

    X = block if before is None else before.transform(block)
    if columns is None:
        return X
    if callable(columns):  # make_column_selector
        columns = columns(X)
    return _safe_indexing(X, columns, axis=1)


# on the workers -------------------------------------------------------------------
def _partial_fit(step, before, columns, block):
    if len(block) == 0:
        return step
    return step.partial_fit(_view(block, before, columns))


def _categories(before, columns, block):
    from sklearn.utils.validation import check_array

    if len(block) == 0:
        return None
    X = _view(block, before, columns)
    X = X if hasattr(X, "iloc") else check_array(X, dtype=None, ensure_all_finite=False)
    columns = [X.iloc[:, j].to_numpy() for j in range(X.shape[1])] if hasattr(X, "iloc") else X.T
    return [np.unique(c) for c in columns]


def _head_rows(before, columns, block, n):
    if len(block) == 0:
        return None
    part = block.iloc[:n] if hasattr(block, "iloc") else block[:n]
    return _view(part, before, columns)
