"""What the dask tests count on the workers, the package keeping no counter for them.

:class:`Counting`, a worker plugin (``client.register_plugin(Counting())``, run again
on every worker that joins later, such as one a nanny starts after a kill), wraps
the package's worker-side functions in each worker process:

- ``served``: the rounds a worker served, the sums or steps of its server's calls
  (``_evaluate``, ``_batch_sums`` when its rows' weights are not all zero,
  ``_local_steps`` when its losses stay finite);
- ``predicted``: the validation rows a worker predicted during fits (``_predict_rows``);
- ``predictors``: the blocks predicted on dask collections, by ``id`` of the
  estimator that predicted them (``_apply``, ``_score_part`` of a block with rows).

The server (``_Server``) calls those functions by their module's name, and tasks and
graphs name them by module and name, so the wrappers are what runs. :func:`served`,
:func:`predicted`, :func:`predictors` and :func:`engines` read each worker's
numbers (``client.run``). The workers may not import this file: it is pickled by
value (``cloudpickle.register_pickle_by_value``), its numbers kept in the plugin,
which the worker holds.
"""

import sys
from collections import Counter

import cloudpickle
from distributed import WorkerPlugin

#: The plugin's name on the workers.
NAME = "onnxgrad-sklearn-test-counts"

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _rows_served(result):
    return True


def _sums_served(result):
    return result is not None  # None: the worker's rows of the batch weigh nothing


def _steps_served(result):
    return len(result[2]) > 0  # no weights: a loss was not finite, the steps stopped


class Counting(WorkerPlugin):
    """Counts what each worker process does for the tests (see the module)."""

    name = NAME

    def setup(self, worker):
        from sklearn.utils.validation import _num_samples

        from onnxgrad_sklearn._dask import predict
        from onnxgrad_sklearn._dask import worker as on_worker

        self.counts = {"served": Counter(), "predicted": Counter(), "predictors": Counter()}
        self.originals = []
        counts = self.counts

        def wrap(module, name, count):
            original = getattr(module, name)

            def wrapped(*args, **kwargs):
                result = original(*args, **kwargs)
                count(args, result)
                return result

            self.originals.append((module, name, original))
            setattr(module, name, wrapped)

        for name, served in (
            ("_evaluate", _rows_served),
            ("_batch_sums", _sums_served),
            ("_local_steps", _steps_served),
        ):

            def count(args, result, served=served):
                if served(result):
                    counts["served"][args[1]] += 1  # by fit (args: payload, fit_id, ...)

            wrap(on_worker, name, count)

        def count_predicted(args, result):
            counts["predicted"][args[1]] += len(result[0])

        def count_block(args, result):  # _apply(block, est, name)
            counts["predictors"][id(args[1])] += 1

        def count_scored(args, result):  # _score_part(est, X, y, w, classifier)
            if _num_samples(args[1]):
                counts["predictors"][id(args[0])] += 1

        wrap(on_worker, "_predict_rows", count_predicted)
        wrap(predict, "_apply", count_block)
        wrap(predict, "_score_part", count_scored)

    def teardown(self, worker):
        for module, name, original in reversed(self.originals):
            setattr(module, name, original)


def _read(what, clear=False, dask_worker=None):
    plugin = dask_worker.plugins[NAME]
    found = plugin.counts[what]
    out = dict(found) if what == "predictors" else sum(found.values())
    if clear:
        found.clear()
    return out


def served(client):
    """The rounds each worker served so far (``{address: n}``)."""
    return client.run(_read, "served")


def predicted(client):
    """The validation rows each worker predicted during fits so far (``{address: n}``)."""
    return client.run(_read, "predicted")


def predictors(client, clear=False):
    """``{address: {id of an estimator: blocks it predicted}}``; ``clear``: then forget."""
    return client.run(_read, "predictors", clear)


def _engines_kept():
    from onnxgrad_sklearn._dask import worker

    with worker._ENGINES_LOCK:
        return len(worker._ENGINES) + len(worker._ORDERS)


def engines(client):
    """The engines and local-SGD orders each worker keeps (``{address: n}``)."""
    return client.run(_engines_kept)
