"""The names of the training graph's inputs and outputs, which the engine, the
backends and the passes share (one definition each)."""

#: The batch dimension's name in the training graph.
BATCH = "batch"
#: The training graph's targets input, and the name of its second dimension.
Y_TRUE = "y_true"
TARGETS = "targets"
#: The training graph's per-row weights input.
SAMPLE_WEIGHT = "sample_weight"
#: The training graph's output: the weighted mean loss of the batch, penalty included.
LOSS = "loss"
#: Prefix of the optimizer's update graph's names inside a graph it is appended to (the
#: standard backend's step graph, the agent's gradient graph).
UPDATE = "update/"
#: The training graph's inputs holding the L2 and L1 coefficients of the penalty.
PENALTY_INPUTS = ("penalty_l2", "penalty_l1")
#: The training graph's metadata key saying it was made from an ONNX template
#: (``backends.choose_backend`` gives such graphs to the standard backend by default).
ONNX_TEMPLATE_KEY = "onnxgrad_sklearn.onnx_template"
