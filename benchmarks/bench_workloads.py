"""The benchmark's workloads: data, models and the estimators of each framework.

Two kinds of workload:

* epoch workloads (:data:`WORKLOADS`): seconds per epoch of a fit that is already
  warm (the engine made), on 50,000 rows and more;
* whole-fit workloads (:data:`FITS`): the time of a whole ``fit`` of a new
  estimator on small data, as most scikit-learn users train (conversion, graphs
  and sessions included), in float32 and float64.

The columns (:data:`FRAMEWORKS`): this package with each backend (``agent``:
onnxruntime-training's TrainingAgent, ``standard``: onnx-ad gradient graphs),
a PyTorch loop and scikit-learn, all from the same data, the same initial
weights (scikit-learn's Glorot draws for the MLPs) and equivalent update rules.
The epoch workloads have one more column, :data:`FLOOR`: NumPy computing only the
matrix products and activations of each batch (:func:`floor_step`), the time no
framework can go below with the same BLAS at the same thread count.
"""

from __future__ import annotations

import numpy as np
from bench_common import SEED, THREADS

#: Columns of the tables: the package's two backends, PyTorch, scikit-learn.
FRAMEWORKS = ("agent", "standard", "torch", "sklearn")
#: The columns that are this package (``framework`` -> ``backend``).
ORT_BACKENDS = ("agent", "standard")
#: The epoch workloads' reference column: NumPy's matrix products and activations only.
FLOOR = "floor"
#: Columns of the epoch tables: the frameworks, then the floor.
EPOCH_COLUMNS = (*FRAMEWORKS, FLOOR)

#: Epoch workloads; ``quick_rows`` replaces ``rows`` with --quick.
WORKLOADS = {
    "mlp_reg_b256": {
        "title": "MLP regression 100-256-256-1, Nesterov, batch 256",
        "kind": "mlp_reg",
        "rows": 50_000,
        "quick_rows": 3_000,
        "features": 100,
        "hidden": (256, 256),
        "optimizer": "nesterov",
        "batch": 256,
        "lr": 0.001,
    },
    "mlp_reg_b32": {
        "title": "MLP regression 100-256-256-1, Nesterov, batch 32",
        "kind": "mlp_reg",
        "rows": 50_000,
        "quick_rows": 1_500,
        "features": 100,
        "hidden": (256, 256),
        "optimizer": "nesterov",
        "batch": 32,
        "lr": 0.001,
    },
    "mlp_clf_b64": {
        "title": "MLP classification 100-128-3, Adam, batch 64",
        "kind": "mlp_clf",
        "rows": 50_000,
        "quick_rows": 3_000,
        "features": 100,
        "hidden": (128,),
        "classes": 3,
        "optimizer": "adam",
        "batch": 64,
        "lr": 0.001,
    },
    "linear_b1024": {
        "title": "LinearRegression 20 features, plain SGD, batch 1024",
        "kind": "linear",
        "rows": 1_000_000,
        "quick_rows": 50_000,
        "features": 20,
        "optimizer": "sgd",
        "batch": 1024,
        "lr": 0.01,
    },
}

#: Whole-fit workloads (small data); ``quick_epochs`` with --quick.
FITS = {
    "fit_diabetes_nesterov": {
        "title": "MLP (64,) on diabetes 442 x 10, Nesterov, batch 32, 100 epochs",
        "kind": "mlp_reg",
        "data": "diabetes",
        "rows": 442,
        "features": 10,
        "hidden": (64,),
        "optimizer": "nesterov",
        "batch": 32,
        "lr": 0.001,
        "epochs": 100,
        "quick_epochs": 10,
        "dtype": "float32",
    },
    "fit_5k_adam": {
        "title": "MLP (32, 32) on 5,000 x 20, Adam, batch 64, 50 epochs",
        "kind": "mlp_reg",
        "data": "synthetic",
        "rows": 5_000,
        "features": 20,
        "hidden": (32, 32),
        "optimizer": "adam",
        "batch": 64,
        "lr": 0.001,
        "epochs": 50,
        "quick_epochs": 5,
        "dtype": "float32",
    },
    "fit_b256_nesterov": {
        "title": "MLP 100-256-256-1 on 20,000 x 100, Nesterov, batch 256, 3 epochs",
        "kind": "mlp_reg",
        "data": "synthetic",
        "rows": 20_000,
        "features": 100,
        "hidden": (256, 256),
        "optimizer": "nesterov",
        "batch": 256,
        "lr": 0.001,
        "epochs": 3,
        "quick_epochs": 1,
        "dtype": "float32",
    },
}
for _name in list(FITS):
    FITS[_name + "_f64"] = {
        **FITS[_name],
        "title": FITS[_name]["title"] + ", float64",
        "dtype": "float64",
    }
