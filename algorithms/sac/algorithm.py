"""RaylabSAC: the training step that overlaps collection and learning."""

from __future__ import annotations

import time

from ray.rllib.algorithms.sac import SAC
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, LEARNER_RESULTS

from raylab.algorithms.algorithm import RaylabAlgorithmMixin
from raylab.algorithms.sac.config import RaylabSACConfig
from raylab.algorithms.sac.env_runner import SAMPLE_TAG
from raylab.algorithms.sac.learner import owed_updates


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

    _sample_tag = SAMPLE_TAG

    def in_flight_limit(self) -> int:
        # One sample request in flight per EnvRunner (step 3 of training_step).
        group = self.env_runner_group
        return group.num_remote_env_runners() if group is not None else 0

    @classmethod
    def get_default_config(cls) -> RaylabSACConfig:
        return RaylabSACConfig()

    def _fast_state(self) -> dict:
        st = getattr(self, "_raylab", None)
        if st is None:
            # The Learner's counters: not zero after a restore with the replay in the
            # checkpoint (no random warm-up again, updates owed as before).
            (status,) = self._learner_call(lambda learner: learner.status())[:1]
            st = self._raylab = {
                "status": status,
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

        self.note_in_flight()
        self.cut_iteration_on_stop()

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
