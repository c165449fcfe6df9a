"""raylab's SAC: learner-owned device replay, asynchronous collection, one fused update.

RLlib's stock SAC keeps the replay buffer in the algorithm process, turns every timestep into an
episode object and makes one synchronous round trip per update. Here:

- EnvRunners (``RaylabSACEnvRunner.sample_transitions``) step their vector env for
  ``env_steps_per_sync`` steps with the latest weights they were sent and put the transitions,
  as a handful of flat arrays, into Ray's object store; a shard per Learner.
- The algorithm loop (``RaylabSAC.training_step``) keeps one request in flight per EnvRunner,
  hands each result's object refs to the Learners (``ingest``; the arrays travel from the
  EnvRunner's node to the Learner directly) and sends the newest published weights along with
  the next request. It throttles collection so that the learner's backlog stays within one
  round of requests: the replay ratio holds and staleness stays bounded.
- Each Learner (``RaylabSACLearner``) owns a ``DeviceReplay`` ring on its device and runs its
  update loop on a background thread: wait until ``updates_per_step`` x ingested steps allows
  another update, take the prefetched batch, prefetch the next, run one fused actor / critic /
  temperature step (one backward, foreach / fused Adam, foreach polyak), publish weights every
  ``weight_sync_every`` updates. Loss statistics stay on the device until metrics are read.

Canonical learner phases per update: Collector Wait, Replay Batch Wait, Replay Sample,
Learning, Weight Publish (the iteration wall is one update); ingest is a background diagnostic
(``Perf/replay_ingress_h2d_submit_ms``). With several Learners the gradients are all-reduced
once per update (``Perf/dp_gradient_sync_ms_per_rank`` / ``_calls_per_rank``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any, Dict, List, Optional

import numpy as np
import ray
import torch
from ray.rllib.algorithms.sac import SAC, SACConfig
from ray.rllib.algorithms.sac.torch.sac_torch_learner import SACTorchLearner
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, LEARNER_RESULTS

from raylab.algorithms.algorithm import RaylabAlgorithmMixin
from raylab.algorithms.env_runner import RaylabEnvRunner, one_torch_thread
from raylab.algorithms.replay import DeviceReplay
from raylab.algorithms.rollout import RolloutLoop
from raylab.algorithms.sac_kernel import SACParts, sac_update
from raylab.algorithms.sac_module import RaylabSACModule
from raylab.metrics import schema as S
from raylab.metrics import tracker as stats_tracker
from raylab.metrics.timeline import (
    COLLECTOR_TRACKER,
    LEARNER_TRACKER,
    Timeline,
    push_partial_state,
)

SAMPLE_TAG = "raylab_sample"


class RaylabSACConfig(SACConfig):
    """SACConfig plus the settings of raylab's asynchronous device-replay path."""

    def __init__(self, algo_class=None):
        super().__init__(algo_class=algo_class or RaylabSAC)
        self.updates_per_step = 1.0  # gradient updates per ingested env step (replay ratio)
        self.weight_sync_every = 1  # publish weights every N updates
        self.env_steps_per_sync = 1  # vector steps per EnvRunner request
        self.buffer_capacity = 1_000_000
        self.learning_starts = 1000  # env steps (uniform random actions) before updates
        self.torch_compile = False  # GPU only
        self.bf16_autocast = False  # GPU only
        self.learner_torch_threads = 1
        self.env_runner_cls = RaylabSACEnvRunner
        # One sample request in flight per EnvRunner; iterations end on time, not on a
        # minimum number of sampled steps.
        self.max_requests_in_flight_per_env_runner = 1
        self.min_sample_timesteps_per_iteration = 0

    def get_default_learner_class(self):
        return RaylabSACLearner

    def get_default_rl_module_spec(self):
        from ray.rllib.core.rl_module.rl_module import RLModuleSpec

        return RLModuleSpec(module_class=RaylabSACModule)


