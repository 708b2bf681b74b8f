"""The optimizers' update graphs and the learning-rate schedule against scikit-learn's
``neural_network/_stochastic_optimizers.py``, number for number (float64 graphs)."""

import numpy as np
import onnxruntime
import pytest
from sklearn.neural_network._stochastic_optimizers import AdamOptimizer, SGDOptimizer

from onnxgrad_sklearn.optim import (
    SGD,
    Adam,
    LearningRateSchedule,
    Momentum,
    Nesterov,
    get_optimizer,
)

SHAPES = [(3, 4), (4,), (4, 1)]


def _weights(seed):
    rng = np.random.RandomState(seed)
    return [rng.randn(*shape) for shape in SHAPES]


def _steps(optimizer, learning_rate, flat, n_steps=4):
    """The weights after ``n_steps`` updates by the optimizer's ONNX graph."""
    model = optimizer.build_update_model(SHAPES, flat=flat, dtype=np.float64)
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    params = _weights(0)
    states = [optimizer.init_state(p) for p in params]
    for step in range(1, n_steps + 1):
        grads = _weights(step)
        feeds = {"learning_rate": np.array(optimizer.step_learning_rate(learning_rate, step))}
        if flat:
            feeds["param"] = np.concatenate([p.ravel() for p in params])
            feeds.update({f"grad_{i}": g for i, g in enumerate(grads)})
            for name in optimizer.state_names:
                feeds[name] = np.concatenate([s[name].ravel() for s in states])
            out = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
            sizes = np.cumsum([int(np.prod(s)) for s in SHAPES])[:-1]
            params = [p.reshape(s) for p, s in zip(np.split(out["new_param"], sizes), SHAPES)]
            for name in optimizer.state_names:
                parts = np.split(out[f"new_{name}"], sizes)
                for state, part, shape in zip(states, parts, SHAPES):
                    state[name] = part.reshape(shape)
        else:
            for i, (p, g, s) in enumerate(zip(params, grads, states)):
                feeds[f"param_{i}"], feeds[f"grad_{i}"] = p, g
                feeds.update({f"{name}_{i}": s[name] for name in optimizer.state_names})
            out = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
            params = [out[f"new_param_{i}"] for i in range(len(SHAPES))]
            for i, s in enumerate(states):
                for name in optimizer.state_names:
                    s[name] = out[f"new_{name}_{i}"]
    return params


def _sklearn_steps(make, n_steps=4):
    params = _weights(0)
    optimizer = make(params)
    for step in range(1, n_steps + 1):
        optimizer.update_params(params, _weights(step))
    return params


@pytest.mark.parametrize("flat", [False, True], ids=["per-weight", "flat"])
@pytest.mark.parametrize(
    "ours, momentum, nesterov",
    [(SGD(), 0.0, False), (Momentum(0.8), 0.8, False), (Nesterov(0.7), 0.7, True)],
    ids=["sgd", "momentum", "nesterov"],
)
def test_sgd_updates_are_scikit_learns(ours, momentum, nesterov, flat):
    got = _steps(ours, 0.05, flat)
    want = _sklearn_steps(
        lambda p: SGDOptimizer(p, 0.05, "constant", momentum=momentum, nesterov=nesterov)
    )
    for g, w, start in zip(got, want, _weights(0)):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)
        assert not np.allclose(g, start)


@pytest.mark.parametrize("flat", [False, True], ids=["per-weight", "flat"])
def test_adam_updates_are_scikit_learns(flat):
    ours = Adam(beta_1=0.8, beta_2=0.95, epsilon=1e-6)
    got = _steps(ours, 0.01, flat, n_steps=5)
    want = _sklearn_steps(
        lambda p: AdamOptimizer(p, 0.01, beta_1=0.8, beta_2=0.95, epsilon=1e-6), n_steps=5
    )
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)


def test_invscaling_schedule_is_scikit_learns():
    ours = LearningRateSchedule("invscaling", 0.1, power_t=0.3)
    theirs = SGDOptimizer(_weights(0), 0.1, "invscaling", power_t=0.3)
    for time_step in (10, 250, 4000):
        ours.iteration_ends(time_step)
        theirs.iteration_ends(time_step)
        assert ours.learning_rate == pytest.approx(theirs.learning_rate, rel=1e-15)


def test_adaptive_schedule_divides_by_five_then_stops_as_scikit_learn():
    ours = LearningRateSchedule("adaptive", 1e-4)
    theirs = SGDOptimizer(_weights(0), 1e-4, "adaptive")
    decisions = []
    for _ in range(8):
        decisions.append((ours.trigger_stopping("msg"), theirs.trigger_stopping("msg", False)))
        assert ours.learning_rate == pytest.approx(theirs.learning_rate, rel=1e-15)
    assert [a for a, _ in decisions] == [b for _, b in decisions]
    assert decisions[-1] == (True, True) and decisions[0] == (False, False)


def test_constant_schedule_stops_at_the_first_plateau():
    schedule = LearningRateSchedule("constant", 0.01)
    schedule.iteration_ends(1000)
    assert schedule.learning_rate == 0.01
    assert schedule.trigger_stopping("msg")


def test_optimizers_by_name_and_refusals():
    assert type(get_optimizer("nesterov")) is Nesterov
    assert type(get_optimizer("adam")) is Adam
    with pytest.raises(ValueError, match="not element-wise"):
        get_optimizer("lbfgs").build_update_model(SHAPES, flat=True)
    with pytest.raises(ValueError):
        get_optimizer("no-such-optimizer")
