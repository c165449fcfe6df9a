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
  temperature step (one backward, fused Adam, foreach polyak), publish weights every
  ``weight_sync_every`` updates. Loss statistics stay on the device until metrics are read.

Canonical learner phases per update: Collector Wait, Replay Batch Wait, Replay Sample,
Learning, Weight Publish (the iteration wall is one update); ingest is a background diagnostic
(``Perf/replay_ingress_h2d_submit_ms``). With several Learners the gradients are all-reduced
once per update (``Perf/dp_gradient_sync_ms_per_rank`` / ``_calls_per_rank``).
"""

from raylab.algorithms.sac.algorithm import RaylabSAC
from raylab.algorithms.sac.config import RaylabSACConfig
from raylab.algorithms.sac.env_runner import RaylabSACEnvRunner
from raylab.algorithms.sac.learner import RaylabSACLearner, owed_updates

__all__ = ["RaylabSAC", "RaylabSACConfig", "RaylabSACEnvRunner", "RaylabSACLearner", "owed_updates"]
