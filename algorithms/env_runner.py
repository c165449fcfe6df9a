"""raylab's EnvRunners.

- :class:`RaylabEnvRunner`: RLlib's ``SingleAgentEnvRunner`` with a readable actor name (Ray
  shows an actor's ``repr`` in the dashboard's actor list and in log prefixes, so EnvRunners read
  as ``raylab-envrunner-<index>``; index 0 is the local one, if any). The path for any
  Gymnasium id, and for raylab tasks with ``training.fast_sampler=false``.
- :class:`RaylabFastEnvRunner`: the same actor whose training samples (``sample()`` of
  ``num_timesteps`` with exploration, what PPO and APPO ask for) come from raylab's
  :class:`~raylab.algorithms.rollout.RolloutLoop` on the batched env: per vector step one forward
  pass, one action sample and one env step; the episode chunks RLlib's learner connectors expect
  are built once per fragment. Anything else (random actions, ``num_episodes``, inference) goes
  through RLlib's loop, after which the fast loop starts from a fresh reset.
- :class:`RaylabEvalEnvRunner`: the EnvRunner of RLlib's evaluation group. RLlib schedules the
  evaluation (``evaluation_interval``, ``evaluation_duration`` episodes) and syncs the weights;
  the episodes are run by :func:`raylab.algorithms.evaluation.run_policy_episodes`, the code
  ``raylab eval`` runs, on an env built like the training env: deterministic actions, episode
  k seeded ``training.eval_seed + k``.
"""

from __future__ import annotations

import time
import uuid
from typing import List, Optional

import numpy as np
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

from raylab.algorithms import rllib_compat
from raylab.algorithms.activations import use_fast_tanh
from raylab.algorithms.algorithm import EPISODES_KEY
from raylab.algorithms.env_errors import EnvErrorReporting
from raylab.algorithms.rollout import Fragment, RolloutLoop
from raylab.metrics import schema as S
from raylab.metrics import trace
from raylab.metrics import tracker as stats_tracker
from raylab.metrics.timeline import COLLECTOR_TRACKER, EVAL_TRACKER, label, push_partial_state
from raylab.quiet import quiet_actor

_ROLLOUT = label(S.PERF_COLLECTION_TIME)
_EXTRACT = label(S.PERF_COLLECTOR_TRANSITION_EXTRACT_MS)


class RaylabEnvRunner(EnvErrorReporting, SingleAgentEnvRunner):
    """RLlib's EnvRunner; env exceptions are reported to the run (raylab.algorithms.env_errors)."""

    _trace_role = ("env_runner", "EnvRunner")  # trace file prefix, process name

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # A remote EnvRunner writes its own trace (the local one, index 0, lives in the
        # algorithm's process, which traces itself).
        index = getattr(self, "worker_index", 0)
        if index > 0:
            role, name = self._trace_role
            trace.configure(trace.settings_from(self.config), f"{role}-{index}", f"{name} {index}")

    def __repr__(self) -> str:
        return f"raylab-envrunner-{getattr(self, 'worker_index', 0)}"

    def make_module(self):
        super().make_module()
        if self.module is not None:  # the Learners' function (raylab.algorithms.activations)
            use_fast_tanh(self.module)

    def stop(self):
        super().stop()
        # A healthy shutdown (RLlib stops every EnvRunner before Ray ends its process) closes
        # this runner's trace file; a killed one is left an open array, which readers accept.
        if getattr(self, "worker_index", 0) > 0:
            trace.shutdown()

    def _trace_sample_thread(self) -> None:
        """Name the trace track of the thread that serves sample requests (once)."""
        if not getattr(self, "_sample_track_named", False):
            trace.name_thread("sample requests (collector timeline)")
            self._sample_track_named = True

    def make_env(self):
        # Library chatter routed before any model compiles, also in a Ray job's workers (which
        # have no raylab setup hook): raylab.quiet.
        quiet_actor()
        return super().make_env()

    def _log_episode_metrics(self, length, ret, sec):  # a hook: rllib_compat.OVERRIDDEN_HOOKS
        # Every sampling path (RLlib's loop, raylab's rollout loop, SAC's transitions) reports
        # each finished episode here: RLlib's windowed means, and the episode itself for the
        # algorithm's reward window (raylab.algorithms.algorithm).
        super()._log_episode_metrics(length, ret, sec)
        self.metrics.log_value(EPISODES_KEY, (float(ret), int(length)), reduce="item_series")

    def batched_env(self):
        """The vector env itself, under RLlib's ``DictInfoToList`` wrapper."""
        return getattr(self.env, "env", self.env)


def one_torch_thread() -> None:
    """One intra-op torch thread in a sampling process. Inference on a batch of a few dozen
    observations gains nothing from more, and their OpenMP workers keep spinning after each
    forward pass on the cores the physics threads need: in one process on 2 cores, sampling ran
    at 5,200 env steps/s with torch's default 2 threads and at 9,500 with 1 (32 envs, 2 physics
    threads). Ray already sets OMP_NUM_THREADS to a worker's CPUs (1 for a default EnvRunner);
    this also holds where it does not (an in-process EnvRunner, an EnvRunner that reserves
    several CPUs for its physics threads)."""
    torch.set_num_threads(1)


