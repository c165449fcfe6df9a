"""raylab.envs: MuJoCo tasks, the batched MuJoCo backend and Gymnasium registration.

Importing this package registers every raylab task with Gymnasium under the ``raylab/``
namespace; environment code is imported lazily by Gymnasium's entry points.
"""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"


def asset_path(name: str) -> Path:
    """Path of a shipped MJCF asset (works from a checkout, an editable or a wheel install)."""
    path = ASSETS / name
    if not path.exists():
        raise FileNotFoundError(f"raylab asset {name!r} not found in {ASSETS}")
    return path


def _register() -> None:
    import gymnasium as gym

    from raylab.envs.tasks import TASKS

    for spec in TASKS.values():
        if spec.gym_id in gym.registry:
            continue
        entry = _ENTRY_POINTS.get(spec.name)
        if entry is None:
            continue
        gym.register(id=spec.gym_id, entry_point=entry[0], vector_entry_point=entry[1])
    if PROBE_ID not in gym.registry:
        gym.register(id=PROBE_ID, entry_point="raylab.envs.probe:CountingEpisodesEnv")


# A probe env for pipeline tests (raylab.envs.probe); not a task.
PROBE_ID = "raylab/CountingEpisodes-v0"


# task name -> (single-env entry point, vector entry point); filled as tasks land.
_ENTRY_POINTS: dict = {
    "microduck_balance": (
        "raylab.envs.microduck:MicroduckBalanceEnv",
        "raylab.envs.microduck_vec:MicroduckBalanceVecEnv",
    ),
    "go2_joystick_flat": (
        "raylab.envs.go2:Go2JoystickFlatEnv",
        "raylab.envs.go2:Go2JoystickFlatVecEnv",
    ),
    "microduck_joystick": (
        "raylab.envs.microduck_joystick:MicroduckJoystickEnv",
        "raylab.envs.microduck_joystick:MicroduckJoystickVecEnv",
    ),
}

_register()
