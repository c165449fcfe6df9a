"""RaylabSACConfig: RLlib's SACConfig plus the settings of raylab's asynchronous device-replay
path."""

from __future__ import annotations

from ray.rllib.algorithms.sac import SACConfig

from raylab.algorithms.sac.env_runner import RaylabSACEnvRunner
from raylab.algorithms.sac.learner import RaylabSACLearner
from raylab.algorithms.sac.module import RaylabSACModule


class RaylabSACConfig(SACConfig):
    """SACConfig plus the settings of raylab's asynchronous device-replay path."""

    def __init__(self, algo_class=None):
        from raylab.algorithms.sac.algorithm import RaylabSAC

        super().__init__(algo_class=algo_class or RaylabSAC)
        self.updates_per_step = 1.0  # gradient updates per ingested env step (replay ratio)
        self.weight_sync_every = 1  # publish weights every N updates
        self.env_steps_per_sync = 1  # vector steps per EnvRunner request
        self.buffer_capacity = 1_000_000
        self.learning_starts = 1000  # env steps (uniform random actions) before updates
        self.torch_compile = False  # GPU only
        self.bf16_autocast = False  # GPU only
        self.critic_loss = "huber"  # or "mse" (raylab.algorithms.sac.update.CRITIC_LOSSES)
        self.reward_scale = 1.0  # rewards enter the replay multiplied by this
        self.learner_torch_threads = 1
        # The replay ring (and the counters that go with it) in the Learner's checkpoint state,
        # the old API stack's key: a restored run then goes on as the saved one would have.
        self.store_buffer_in_checkpoints = False
        # The actor's half of each update on a second thread (None: where the CPU Learner
        # may use 2+ cores; raylab.algorithms.sac.learner.split_update_on).
        self.split_update = None
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
