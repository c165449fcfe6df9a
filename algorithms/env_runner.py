"""raylab's EnvRunner: RLlib's SingleAgentEnvRunner with a readable actor name.

Ray shows an actor's ``repr`` in the dashboard's actor list and in log prefixes, so the
EnvRunners read as ``raylab-envrunner-<index>`` there (index 0 is the local one, if any).
"""

from __future__ import annotations

from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner


class RaylabEnvRunner(SingleAgentEnvRunner):
    def __repr__(self) -> str:
        return f"raylab-envrunner-{getattr(self, 'worker_index', 0)}"
