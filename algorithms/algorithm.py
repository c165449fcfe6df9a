"""raylab's Algorithm classes: RLlib's PPO / APPO (and raylab's SAC) plus two things a run needs
across reports and restarts.

- **The reward window.** ``Train/mean_reward`` and ``Train/mean_episode_length`` are means over
  the latest ``training.reward_window`` completed episodes of all EnvRunners
  (``metrics_num_episodes_for_smoothing`` in RLlib's config). RLlib 2.60 clears its episode
  statistics on every reduce, so every EnvRunner ships each finished episode's (return, length)
  as an ``item_series`` (:data:`EPISODES_KEY`, see ``RaylabEnvRunner._log_episode_metrics``),
  and the algorithm keeps the window. It is part of the algorithm's checkpoint state, so it
  survives ``raylab train --resume``.
- **Evaluation.** RLlib's own evaluation machinery runs it (``evaluation_interval``,
  ``evaluation_duration``, an evaluation EnvRunner group of
  :class:`~raylab.algorithms.env_runner.RaylabEvalEnvRunner`); ``training.eval_before_train``
  adds one evaluation of the initial policy before the first update, reported with the first
  result. The best evaluation score is kept in the checkpoint state too, and a result that
  improves it asks Tune for a checkpoint (``should_checkpoint``), which the driver keeps as the
  run's ``best`` checkpoint.
- **Evaluation beside training** (``training.eval_background``, the default). The algorithm runs
  each periodic evaluation on a thread of its own process at idle priority (Linux
  ``SCHED_IDLE``, also for the evaluation env's physics threads, which that thread starts), on
  the weights the Learner had when it started, while the iterations go on: the evaluation takes
  the cores only when training leaves them idle, so it costs training little, and its results
  come with the first result after it ends (one evaluation at a time: one that falls due while
  another runs starts after it). An evaluation still running when the run stops is dropped.
  The initial policy's evaluation (``eval_before_train``) stays before the first update, so that
  its tags are written at env step 0 ahead of every other.
- **The evaluated weights.** APPO's and SAC's Learners keep updating while the evaluation runs
  (their learner threads work through the batches already queued), so the Learner's weights in
  a checkpoint written after an evaluation are a few updates past the ones evaluated. A
  checkpoint of an iteration that evaluated also holds the evaluation EnvRunner's module, the
  policy that earned the score (:data:`EVALUATED_MODULE_DIR`); the run's ``best`` copy puts it
  in the Learner's place (``raylab.reporting.keep_best_checkpoint``), so ``raylab eval`` of
  ``best`` replays the evaluation's score exactly.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Tuple

import numpy as np
from ray.rllib.algorithms.appo import APPO
from ray.rllib.algorithms.ppo import PPO
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, EVALUATION_RESULTS

from raylab.algorithms.env_errors import EnvErrorPolicy
from raylab.metrics import schema as S
from raylab.metrics import trace
from raylab.quiet import quiet_actor

EPISODES_KEY = "raylab_episodes"  # per-episode (return, length) items from every EnvRunner
STATE_KEY = "raylab"  # the algorithm state raylab adds to RLlib's checkpoint
EVAL_BEFORE_TRAIN_KEY = "raylab_eval_before_train"  # evaluation results of the initial policy
BEST_EVAL_KEY = "raylab_best_eval"  # {"score", "iteration"} of the best evaluation so far
EPISODE_LOG_KEY = "raylab_episode_log"  # [[return, length], ...] of this iteration
# In a checkpoint of an iteration that evaluated: the evaluation EnvRunner's RLModule (the
# weights the evaluation ran), saved with RLModule.save_to_path.
EVALUATED_MODULE_DIR = "raylab_evaluated_module"
# Where an Algorithm checkpoint keeps the Learner's RLModule (what `raylab eval` loads).
LEARNER_MODULE_DIR = Path("learner_group") / "learner" / "rl_module" / "default_policy"


class RewardWindow:
    """The latest ``size`` completed episodes' returns and lengths."""

    def __init__(self, size: int, items: Iterable[Tuple[float, float]] = ()):
        self.items: deque = deque(((float(r), float(n)) for r, n in items), maxlen=int(size))

    def extend(self, items: Iterable[Tuple[float, float]]) -> None:
        self.items.extend((float(r), float(n)) for r, n in items)

    def means(self) -> Optional[Tuple[float, float]]:
        """(mean return, mean length) over the window; None before the first episode."""
        if not self.items:
            return None
        arr = np.asarray(self.items, dtype=np.float64)
        return float(arr[:, 0].mean()), float(arr[:, 1].mean())