def owed_updates(ingested: int, learning_starts: int, updates_per_step: float) -> int:
    """Gradient updates the replay ratio allows after ``ingested`` env steps."""
    if ingested < max(1, learning_starts):
        return 0
    return int((ingested - learning_starts + 1) * updates_per_step)


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

    def sample_transitions(
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
            self._log_episode_metrics(length, ret, 0.0)
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
        tracker.scalar(
            **{
                S.PERF_COLLECTOR_TRANSITION_EXTRACT_MS: (t3 - t_extract) * 1000.0,
                S.PERF_COLLECTOR_REPLAY_WRITE_MS: (t4 - t3) * 1000.0,
                S.PERF_COLLECTION_TIME: t4 - t_start,
            }
        )
        self.num_env_steps_sampled_lifetime += count
        self._increase_sampled_metrics(count, len(frag.episodes))
        from raylab.algorithms.callbacks import record_env_log

        record_env_log(self, self.metrics)
        return {
            "shards": shards,
            "count": count,
            "version": self._weights_version,
            "metrics": self.get_metrics(),
        }


# ---------------------------------------------------------------------------- Learner side


class RaylabSACLearner(SACTorchLearner):
    """SAC learner with its own device replay ring and a background update loop."""

    def __repr__(self) -> str:
        return f"raylab-learner-{os.environ.get('RANK', '0')}"

    def build(self) -> None:
        super().build()
        cfg = self.config
        if self._device.type == "cpu":
            torch.set_num_threads(max(1, int(cfg.learner_torch_threads)))
        self.metrics._threading_lock = threading.RLock()
        self._model_lock = threading.Lock()  # the update vs get_state / set_state
        self._replay_lock = threading.Lock()
        self._cond = threading.Condition()
        self._replay: Optional[DeviceReplay] = None
        self._ingested = 0
        self._updates = 0
        self._version = 0
        self._published_ref = None
        self._published_ref_version = -1
        self._stop = False
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._staleness: List[float] = []
        self.timeline = Timeline(
            LEARNER_TRACKER,
            phases=(
                S.PERF_LEARNER_COLLECTOR_WAIT_MS,
                S.PERF_LEARNER_REPLAY_BATCH_WAIT_MS,
                S.PERF_LEARNER_REPLAY_SAMPLE_MS,
                S.PERF_LEARNING_TIME,
                S.PERF_LEARNER_WEIGHT_PUBLISH_MS,
            ),
            wall_tag=S.PERF_ITERATION_TIME,
        )
        self.stats = stats_tracker.get(LEARNER_TRACKER)
        self._mid = DEFAULT_MODULE_ID
        module = self.module[self._mid].unwrapped()

        self._acc: Dict[str, torch.Tensor] = {}
        self._acc_n = 0
        self._world = (
            torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        )
        self._rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self._parts = SACParts(
            pi=module.pi,
            qf=module.qf,
            qf_twin=module.qf_twin,
            target_qf=module.target_qf,
            target_qf_twin=module.target_qf_twin,
            log_alpha=self.curr_log_alpha[self._mid],
            optimizers=list(self._named_optimizers.values()),
        )
        self._update_fn = self._fused_update
        if cfg.torch_compile and self._device.type == "cuda":
            self._update_fn = torch.compile(self._fused_update)
        self._publish()

    def configure_optimizers_for_module(self, module_id, config=None) -> None:
        # Critic, actor and temperature optimizers, as foreach (CPU) or fused (GPU) Adam.
        module = self._module[module_id]
        fused = self._device.type == "cuda"
        opts = {"foreach": not fused, "fused": fused, "eps": 1e-7}
        critic = self.get_parameters(module.qf) + self.get_parameters(module.qf_twin)
        groups = [
            ("qf", critic, config.critic_lr),
            ("policy", self.get_parameters(module.pi), config.actor_lr),
            ("alpha", [self.curr_log_alpha[module_id]], config.alpha_lr),
        ]
        for name, params, lr in groups:
            self.register_optimizer(
                module_id=module_id,
                optimizer_name=name,
                optimizer=torch.optim.Adam(params, **opts),
                params=params,
                lr_or_lr_schedule=lr,
            )

    # ---- ingest (actor request thread) ---------------------------------------------------
    def ingest(self, shard_refs: List[Any], runner_version: int) -> Dict[str, Any]:
        """Add one EnvRunner result's shard (this rank's) to the device replay."""
        ref = shard_refs[self._rank % len(shard_refs)]
        with self.timeline.background(S.PERF_REPLAY_INGRESS_H2D_SUBMIT_MS):
            batch = ray.get(ref) if isinstance(ref, ray.ObjectRef) else ref
            with self._replay_lock:
                if self._replay is None:
                    self._make_replay(batch)
                n = self._replay.add(batch)
                if self._device.type == "cuda":
                    # Once per ingest (one EnvRunner result), not per update: the rows count
                    # as sampleable only once their host-to-device copies have landed.
                    torch.cuda.current_stream(self._device).synchronize()
        with self._cond:
            self._ingested += n
            self._staleness.append(float(self._version - max(runner_version, 0)))
            self._cond.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name="raylab-sac-update", daemon=True
            )
            self._thread.start()
        return self.status()

    def _make_replay(self, batch: Dict[str, np.ndarray]) -> None:
        cfg = self.config
        self._replay = DeviceReplay(
            capacity=cfg.buffer_capacity,
            obs_dim=int(np.asarray(batch["obs"]).shape[-1]),
            action_dim=int(np.asarray(batch["actions"]).shape[-1]),
            batch_size=cfg.train_batch_size_per_learner,
            device=self._device,
            seed=(cfg.seed or 0) + 17 * self._rank,
        )
        self._spare = self._replay.new_output()

    def status(self) -> Dict[str, Any]:
        if self._error is not None:
            raise RuntimeError("the SAC update thread failed") from self._error
        return {
            "ingested": self._ingested,
            "updates": self._updates,
            "version": self._version,
            "size": self._replay.size if self._replay is not None else 0,
        }

    def _allowed_updates(self) -> int:
        # Updates start once learning_starts steps are in and then follow the replay ratio
        # (the random warm-up steps are not "owed" updates).
        return owed_updates(
            self._ingested, self.config.learning_starts, self.config.updates_per_step
        )

    def wait_for_backlog(self, max_pending: int, timeout_s: float) -> Dict[str, Any]:
        """Block (up to timeout_s) until at most max_pending updates are owed."""
        deadline = time.perf_counter() + timeout_s
        with self._cond:
            while self._allowed_updates() - self._updates > max_pending and self._error is None:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                self._cond.wait(timeout=left)
        return self.status()

    # ---- update loop (background thread) -------------------------------------------------
    def _loop(self) -> None:
        tl = self.timeline
        tl.bind_to_current_thread()
        batch = None
        try:
            while not self._stop:
                tl.boundary()
                with tl.phase(S.PERF_LEARNER_COLLECTOR_WAIT_MS):
                    with self._cond:
                        while self._updates >= self._allowed_updates() and not self._stop:
                            self._cond.wait(timeout=0.5)
                if self._stop:
                    break
                with tl.phase(S.PERF_LEARNER_REPLAY_BATCH_WAIT_MS):
                    if batch is None:  # first update: nothing was prefetched yet
                        with self._replay_lock:
                            batch = self._replay.sample()
                    # No host synchronisation per update: the prefetch, the update and the
                    # next prefetch are queued on the same CUDA stream, which orders them. (On a
                    # GPU the phase timers therefore measure the host side of each phase.)
                current = batch
                with tl.phase(S.PERF_LEARNER_REPLAY_SAMPLE_MS):
                    # Prefetch the next batch into the spare buffers while this one trains.
                    with self._replay_lock:
                        batch = self._replay.sample(out=self._spare)
                    self._spare = current
                with tl.phase(S.PERF_LEARNING_TIME):
                    with self._model_lock:
                        self._update_fn(current)
                with self._cond:
                    self._updates += 1
                    self._cond.notify_all()
                if self._updates % max(1, int(self.config.weight_sync_every)) == 0:
                    with tl.phase(S.PERF_LEARNER_WEIGHT_PUBLISH_MS):
                        self._publish()
        except BaseException as e:  # surfaced to the algorithm through status()
            self._error = e
            with self._cond:
                self._cond.notify_all()

    def _fused_update(self, b: Dict[str, torch.Tensor]) -> None:
        """One fused SAC step (``sac_kernel.sac_update``); statistics stay on the device."""
        cfg = self.config
        wrapped = self.module[self._mid]
        no_sync = wrapped.no_sync() if hasattr(wrapped, "no_sync") else contextlib.nullcontext()
        with no_sync:
            stats = sac_update(
                self._parts,
                b,
                gamma=cfg.gamma,
                tau=cfg.tau,
                target_entropy=self.target_entropy[self._mid],
                grad_clip=cfg.grad_clip,
                bf16=cfg.bf16_autocast and self._device.type == "cuda",
                all_reduce=self._all_reduce_grads if self._world > 1 else None,
            )
        with torch.no_grad():  # accumulated on the device; read once per metrics pull
            for name, v in stats.items():
                v = v.float()
                self._acc[name] = self._acc[name] + v if name in self._acc else v.clone()
            self._acc_n += 1

    def _all_reduce_grads(self) -> None:
        t0 = time.perf_counter()
        params = [p for p in self.module[self._mid].unwrapped().parameters() if p.grad is not None]
        params.append(self.curr_log_alpha[self._mid])
        grads = [p.grad for p in params if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        torch.distributed.all_reduce(flat)
        flat /= self._world
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
        self.stats.scalar(
            **{
                S.PERF_DP_GRADIENT_SYNC_MS_PER_RANK: (time.perf_counter() - t0) * 1000.0,
                S.PERF_DP_GRADIENT_SYNC_CALLS_PER_RANK: 1.0,
            }
        )

    def _publish(self) -> None:
        """A new weights version (copied to host memory only when an EnvRunner needs it)."""
        self._version += 1

    def published_weights(self, known_version: int):
        """(version, ObjectRef of the inference weights) when newer than known_version."""
        if self._version <= known_version:
            return None
        if self._published_ref_version != self._version:
            with self._model_lock:
                version = self._version
                state = self.module[self._mid].unwrapped().get_state(inference_only=True)
                state = {
                    k: (v.detach().cpu().numpy() if torch.is_tensor(v) else np.array(v))
                    for k, v in state.items()
                }
            self._published_ref = ray.put(state)
            self._published_ref_version = version
        return self._published_ref_version, self._published_ref

    def pop_results(self) -> Dict[str, Any]:
        """Learner statistics since the last call, in RLlib's result format."""
        with self._model_lock:
            acc, n = self._acc, self._acc_n
            self._acc, self._acc_n = {}, 0
        if n:
            means = {k: float(v) / n for k, v in acc.items()}
            self.stats.scalar(
                **{
                    S.loss_tag("critic"): means["critic"],
                    S.loss_tag("actor"): means["actor"],
                    S.loss_tag("alpha"): means["alpha"],
                    S.policy_tag("q_mean"): means["q_mean"],
                    S.policy_tag("alpha"): means["alpha_value"],
                    S.policy_tag("logp"): means["logp"],
                }
            )
        now = time.perf_counter()
        last = getattr(self, "_last_pop", None)
        if last is not None and now > last:
            self.stats.scalar(**{S.PERF_LEARNER_UPDATES_PER_S: n / (now - last)})
        self._last_pop = now
        with self._cond:
            staleness, self._staleness = self._staleness, []
        if staleness:
            self.stats.scalar(**{S.PERF_POLICY_STALENESS: float(np.mean(staleness))})
        if self._replay is not None:
            self.stats.scalar(**{S.PERF_REPLAY_BUFFER_SIZE: float(self._replay.size)})
        push_partial_state(self.metrics, LEARNER_TRACKER)
        return self.metrics.reduce()

    def get_state(self, *args, **kwargs):
        with self._model_lock:
            return super().get_state(*args, **kwargs)

    def set_state(self, state) -> None:
        with self._model_lock:
            super().set_state(state)
            self._publish()

    def shutdown(self) -> None:
        self._stop = True
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        super().shutdown()


# ------------------------------------------------------------------------ algorithm loop


class RaylabSAC(RaylabAlgorithmMixin, SAC):
    """SAC whose training step overlaps collection and learning (see the module docstring)."""

    def cleanup(self) -> None:
        # RLlib shuts down only a local Learner; stop the remote update threads too, so the
        # Learner processes exit cleanly.
        try:
            if self.learner_group is not None and not self.learner_group.is_local:
                self.learner_group.foreach_learner(lambda learner: learner.shutdown())
        except Exception:  # a dead Learner actor has nothing left to stop
            pass
        super().cleanup()

    @classmethod
    def get_default_config(cls) -> RaylabSACConfig:
        return RaylabSACConfig()

    def _fast_state(self) -> dict:
        st = getattr(self, "_raylab", None)
        if st is None:
            st = self._raylab = {
                "status": {"ingested": 0, "updates": 0, "version": 0, "size": 0},
                "weights": None,  # (version, ref) sent with the next requests
                "last_metrics": 0.0,
            }
        return st

    def _learner_call(self, fn):
        results = self.learner_group.foreach_learner(fn)
        return [r.get() if hasattr(r, "get") else r for r in results]

    def training_step(self) -> None:
        cfg = self.config
        st = self._fast_state()
        n_runners = self.env_runner_group.num_remote_env_runners()
        n_learners = max(1, cfg.num_learners)
        steps = max(1, int(cfg.env_steps_per_sync))
        per_request = steps * cfg.num_envs_per_env_runner

        # 1. Hand finished samples to the learners.
        if n_runners == 0:
            ready = [(0, self._request(self.env_runner, steps, n_learners))]
        else:
            ready = self.env_runner_group.fetch_ready_async_reqs(
                tags=SAMPLE_TAG, timeout_seconds=0.01
            )
        for _, out in ready:
            statuses = self._learner_call(
                lambda learner, refs=out["shards"], v=out["version"]: learner.ingest(refs, v)
            )
            st["status"] = statuses[0]
            self.metrics.aggregate([out["metrics"]], key=ENV_RUNNER_RESULTS)

        # 2. Newest weights, sent along with the next requests.
        known = (st["weights"] or (-1,))[0]
        if st["status"]["version"] > known:
            fresh = self._learner_call(lambda learner, v=known: learner.published_weights(v))[0]
            if fresh is not None:
                st["weights"] = fresh

        # 3. New requests (one in flight per EnvRunner; RLlib's actor manager skips busy ones
        #    and forgets requests of failed ones) while the learners' backlog is within one round.
        if n_runners:
            max_pending = int(cfg.updates_per_step * per_request * n_runners / n_learners)
            status = st["status"]
            owed = owed_updates(status["ingested"], cfg.learning_starts, cfg.updates_per_step)
            owed -= status["updates"]
            if owed > max_pending:
                st["status"] = self._learner_call(
                    lambda learner, m=max_pending: learner.wait_for_backlog(m, 0.05)
                )[0]
            else:
                version, ref = st["weights"] or (-1, None)
                random_left = max(0, cfg.learning_starts - status["ingested"]) // n_runners
                self.env_runner_group.foreach_env_runner_async(
                    lambda r, s=steps, w=ref, v=version, k=random_left, m=n_learners: (
                        r.sample_transitions(s, w, v, k, m)
                    ),
                    tag=SAMPLE_TAG,
                )

        # 4. Learner statistics a few times per iteration.
        now = time.perf_counter()
        if now - st["last_metrics"] > 0.25:
            st["last_metrics"] = now
            results = self._learner_call(lambda learner: learner.pop_results())
            self.metrics.aggregate(results, key=LEARNER_RESULTS)

    def _request(self, runner, steps: int, shards: int) -> dict:
        st = self._fast_state()
        version, ref = st["weights"] or (-1, None)
        random_left = max(0, self.config.learning_starts - st["status"]["ingested"])
        return runner.sample_transitions(steps, ref, version, random_left, shards)
