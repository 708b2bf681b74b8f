"""
Training an ONNX model exported by PyTorch
==========================================

Any ONNX model can be the template: here a small convolutional network is written in
PyTorch, exported once with ``torch.onnx.export``, and trained on scikit-learn's
digits 0 to 4 by an :class:`~onnxgrad_sklearn.OrtGradientClassifier` through
:class:`~onnxgrad_sklearn.OnnxTemplate`: PyTorch is needed to write the model, not to
train it. A ``FunctionTransformer`` in front reshapes the 64 pixel columns into
8 x 8 images, the model's input. Then transfer learning to the digits 5 to 9: the
trained convolutions frozen and only the last layer trained, or every weight.
"""

import io
import time
import warnings

import matplotlib.pyplot as plt
import numpy as np
import onnx
import torch
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer

from onnxgrad_sklearn import OnnxTemplate, OrtGradientClassifier


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16 * 2 * 2, 5)  # five classes in each task

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))


torch.manual_seed(0)
buffer = io.BytesIO()
torch.onnx.export(
    SmallCNN().eval(),
    (torch.zeros(1, 1, 8, 8),),
    buffer,
    dynamo=False,
    input_names=["image"],
    output_names=["logits"],
    dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
)
model = onnx.load_from_string(buffer.getvalue())
warnings.filterwarnings("ignore", category=ConvergenceWarning)  # a fixed number of epochs
print("initializers:", [init.name for init in model.graph.initializer])

X, y = load_digits(return_X_y=True)
X = (X / 16.0).astype(np.float32)
first, second = y < 5, y >= 5  # two tasks: the digits 0 to 4, then 5 to 9
X_train, X_test, y_train, y_test = train_test_split(X[first], y[first], random_state=0)
images = FunctionTransformer(lambda rows: rows.reshape(-1, 1, 8, 8))

# %%
# Every weight trained on the digits 0 to 4, with the estimators' defaults (Adam,
# batches of 200 rows).
clf = OrtGradientClassifier(make_pipeline(images, OnnxTemplate(model)), max_iter=100)
clf.fit(X_train, y_train)
print(f"digits 0-4, every weight trained: test accuracy {clf.score(X_test, y_test):.3f}")

# %%
# Transfer learning to the digits 5 to 9, from the trained model: first with the
# convolutions frozen (only the last layer learns: the frozen weights come back bit for
# bit and an epoch runs no backward pass through them), then with every weight
# fine-tuned, for comparison.
trained = clf.estimator_[-1].to_onnx()  # the ONNX model holding the trained weights
X_train, X_test, y_train, y_test = train_test_split(X[second], y[second], random_state=0)
curves = {}
for name, frozen in [("last layer", ["conv*"]), ("every weight", None)]:
    transfer = OrtGradientClassifier(
        make_pipeline(images, OnnxTemplate(trained, frozen=frozen)), max_iter=100
    )
    start = time.perf_counter()
    transfer.fit(X_train, y_train)
    seconds = time.perf_counter() - start
    curves[name] = transfer.loss_curve_
    print(f"digits 5-9, {name} trained: test accuracy {transfer.score(X_test, y_test):.3f} "
          f"({seconds:.1f} s)")  # fmt: skip
    if frozen:
        kept = transfer.estimator_[-1]
given = {i.name: onnx.numpy_helper.to_array(i) for i in trained.graph.initializer}
same = all(
    np.array_equal(onnx.numpy_helper.to_array(i), given[i.name])
    for i in kept.to_onnx().graph.initializer
    if i.name.startswith("conv")
)
print(f"trained: {sorted(kept.weights_)}; frozen weights unchanged: {same}")

# %%
# The training curves on the digits 5 to 9.
for name, curve in curves.items():
    plt.plot(curve, label=f"{name} trained")
plt.xlabel("epoch")
plt.ylabel("training log-loss")
plt.legend()
plt.show()