def idle_priority() -> bool:
    """Put the calling thread (and the threads it starts from now on) at idle priority: Linux's
    ``SCHED_IDLE``, else the lowest nice value. False where neither is allowed."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return True
    except (AttributeError, OSError):
        pass
    try:
        os.nice(19)  # per thread on Linux
        return True
    except OSError:
        return False


class BackgroundEvaluation:
    """One evaluation on the algorithm's local evaluation EnvRunner, on a thread at idle
    priority (``training.eval_background``)."""

    JOIN_S = 30.0  # how long stop() waits for a cancelled evaluation's thread

    def __init__(self, runner, episodes: int):
        self.runner, self.episodes = runner, int(episodes)
        self.cancel = threading.Event()
        self.metrics = None  # the runner's metrics once the episodes are done
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, name="raylab-evaluation", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from raylab.algorithms.env_runner import EvaluationCancelled

        idle_priority()
        trace.name_thread("evaluation beside training")
        try:
            self.runner.evaluate_episodes(self.episodes, cancel=self.cancel)
            self.metrics = self.runner.get_metrics()
        except EvaluationCancelled:
            pass
        except BaseException as e:  # re-raised on the algorithm's thread
            self.error = e

    def done(self) -> bool:
        return not self.thread.is_alive()

    def stop(self) -> None:
        self.cancel.set()
        self.thread.join(self.JOIN_S)


class RaylabAlgorithmMixin(EnvErrorPolicy):
    """Reward window, evaluation before training and the best evaluation, for any of raylab's
    algorithms (put it before the RLlib Algorithm class); deterministic env errors stop the run
    (:class:`~raylab.algorithms.env_errors.EnvErrorPolicy`)."""

    @property
    def reward_window(self) -> RewardWindow:
        window = self.__dict__.get("_reward_window")
        if window is None:
            window = self._reward_window = RewardWindow(
                self.config.metrics_num_episodes_for_smoothing
            )
        return window

    @property
    def best_eval(self) -> Optional[Dict[str, float]]:
        return self.__dict__.get("_best_eval")

    def setup(self, config) -> None:
        quiet_actor()  # raylab.quiet, also in a Ray job's workers (no raylab setup hook there)
        # This process drives the iterations; its trace (before super().setup, which builds a
        # local EnvRunner / Learner that trace into the same file).
        settings = (
            config.get(trace.CONFIG_ATTR)
            if isinstance(config, dict)
            else trace.settings_from(config)
        )
        trace.configure(settings, "algorithm", "Algorithm (driver loop)")
        trace.name_thread("iterations (driver timeline)")
        super().setup(config)

    def cleanup(self) -> None:
        # Tune stops a finished trial's algorithm (this), then Ray ends its process, possibly
        # before the interpreter's exit handlers run: close this process's trace file here, as
        # the EnvRunners do in stop(), so a healthy run leaves every trace a closed JSON array.
        # An evaluation beside training stops first (it steps the evaluation EnvRunner's env).
        try:
            running = self.__dict__.pop("_background_eval", None)
            if running is not None:
                running.stop()
            super().cleanup()
        finally:
            trace.shutdown()

    def training_step(self):
        with trace.span("Training Step", "driver"):
            out = super().training_step()
        self.note_in_flight()
        self.cut_iteration_on_stop()
        return out

    def cut_iteration_on_stop(self) -> None:
        """After a Ctrl-C / SIGTERM the iteration ends at this training step (each ends with a
        learner update) instead of running more of them to fill ``min_time_s_per_iteration``
        (``training.iteration_s``): RLlib reads the minimum from the config before every further
        training step, so it is set to zero here (the config is frozen, hence
        ``object.__setattr__``; a stopping run is never trained further from this object)."""
        if self.config.min_time_s_per_iteration and self.stop_requested():
            for key in (
                "min_time_s_per_iteration",
                "min_sample_timesteps_per_iteration",
                "min_train_timesteps_per_iteration",
            ):
                object.__setattr__(self.config, key, 0)

    # -- sample requests in flight (the runtime manifest's inference_flight) ----------------
    # Each EnvRunner runs its own policy inference, so a sample request in flight is the
    # collectors' inference flight. The tag of the algorithm's asynchronous sample requests
    # (None: it samples synchronously, one request per healthy EnvRunner during each call).
    _sample_tag: Optional[str] = None

    def note_in_flight(self) -> None:
        """Count the sample requests in flight (called after every training step)."""
        group = getattr(self, "env_runner_group", None)
        if group is None:
            return
        if self._sample_tag is None:
            now, peak = 0, int(group.num_healthy_remote_env_runners())
        else:
            now = peak = int(group.num_in_flight_async_reqs(tag=self._sample_tag))
        self._flight_now = now
        self._flight_max = max(getattr(self, "_flight_max", 0), peak)

    def flight_report(self) -> Dict[str, int]:
        """In flight now, the most since the previous report (then reset), and the limit."""
        now = int(getattr(self, "_flight_now", 0))
        report = {
            "in_flight": now,
            "max_in_flight": int(max(getattr(self, "_flight_max", 0), now)),
            "limit": self.in_flight_limit(),
        }
        self._flight_max = now
        return report

    def in_flight_limit(self) -> int:
        """Sample requests allowed in flight at once: RLlib's per-EnvRunner limit for
        asynchronous sampling, one per EnvRunner for synchronous sampling."""
        group = getattr(self, "env_runner_group", None)
        runners = group.num_remote_env_runners() if group is not None else 0
        if self._sample_tag is None:
            return runners
        return int(self.config.max_requests_in_flight_per_env_runner) * runners

    # -- the window and the best evaluation, per result ------------------------------------
    def update_progress(self, result: Dict[str, Any]) -> None:
        """Write the window means and the evaluation tags into ``result`` (called from the
        ``on_train_result`` callback, before Tune's stopper and scheduler see the result)."""
        runners = result.get(ENV_RUNNER_RESULTS, {})
        items = runners.pop(EPISODES_KEY, None) if isinstance(runners, dict) else None
        if isinstance(items, tuple):  # RLlib hands a lone item over unwrapped
            items = [items]
        episodes = []
        if isinstance(items, list):
            episodes = [i for i in items if isinstance(i, tuple) and len(i) == 2]
            self.reward_window.extend(episodes)
        if getattr(self.config, "raylab_episode_log", False):  # for the driver's episodes.csv
            result[EPISODE_LOG_KEY] = [[float(r), int(n)] for r, n in episodes]
        means = self.reward_window.means()
        # NaN until the first episode completes: the driver omits non-finite values.
        mean_return, mean_length = means if means is not None else (float("nan"),) * 2
        result[S.TRAIN_MEAN_REWARD] = mean_return
        result[S.TRAIN_MEAN_EPISODE_LENGTH] = mean_length

        # RLlib carries the last evaluation's results into every later result: keep only an
        # evaluation that ended in this iteration.
        if not self.__dict__.get("_evaluated_this_step"):
            result.pop(EVALUATION_RESULTS, None)
        # The best evaluation of a trained policy (the initial policy's, before training, is no
        # checkpoint's): a new best asks Tune to checkpoint this iteration.
        score = eval_tags(result.get(EVALUATION_RESULTS)).get(S.EVAL_MEAN_REWARD)
        if score is not None:  # a sweep's scheduler may rank trials by it (raylab.sweep)
            result[S.EVAL_MEAN_REWARD] = score
        best = self.best_eval
        if score is not None and (best is None or score > best["score"]):
            self._best_eval = {"score": score, "iteration": int(self.iteration)}
            result["should_checkpoint"] = True
        if self.best_eval is not None:
            result[BEST_EVAL_KEY] = dict(self.best_eval)

    # -- evaluation of the initial policy, evaluation beside training ----------------------
    def step(self):
        before = None
        if self.iteration == 0 and getattr(self.config, "raylab_eval_before_train", False):
            before = self.evaluate()  # the evaluation results themselves
            # Reported on their own, not again inside the first iteration's "evaluation".
            self.metrics.delete(EVALUATION_RESULTS, key_error=False)
        self._evaluated_this_step = False  # set by an evaluation inside the step
        if getattr(self.config, "raylab_eval_background", False):
            result = self._step_beside_evaluation()
        else:
            with trace.span("Algorithm Step", "driver"):
                result = super().step()
        if before is not None:
            result[EVAL_BEFORE_TRAIN_KEY] = before
        return result

    def evaluate(self, *args, **kwargs):
        out = super().evaluate(*args, **kwargs)
        self._evaluated_this_step = True
        return out

    def _step_beside_evaluation(self):
        """One iteration with the periodic evaluations on their own thread
        (:class:`BackgroundEvaluation`): collect one that ended, else start one that is due,
        then train."""
        ended = self._collect_background_eval()
        every = int(getattr(self.config, "raylab_eval_every", 0))
        # A new one never starts in the iteration that reports the last: the checkpoint of
        # that iteration saves the evaluated module.
        if ended is None and every > 0 and self.__dict__.get("_background_eval") is None:
            due = self.__dict__.get("_next_eval")
            if due is None:  # (also after a restore)
                due = self._next_eval = (self.iteration // every + 1) * every
            if self.iteration >= due:
                self._start_background_eval()
                self._next_eval = self.iteration + every
        with trace.span("Algorithm Step", "driver"):
            result = super().step()
        if ended is not None:
            result[EVALUATION_RESULTS] = ended
            self._evaluated_this_step = True  # its module goes into this checkpoint
        return result

    def _start_background_eval(self) -> None:
        # The weights the Learner has now, as RLlib's evaluate() syncs them.
        self.eval_env_runner_group.sync_weights(
            from_worker_or_learner_group=self.learner_group, inference_only=True
        )
        self._background_eval = BackgroundEvaluation(
            self.eval_env_runner, int(self.config.evaluation_duration)
        )

    def _collect_background_eval(self) -> Optional[Dict[str, Any]]:
        """RLlib's evaluation results of an evaluation that ended, else None."""
        running = self.__dict__.get("_background_eval")
        if running is None or not running.done():
            return None
        self._background_eval = None
        if running.error is not None:
            raise running.error
        # As RLlib's evaluate() turns the evaluation EnvRunner's metrics into its results.
        self.metrics.aggregate([running.metrics], key=(EVALUATION_RESULTS, ENV_RUNNER_RESULTS))
        evaluation = self.metrics.peek(EVALUATION_RESULTS, default={}, latest_merged_only=True)
        self.metrics.delete(EVALUATION_RESULTS, key_error=False)
        return evaluation

    # -- checkpoint state ------------------------------------------------------------------
    def save_checkpoint(self, checkpoint_dir: str) -> None:
        super().save_checkpoint(checkpoint_dir)
        runner = self.eval_env_runner if self.__dict__.get("_evaluated_this_step") else None
        module = getattr(runner, "module", None)
        if module is not None:
            module.save_to_path(str(Path(checkpoint_dir) / EVALUATED_MODULE_DIR))

    def get_state(self, *args, **kwargs) -> Dict[str, Any]:
        state = super().get_state(*args, **kwargs)
        state[STATE_KEY] = {
            "reward_window": list(self.reward_window.items),
            "best_eval": self.best_eval,
        }
        return state

    def set_state(self, state: Dict[str, Any]) -> None:
        super().set_state(state)
        ours = state.get(STATE_KEY)
        if ours:
            size = self.config.metrics_num_episodes_for_smoothing
            self._reward_window = RewardWindow(size, ours.get("reward_window", ()))
            self._best_eval = ours.get("best_eval")


def eval_tags(evaluation: Any) -> Dict[str, float]:
    """The canonical ``Eval/*`` tags in an evaluation result (RLlib's ``evaluation`` entry)."""
    from raylab.metrics.timeline import EVAL_TRACKER, pull_final_stats

    if not isinstance(evaluation, dict):
        return {}
    return pull_final_stats(evaluation, ENV_RUNNER_RESULTS, EVAL_TRACKER)


class RaylabPPO(RaylabAlgorithmMixin, PPO):
    """RLlib's PPO with raylab's reward window and evaluation bookkeeping."""


class RaylabAPPO(RaylabAlgorithmMixin, APPO):
    """RLlib's APPO with raylab's reward window and evaluation bookkeeping."""

    _sample_tag = "sample_get_state_and_metrics"  # IMPALA.training_step's request tag
