"""The one door to RLlib's, Tune's and Ray's private names.

raylab is written against one Ray release series (:data:`RAY_SERIES`). Where that release
offers no public point for what raylab needs, the private attribute, method or module is used
here and only here: every other module calls the functions below. Moving raylab to another
Ray release means reading this file; ``tests/test_rllib_compat.py`` checks every name it lists
on the installed Ray and fails naming the ones that moved.

Two kinds of names:

- **Accessors** (the functions below): state of RLlib objects that raylab reads or sets (an
  EnvRunner's seed, its sample counters, a learner's metrics lock, APPO's old policy) and
  Ray internals (the GCS cluster config, the internal KV, Tune's actor manager).
- **Hooks** (:data:`OVERRIDDEN_HOOKS`): private methods of RLlib classes that raylab's
  subclasses override, because RLlib has no public extension point there. The overrides stay
  in their classes; this table names them so that the test can check they still exist.
"""

from __future__ import annotations

import importlib
import threading
from collections import defaultdict
from typing import Any, Dict, Optional, Tuple

RAY_SERIES = "2.60"

# Private methods of RLlib classes overridden by raylab's subclasses: "module:Class" -> names.
OVERRIDDEN_HOOKS: Dict[str, Tuple[str, ...]] = {
    # RaylabEnvRunner / RaylabFastEnvRunner (algorithms/env_runner.py): raylab's rollout loop
    # in place of RLlib's sampling loop, and every finished episode reported to the algorithm.
    "ray.rllib.env.single_agent_env_runner:SingleAgentEnvRunner": (
        "_sample",
        "_log_episode_metrics",
    ),
    # raylab's Learners (algorithms/learners.py): batches are made where the timeline sees them;
    # RaylabPPOLearner runs the epochs of minibatches in one _update call and counts them.
    "ray.rllib.core.learner.learner:Learner": (
        "_make_batch_if_necessary",
        "_update",
        "_log_steps_trained_metrics",
    ),
}

# Private attributes read or set through the accessors below: "module:Class" -> names (set on
# instances by the class's own constructor or build, so the test builds one to check them).
INSTANCE_ATTRIBUTES: Dict[str, Tuple[str, ...]] = {
    "ray.rllib.env.single_agent_env_runner:SingleAgentEnvRunner": (
        "_seed",
        "_needs_initial_reset",
        "_weights_seq_no",
        "_metrics_num_env_steps_sampled",
    ),
    "ray.rllib.algorithms.appo.appo_learner:APPOLearner": (
        "_last_update_ts_by_mid",
        "_learner_thread_in_queue",
    ),
    "ray.rllib.algorithms.appo.torch.default_appo_torch_rl_module:DefaultAPPOTorchRLModule": (
        "_old_encoder",
        "_old_pi",
    ),
    "ray.rllib.utils.metrics.metrics_logger:MetricsLogger": ("_threading_lock",),
    "ray.rllib.core.learner.learner:Learner": ("_optimizer_lr_schedules",),
    "ray.rllib.utils.schedules.scheduler:Scheduler": ("_curr_value",),
}

# Private methods called (not overridden): "module:Class" -> names.
CALLED_METHODS: Dict[str, Tuple[str, ...]] = {
    "ray.rllib.env.single_agent_env_runner:SingleAgentEnvRunner": (
        "_log_env_steps",
        "_increase_sampled_metrics",
        "_log_episode_metrics",
    ),
    "ray.rllib.core.learner.torch.torch_learner:TorchLearner": (
        "_get_tensor_variable",
        "_compute_off_policyness",
    ),
}

# Private modules and module-level names: "module" -> names.
MODULE_NAMES: Dict[str, Tuple[str, ...]] = {
    "ray._private.state": ("state",),
    "ray.experimental.internal_kv": ("_internal_kv_get",),
    "ray.air.execution._internal.actor_manager": ("RayActorManager",),
}


def resolve(path: str) -> Any:
    """``"module:Class"`` (or ``"module"``) -> the object."""
    module, _, name = path.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, name) if name else obj


# --------------------------------------------------------------------------- the Ray version


def ray_version_problem(version: Optional[str] = None) -> Optional[str]:
    """One line saying why this Ray cannot run raylab, or None when it can."""
    if version is None:
        from importlib.metadata import version as installed

        version = installed("ray")  # without importing Ray
    if version == RAY_SERIES or version.startswith(RAY_SERIES + "."):
        return None
    return (
        f"installed Ray is {version}, but raylab is written against Ray {RAY_SERIES}.x (it "
        f"uses RLlib internals that change between releases: algorithms/rllib_compat.py); "
        f'install it with: pip install "ray[default,rllib,tune]=={RAY_SERIES}.*"'
    )


# --------------------------------------------------------------------------- EnvRunners


def take_initial_reset_seed(runner) -> Optional[int]:
    """The seed of an EnvRunner's first reset (RLlib's own seeding of its envs) the first time
    it is asked for, None afterwards: the caller resets the envs with it."""
    seed = runner._seed if runner._needs_initial_reset else None
    runner._needs_initial_reset = False
    return seed


def weights_seq_no(actor) -> int:
    """The sequence number of the weights an EnvRunner samples with (APPO's staleness), or of
    a Learner's current update."""
    return actor._weights_seq_no


def grad_scalers(learner):
    """A TorchLearner's mixed-precision gradient scalers, or None."""
    return getattr(learner, "_grad_scalers", None)


