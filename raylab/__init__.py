"""raylab: robot reinforcement learning in MuJoCo on Ray."""

import os
import sys

__version__ = "0.1.0"

# MuJoCo picks its OpenGL platform once, when `mujoco` is first imported (and the envs import it
# early). raylab renders only offscreen (`raylab eval --video`), so on Linux it asks for EGL,
# which needs no display, unless MUJOCO_GL says otherwise.
if sys.platform.startswith("linux"):
    os.environ.setdefault("MUJOCO_GL", "egl")

# Ray reads RAY_DEDUP_LOGS_SKIP_REGEX when it is imported (raylab.quiet.skip_ray_lines).
from raylab.quiet import skip_ray_lines  # noqa: E402

skip_ray_lines()