del _name

SKLEARN_NOTE = {
    "linear_b1024": "SGDRegressor: per-sample SGD (not mini-batch)",
}


def frameworks_for(spec: dict) -> tuple[str, ...]:
    """The columns a workload has: the TrainingAgent trains float32 only."""
    if spec.get("dtype") == "float64":
        return tuple(f for f in FRAMEWORKS if f != "agent")
    return FRAMEWORKS


def make_data(spec: dict, rows: int | None = None):
    """Return ``X`` (C-contiguous, the workload's dtype) and ``y``, from a fixed seed."""
    dtype = np.dtype(spec.get("dtype", "float32"))
    if spec.get("data") == "diabetes":
        from sklearn.datasets import load_diabetes

        X, y = load_diabetes(return_X_y=True)
        X = (X - X.mean(axis=0)) / X.std(axis=0)
        y = (y - y.mean()) / y.std()
        return np.ascontiguousarray(X, dtype=dtype), np.ascontiguousarray(y, dtype=dtype)
    rows = rows or spec["rows"]
    rng = np.random.default_rng(SEED)
    n_features = spec["features"]
    X = rng.standard_normal((rows, n_features), dtype=np.float32)
    w = rng.standard_normal(n_features).astype(np.float32) / np.sqrt(n_features)
    if spec["kind"] == "mlp_clf":
        W = rng.standard_normal((n_features, spec["classes"])).astype(np.float32)
        y = np.argmax(X @ W + 0.5 * rng.standard_normal((rows, spec["classes"])), axis=1)
        return X, y.astype(np.int64)
    z = X @ w
    if spec["kind"] == "mlp_reg":
        z = z + 0.5 * np.sin(2 * X[:, 0]) * X[:, 1]
    y = z + 0.1 * rng.standard_normal(rows).astype(np.float32)
    return np.ascontiguousarray(X, dtype=dtype), np.ascontiguousarray(y, dtype=dtype)


def n_outputs(spec: dict) -> int:
    """Width of the model's last layer."""
    return spec["classes"] if spec["kind"] == "mlp_clf" else 1


def layer_units(spec: dict) -> list[int]:
    """Units of every layer of an MLP workload, input and output included."""
    return [spec["features"], *spec["hidden"], n_outputs(spec)]


def glorot_weights(units, seed: int = SEED):
    """Return MLPRegressor's initial (coefs, intercepts) for ``units``, relu activation."""
    rng = np.random.RandomState(seed)
    coefs, intercepts = [], []
    for fan_in, fan_out in zip(units[:-1], units[1:]):
        bound = np.sqrt(6.0 / (fan_in + fan_out))
        coefs.append(rng.uniform(-bound, bound, (fan_in, fan_out)))
        intercepts.append(rng.uniform(-bound, bound, fan_out))
    return coefs, intercepts


def model_memory(spec: dict) -> dict:
    """Parameters of a workload's model and MB of weights + gradients + optimizer state."""
    if spec["kind"] == "linear":
        n = spec["features"] + 1
    else:
        units = layer_units(spec)
        n = sum(a * b + b for a, b in zip(units[:-1], units[1:]))
    n_state = {"sgd": 0, "nesterov": 1, "adam": 2}[spec["optimizer"]]
    size = np.dtype(spec.get("dtype", "float32")).itemsize
    return {"n_params": n, "weights_grads_state_mb": n * size * (2 + n_state) / 2**20}