class RaylabFastEnvRunner(RaylabEnvRunner):
    _loop: Optional[RolloutLoop] = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        one_torch_thread()

    def _sample(  # a hook: rllib_compat.OVERRIDDEN_HOOKS
        self,
        *,
        num_timesteps: Optional[int] = None,
        num_episodes: Optional[int] = None,
        explore: bool,
        random_actions: bool = False,
        force_reset: bool = False,
    ) -> List[SingleAgentEpisode]:
        if num_timesteps is None or random_actions or not explore or self.module is None:
            self._loop = None  # RLlib's loop steps the env now; ours must reset next time
            return super()._sample(
                num_timesteps=num_timesteps,
                num_episodes=num_episodes,
                explore=explore,
                random_actions=random_actions,
                force_reset=force_reset,
            )
        t_start = time.perf_counter()
        tracker = stats_tracker.get(COLLECTOR_TRACKER)
        self._trace_sample_thread()
        # An EnvRunner's module never trains: in eval mode RLlib's forward_exploration does not
        # switch it back to train mode (all submodules) after every step, and raylab's modules
        # skip the switch to eval mode too (AsymmetricPPOModule.explore).
        self.module.eval()
        policy = getattr(self.module, "explore", self.module.forward_exploration)
        if self._loop is None or force_reset:
            self._loop = RolloutLoop(self.batched_env(), tracker)
            # The same seeding as RLlib's own first reset of this EnvRunner.
            self._loop.reset(seed=rllib_compat.take_initial_reset_seed(self))
            self._chunk_ids = [uuid.uuid4().hex for _ in range(self.num_envs)]
            self._chunk_t = np.zeros(self.num_envs, dtype=np.int64)
            self._ep_start = np.full(self.num_envs, time.perf_counter())
        # Whole vector steps until num_timesteps transitions, as RLlib's loop counts them.
        frag = self._loop.run(
            policy,
            self.module.get_exploration_action_dist_cls(),
            min_transitions=max(1, int(num_timesteps)),
            noise_correlation=float(getattr(self.config, "raylab_noise_correlation", 0.0)),
        )
        steps = frag.num_steps
        t_extract = time.perf_counter()
        samples = self._chunks(frag)
        t_extracted = time.perf_counter()
        tracker.scalar(
            **{S.PERF_COLLECTOR_TRANSITION_EXTRACT_MS: (t_extracted - t_extract) * 1000.0}
        )
        trace.complete(_EXTRACT, t_extract, t_extracted, "collector")
        now = time.perf_counter()
        for env_index, length, ret, truncated in frag.episodes:
            rllib_compat.log_episode(self, length, ret, now - self._ep_start[env_index])
            self._ep_start[env_index] = now
            tracker.scalar(**{S.EPISODE_TIMEOUT_RATE: 1.0 if truncated else 0.0})
        t_end = time.perf_counter()
        tracker.scalar(**{S.PERF_COLLECTION_TIME: t_end - t_start})
        trace.complete(_ROLLOUT, t_start, t_end, "collector")
        rllib_compat.count_sampled(self, steps, len(frag.episodes))
        return samples

    def _chunks(self, frag: Fragment) -> List[SingleAgentEpisode]:
        """The fragment as RLlib episode chunks: one per env and episode piece, with the final
        observation of every piece (truncated ones bootstrap from it), numpy'd."""
        out = []
        T = frag.valid.shape[0]
        done = (frag.terminated | frag.truncated) & frag.valid
        obs_space, act_space = self.env.single_observation_space, self.env.single_action_space
        for i in range(self.num_envs):
            start = 0  # obs index where the current piece begins
            # Piece boundaries: a transition that ends an episode, or a reset step.
            cuts = np.flatnonzero(done[:, i] | ~frag.valid[:, i])
            for t in list(cuts) + [T]:
                if t < T and not frag.valid[t, i]:
                    # Step t reset the env: the new episode begins at obs[t + 1].
                    start = t + 1
                    self._chunk_ids[i] = uuid.uuid4().hex
                    self._chunk_t[i] = 0
                    continue
                end = t + 1 if t < T else T  # transitions [start, end)
                if end > start:
                    out.append(self._episode(frag, i, start, end, t < T, obs_space, act_space))
                    self._chunk_t[i] += end - start
                start = end
        return out

    def _episode(self, frag, i, start, end, done, obs_space, act_space) -> SingleAgentEpisode:
        sl = slice(start, end)
        extra = {WEIGHTS_SEQ_NO: np.full(end - start, rllib_compat.weights_seq_no(self))}
        if frag.logp is not None:
            extra[Columns.ACTION_LOGP] = frag.logp[sl, i]
        if frag.dist_inputs is not None:
            extra[Columns.ACTION_DIST_INPUTS] = frag.dist_inputs[sl, i]
        return SingleAgentEpisode(
            id_=self._chunk_ids[i],
            observations=frag.obs[start : end + 1, i],
            infos=[{} for _ in range(end + 1 - start)],  # RLlib's learners read no infos
            observation_space=obs_space,
            actions=frag.actions[sl, i],
            action_space=act_space,
            rewards=frag.rewards[sl, i],
            extra_model_outputs=extra,
            terminated=bool(done and frag.terminated[end - 1, i]),
            truncated=bool(done and frag.truncated[end - 1, i]),
            t_started=int(self._chunk_t[i]),
            len_lookback_buffer=0,
        )


