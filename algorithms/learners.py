"""raylab's Learner subclasses: RLlib's PPO / APPO / SAC torch learners with phase timers.

Each learner owns one ``Timeline`` for its main update loop and records, per loop iteration,
the canonical learner phases that exist on its path (``raylab.metrics.schema``):

- PPO (synchronous; the loop is the learner actor's request thread):
  Collector Wait (idle between two update requests: EnvRunners are sampling), Episode
  Transfer (resolving episode refs from the object store), Replay Stage (learner connector:
  episodes -> train batch, GAE), Learning (forward / backward / optimizer over all epochs).
- APPO (asynchronous; the loop is RLlib's learner thread): Collector Wait (blocked on an empty
  circular buffer), Replay Sample (taking a batch from it), Learning, Weight Publish (learner
  state for the EnvRunner broadcast). The request thread that receives episodes and stages
  them into the buffer overlaps this loop: it is a background diagnostic (Ingest).
- SAC has its own learner with a device replay and an asynchronous update loop
  (``raylab.algorithms.sac``).

Whatever the loop does outside these phases is Other = wall - accounted. Loss and policy
statistics go through the stats tracker with their masks as denominators.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Dict, List, Optional

import numpy as np
from ray.rllib.algorithms.appo.torch.appo_torch_learner import APPOTorchLearner
from ray.rllib.algorithms.appo.utils import CircularBuffer
from ray.rllib.algorithms.impala.impala_learner import IMPALALearner
from ray.rllib.algorithms.ppo.ppo import (
    LEARNER_RESULTS_KL_KEY,
    LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY,
    LEARNER_RESULTS_VF_LOSS_UNCLIPPED_KEY,
)
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.core import ALL_MODULES
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.learner import ENTROPY_KEY, POLICY_LOSS_KEY, VF_LOSS_KEY
from ray.rllib.core.learner.training_data import TrainingData
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.metrics import (
    MODULE_TRAIN_BATCH_SIZE_MEAN,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_ENV_STEPS_TRAINED,
    NUM_ENV_STEPS_TRAINED_LIFETIME,
    NUM_MODULE_STEPS_TRAINED,
    NUM_MODULE_STEPS_TRAINED_LIFETIME,
    WEIGHTS_SEQ_NO,
)
from ray.rllib.utils.torch_utils import explained_variance

from raylab.algorithms import rllib_compat
from raylab.metrics import schema as S
from raylab.metrics import trace
from raylab.metrics import tracker as stats_tracker
from raylab.metrics.timeline import LEARNER_TRACKER, Timeline, label, push_partial_state

logger = logging.getLogger(__name__)


def orthogonal_init(module) -> None:
    """The reference PPO's initialisation of an actor-critic RLModule: every Linear layer's
    weights orthogonal with gain sqrt(2) and biases 0, except the value output (gain 1) and the
    policy output (gain 1 here; the caller scales it by ``init_policy_scale``)."""
    import math

    import torch

    def linears(part):
        return [m for m in part.modules() if isinstance(m, torch.nn.Linear)]

    outputs = [linears(module.pi)[-1], linears(module.vf)[-1]]
    with torch.no_grad():
        for part in (module.encoder, module.pi, module.vf):
            for layer in linears(part):
                gain = 1.0 if any(layer is o for o in outputs) else math.sqrt(2.0)
                torch.nn.init.orthogonal_(layer.weight, gain=gain)
                if layer.bias is not None:
                    layer.bias.zero_()


class _TimedLearnerMixin:
    """Phase timers and tracker export shared by the raylab learners."""

    _main_phases: tuple = ()

    def __repr__(self) -> str:
        # The Learner actor's name in the Ray dashboard and in log prefixes.
        import os

        return f"raylab-learner-{os.environ.get('RANK', '0')}"

    def _init_policy_head(self) -> None:
        """Small initial mean action and a chosen initial std (continuous actions only).

        The last Linear layer of the policy head outputs [mean, log_std]: its weights are
        scaled down and the log-std half of its bias is set, so the first rollouts explore
        around the mean action 0 with std exp(init_log_std) instead of saturating the
        actuators. With ``algo.free_log_std`` the layer outputs the mean only and the head's
        own log-std parameter is set. With ``algo.orthogonal_init`` every Linear layer is first
        re-initialised orthogonally (:func:`orthogonal_init`). EnvRunners receive these
        weights at the first sync. First every tanh becomes a :class:`FastTanh`
        (raylab.algorithms.activations), as in the EnvRunners.
        """
        import torch

        from raylab.algorithms.activations import use_fast_tanh

        use_fast_tanh(self.module)  # before the target networks copy the policy
        cfg = (self.config.learner_config_dict or {}).get("policy_init")
        if not cfg:
            return
        for module_id in self.module.keys():
            module = self.module[module_id]
            module = module.unwrapped() if hasattr(module, "unwrapped") else module
            space = getattr(module, "action_space", None)
            head = getattr(module, "pi", None)
            if head is not None and cfg.get("orthogonal"):
                orthogonal_init(module)
            if space is None or head is None or not hasattr(space, "shape") or not space.shape:
                continue
            last = [m for m in head.modules() if isinstance(m, torch.nn.Linear)][-1]
            act_dim = int(space.shape[0])
            free = getattr(head, "log_std", None)  # RLlib's free_log_std head
            if last.out_features != (act_dim if free is not None else 2 * act_dim):
                continue
            with torch.no_grad():
                last.weight.mul_(cfg["scale"])
                last.bias[:act_dim].zero_()
                if free is not None:
                    free.fill_(cfg["log_std"])
                else:
                    last.bias[act_dim:].fill_(cfg["log_std"])

    def configure_optimizers_for_module(self, module_id, config=None) -> None:
        """RLlib's one Adam per module, built as torch's fused Adam with ``algo.adam_eps``:
        one kernel over every parameter where the default Adam on CPU loops over them in
        Python (0.15 against 0.47 ms per step for two 256-256 MLPs here, about a sixth of a
        64-sample PPO minibatch update). The same update rule; the order of its floating-point
        operations differs."""
        import torch

        params = self.get_parameters(self._module[module_id])
        eps = (self.config.learner_config_dict or {}).get("adam_eps")
        self.register_optimizer(
            module_id=module_id,
            optimizer=torch.optim.Adam(params, eps=1e-8 if eps is None else float(eps), fused=True),
            params=params,
            lr_or_lr_schedule=config.lr,
        )

    def _init_timeline(self) -> None:
        import torch

        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        trace.configure(
            trace.settings_from(self.config), role=f"learner-{rank}", process_name=f"Learner {rank}"
        )
        self.timeline = Timeline(
            LEARNER_TRACKER, phases=self._main_phases, wall_tag=S.PERF_ITERATION_TIME
        )
        self.stats = stats_tracker.get(LEARNER_TRACKER)

    # ---- phases every path shares --------------------------------------------------------
    # Learning is the loop's share of ``Learner.update`` between RLlib's two public hooks,
    # ``before_gradient_based_update`` and ``after_gradient_based_update``, less the Replay
    # Stage inside it; one gradient update is one ``compute_loss_for_module`` call.

    def before_gradient_based_update(self, *, timesteps):
        super().before_gradient_based_update(timesteps=timesteps)
        if self.timeline.on_owner_thread():
            self._learning_t0 = self._segment_t0 = time.perf_counter()
            self._segment_c0 = time.thread_time()
            self._staged_s = 0.0
            self._learning_spans = []  # Learning's intervals around the Replay Stage (traces)
            tracer = trace.active()
            self._learning_cuda = tracer.cuda.start() if tracer and tracer.cuda else None

    def after_gradient_based_update(self, *, timesteps):
        super().after_gradient_based_update(timesteps=timesteps)
        for module_id in self.module.keys():
            norm = self._obs_norm(module_id)
            if norm is not None:
                norm.commit()  # this update's observations join the statistics now
            module = self.module[module_id]
            module = module.unwrapped() if hasattr(module, "unwrapped") else module
            if getattr(module, "log_std_bound", None) is not None:  # algo.final_max_log_std
                # the run's seconds since the previous update (0 at the first), on this clock
                now = time.monotonic()
                ticks = self.__dict__.setdefault("_schedule_ticks", {})
                last = ticks.get(module_id, now)
                ticks[module_id] = now
                module.set_log_std_bound(
                    int(timesteps.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, 0)), add_seconds=now - last
                )
        t0 = getattr(self, "_learning_t0", None)
        if t0 is not None and self.timeline.on_owner_thread():
            now = time.perf_counter()
            learning = now - t0 - self._staged_s
            spans = self._learning_spans + [
                (self._segment_t0, now, self._segment_c0, time.thread_time())
            ]
            self.timeline.add(S.PERF_LEARNING_TIME, max(0.0, learning), spans=spans)
            self._learning_t0 = None
            tracer = trace.active()
            if self._learning_cuda is not None and tracer is not None and tracer.cuda:
                tracer.cuda.end(label(S.PERF_LEARNING_TIME), self._learning_cuda)

    def _make_batch_if_necessary(self, training_data):  # a hook: rllib_compat.OVERRIDDEN_HOOKS
        # RLlib 2.60 has no public hook around the learner connector (episodes -> train
        # batch), so the Replay Stage / Ingest timer wraps this method of Learner.update.
        if not self.timeline.on_owner_thread():
            with self.timeline.background(S.PERF_LEARNER_INGEST_MS):
                return super()._make_batch_if_necessary(training_data)
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            with self.timeline.phase(S.PERF_LEARNER_REPLAY_STAGE_MS):
                return super()._make_batch_if_necessary(training_data)
        finally:
            if getattr(self, "_learning_t0", None) is not None:
                now = time.perf_counter()
                self._staged_s += now - t0
                self._learning_spans.append((self._segment_t0, t0, self._segment_c0, c0))
                self._segment_t0, self._segment_c0 = now, time.thread_time()

    def _adapt_lr_to_kl(self, module_id: str, batch: Dict[str, Any], fwd_out) -> None:
        """``algo.lr_schedule=adaptive_kl``: before this minibatch's optimizer step, move the
        module's learning rate by the KL of its current policy from the policy that sampled
        the minibatch (:func:`adapted_lr`). No-op for the other schedules."""
        target = (self.config.learner_config_dict or {}).get("lr_kl_target")
        if target is None:
            return
        if Columns.ACTION_DIST_INPUTS not in batch:
            raise RuntimeError(
                "algo.lr_schedule=adaptive_kl needs the sampling policy's distribution inputs "
                "in the train batch (ACTION_DIST_INPUTS); this batch has none"
            )
        kl = float(policy_kl(self.module[module_id], batch, fwd_out))
        for _, optimizer in self.get_optimizers_for_module(module_id):
            lr = adapted_lr(optimizer.param_groups[0]["lr"], kl, float(target))
            rllib_compat.set_constant_lr(self, optimizer, lr)
        self.stats.scalar(**{S.policy_tag("sampling_kl"): kl})

    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        self._adapt_lr_to_kl(module_id, batch, fwd_out)
        loss = super().compute_loss_for_module(
            module_id=module_id, config=config, batch=batch, fwd_out=fwd_out
        )
        self._count_updates(1)
        self._record_batch_stats(module_id, batch)
        self.stats.scalar(**{S.loss_tag("total"): float(loss.detach())})
        # algo.normalize_obs: this minibatch was normalised with the statistics it was sampled
        # with; it joins them after the whole update (raylab.algorithms.modules.RunningObsNorm).
        norm = self._obs_norm(module_id)
        if norm is not None:
            norm.collect(batch[Columns.OBS], batch.get(Columns.LOSS_MASK))
        return loss

    def _obs_norm(self, module_id: str):
        module = self.module[module_id]
        return getattr(
            module.unwrapped() if hasattr(module, "unwrapped") else module, "obs_norm", None
        )

    def _count_updates(self, n: int) -> None:
        self._grad_updates = getattr(self, "_grad_updates", 0) + n
        self._updates_lifetime = getattr(self, "_updates_lifetime", 0) + n

    def _record_batch_stats(self, module_id: str, batch: Dict[str, Any]) -> None:
        """Policy statistics of a batch through the stats tracker, masks as denominators."""
        import torch

        with torch.no_grad():
            obs = batch[Columns.OBS]
            mask = batch.get(Columns.LOSS_MASK)
            if mask is None:
                mask = torch.ones(obs.shape[0], dtype=torch.bool, device=obs.device)
            self.stats.denominator(_valid_steps=mask.bool())
            values = {}
            if Postprocessing.ADVANTAGES in batch:
                values[S.policy_tag("advantage")] = batch[Postprocessing.ADVANTAGES]
            if Postprocessing.VALUE_TARGETS in batch:
                values[S.policy_tag("value_target")] = batch[Postprocessing.VALUE_TARGETS]
            if Columns.ACTION_LOGP in batch:
                values[S.policy_tag("behaviour_logp")] = batch[Columns.ACTION_LOGP]
            if values:
                self.stats.stat("_valid_steps", "avg", **values)

    def learner_status(self) -> Dict[str, Any]:
        """Lifetime gradient updates and the learner's ring (the runtime manifest's)."""
        return {"updates": int(getattr(self, "_updates_lifetime", 0)), "ring": self._ring_status()}

    def _ring_status(self):
        return None  # PPO trains on each batch as it comes: no ring

    def _export_stats(self, min_interval_s: float = 0.0) -> None:
        """Ship the tracker (at most every min_interval_s), with the gradient-update rate."""
        now = time.perf_counter()
        last = getattr(self, "_last_export", None)
        if last is not None and now - last < min_interval_s:
            return
        if last is not None and now > last:
            rate = getattr(self, "_grad_updates", 0) / (now - last)
            self.stats.scalar(**{S.PERF_LEARNER_UPDATES_PER_S: rate})
        self._last_export, self._grad_updates = now, 0
        push_partial_state(self.metrics, LEARNER_TRACKER)


# algo.lr_schedule=adaptive_kl: the factor and the bounds of the rate (the rule of the public
# legged-robot PPO setups).
ADAPTIVE_LR_FACTOR = 1.5
ADAPTIVE_LR_BOUNDS = (1e-5, 1e-2)


def adapted_lr(lr: float, kl: float, target: float) -> float:
    """The next learning rate under ``adaptive_kl``: divided by 1.5 when the KL exceeds twice
    the target, multiplied by 1.5 when it is below half of it, else unchanged; clipped to
    :data:`ADAPTIVE_LR_BOUNDS`. A KL that is not finite counts as too large."""
    low, high = ADAPTIVE_LR_BOUNDS
    if not np.isfinite(kl) or kl > 2.0 * target:
        return max(lr / ADAPTIVE_LR_FACTOR, low)
    if kl < 0.5 * target:
        return min(lr * ADAPTIVE_LR_FACTOR, high)
    return lr


def policy_kl(module, batch: Dict[str, Any], fwd_out):
    """Mean KL(sampling policy || current policy) over a batch's loss-masked rows, from the
    distribution inputs the EnvRunner stored and those of the forward pass (no gradient)."""
    import torch

    module = module.unwrapped() if hasattr(module, "unwrapped") else module
    cls = module.get_train_action_dist_cls()
    with torch.no_grad():
        old = cls.from_logits(batch[Columns.ACTION_DIST_INPUTS])
        new = cls.from_logits(fwd_out[Columns.ACTION_DIST_INPUTS].detach())
        kl = old.kl(new)
        mask = batch.get(Columns.LOSS_MASK)
        if mask is None:
            return kl.mean()
        mask = mask.bool()
        return torch.where(mask, kl, 0.0).sum() / mask.sum().clamp(min=1)


def minibatch_indices(
    n: int,
    minibatch_size: Optional[int],
    num_epochs: int,
    num_total_minibatches: int = 0,
    shuffle: bool = True,
    rng=np.random,
) -> List[np.ndarray]:
    """The rows of each minibatch of one PPO update, in RLlib's cyclic layout: a stream of
    epochs over the ``n`` rows (each a fresh permutation with ``shuffle``, else 0..n-1) cut
    into minibatches of ``minibatch_size`` (all rows when None) until ``num_epochs`` epochs are
    covered, or into ``num_total_minibatches`` minibatches when that is positive (what RLlib's
    LearnerGroup asks of several Learners, so that they take equal numbers of steps). A
    minibatch that crosses an epoch's end takes the rest of that epoch and the start of the
    next. RLlib's own iterator shuffles at each epoch's end only, so its first epoch runs in
    the batch's order; this layout shuffles every epoch, the first one too."""
    size = int(minibatch_size or n)
    count = num_total_minibatches if num_total_minibatches > 0 else -(-num_epochs * n // size)
    epochs = -(-count * size // n)
    order = np.concatenate([rng.permutation(n) if shuffle else np.arange(n) for _ in range(epochs)])
    return [order[i * size : (i + 1) * size] for i in range(count)]


# The smallest minibatch whose update runs faster on every core than on one (2 cores, one update:
# 32 and 64 rows 0.83-0.99x, 256 rows 1.05x, 1,024 rows 1.22x; torch splits an op across
# threads only when it is large, and every op pays the hand-over;
# benchmarks/results/ppo_update_threads.json).
THREADED_MINIBATCH = 512


def update_threads(
    wanted: Optional[int], num_learners: int, cores: int, minibatch_size: Optional[int] = None
) -> int:
    """``algo.learner_threads``: torch threads for PPO's update on CPU; by default every core of
    the Learner's machine with one Learner (nobody samples while PPO learns) and minibatches of
    at least :data:`THREADED_MINIBATCH` rows (``None``: the whole batch), else 1; never more
    than the cores."""
    if wanted is None:
        big = minibatch_size is None or int(minibatch_size) >= THREADED_MINIBATCH
        wanted = cores if num_learners <= 1 and big else 1
    return max(1, min(int(wanted), cores))


class RaylabPPOLearner(_TimedLearnerMixin, PPOTorchLearner):
    """RLlib's PPO learner with raylab's minibatch loop.

    ``update`` hands RLlib's ``Learner.update`` the whole train batch as one item and runs the
    epochs of minibatches itself (:meth:`_update`): per minibatch only the forward pass, the
    PPO loss, backward, the global-norm clip (torch's foreach kernels) and the optimizer
    step. RLlib's loop adds per minibatch a slice-and-concatenate of the batch, about twenty
    metrics-logger calls (loss statistics, step counters, throughputs, Prometheus timers), a
    boolean-indexed mean per loss term and two finiteness checks per parameter tensor, which
    with the 64-row minibatches of the tuned Gymnasium settings cost more than the learning.
    Here the statistics RLlib keeps for the last minibatch only (``window=1``) are computed
    once, from the last minibatch; the step counters count every minibatch as RLlib's do; the
    policy statistics and the observations for ``algo.normalize_obs`` are taken once from the
    whole batch (every epoch covers it). Configurations the loop does not cover (several
    modules, clipping by value or per tensor, grad scalers, a compiled update) run RLlib's.
    """

    _main_phases = S.LEARNER_MAIN_PHASES["ppo"]

    def build(self) -> None:
        super().build()
        self._init_policy_head()
        self._init_timeline()
        self._last_update_end = None
        self._layout = None  # this update's minibatch layout while raylab's loop runs it
        self._trained = None  # (minibatches, rows each) of the last update raylab's loop ran
        self._update_threads = self._resolve_update_threads()

    def _resolve_update_threads(self) -> int:
        import os

        wanted = (self.config.learner_config_dict or {}).get("update_threads")
        cores = len(os.sched_getaffinity(0))
        minibatch = self.config.minibatch_size
        return update_threads(wanted, self.config.num_learners, cores, minibatch)

    def _own_loop_covers(self) -> bool:
        module_ids = list(self.module.keys())
        if len(module_ids) != 1 or rllib_compat.grad_scalers(self) is not None:
            return False
        if self.config.torch_compile_learner:
            return False
        config = self.config.get_config_for_module(module_ids[0])
        return not config.grad_clip or config.grad_clip_by == "global_norm"

    def update(
        self,
        *args,
        training_data=None,
        num_epochs: int = 1,
        minibatch_size: Optional[int] = None,
        shuffle_batch_per_epoch: bool = False,
        num_total_minibatches: int = 0,
        **kwargs,
    ):
        # The request thread is this loop's thread; the gap since the previous update is the
        # time the learner waited for the EnvRunners.
        self.timeline.bind_to_current_thread("learner (update requests: main timeline)")
        if self._last_update_end is not None:
            now, end = time.perf_counter(), self._last_update_end
            self.timeline.add(
                S.PERF_LEARNER_COLLECTOR_WAIT_MS,
                now - end[0],
                spans=[(end[0], now, end[1], time.thread_time())],
            )
        if training_data is not None:
            with self.timeline.phase(S.PERF_LEARNER_EPISODE_TRANSFER_MS):
                training_data.solve_refs()
        layout = dict(
            num_epochs=num_epochs,
            minibatch_size=minibatch_size,
            shuffle_batch_per_epoch=shuffle_batch_per_epoch,
            num_total_minibatches=num_total_minibatches,
        )
        if self._own_loop_covers():
            # RLlib's update sees one batch of one epoch and calls _update once with it.
            self._layout, self._trained = layout, None
            layout = dict(num_epochs=1, minibatch_size=None, shuffle_batch_per_epoch=False)
        import torch

        threads = torch.get_num_threads()
        if self.device.type == "cpu":
            torch.set_num_threads(self._update_threads)
        try:
            result = super().update(*args, training_data=training_data, **layout, **kwargs)
        finally:
            self._layout = None
            torch.set_num_threads(threads)
        self._last_update_end = (time.perf_counter(), time.thread_time())
        return result

    def _update(self, batch: Dict[str, Any]):  # a hook: rllib_compat.OVERRIDDEN_HOOKS
        if self._layout is None:
            return super()._update(batch)
        import torch

        layout = self._layout
        ((module_id, module_batch),) = batch.items()
        n = len(module_batch)
        columns = {
            k: v for k, v in module_batch.items() if torch.is_tensor(v) and v.ndim and len(v) == n
        }
        rest = {k: v for k, v in module_batch.items() if k not in columns}
        config = self.config.get_config_for_module(module_id)
        optimizers = [opt for _, opt in self.get_optimizers_for_module(module_id)]

        rllib_compat.log_off_policyness(self, batch)
        self._record_batch_stats(module_id, columns)
        norm = self._obs_norm(module_id)
        if norm is not None:  # joins the statistics after the update (after_gradient_based_update)
            norm.collect(columns[Columns.OBS], columns.get(Columns.LOSS_MASK))

        chunks = minibatch_indices(
            n,
            layout["minibatch_size"],
            layout["num_epochs"],
            layout["num_total_minibatches"],
            shuffle=layout["shuffle_batch_per_epoch"] and layout["num_epochs"] > 1,
        )
        # RLlib's forward_train puts the module in train mode on every call (a walk over all
        # its submodules); without a DDP wrapper to go through, that is done once here.
        module = self.module[module_id]
        if module is module.unwrapped():
            module.train()
            forward = module._forward_train
        else:
            forward = module.forward_train
        loss_sum = None
        for rows in chunks:
            index = torch.from_numpy(rows).to(self.device)
            minibatch = {**rest, **{k: v.index_select(0, index) for k, v in columns.items()}}
            fwd_out = forward(minibatch)
            self._adapt_lr_to_kl(module_id, minibatch, fwd_out)
            loss = self._ppo_loss(module_id, config, minibatch, fwd_out)
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = self._clip_and_step(config, optimizers)
            loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()

        self._count_updates(len(chunks))
        self._trained = (len(chunks), len(chunks[0]))
        self.stats.scalar(**{S.loss_tag("total"): float(loss_sum) / len(chunks)})
        self._log_loss_terms(module_id)
        if config.grad_clip:
            name = self.get_optimizers_for_module(module_id)[0][0]
            self.metrics.log_value(
                (module_id, f"gradients_{name}_global_norm"), grad_norm, window=1
            )
        return {module_id: fwd_out}, {module_id: loss}, {}

    def _clip_and_step(self, config, optimizers):
        """Clip by the global norm (when ``grad_clip``), then step; gradients that are not
        finite are zeroed (or the step skipped, with ``torch_skip_nan_gradients``), as RLlib's
        TorchLearner does. Returns the global norm before clipping."""
        import torch

        total = None
        for opt in optimizers:
            params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
            if config.grad_clip:
                total = torch.nn.utils.clip_grad_norm_(params, config.grad_clip, foreach=True)
            else:
                total = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
            if not bool(torch.isfinite(total)):
                if config.torch_skip_nan_gradients:
                    logger.warning("Skipping a PPO update: its gradients are not finite.")
                    continue
                logger.warning("PPO gradients contain nan/inf values: setting them to zero.")
                for p in params:
                    p.grad = torch.nan_to_num(p.grad)
            opt.step()
        return total

    def _ppo_loss(self, module_id, config, batch, fwd_out):
        """RLlib's PPO loss (clipped surrogate, squared value error clipped at
        ``vf_clip_param``, entropy bonus, optional KL penalty), with masked means as sums over
        ``torch.where`` and its statistics left for :meth:`_log_loss_terms`."""
        import torch

        module = self.module[module_id].unwrapped()
        mask = batch.get(Columns.LOSS_MASK)
        if mask is None:
            mean = torch.mean
        else:
            num_valid = mask.sum()

            def mean(x):
                return torch.where(mask, x, 0.0).sum() / num_valid

        curr = module.get_train_action_dist_cls().from_logits(fwd_out[Columns.ACTION_DIST_INPUTS])
        ratio = torch.exp(curr.logp(batch[Columns.ACTIONS]) - batch[Columns.ACTION_LOGP])
        advantages = batch[Postprocessing.ADVANTAGES]
        surrogate = torch.min(
            advantages * ratio,
            advantages * torch.clamp(ratio, 1 - config.clip_param, 1 + config.clip_param),
        )
        entropy = curr.entropy()
        if config.use_critic:
            values = module.compute_values(batch, embeddings=fwd_out.get(Columns.EMBEDDINGS))
            vf_loss = torch.pow(values - batch[Postprocessing.VALUE_TARGETS], 2.0)
            vf_clipped = torch.clamp(vf_loss, 0, config.vf_clip_param)
        else:
            values = vf_loss = vf_clipped = torch.zeros_like(surrogate)
        coeff = self.entropy_coeff_schedulers_per_module[module_id].get_current_value()
        total = mean(-surrogate + config.vf_loss_coeff * vf_clipped - coeff * entropy)
        kl = None
        if config.use_kl_loss:
            prev = module.get_exploration_action_dist_cls().from_logits(
                batch[Columns.ACTION_DIST_INPUTS]
            )
            kl = mean(prev.kl(curr))
            total = total + self.curr_kl_coeffs_per_module[module_id] * kl
        self._loss_terms = (mean, surrogate, vf_clipped, vf_loss, values, batch, entropy, kl)
        return total

    def _log_loss_terms(self, module_id) -> None:
        """The last minibatch's loss statistics under RLlib's PPO keys (RLlib keeps only the
        last minibatch's too)."""
        import torch

        mean, surrogate, vf_clipped, vf_loss, values, batch, entropy, kl = self._loss_terms
        self._loss_terms = None
        with torch.no_grad():
            targets = batch.get(Postprocessing.VALUE_TARGETS, values)
            self.metrics.log_dict(
                {
                    POLICY_LOSS_KEY: -mean(surrogate.detach()),
                    VF_LOSS_KEY: mean(vf_clipped.detach()),
                    LEARNER_RESULTS_VF_LOSS_UNCLIPPED_KEY: mean(vf_loss.detach()),
                    LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY: explained_variance(
                        targets, values.detach()
                    ),
                    ENTROPY_KEY: mean(entropy.detach()),
                    LEARNER_RESULTS_KL_KEY: (torch.tensor(0.0) if kl is None else kl.detach()),
                },
                key=module_id,
                window=1,
            )

    def _log_steps_trained_metrics(self, batch):  # a hook: rllib_compat.OVERRIDDEN_HOOKS
        # RLlib counts per minibatch: its rows as module steps, the whole batch's env steps as
        # env steps; raylab's loop ran them all in one _update call.
        if self._trained is None:
            return super()._log_steps_trained_metrics(batch)
        count, size = self._trained
        self._trained = None
        log = self.metrics.log_value
        for mid in batch.policy_batches:
            log((mid, WEIGHTS_SEQ_NO), rllib_compat.weights_seq_no(self), window=1)
            log((mid, MODULE_TRAIN_BATCH_SIZE_MEAN), size, reduce="mean")
            log((mid, NUM_MODULE_STEPS_TRAINED), count * size, reduce="sum")
            log(
                (mid, NUM_MODULE_STEPS_TRAINED_LIFETIME),
                count * size,
                reduce="lifetime_sum",
                with_throughput=True,
            )
        module_steps = count * size * len(batch.policy_batches)
        for key, value in (
            (NUM_MODULE_STEPS_TRAINED, module_steps),
            (NUM_MODULE_STEPS_TRAINED_LIFETIME, module_steps),
            (NUM_ENV_STEPS_TRAINED, count * batch.env_steps()),
            (NUM_ENV_STEPS_TRAINED_LIFETIME, count * batch.env_steps()),
        ):
            reduce = "lifetime_sum" if key.endswith("_lifetime") else "sum"
            log((ALL_MODULES, key), value, reduce=reduce, with_throughput=True)

    def after_gradient_based_update(self, *, timesteps):
        super().after_gradient_based_update(timesteps=timesteps)
        # One update() call is one loop iteration; close it and ship the statistics.
        self.timeline.boundary()
        self._export_stats()


class _TimedCircularBuffer(CircularBuffer):
    """APPO's circular buffer, timed from the learner thread, waiting without busy polling.

    ``get`` marks the learner loop's iteration boundary, then splits the call into Collector
    Wait (blocked while the buffer is empty) and Replay Sample (drawing the batch).
    """

    def __init__(self, *args, timeline: Timeline, **kwargs):
        super().__init__(*args, **kwargs)
        self._timeline = timeline
        self._ready = threading.Condition()  # notified by put; len() takes the buffer's lock

    def put(self, item, block=True, timeout=None):
        dropped = super().put(item, block=block, timeout=timeout)
        self.puts = getattr(self, "puts", 0) + 1
        self.high_water = max(getattr(self, "high_water", 0), len(self))
        with self._ready:
            self._ready.notify_all()
        return dropped

    def get(self, block=True, timeout=None):
        tl = self._timeline
        if not tl.is_bound():
            tl.bind_to_current_thread("learner thread (main timeline)")
        tl.boundary()
        with tl.phase(S.PERF_LEARNER_COLLECTOR_WAIT_MS):
            with self._ready:
                while len(self) == 0:
                    self._ready.wait(timeout=0.5)
        with tl.phase(S.PERF_LEARNER_REPLAY_SAMPLE_MS):
            return super().get(block=block, timeout=timeout)


# The behaviour log-probability given to the step RLlib appends to every episode chunk (see
# weightless_phantom_steps): exp(logp - PHANTOM_LOGP) is 0 in float32 for any real logp.
PHANTOM_LOGP = 1.0e4


def weightless_phantom_steps(batch: Dict[str, Any]) -> Dict[str, Any]:
    """APPO's batch with V-trace's importance weight 0 on the step RLlib appends to every
    episode chunk (``AddOneTsToEpisodesAndTruncate``; ``LOSS_MASK`` False there).

    That step holds the chunk's last observation so that its value can bootstrap the chunk's
    last real step. RLlib 2.60's APPO loss gives it discount 0 and reward 0 but a full weight,
    so its V-trace error is ``0 - V(s_T)``, and the recursion adds ``gamma * c * (-V(s_T))`` to
    the last real step's target: ``r + gamma V(s_T) - gamma V(s_T) = r``. Every chunk's end
    (each rollout fragment's, 32 env steps by default) then counts as a terminal state, and
    the policy only sees the rewards up to the end of its fragment. With weight 0 the phantom
    step's error is 0, its target is its own value, and the last real step bootstraps from
    ``V(s_T)`` as GAE does in PPO. The step stays out of every loss (its ``LOSS_MASK``)."""
    import torch

    mask = batch.get(Columns.LOSS_MASK)
    if mask is None or Columns.ACTION_LOGP not in batch:
        return batch
    logp = batch[Columns.ACTION_LOGP]
    return {**batch, Columns.ACTION_LOGP: torch.where(mask.bool(), logp, PHANTOM_LOGP)}


def batches_of_rows(episodes: List[Any], rows: int) -> List[List[Any]]:
    """Episode chunks in consecutive groups of about ``rows`` env steps each.

    RLlib's APPO hands its learner whole ``sample()`` results, as many as reach
    ``train_batch_size``: with ``num_envs * rollout_fragment_length`` above it one sample is one
    batch, and each pass of the circular buffer one gradient step on all of it (128 envs x 32
    steps: 4,096 rows, half the updates per env step of 32 envs' 2,048-row batches). Split into
    ``round(total / rows)`` groups of whole chunks, the batch is ``train_batch_size`` again."""
    total = sum(len(e) for e in episodes)
    n = max(1, min(len(episodes), round(total / max(1, rows))))
    if n == 1:
        return [episodes]
    groups: List[List[Any]] = [[]]
    filled = 0
    for ep in episodes:
        if filled >= total * len(groups) / n and len(groups) < n:
            groups.append([])
        groups[-1].append(ep)
        filled += len(ep)
    return groups


class RaylabAPPOLearner(_TimedLearnerMixin, APPOTorchLearner):
    _main_phases = S.LEARNER_MAIN_PHASES["appo"]

    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        return super().compute_loss_for_module(
            module_id=module_id,
            config=config,
            batch=weightless_phantom_steps(batch),
            fwd_out=fwd_out,
        )

    def build(self) -> None:
        # APPOLearner.build, with the timed buffer in place of RLlib's CircularBuffer. RLlib
        # 2.60 has no public point for this timer (rllib_compat.build_appo_learner_with_buffer).
        self._init_timeline()
        buffer = None
        if self.config.use_circular_buffer:
            buffer = _TimedCircularBuffer(
                num_batches=self.config.circular_buffer_num_batches,
                iterations_per_batch=self.config.circular_buffer_iterations_per_batch,
                timeline=self.timeline,
            )
        rllib_compat.build_appo_learner_with_buffer(self, buffer, IMPALALearner)
        self._init_policy_head()  # before the target networks copy the policy
        rllib_compat.finish_appo_learner_build(self)

    def update(self, training_data, **kwargs):
        # Request thread: resolve the episodes from the object store. It overlaps the learner
        # thread, so it is a background diagnostic, never part of the learner's wall time.
        if not getattr(self, "_request_track_named", False):
            trace.name_thread("update requests (ingest, background)")
            self._request_track_named = True
        t0 = time.perf_counter()
        with self.timeline.background(S.PERF_LEARNER_INGEST_MS):
            training_data.solve_refs()
        self._ingest_s = getattr(self, "_ingest_s", 0.0) + time.perf_counter() - t0
        self._ingest_n = getattr(self, "_ingest_n", 0) + 1
        episodes = training_data.episodes
        if episodes is None:
            return super().update(training_data, **kwargs)
        groups = batches_of_rows(episodes, int(self.config.train_batch_size_per_learner))
        if len(groups) == 1:
            return super().update(training_data, **kwargs)
        # One batch per group, each queued for the learner thread like a sample of its own.
        result: Dict[str, Any] = {}
        for group in groups:
            result.update(super().update(TrainingData(episodes=group), **kwargs) or {})
        return result

    def _ring_status(self):
        buffer = getattr(self, "_learner_thread_in_queue", None)
        if not isinstance(buffer, CircularBuffer):
            return None
        n = getattr(self, "_ingest_n", 0)
        return {
            "kind": "appo_circular_buffer",
            "unit": "batches",
            "capacity": int(self.config.circular_buffer_num_batches),
            "size": len(buffer),
            "high_water": int(getattr(buffer, "high_water", 0)),
            "ingested": int(getattr(buffer, "puts", 0)),
            "ingest_ms_mean": 1000.0 * self._ingest_s / n if n else None,
        }

    def get_state(self, *args, **kwargs):
        if self.timeline.on_owner_thread() and self.timeline.is_bound():
            with self.timeline.phase(S.PERF_LEARNER_WEIGHT_PUBLISH_MS):
                return super().get_state(*args, **kwargs)
        return super().get_state(*args, **kwargs)

    def after_gradient_based_update(self, *, timesteps):
        super().after_gradient_based_update(timesteps=timesteps)
        if self.timeline.on_owner_thread():
            self._export_stats(min_interval_s=0.5)
