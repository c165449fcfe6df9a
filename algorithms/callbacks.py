"""RLlib callbacks: the progress metrics of each result (algorithm side), and EnvRunner-side
task reward terms, termination counts and timeout rate.

They run inside the EnvRunner actors. Values go through the raylab stats tracker and reach the
driver as partial states inside RLlib's result (see ``timeline.push_partial_state``).
RLlib's own EnvRunner timers supply the collector timeline (env step, inference, rollout wall).
"""

from __future__ import annotations

import numpy as np
from ray.rllib.callbacks.callbacks import RLlibCallback

from raylab.metrics import schema as S
from raylab.metrics import tracker as stats_tracker
from raylab.metrics.timeline import COLLECTOR_TRACKER, push_partial_state

# The batched env's step parts (BatchedVecEnv.STEP_PARTS) -> their nested Env Step tags.
STEP_PART_TAGS = {
    "action_validate": S.PERF_COLLECTOR_ACTION_VALIDATE_MS,
    "apply_action": S.PERF_COLLECTOR_APPLY_ACTION_MS,
    "backend_step": S.PERF_COLLECTOR_BACKEND_STEP_MS,
    "update_state": S.PERF_COLLECTOR_UPDATE_STATE_MS,
    "reset_done": S.PERF_COLLECTOR_RESET_DONE_MS,
}

# Result key of the actor placement the driver turns into the runtime manifest.
RUNTIME_KEY = "raylab_runtime"
# Result key of the per-result flow figures of the manifest (in flight, ring, ingress, updates).
FLOW_KEY = "raylab_flow"


class RaylabCallbacks(RLlibCallback):
    _runtime_key = None

    def on_train_result(self, *, algorithm, metrics_logger=None, result, **kwargs):
        # The canonical progress metrics at the top of the result, for Tune's stopper and
        # schedulers (they see the result before the driver maps it): the reward window and
        # the best evaluation (raylab.algorithms.algorithm). NaN until an episode ends.
        update = getattr(algorithm, "update_progress", None)
        if update is not None:
            update(result)
        # Attach actor placement for the runtime manifest on the first result and after any
        # EnvRunner restart (the driver's Tune callback turns it into the manifest).
        result[FLOW_KEY] = runtime_flow(algorithm)
        restarts = result.get("fault_tolerance", {}).get("num_remote_worker_restarts", 0)
        if self._runtime_key != restarts:
            result[RUNTIME_KEY] = {**runtime_info(algorithm), "restarts": restarts}
            self._runtime_key = restarts

    def on_episode_end(self, *, episode, env_runner=None, metrics_logger=None, **kwargs):
        # A truncation is a timeout (the episode reached its step limit); a termination is not.
        timed_out = 1.0 if episode.is_truncated else 0.0
        stats_tracker.get(COLLECTOR_TRACKER).scalar(**{S.EPISODE_TIMEOUT_RATE: timed_out})

    def on_sample_end(self, *, env_runner=None, metrics_logger=None, samples=None, **kwargs):
        if env_runner is not None and metrics_logger is not None:
            record_env_log(env_runner, metrics_logger)


def record_env_log(env_runner, metrics_logger) -> None:
    """Task reward terms and termination counts since the last call, then ship the tracker."""
    tracker = stats_tracker.get(COLLECTOR_TRACKER)
    env = getattr(env_runner, "env", None)
    pop_log = getattr(getattr(env, "unwrapped", None), "pop_log", None)
    pop_step_times = getattr(getattr(env, "unwrapped", None), "pop_step_times", None)
    if callable(pop_step_times):  # the batched env's Env Step, part by part, per step
        means, steps = pop_step_times()
        if steps:  # weighted by the steps, as Env Step itself is
            tracker.scalar_series(
                **{STEP_PART_TAGS[k]: np.full(steps, v) for k, v in means.items()}
            )
    if callable(pop_log):
        log = pop_log()
        family = {k: S.spec_of(k).name for k in log}
        terms = {k: v for k, v in log.items() if family[k] == S.REWARD_FAMILY}
        counts = {k: v for k, v in log.items() if family[k] == S.EPISODE_TERMINATION_FAMILY}
        if terms:
            tracker.scalar(**terms)
        if counts:
            # Counts add up across EnvRunners and sample calls (a SUM, not a mean).
            tracker.denominator(_one=np.ones(1, dtype=bool))
            tracker.stat("_one", "sum", **{k: np.array([v], float) for k, v in counts.items()})
    push_partial_state(metrics_logger, COLLECTOR_TRACKER)


def runtime_flow(algorithm) -> dict:
    """Sample requests in flight (since the previous report) and each Learner's status
    (lifetime updates, its ring): the runtime manifest's per-result fields."""
    report = getattr(algorithm, "flight_report", None)
    flight = report() if report is not None else None
    try:
        statuses = algorithm.learner_group.foreach_learner(
            lambda learner: learner.learner_status() if hasattr(learner, "learner_status") else None
        )
        learners = [r.get() if hasattr(r, "get") else r for r in statuses]
    except Exception:  # a Learner being restarted: no status this time
        learners = []
    # A dead Learner's entry is its error (RLlib's foreach_learner returns it): no status.
    return {"inference_flight": flight, "learners": [s for s in learners if isinstance(s, dict)]}


def runtime_info(algorithm) -> dict:
    """Where each EnvRunner and Learner actor runs and on what device (for the manifest)."""
    from raylab.metrics.manifest import actor_placement

    def runner_info(runner):
        env = getattr(runner, "env", None)
        base = getattr(env, "unwrapped", env)
        return actor_placement(
            int(getattr(runner, "worker_index", 0)),
            "cpu",
            kind="env_runner",
            num_envs=int(getattr(runner, "num_envs", 1) or 1),
            num_threads=int(getattr(base, "num_threads", 1) or 1),
        )

    def learner_info(learner):
        return actor_placement(
            int(getattr(learner, "_rank", 0) or 0),
            str(getattr(learner, "_device", None) or "cpu"),
            kind="learner",
        )

    def backend_info(runner):
        env = getattr(runner, "env", None)
        sim = getattr(getattr(env, "unwrapped", env), "sim", None)
        return sim.diagnostics() if hasattr(sim, "diagnostics") else None

    group = algorithm.env_runner_group
    runners = group.foreach_env_runner(runner_info, local_env_runner=False)
    backends = group.foreach_env_runner(backend_info, local_env_runner=False)
    learners = algorithm.learner_group.foreach_learner(learner_info)
    learners = [r.get() if hasattr(r, "get") else r for r in learners]
    return {
        "env_runners": list(runners),
        "learners": learners,
        # One EnvRunner's physics backend (they are built alike); None for a Gymnasium id.
        "backend_diagnostics": next((b for b in backends if b is not None), None),
    }
