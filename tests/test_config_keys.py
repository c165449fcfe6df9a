"""No option that does nothing: every `algo.*` key of every algorithm reaches the RLlib config
that `raylab train` builds, or composing it is refused.

Each key is set to a value other than its default and the built `AlgorithmConfig` (its
`to_dict()`, which holds the model config and the learner's own settings) must differ from the
default one. A key that the algorithm does not read is not in its config class at all, so
composing it fails with one line (tests/test_cli_config.py::
test_options_an_algorithm_does_not_read_are_refused)."""

from __future__ import annotations

import json

import pytest

from raylab.algorithms.build import build_algorithm_config
from raylab.config import ALGOS, compose, iter_keys

# Keys that are raylab's own, not the algorithm's: where they go is tested where they are used.
RAYLAB_SIDE = {
    "algo.name": "set by --algo (it picks the config class)",
    "algo.algo_log_name": "the folder under logs/ (tests/test_metrics_rundir.py)",
}
CHOICES = {
    "algo.activation": {"tanh": "relu", "relu": "tanh", "silu": "tanh"},
    "algo.critic_loss": {"huber": "mse", "mse": "huber"},
    "algo.lr_schedule": {"constant": "linear", "linear": "constant"},
}

# Optional keys whose default (null) is derived: a value to set instead.
NONE_DEFAULTS = {
    "algo.learner_threads": 2,
    "algo.split_update": False,
    "algo.lr_kl_target": 0.02,
    "algo.mean_bound": 5.0,
}
# Keys that only work beside another one (composing them alone is refused): compared with the
# config that has the companion only.
COMPANIONS = {
    "algo.final_max_log_std": ["algo.max_log_std=1.0"],
    "algo.lr_kl_target": ["algo.lr_schedule=adaptive_kl"],
}


def _another(key, value):
    if key in CHOICES:
        return CHOICES[key][value]
    if value is None:  # an optional number whose default is "derived" (target_entropy)
        return NONE_DEFAULTS.get(key, -1.0)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1 if value else 2
    if isinstance(value, float):
        return value * 0.5 + 0.0123
    if isinstance(value, list):
        return [17, 19]
    raise AssertionError(f"{key}: no other value for {value!r}: extend _another")


def _built(cfg) -> dict:
    return {k: repr(v) for k, v in build_algorithm_config(cfg).to_dict().items()}


@pytest.mark.parametrize("algo", list(ALGOS))
def test_every_algo_key_reaches_the_rllib_config(algo):
    base = compose(algo, "Pendulum-v1")
    default = _built(base)
    silent = []
    for key, value in iter_keys(base.algo, "algo."):
        if key in RAYLAB_SIDE:
            continue
        new = _another(key, value)
        companions = COMPANIONS.get(key, [])
        reference = (
            _built(compose(algo, "Pendulum-v1", overrides=companions)) if companions else default
        )
        overrides = companions + [f"{key}={json.dumps(new)}"]
        built = _built(compose(algo, "Pendulum-v1", overrides=overrides))
        if built == reference:
            silent.append(f"{key}={new}")
    assert not silent, f"{algo}: accepted and changed nothing in the RLlib config: {silent}"
