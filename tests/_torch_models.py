"""Small PyTorch models exported to ONNX, and a PyTorch training loop to compare with.

Imported by tests that skip without torch (``pytest.importorskip("torch")`` first).
"""

from __future__ import annotations

import io

import numpy as np
import onnx
import torch


def export(module, example, *, input_name="x", dynamic=True, opset=17, training=False):
    """``module`` exported by the legacy exporter (names kept, no constant folding)."""
    f = io.BytesIO()
    kwargs = {}
    if training:
        kwargs["training"] = torch.onnx.TrainingMode.TRAINING
    torch.onnx.export(
        module,
        (example,),
        f,
        dynamo=False,
        do_constant_folding=False,
        input_names=[input_name],
        output_names=["out"],
        dynamic_axes={input_name: {0: "batch"}, "out": {0: "batch"}} if dynamic else None,
        opset_version=opset,
        **kwargs,
    )
    return onnx.load_from_string(f.getvalue())


def distinct_(module, seed=0):
    """Give every parameter and buffer distinct values (the legacy exporter merges
    initializers of equal values: a fresh BatchNorm's bias and running mean)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in [*module.named_parameters(), *module.named_buffers()]:
            if p.dtype.is_floating_point:
                if "running_var" in name:
                    p.copy_(0.5 + torch.rand(p.shape, generator=gen, dtype=p.dtype))
                elif "running_mean" in name or "bias" in name:
                    p.add_(0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return module


def mlp(n_in=10, hidden=16, n_out=1, seed=0, dtype=torch.float32, softmax=False):
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(n_in, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, n_out)]
    if softmax:
        layers.append(torch.nn.Softmax(dim=1))
    return torch.nn.Sequential(*layers).to(dtype)


class SmallCNN(torch.nn.Module):
    """Conv, BatchNorm, ReLU, MaxPool, Conv, ReLU, AveragePool, Flatten, Linear."""

    def __init__(self, n_classes=3, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.c1 = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.c2 = torch.nn.Conv2d(4, 6, 3)
        self.fc = torch.nn.Linear(6, n_classes)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.c1(x))), 2)
        x = torch.nn.functional.avg_pool2d(torch.relu(self.c2(x)), 2)
        return self.fc(torch.flatten(x, 1))


class TextClassifier(torch.nn.Module):
    """Embedding, mean over the tokens, LayerNorm, Linear."""

    def __init__(self, vocabulary=50, dim=8, n_classes=3, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = torch.nn.Embedding(vocabulary, dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.fc = torch.nn.Linear(dim, n_classes)

    def forward(self, ids):
        return self.fc(self.norm(self.emb(ids).mean(dim=1)))


def train_sgd(module, X, y, loss, lr, batch_size, epochs=1, weight=None):
    """Plain SGD over consecutive batches (no shuffling), as the estimators with
    ``optimizer="sgd", shuffle=False``; ``loss``: "squared_error" (half the mean
    squared error) or "log_loss" (cross-entropy of the logits)."""
    opt = torch.optim.SGD(module.parameters(), lr=lr)
    X, y = torch.as_tensor(X), torch.as_tensor(y)
    for _ in range(epochs):
        for start in range(0, len(X), batch_size):
            xb, yb = X[start : start + batch_size], y[start : start + batch_size]
            opt.zero_grad()
            out = module(xb)
            if loss == "squared_error":
                value = 0.5 * ((out.reshape(yb.shape) - yb) ** 2).mean()
            else:
                value = torch.nn.functional.cross_entropy(out, yb)
            value.backward()
            opt.step()
    return {name: p.detach().numpy().copy() for name, p in module.named_parameters()}


def weights_by_name(model: onnx.ModelProto) -> dict:
    return {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}


def as_numpy(array):
    return np.asarray(array)
