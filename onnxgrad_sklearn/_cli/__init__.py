"""The parts of the command line (:mod:`onnxgrad_sklearn.cli`), one module per job.

* :mod:`~onnxgrad_sklearn._cli.common`: the constants, errors and helpers every
  command uses (reading a CSV file, loading a saved model);
* :mod:`~onnxgrad_sklearn._cli.parser`: the argument parser;
* :mod:`~onnxgrad_sklearn._cli.data`: ``fit``'s training data, its checks and split;
* :mod:`~onnxgrad_sklearn._cli.choose`: ``fit``'s template, loss and target scaling;
* :mod:`~onnxgrad_sklearn._cli.report`: what ``fit`` prints and the files it writes;
* :mod:`~onnxgrad_sklearn._cli.fit` and :mod:`~onnxgrad_sklearn._cli.predict`: the commands.

The ONNX model ``fit`` writes is made by the library (:mod:`onnxgrad_sklearn._export`).
"""
