"""raylab: robot reinforcement learning in MuJoCo on Ray."""

__version__ = "0.1.0"