def set_constant_lr(learner, optimizer, lr: float) -> None:
    """Set the learning rate of an optimizer registered with a constant rate: in its param
    groups and as the constant of RLlib's scheduler for it, which ``after_gradient_based_update``
    would otherwise write back (and logs as the optimizer's rate)."""
    schedule = learner._optimizer_lr_schedules.get(optimizer)
    if schedule is not None:
        if schedule.use_schedule:
            raise RuntimeError("set_constant_lr on an optimizer with a learning-rate schedule")
        schedule._curr_value = float(lr)
    for group in optimizer.param_groups:
        group["lr"] = float(lr)


def log_off_policyness(learner, batch) -> None:
    """A TorchLearner's metric of how many updates the batch's sampling weights lag behind."""
    learner._compute_off_policyness(batch)


def count_sampled(runner, steps: int, episodes: int, env_steps_metric: bool = True) -> None:
    """Count ``steps`` env steps and ``episodes`` finished episodes in an EnvRunner's metrics
    the way RLlib's own sampling loop does (``env_steps_metric``: also its per-sample env-steps
    metric, which SAC's transition path reports itself)."""
    if env_steps_metric:
        runner._log_env_steps(metric=runner._metrics_num_env_steps_sampled, num_steps=steps)
    runner._increase_sampled_metrics(steps, episodes)


def log_episode(runner, length: int, ret: float, seconds: float) -> None:
    """Report one finished episode through the EnvRunner's episode-metrics hook (raylab's
    override of it also hands the episode to the algorithm's reward window)."""
    runner._log_episode_metrics(length, ret, seconds)


# --------------------------------------------------------------------------- Learners and modules


def make_metrics_reentrant(learner) -> None:
    """A re-entrant lock for a learner's MetricsLogger, as RLlib's own IMPALA learner sets:
    SAC's update thread logs while the request thread reduces."""
    learner.metrics._threading_lock = threading.RLock()


def old_policy(module) -> Tuple[Any, Any]:
    """APPO's old (target) policy of a module: (encoder, policy head)."""
    return module._old_encoder, module._old_pi


def build_appo_learner_with_buffer(learner, buffer, impala_learner_cls) -> None:
    """The first half of ``APPOLearner.build`` with ``buffer`` as the learner thread's circular
    buffer: RLlib creates its own unconditionally and no option picks the class, so this
    repeats what APPOLearner.build does around it (the update timestamps, then
    IMPALALearner.build, which starts the learner thread on the buffer). The caller may change
    the module's weights, then calls :func:`finish_appo_learner_build`."""
    learner._last_update_ts_by_mid = defaultdict(int)
    if buffer is not None:
        learner._learner_thread_in_queue = buffer
    impala_learner_cls.build(learner)


def finish_appo_learner_build(learner) -> None:
    """The rest of ``APPOLearner.build``: the target (old-policy) networks, copied from the
    module as it is now, and the per-module KL coefficients."""
    from ray.rllib.core.rl_module.apis import TargetNetworkAPI
    from ray.rllib.utils.lambda_defaultdict import LambdaDefaultDict

    learner.module.foreach_module(
        lambda mid, mod: mod.make_target_networks() if isinstance(mod, TargetNetworkAPI) else None
    )
    learner.curr_kl_coeffs_per_module = LambdaDefaultDict(
        lambda module_id: learner._get_tensor_variable(
            learner.config.get_config_for_module(module_id).kl_coeff
        )
    )


# --------------------------------------------------------------------------- Ray and Tune


def gcs_cluster_config():
    """The cluster config the autoscaler publishes in the GCS (node groups), or None."""
    from ray._private import state

    return state.state.get_cluster_config()


def internal_kv_get(key: str) -> Optional[bytes]:
    """A value of Ray's internal key-value store (the autoscaler's status report)."""
    from ray.experimental.internal_kv import _internal_kv_get

    return _internal_kv_get(key)


class _LiveFutures(set):
    """One actor's task futures in Tune's actor manager, without the resolved ones."""

    def __init__(self, events):
        super().__init__()
        self._events = events

    def add(self, future) -> None:
        live = self._events.get_futures()  # the futures not resolved yet (a few)
        self.intersection_update(live)
        super().add(future)


def release_resolved_trial_futures() -> bool:
    """Stop Tune's driver from keeping every trial result in the object store.

    Ray 2.60's ``RayActorManager`` adds the future of every task it schedules on a trial's
    actor (each ``train`` call: one result dict, about 22 KB for an RLlib trial) to a per-actor
    set that is emptied only when the actor is removed, so the driver keeps a reference to
    every result of the trial's life: the object store grew about 1 MB a minute in a soak of
    the default APPO run, about 160 MB in two hours. The set is only read to discard the
    actor's pending futures when it is removed, so each add here first drops the futures the
    event manager has already resolved. Applied once per process; False (and nothing changed)
    where Ray's internals are not the expected ones."""
    from ray.air.execution._internal.actor_manager import RayActorManager

    if getattr(RayActorManager, "_raylab_live_futures", False):
        return True
    init = RayActorManager.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        futures = getattr(self, "_tracked_actors_to_task_futures", None)
        events = getattr(self, "_actor_task_events", None)
        if isinstance(futures, defaultdict) and not futures and hasattr(events, "get_futures"):
            self._tracked_actors_to_task_futures = defaultdict(lambda: _LiveFutures(events))

    probe = RayActorManager.__init__.__code__.co_names
    if "_tracked_actors_to_task_futures" not in probe or "_actor_task_events" not in probe:
        return False
    RayActorManager.__init__ = __init__
    RayActorManager._raylab_live_futures = True
    return True
