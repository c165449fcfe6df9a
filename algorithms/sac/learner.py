"""RaylabSACLearner: the device replay ring, the background update loop, weight publishing."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional

import numpy as np
import ray
import torch
from ray.rllib.algorithms.sac.sac_learner import SACLearner
from ray.rllib.core import COMPONENT_OPTIMIZER, DEFAULT_MODULE_ID
from ray.rllib.core.learner.torch.torch_learner import TorchLearner

from raylab.algorithms import rllib_compat
from raylab.algorithms.sac.replay import DeviceReplay
from raylab.algorithms.sac.update import SACParts, sac_update
from raylab.envs.core.backend import usable_cores
from raylab.metrics import schema as S
from raylab.metrics import trace
from raylab.metrics import tracker as stats_tracker
from raylab.metrics.timeline import (
    LEARNER_TRACKER,
    Timeline,
    push_partial_state,
)

# Learner state keys of raylab's SAC (beside RLlib's module and optimizer state).
TEMPERATURE_STATE = "log_alpha"
REPLAY_STATE = "replay"  # only with algo.store_buffer_in_checkpoints


def split_update_on(wanted: Optional[bool], cuda: bool, world: int, cores: int) -> bool:
    """Whether the Learner splits each update over two threads (``algo.split_update``): as
    asked, else on a CPU Learner that is alone and may use 2 or more cores."""
    if wanted is not None:
        return bool(wanted)
    return not cuda and world == 1 and cores >= 2


def owed_updates(ingested: int, learning_starts: int, updates_per_step: float) -> int:
    """Gradient updates the replay ratio allows after ``ingested`` env steps."""
    if ingested < max(1, learning_starts):
        return 0
    return int((ingested - learning_starts + 1) * updates_per_step)


class RaylabSACLearner(SACLearner, TorchLearner):
    """SAC learner with its own device replay ring and a background update loop.

    From RLlib it takes SACLearner's temperature and target-entropy state and TorchLearner's
    devices and optimizer registry; the update itself is :func:`sac_update`, called by the
    learner's own loop. RLlib's ``Learner.update`` path is never taken (raylab's training
    step feeds :meth:`ingest`), so its loss hook refuses rather than computing a second,
    untested version of the losses."""

    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        raise NotImplementedError(
            "raylab's SAC learner updates in its own loop (ingest / sac_update); RLlib's "
            "Learner.update path is not used"
        )

    def __repr__(self) -> str:
        return f"raylab-learner-{os.environ.get('RANK', '0')}"

    def build(self) -> None:
        super().build()
        cfg = self.config
        rank = int(os.environ.get("RANK", "0"))
        trace.configure(
            trace.settings_from(cfg), role=f"learner-{rank}", process_name=f"Learner {rank}"
        )
        if self.device.type == "cpu":
            # at most the cores this learner's process may use
            torch.set_num_threads(max(1, min(int(cfg.learner_torch_threads), usable_cores())))
        # The update thread logs while the request thread reduces: RLlib's MetricsLogger has no
        # public switch for that, so this sets the lock RLlib's own IMPALA learner sets.
        rllib_compat.make_metrics_reentrant(self)
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
            phases=S.LEARNER_MAIN_PHASES["sac"],
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
            optimizers=[opt for _, opt in self.get_optimizers_for_module(self._mid)],
            log_std_min=module.log_std_min,
            mean_bound=module.mean_bound,
        )
        self._helper: Optional[ThreadPoolExecutor] = None
        if split_update_on(
            cfg.split_update, self.device.type == "cuda", self._world, usable_cores()
        ):
            self._helper = ThreadPoolExecutor(1, thread_name_prefix="sac-actor-half")
        self._update_fn = self._fused_update
        if cfg.torch_compile and self.device.type == "cuda":
            self._update_fn = torch.compile(self._fused_update)
        self._publish()

    def configure_optimizers_for_module(self, module_id, config=None) -> None:
        # Critic, actor and temperature optimizers, as torch's fused Adam (CPU and GPU): one
        # kernel over the parameters (on CPU 0.15 ms per step for two 256-256 MLPs, against
        # 0.38 foreach and 0.47 per tensor).
        module = self.module[module_id]
        opts = {"fused": True, "eps": 1e-7}
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
        if not getattr(self, "_ingest_track_named", False):
            trace.name_thread("ingest requests (replay ingress, background)")
            self._ingest_track_named = True
        t0 = time.perf_counter()
        with self.timeline.background(S.PERF_REPLAY_INGRESS_H2D_SUBMIT_MS):
            batch = ray.get(ref) if isinstance(ref, ray.ObjectRef) else ref
            scale = float(getattr(self.config, "reward_scale", 1.0))
            if scale != 1.0:  # algo.reward_scale: what the critics learn from
                batch = {**batch, "rewards": np.asarray(batch["rewards"]) * np.float32(scale)}
            with self._replay_lock:
                if self._replay is None:
                    self._make_replay(batch)
                n = self._replay.add(batch)
                if self.device.type == "cuda":
                    # Once per ingest (one EnvRunner result), not per update: the rows count
                    # as sampleable only once their host-to-device copies have landed.
                    torch.cuda.current_stream(self.device).synchronize()
        self._ingest_s = getattr(self, "_ingest_s", 0.0) + time.perf_counter() - t0
        self._ingest_n = getattr(self, "_ingest_n", 0) + 1
        with self._cond:
            self._ingested += n
            self._staleness.append(float(self._version - max(runner_version, 0)))
            self._cond.notify_all()
        self._start_updates()
        return self.status()

    def _start_updates(self) -> None:
        """Start the update thread (once there is a ring to sample from)."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="raylab-sac-update", daemon=True
                )
                self._thread.start()

    def _make_replay(self, batch: Dict[str, np.ndarray]) -> None:
        cfg = self.config
        self._replay = DeviceReplay(
            capacity=cfg.buffer_capacity,
            obs_dim=int(np.asarray(batch["obs"]).shape[-1]),
            action_dim=int(np.asarray(batch["actions"]).shape[-1]),
            batch_size=cfg.train_batch_size_per_learner,
            device=self.device,
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

    def learner_status(self) -> Dict[str, Any]:
        """Lifetime gradient updates and the device replay (the runtime manifest's ring)."""
        replay = self._replay
        n = getattr(self, "_ingest_n", 0)
        ring = {
            "kind": "sac_device_replay",
            "unit": "transitions",
            "capacity": int(self.config.buffer_capacity),
            "size": int(replay.size) if replay is not None else 0,
            # A ring that only grows until it wraps: its high water is its largest size.
            "high_water": int(replay.size) if replay is not None else 0,
            "ingested": int(self._ingested),
            "ingest_ms_mean": 1000.0 * self._ingest_s / n if n else None,
        }
        return {"updates": int(self._updates), "ring": ring}

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
        tl.bind_to_current_thread("SAC update thread (main timeline)")
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
                bf16=cfg.bf16_autocast and self.device.type == "cuda",
                all_reduce=self._all_reduce_grads if self._world > 1 else None,
                critic_loss=cfg.critic_loss,
                helper=self._helper,
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
            **{S.PERF_DP_GRADIENT_SYNC_MS_PER_RANK: (time.perf_counter() - t0) * 1000.0}
        )
        self._sync_calls = getattr(self, "_sync_calls", 0) + 1

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
        if self._world > 1:  # this rank's all-reduce calls since the last report
            calls, self._sync_calls = getattr(self, "_sync_calls", 0), 0
            self.stats.scalar(**{S.PERF_DP_GRADIENT_SYNC_CALLS_PER_RANK: float(calls)})
        push_partial_state(self.metrics, LEARNER_TRACKER)
        return self.metrics.reduce()

    def get_state(self, components=None, *, not_components=None, **kwargs):
        """RLlib's Learner state plus the temperature (a Learner variable, not a module
        parameter: the optimizer state holds only its Adam moments) and, with
        ``algo.store_buffer_in_checkpoints``, the replay ring with the counters that go with
        it (env steps taken in, updates done)."""
        with self._model_lock:
            state = super().get_state(components, not_components=not_components, **kwargs)
            if self._check_component(COMPONENT_OPTIMIZER, components, not_components):
                state[TEMPERATURE_STATE] = self.curr_log_alpha[self._mid].detach().cpu().numpy()
        if self.config.store_buffer_in_checkpoints and self._check_component(
            REPLAY_STATE, components, not_components
        ):
            with self._replay_lock, self._cond:
                if self._replay is not None:
                    state[REPLAY_STATE] = {
                        "ring": self._replay.get_state(),
                        "ingested": self._ingested,
                        "updates": self._updates,
                    }
        return state

    def set_state(self, state) -> None:
        with self._model_lock:
            super().set_state(state)
            if TEMPERATURE_STATE in state:
                with torch.no_grad():
                    log_alpha = torch.as_tensor(np.asarray(state[TEMPERATURE_STATE]))
                    self.curr_log_alpha[self._mid].copy_(log_alpha)
            self._publish()
        saved = state.get(REPLAY_STATE)
        if saved is not None:
            # Without the ring the counters stay at 0: the restored Learner waits for
            # learning_starts new transitions (random actions) before it updates again.
            with self._replay_lock:
                self._replay = DeviceReplay.from_state(
                    saved["ring"], self.config.train_batch_size_per_learner, self.device
                )
                self._spare = self._replay.new_output()
            with self._cond:
                self._ingested, self._updates = int(saved["ingested"]), int(saved["updates"])
                self._cond.notify_all()
            # The updates still owed when the checkpoint was taken start now: the algorithm
            # requests no new samples while that backlog is over its limit, so waiting for the
            # next ingest to start the thread would wait forever.
            self._start_updates()

    def shutdown(self) -> None:
        self._stop = True
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if self._helper is not None:
            self._helper.shutdown(wait=False)
        super().shutdown()


# ------------------------------------------------------------------------ algorithm loop
