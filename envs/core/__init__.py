"""The bottom of raylab.envs, shared by every task:

- :mod:`~raylab.envs.core.backend`: ``BatchedMujoco``, N MuJoCo envs stepped on T threads;
- :mod:`~raylab.envs.core.managers`: the term tables (observations, rewards, terminations,
  commands, events) and their managers;
- :mod:`~raylab.envs.core.vec_env`: ``BatchedVecEnv``, the Gymnasium vector env every task
  subclasses (seeding, action checks, autoreset modes, info modes, ``pop_log``).
"""