class EvaluationCancelled(Exception):
    """An evaluation beside training stopped early (the run ended while it ran)."""


class RaylabEvalEnvRunner(RaylabEnvRunner):
    """Evaluation EnvRunner: ``sample(num_episodes=N)`` without exploration runs N episodes of
    :func:`raylab.algorithms.evaluation.run_policy_episodes` and reports their statistics as the
    ``Eval/*`` tags through the ``eval`` stats tracker (merged across evaluation EnvRunners by
    weight)."""

    _eval_env = None
    _eval_beside = False  # the env was built for an evaluation beside training
    _trace_role = ("eval_env_runner", "Eval EnvRunner")

    def __repr__(self) -> str:
        return f"raylab-eval-envrunner-{getattr(self, 'worker_index', 0)}"

    def sample(
        self,
        *,
        num_timesteps=None,
        num_episodes=None,
        explore=None,
        random_actions=False,
        force_reset=False,
        **kwargs,
    ):
        explore = self.config.explore if explore is None else explore
        if num_episodes is None or explore or random_actions or self.module is None:
            return super().sample(
                num_timesteps=num_timesteps,
                num_episodes=num_episodes,
                explore=explore,
                random_actions=random_actions,
                force_reset=force_reset,
                **kwargs,
            )
        self.evaluate_episodes(int(num_episodes))
        return []

    def evaluate_episodes(self, num_episodes: int, cancel=None) -> None:
        """Run ``num_episodes`` deterministic episodes of this runner's module and put their
        statistics (``Eval/*``) into its metrics. ``cancel`` (a ``threading.Event``): set, the
        episodes stop at the next env step with :class:`EvaluationCancelled` (an evaluation
        beside training, ``training.eval_background``, when the run stops)."""
        from raylab.algorithms.evaluation import (
            MAX_EVAL_ENVS,
            deterministic_policy,
            eval_vec_env,
            run_policy_episodes,
        )

        n = int(min(num_episodes, MAX_EVAL_ENVS))
        # Beside training the env is built on the (idle-priority) evaluation thread, so that its
        # physics threads start at that priority; one built for an evaluation in line (the
        # initial policy's) is rebuilt once.
        beside = cancel is not None
        if self._eval_env is None or self._eval_env.num_envs != n or self._eval_beside != beside:
            if self._eval_env is not None:
                self._eval_env.close()
            mode = self.config.gym_env_vectorize_mode
            batched = getattr(mode, "value", mode) == "vector_entry_point"
            self._eval_env = eval_vec_env(self.config.env, self.config.env_config, n, batched)
            self._eval_beside = beside
        self.module.eval()
        space = self._eval_env.single_action_space
        seed = int(getattr(self.config, "raylab_eval_seed", 0))
        policy = deterministic_policy(self.module, space)
        if cancel is not None:
            act = policy

            def policy(obs):
                if cancel.is_set():
                    raise EvaluationCancelled
                return act(obs)

        t0 = time.perf_counter()
        # One intra-op torch thread while the evaluation runs (one_torch_thread's reason: the
        # idle OpenMP workers spin on the physics threads' cores; a default evaluation took
        # 6.0 s with torch's 2 threads and 4.8 s with 1), then the process's own setting again:
        # this is the algorithm's process, where a local Learner may train. Beside training
        # (``cancel`` given) the setting, which is the process's, is left alone: the local
        # Learner trains meanwhile, and the evaluation's threads run at idle priority.
        threads = torch.get_num_threads()
        if cancel is None:
            torch.set_num_threads(1)
        try:
            stats = run_policy_episodes(policy, self._eval_env, int(num_episodes), seed)
        finally:
            if cancel is None:
                torch.set_num_threads(threads)
        tracker = stats_tracker.get(EVAL_TRACKER)
        t1 = time.perf_counter()
        tracker.scalar(**{S.PERF_EVALUATION_MS: (t1 - t0) * 1000.0})
        trace.complete(label(S.PERF_EVALUATION_MS), t0, t1, "evaluation")
        tracker.scalar_series(**{S.EVAL_MEAN_REWARD: np.asarray(stats["returns"])})
        tracker.scalar_series(**{S.EVAL_MEAN_EPISODE_LENGTH: np.asarray(stats["lengths"])})
        if stats["survivals"] is not None:
            tracker.scalar_series(**{S.EVAL_SURVIVAL: np.asarray(stats["survivals"])})
        push_partial_state(self.metrics, EVAL_TRACKER)

    def stop(self):
        if self._eval_env is not None:
            self._eval_env.close()
            self._eval_env = None
        super().stop()
