"""RaylabSACEnvRunner: steps its vector env and returns transitions as flat arrays in the object
store, one shard per Learner."""

from __future__ import annotations

import time
from typing import Any, Dict

import numpy as np
import ray

from raylab.algorithms import rllib_compat
from raylab.algorithms.env_runner import RaylabEnvRunner, one_torch_thread
from raylab.algorithms.rollout import RolloutLoop
from raylab.metrics import schema as S
from raylab.metrics import trace
from raylab.metrics import tracker as stats_tracker
from raylab.metrics.timeline import COLLECTOR_TRACKER, label

SAMPLE_TAG = "raylab_sample"


# --------------------------------------------------------------------------- EnvRunner side


class RaylabSACEnvRunner(RaylabEnvRunner):
    """Steps the vector env directly and returns transitions as arrays (no episode objects)."""

    def _fast_init(self) -> None:
        one_torch_thread()
        self._loop = RolloutLoop(self.batched_env(), stats_tracker.get(COLLECTOR_TRACKER))
        self._weights_version = -1
        self._rng = np.random.default_rng((self.config.seed or 0) * 7919 + self.worker_index)
        self._act_dim = self._loop.low.shape[0]
        self._dist_cls = self.module.get_exploration_action_dist_cls() if self.module else None
        # Our module clamps log-std itself; RLlib's distribution gets (mean, log_std).

    def sample_transitions(self, *args, **kwargs) -> Dict[str, Any]:
        """One request of transitions (an env exception is reported to the run first)."""
        return self.guarded(self._sample_transitions, *args, **kwargs)

    def _sample_transitions(
        self,
        num_steps: int,
        weights: Any = None,
        version: int = -1,
        random_steps_left: int = 0,
        num_shards: int = 1,
    ) -> Dict[str, Any]:
        if not hasattr(self, "_loop"):
            self._fast_init()
        tracker = stats_tracker.get(COLLECTOR_TRACKER)
        t_start = time.perf_counter()
        self._trace_sample_thread()
        if weights is not None and version > self._weights_version:
            state = ray.get(weights) if isinstance(weights, ray.ObjectRef) else weights
            self.module.set_state(state)
            self._weights_version = version
        if self._loop.needs_reset:
            self._loop.reset(
                seed=(self.config.seed or 0) * 100_003 + self.worker_index * self.num_envs
            )
        n = self.num_envs
        frag = self._loop.run(
            self.module.forward_exploration,
            self._dist_cls,
            steps=int(num_steps),
            with_logp=False,
            random_action=lambda k: self._rng.uniform(-1.0, 1.0, size=(k, self._act_dim)).astype(
                np.float32
            ),
            random_steps=-(-int(random_steps_left) // n),  # vector steps still owed random actions
        )
        for _, length, ret, truncated in frag.episodes:
            rllib_compat.log_episode(self, length, ret, 0.0)
            tracker.scalar(**{S.EPISODE_TIMEOUT_RATE: 1.0 if truncated else 0.0})
        t_extract = time.perf_counter()
        # Transitions, flat: (obs[t], actions[t], rewards[t], obs[t + 1]) where valid; NEXT_STEP
        # autoreset makes obs[t + 1] the final observation of an episode that ended at t.
        valid = frag.valid.reshape(-1)
        arrays = {
            "obs": frag.obs[:-1]
            .reshape((-1,) + frag.obs.shape[2:])[valid]
            .astype(np.float32, copy=False),
            "actions": frag.actions.reshape((-1,) + frag.actions.shape[2:])[valid],
            "rewards": frag.rewards.reshape(-1)[valid].astype(np.float32),
            "next_obs": frag.obs[1:]
            .reshape((-1,) + frag.obs.shape[2:])[valid]
            .astype(np.float32, copy=False),
            "terminateds": frag.terminated.reshape(-1)[valid].astype(np.float32),
        }
        count = int(valid.sum())
        t3 = time.perf_counter()
        shards = [
            ray.put({k: v[i::num_shards] for k, v in arrays.items()}) for i in range(num_shards)
        ]
        t4 = time.perf_counter()
        trace.complete(label(S.PERF_COLLECTOR_TRANSITION_EXTRACT_MS), t_extract, t3, "collector")
        trace.complete(label(S.PERF_COLLECTOR_REPLAY_WRITE_MS), t3, t4, "collector")
        trace.complete(label(S.PERF_COLLECTION_TIME), t_start, t4, "collector")
        tracker.scalar(
            **{
                S.PERF_COLLECTOR_TRANSITION_EXTRACT_MS: (t3 - t_extract) * 1000.0,
                S.PERF_COLLECTOR_REPLAY_WRITE_MS: (t4 - t3) * 1000.0,
                S.PERF_COLLECTION_TIME: t4 - t_start,
            }
        )
        self.num_env_steps_sampled_lifetime += count
        rllib_compat.count_sampled(self, count, len(frag.episodes), env_steps_metric=False)
        from raylab.algorithms.callbacks import record_env_log

        record_env_log(self, self.metrics)
        metrics = self.get_metrics()
        # Metrics Publish of this request travels with the next one (this export is done).
        t5 = time.perf_counter()
        tracker.scalar(**{S.PERF_COLLECTOR_METRICS_PUBLISH_MS: (t5 - t4) * 1000.0})
        trace.complete(label(S.PERF_COLLECTOR_METRICS_PUBLISH_MS), t4, t5, "collector")
        return {
            "shards": shards,
            "count": count,
            "version": self._weights_version,
            "metrics": metrics,
        }


# ---------------------------------------------------------------------------- Learner side