def ort_estimator(
    spec: dict,
    backend: str,
    max_iter: int,
    batch: int | None = None,
    warm_start=True,
    threads: int = THREADS,
):
    """Return the onnxgrad_sklearn estimator of a workload (no penalty, fixed seed).

    The threads are set through the estimator's own ``n_jobs`` (onnxruntime ignores
    ``OMP_NUM_THREADS``), the backend through ``backend``.
    """
    from sklearn.linear_model import LinearRegression
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor

    common = dict(
        optimizer=spec["optimizer"],
        learning_rate_init=spec["lr"],
        batch_size=batch or spec["batch"],
        max_iter=max_iter,
        alpha=0.0,
        random_state=SEED,
        warm_start=warm_start,
        tol=0.0,
        n_iter_no_change=10**6,
        n_jobs=threads,
        backend=backend,
        dtype=spec.get("dtype", "float32"),
    )
    if spec["kind"] == "mlp_reg":
        return OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=spec["hidden"]), **common)
    if spec["kind"] == "mlp_clf":
        return OrtGradientClassifier(MLPClassifier(hidden_layer_sizes=spec["hidden"]), **common)
    return OrtGradientRegressor(LinearRegression(), **common)


def sklearn_estimator(spec: dict, max_iter: int, warm_start=True):
    """Return scikit-learn's estimator of a workload: an MLP, or SGDRegressor (per sample)."""
    from sklearn.linear_model import SGDRegressor
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    if spec["kind"] == "linear":
        return SGDRegressor(
            max_iter=max_iter,
            tol=None,
            penalty=None,
            learning_rate="constant",
            eta0=spec["lr"],
            random_state=SEED,
            warm_start=warm_start,
        )
    cls = MLPClassifier if spec["kind"] == "mlp_clf" else MLPRegressor
    return cls(
        hidden_layer_sizes=spec["hidden"],
        solver="adam" if spec["optimizer"] == "adam" else "sgd",
        momentum=0.9,
        nesterovs_momentum=True,
        learning_rate_init=spec["lr"],
        batch_size=spec["batch"],
        alpha=0.0,
        max_iter=max_iter,
        tol=0.0,
        n_iter_no_change=10**6,
        random_state=SEED,
        warm_start=warm_start,
    )


def torch_trainer(spec: dict, X, y, threads: int = THREADS):
    """Return ``epoch(phases=None)``: one epoch of the PyTorch loop of a workload.

    Same model, initial weights, optimizer formulas and epoch shuffle (a permuted
    copy of the data, then slices); the loss is read back at every batch, as the
    estimators do. ``phases`` (a defaultdict) receives the time of each part.
    """
    import time

    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(SEED)
    dtype = torch.float64 if spec.get("dtype") == "float64" else torch.float32
    nn = torch.nn
    if spec["kind"] == "linear":
        model = nn.Linear(spec["features"], 1).to(dtype)
        with torch.no_grad():
            model.weight.zero_()
            model.bias.zero_()
    else:
        coefs, intercepts = glorot_weights(layer_units(spec))
        layers = []
        for i, (c, b) in enumerate(zip(coefs, intercepts)):
            lin = nn.Linear(c.shape[0], c.shape[1]).to(dtype)
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(c.T.copy()))
                lin.bias.copy_(torch.from_numpy(b))
            layers.append(lin)
            if i < len(coefs) - 1:
                layers.append(nn.ReLU())
        model = nn.Sequential(*layers)
    params = list(model.parameters())
    if spec["optimizer"] == "nesterov":
        # torch keeps buf = m*buf + g and steps p -= lr*(g + m*buf): scikit-learn's
        # v = m*v - lr*g; p += m*v - lr*g with v = -lr*buf (constant learning rate).
        opt = torch.optim.SGD(params, lr=spec["lr"], momentum=0.9, nesterov=True)
    elif spec["optimizer"] == "adam":
        opt = torch.optim.Adam(params, lr=spec["lr"], betas=(0.9, 0.999), eps=1e-8)
    else:
        opt = torch.optim.SGD(params, lr=spec["lr"])
    if spec["kind"] == "mlp_clf":

        def loss_fn(out, target):
            return torch.nn.functional.cross_entropy(out, target)

    else:

        def loss_fn(out, target):
            return 0.5 * torch.mean((out - target) ** 2)

    y_model = y if spec["kind"] == "mlp_clf" else y.reshape(-1, 1)
    batch = spec["batch"]
    n = X.shape[0]
    rng = np.random.RandomState(SEED)

    def epoch(phases=None):
        t0 = time.perf_counter()
        idx = rng.permutation(n)
        Xe = torch.from_numpy(X[idx])
        ye = torch.from_numpy(y_model[idx])
        if phases is not None:
            phases["shuffle"] += time.perf_counter() - t0
        total = 0.0
        for start in range(0, n, batch):
            t0 = time.perf_counter()
            xb, yb = Xe[start : start + batch], ye[start : start + batch]
            t1 = time.perf_counter()
            out = model(xb)
            loss = loss_fn(out, yb)
            value = loss.item()
            t2 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            t3 = time.perf_counter()
            opt.step()
            t4 = time.perf_counter()
            total += value * xb.shape[0]
            if phases is not None:
                phases["slice"] += t1 - t0
                phases["forward"] += t2 - t1
                phases["backward"] += t3 - t2
                phases["update"] += t4 - t3
        return total / n

    return epoch


