"""raylab.envs: MuJoCo tasks, the batched MuJoCo backend and Gymnasium registration.

``core/`` holds what every task shares (the batched backend, the term managers, the vector-env
base, option parsing); ``tasks/`` the task table (names, Gymnasium ids and entry points, typed
options, per-algorithm defaults) and one module per task family. Importing this package
registers every task of the table with Gymnasium under the ``raylab/`` namespace; environment
code is imported lazily by Gymnasium's entry points. Nothing here imports Ray or the rest of
raylab.
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


def register(spec) -> None:
    """Add a task (a :class:`~raylab.envs.tasks.TaskSpec`) to raylab's task table and register
    its Gymnasium id: ``--task <name>`` and ``gymnasium.make_vec(<id>)`` then find it. The
    shipped tasks are registered on import; a task of your own, at import of its module (see
    docs/envs.md, "Adding a task")."""
    import gymnasium as gym

    from raylab.envs.tasks import register_task

    register_task(spec)
    if spec.gym_id not in gym.registry:
        gym.register(
            id=spec.gym_id, entry_point=spec.entry_point, vector_entry_point=spec.vector_entry_point
        )


def _register() -> None:
    import gymnasium as gym

    from raylab.envs.tasks import TASKS

    for spec in list(TASKS.values()):
        register(spec)
    if PROBE_ID not in gym.registry:
        gym.register(id=PROBE_ID, entry_point="raylab.envs.probe:CountingEpisodesEnv")


# A probe env for pipeline tests (raylab.envs.probe); not a task.
PROBE_ID = "raylab/CountingEpisodes-v0"


_register()
