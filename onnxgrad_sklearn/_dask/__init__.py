"""Dask collections: fit on a cluster's workers, predict partition by partition.

``fit`` given dask arrays, DataFrames or Series (``_base._fit`` sends them to
:func:`fit_dask`):

- Without a ``distributed`` client, or for what this version trains in one process
  (a loss whose rows mix, non-numeric columns without a ColumnTransformer head), the
  collections are computed into memory and the fit runs as it does on NumPy or pandas
  data, which an INFO log says.
- Otherwise :class:`DaskRows` keeps each partition of X on the worker that holds it,
  with its blocks of y and of the sample weights moved there, checked and in the
  training dtype, and takes the place of X in the shared fit (``_base._fit``). Each
  worker builds its engines once per fit from bytes sent once (an
  :class:`~onnxgrad_sklearn.engine.EngineRecipe`, the loss and the penalty), with its
  ``nthreads`` (``worker._ENGINES``). A fit makes a server on each worker holding
  partitions (a dask actor, ``worker._Server``, made by a task pinned to that worker,
  which hands it the partitions), and every training round is one call of each
  server (:meth:`.rounds.Rounds.serve`): the calls go to the workers without the
  batching of the client's and the scheduler's task messages (every 10 and 5 ms),
  and what they carry is not kept after them.
- The full-batch L-BFGS solver (``_fit.Fit.run_lbfgs``) gets its objective
  from :meth:`DaskRows.objective`: a :class:`DaskFullBatchObjective`, the loop's
  ``_FullBatchObjective`` whose sums over chunks of rows are made on the workers, one
  round per evaluation; the client adds them in the order of the partitions and
  chunks, in float64, and applies the penalty as for rows in memory.
- A mini-batch optimizer (``_fit.Fit.run_epochs``) gets its batches from
  :meth:`DaskRows.batches` (``batches._DaskBatches``): each step's batch is the one
  the fit in memory draws; the workers holding its rows sum the loss and its
  gradients over them, the client adds the sums and the penalty and makes the update
  (``TrainingEngine.apply_gradients``): one round per step. With ``sync_every > 1``
  (local SGD, ``batches._LocalBatches``) each worker trains on its own rows,
  ``sync_every`` steps a round, and the weights are averaged.
- Validation rows stay where they are: early stopping's held-out split is drawn as in
  one process (:meth:`DaskRows.split`), and a validation set given as dask
  collections is kept on the workers holding its blocks
  (:meth:`DaskRows.validation_set`); at each epoch those workers predict its rows
  with the fit's engines, and only the predictions come to the client, which scores
  them as it scores a validation set in memory (``batches._HeldOut``). An ``X_val``
  in memory is scored on the client (its ``y_val`` and weights computed into memory).

``predict``, ``predict_proba``, ``predict_log_proba``, ``decision_function`` and
``score`` on dask collections (``_base.dask_aware``) go to :func:`run_method`.

The modules, from the top (``pyproject.toml`` declares these layers):

- ``fit``: :func:`fit_dask`, on the workers or in memory; ``predict``:
  :func:`run_method`;
- ``placement``: :class:`DaskRows`, the training rows' partitions and their workers;
- ``batches``: the client's side of the epochs (steps, local SGD, early stopping's
  split, the L-BFGS objective); ``rounds``: how the rounds reach the workers, and the
  recovery after workers leave (:class:`DaskWorkerLostError`);
- ``blocks``: collections' kinds and blocks of rows; ``client``: the client and the
  workers' versions; ``head``: a template's preprocessing head fitted on the
  partitions; ``worker``: everything that runs on a worker.
"""

from .batches import DaskFullBatchObjective
from .fit import fit_dask
from .placement import DaskRows
from .predict import run_method
from .rounds import DaskWorkerLostError

__all__ = [
    "DaskFullBatchObjective",
    "DaskRows",
    "DaskWorkerLostError",
    "fit_dask",
    "run_method",
]