def floor_weights(spec: dict) -> list:
    """The floor's float32 weight matrices: the MLPs' Glorot draws, zeros for the linear model.

    The same initial weights as the other columns (biases left out: the floor has none).
    """
    if spec["kind"] == "linear":
        return [np.zeros((spec["features"], 1), dtype=np.float32)]
    coefs, _ = glorot_weights(layer_units(spec))
    return [np.ascontiguousarray(c, dtype=np.float32) for c in coefs]


def floor_step(weights: list, xb, yb, kind: str) -> list:
    """The floor's work on one batch; return the gradient of each weight matrix.

    Forward: ``A = max(A_prev @ W, 0)`` for the hidden layers, ``Z = A @ W`` for the
    output layer (the linear model: ``X @ w``). Output gradient: ``Z - y`` (squared
    error; ``yb`` a column) or, for ``mlp_clf``, ``softmax(Z) - onehot(y)``. Backward,
    for each layer from the last: ``A_prev.T @ dZ``, then, except for the first layer,
    ``dZ @ W.T`` times the ReLU mask. No bias, no bias gradients, no update, no loss.
    """
    acts = [xb]
    a = xb
    for w in weights[:-1]:
        a = a @ w
        np.maximum(a, 0, out=a)
        acts.append(a)
    dz = a @ weights[-1]
    if kind == "mlp_clf":
        dz -= dz.max(axis=1, keepdims=True)
        np.exp(dz, out=dz)
        dz /= dz.sum(axis=1, keepdims=True)
        dz[np.arange(dz.shape[0]), yb] -= 1.0
    else:
        dz -= yb
    grads = [None] * len(weights)
    for i in range(len(weights) - 1, -1, -1):
        grads[i] = acts[i].T @ dz
        if i > 0:
            dz = dz @ weights[i].T
            dz *= acts[i] > 0
    return grads


def floor_trainer(spec: dict, X, y):
    """Return ``epoch()``: the floor's work over one epoch of a workload (float32 NumPy).

    The epoch shuffle of :func:`torch_trainer` (a permuted copy of the data, then
    slices of the batch size), then :func:`floor_step` on each batch; the weights
    never change. The BLAS threads are the caller's (threadpoolctl).
    """
    weights = floor_weights(spec)
    kind = spec["kind"]
    y_model = y if kind == "mlp_clf" else y.reshape(-1, 1)
    batch = spec["batch"]
    n = X.shape[0]
    rng = np.random.RandomState(SEED)

    def epoch():
        idx = rng.permutation(n)
        Xe, ye = X[idx], y_model[idx]
        for start in range(0, n, batch):
            floor_step(weights, Xe[start : start + batch], ye[start : start + batch], kind)

    return epoch
