"""The batched MuJoCo backend: N envs of one model stepped on T threads of one process.

- One ``MjModel`` copy per env, so domain randomisation writes stay private to that env.
- One persistent ``MjData`` per env: the constraint solver's warm start carries over from one
  control step to the next exactly as in a single env stepped on its own.
- A fixed pool: env i always runs on thread ``i mod T`` (thread 0 is the caller). Each env's
  physics is a function of its own model, data and inputs only, so the thread count never
  changes a bit.
- ``mujoco.mj_step`` and ``mujoco.mj_forward`` release the GIL, so the threads overlap the
  physics; the little Python between calls (writing ctrl, copying sensordata out) is short.
- Per control step and env: write ctrl, optionally add a velocity kick, ``mj_step(m, d, n)``,
  evaluate every sensor on the post-step state, copy ``d.sensordata`` into row i of a
  preallocated (N, nsensordata) array.
- The post-step evaluation is ``mj_forward(m, d)`` unless every sensor of the model reads only
  positions, velocities and actuator forces (:data:`SENSOR_PASS_TYPES`). Then it is the
  :func:`sensor_pass`: the forward stages those sensors read, without collision detection and
  the constraint solver, in about a third of ``mj_forward``'s time. It writes bit-identical
  sensordata (the equality contract runs it against the reference env's ``mj_forward``), and
  ``mj_forward`` after ``mj_step`` does not change the trajectory either way: the next
  ``mj_step`` recomputes every stage and neither touches the solver's warm start.

``mujoco.rollout`` is deliberately not used: it does not carry the solver warm start across
calls, so it differs from a persistent-MjData loop in the last bits.
"""

from __future__ import annotations

import copy
import os
import threading
from typing import Callable, List, Optional

import mujoco
import numpy as np

MAX_THREADS = 8

# Sensor types whose values depend only on the stages :func:`sensor_pass` runs.
_T = mujoco.mjtSensor
SENSOR_PASS_TYPES = frozenset(
    int(t)
    for t in (
        _T.mjSENS_JOINTPOS,
        _T.mjSENS_JOINTVEL,
        _T.mjSENS_ACTUATORPOS,
        _T.mjSENS_ACTUATORVEL,
        _T.mjSENS_ACTUATORFRC,
        _T.mjSENS_FRAMEPOS,
        _T.mjSENS_FRAMEQUAT,
        _T.mjSENS_FRAMEXAXIS,
        _T.mjSENS_FRAMEYAXIS,
        _T.mjSENS_FRAMEZAXIS,
        _T.mjSENS_FRAMELINVEL,
        _T.mjSENS_FRAMEANGVEL,
        _T.mjSENS_GYRO,
        _T.mjSENS_VELOCIMETER,
    )
)


def sensor_pass_applies(model: mujoco.MjModel) -> bool:
    """Whether :func:`sensor_pass` evaluates every sensor of ``model`` exactly."""
    return model.nsensor > 0 and all(int(t) in SENSOR_PASS_TYPES for t in model.sensor_type)


def sensor_pass(m: mujoco.MjModel, d: mujoco.MjData) -> None:
    """The forward stages that position, velocity and actuator-force sensors read: kinematics,
    centre-of-mass frames, tendons, transmissions, velocities, actuator forces, then the three
    sensor stages. No collision detection, no constraint solve."""
    mujoco.mj_kinematics(m, d)
    mujoco.mj_comPos(m, d)
    mujoco.mj_tendon(m, d)
    mujoco.mj_transmission(m, d)
    mujoco.mj_sensorPos(m, d)
    mujoco.mj_fwdVelocity(m, d)
    mujoco.mj_sensorVel(m, d)
    mujoco.mj_fwdActuation(m, d)
    mujoco.mj_sensorAcc(m, d)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def thread_limit() -> int:
    """The default cap on physics threads: 8, or fewer when the machine has fewer cores."""
    return min(MAX_THREADS, os.cpu_count() or 1)


def check_num_threads(num_threads, allow_overcommit: bool = False) -> int:
    """Validate a thread count; above the limit only with ``allow_overcommit=True``.
    ``"auto"``: the limit itself (every core this machine has, up to 8). Results never depend
    on the thread count (env i always runs on thread i mod T)."""
    if num_threads == "auto":
        return thread_limit()
    if isinstance(num_threads, bool) or not isinstance(num_threads, (int, np.integer)):
        raise ValueError(f"num_threads must be an integer, got {num_threads!r}")
    num_threads = int(num_threads)
    if num_threads < 1:
        raise ValueError(f"num_threads={num_threads} is invalid; it must be at least 1")
    limit = thread_limit()
    if num_threads > limit and not allow_overcommit:
        raise ValueError(
            f"num_threads={num_threads} is above the limit of {limit} "
            f"(min({MAX_THREADS}, os.cpu_count()={os.cpu_count()})); "
            f"pass allow_overcommit=True to run more threads anyway"
        )
    return num_threads


def name_os_thread(name: str) -> None:
    """Name the calling thread for the OS too (Linux: ``/proc/<pid>/task/<tid>/comm``, at most
    15 bytes), so that tools outside the process (``top -H``, ``benchmarks/cpu_account.py``) can
    tell its CPU time apart. Elsewhere, nothing."""
    import ctypes

    try:
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


class BackendWorkerError(RuntimeError):
    """The physics backend failed on one of its worker threads (the error it raised is the
    cause); raylab names this class in a run's failure (``backend_worker_failure``)."""


class WorkerPool:
    """T-1 persistent worker threads plus the calling thread; ``run(task)`` calls ``task(k)``
    on thread k for k = 0..T-1 (k = 0 is the caller) and returns when all are done."""

    def __init__(self, num_threads: int):
        self.num_threads = num_threads
        self._task: Optional[Callable[[int], None]] = None
        self._go = [threading.Semaphore(0) for _ in range(num_threads - 1)]
        self._done = threading.Semaphore(0)
        self._errors: List[BaseException] = []
        self._closed = False
        self._threads = [
            threading.Thread(target=self._loop, args=(k,), name=f"raylab-physics-{k}", daemon=True)
            for k in range(1, num_threads)
        ]
        for t in self._threads:
            t.start()

    def _loop(self, k: int) -> None:
        name_os_thread(f"physics-{k}")
        go = self._go[k - 1]
        while True:
            go.acquire()
            task = self._task
            if task is None:
                self._done.release()
                return
            try:
                task(k)
            except BaseException as e:  # re-raised in the caller
                self._errors.append((k, e))
            finally:
                self._done.release()

    def run(self, task: Callable[[int], None]) -> None:
        if self._closed:
            raise RuntimeError("the physics worker pool is closed")
        self._task = task
        for go in self._go:
            go.release()
        try:
            task(0)
        except Exception as e:
            self._errors.insert(0, (0, e))
        finally:
            for _ in self._go:
                self._done.acquire()
            self._task = None
        if self._errors:
            k, err = self._errors[0]
            self._errors.clear()
            if not isinstance(err, Exception):  # KeyboardInterrupt, SystemExit: as they are
                raise err
            raise BackendWorkerError(
                f"physics worker {k} failed: {type(err).__name__}: {err}"
            ) from err

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._task = None
        for go in self._go:
            go.release()
        for t in self._threads:
            t.join(timeout=5.0)


class BatchedMujoco:
    """N copies of ``prototype`` with persistent MjData, stepped on a fixed thread pool.

    After every :meth:`step` / :meth:`reset_env`, row i of :attr:`sensordata` holds env i's
    ``d.sensordata`` evaluated on its current state.
    """

    def __init__(
        self,
        prototype: mujoco.MjModel,
        num_envs: int,
        num_threads: int = 1,
        nsubsteps: int = 10,
        allow_overcommit: bool = False,
        kick_dofs: Optional[slice] = None,
        debug_fail_after_steps: int = 0,
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs={num_envs} is invalid; it must be at least 1")
        self.num_envs = int(num_envs)
        self.num_threads = check_num_threads(num_threads, allow_overcommit)
        self.nsubsteps = int(nsubsteps)
        self.prototype = prototype
        # Test only: the last worker thread raises from this step on (0: never).
        self._fail_after = int(debug_fail_after_steps)
        self._steps = 0
        self.models = [copy.copy(prototype) for _ in range(self.num_envs)]
        self.datas = [mujoco.MjData(m) for m in self.models]
        # Persistent numpy views into each MjData (they alias its buffers).
        self._ctrl = [d.ctrl for d in self.datas]
        self._qvel = [d.qvel for d in self.datas]
        self._sensordata = [d.sensordata for d in self.datas]
        # How step() evaluates the sensors after the physics (see the module docstring).
        self.post_step = sensor_pass if sensor_pass_applies(prototype) else mujoco.mj_forward
        self.sensordata = np.zeros((self.num_envs, prototype.nsensordata))
        self.kick_dofs = kick_dofs if kick_dofs is not None else slice(0, 0)
        # Thread k owns envs k, k + T, k + 2T, ...; threads beyond N would have nothing to do.
        self._pool = WorkerPool(min(self.num_threads, self.num_envs))
        self._owned = owned_envs(self.num_envs, self.num_threads)
        # Inputs of the step being run (read by the workers).
        self._in_ctrl: np.ndarray = np.zeros((self.num_envs, prototype.nu))
        self._in_active: np.ndarray = np.ones(self.num_envs, dtype=bool)
        self._in_kick_mask: np.ndarray = np.zeros(self.num_envs, dtype=bool)
        self._in_kick: np.ndarray = np.zeros((self.num_envs, 0))

    def diagnostics(self) -> dict:
        """A snapshot of how this backend runs (the runtime manifest's backend_diagnostics)."""
        m = self.prototype
        return {
            "backend": "mujoco",
            "mujoco_version": mujoco.__version__,
            "device": None,  # CPU MuJoCo: no accelerator binding
            "num_envs": self.num_envs,
            "num_threads": self.num_threads,
            "pool_threads": min(self.num_threads, self.num_envs),
            "nsubsteps": self.nsubsteps,
            "timestep": float(m.opt.timestep),
            "integrator": int(m.opt.integrator),
            "solver": int(m.opt.solver),
            "solver_iterations": int(m.opt.iterations),
            "nq": int(m.nq),
            "nv": int(m.nv),
            "nu": int(m.nu),
            "post_step": "sensor_pass" if self.post_step is sensor_pass else "mj_forward",
        }

    # -- reset -----------------------------------------------------------------------------

    def reset_env(
        self, i: int, key_id: int, qpos: np.ndarray, qvel: np.ndarray, ctrl: np.ndarray
    ) -> None:
        """Keyframe reset of env i, then the given state, one ``mj_forward``, sensordata out.

        Runs on the calling thread; the model must already hold this episode's parameters.
        """
        m, d = self.models[i], self.datas[i]
        mujoco.mj_resetDataKeyframe(m, d, key_id)
        d.qpos[:] = qpos
        d.qvel[:] = qvel
        d.ctrl[:] = ctrl
        mujoco.mj_forward(m, d)
        self.sensordata[i] = self._sensordata[i]

    # -- step ------------------------------------------------------------------------------

    def step(
        self,
        ctrl: np.ndarray,
        active: np.ndarray,
        kick_mask: Optional[np.ndarray] = None,
        kick: Optional[np.ndarray] = None,
    ) -> None:
        """One control step of every active env: ctrl, optional qvel kick on ``kick_dofs``,
        ``nsubsteps`` x ``mj_step``, :attr:`post_step`, sensordata into :attr:`sensordata`."""
        self._in_ctrl = ctrl
        self._in_active = active
        if kick_mask is None:
            self._in_kick_mask = np.zeros(self.num_envs, dtype=bool)
        else:
            self._in_kick_mask = kick_mask
            self._in_kick = kick
        self._steps += 1
        self._pool.run(self._step_owned)

    def _step_owned(self, k: int) -> None:
        models, datas, nsub = self.models, self.datas, self.nsubsteps
        ctrl, active, kick_mask, kick = (
            self._in_ctrl,
            self._in_active,
            self._in_kick_mask,
            self._in_kick,
        )
        kd = self.kick_dofs
        out = self.sensordata
        post_step = self.post_step
        if self._fail_after and self._steps >= self._fail_after and k == len(self._owned) - 1:
            raise RuntimeError(
                f"injected physics failure (env.debug_fail_backend_after_steps={self._fail_after})"
            )
        for i in self._owned[k]:
            if not active[i]:
                continue
            self._ctrl[i][:] = ctrl[i]
            if kick_mask[i]:
                self._qvel[i][kd] += kick[i]
            mujoco.mj_step(models[i], datas[i], nsub)
            post_step(models[i], datas[i])
            out[i] = self._sensordata[i]

    def bare_step(self, ctrl: Optional[np.ndarray] = None) -> None:
        """Physics alone, for benchmarks: ``nsubsteps`` x ``mj_step`` of every env on the same
        threads. With ``ctrl`` (N, nu), each env's controls are set first, so the physics sees the
        same kind of inputs as under a policy (a 14-float copy per env, nothing else)."""
        self._in_ctrl = ctrl
        self._pool.run(self._bare_owned)

    def _bare_owned(self, k: int) -> None:
        models, datas, nsub, ctrl = self.models, self.datas, self.nsubsteps, self._in_ctrl
        for i in self._owned[k]:
            if ctrl is not None:
                self._ctrl[i][:] = ctrl[i]
            mujoco.mj_step(models[i], datas[i], nsub)

    def close(self) -> None:
        self._pool.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def model_bytes(model: mujoco.MjModel) -> bytes:
    """The model's complete binary image (``mj_saveModel``), for byte-for-byte comparisons."""
    buf = np.zeros(mujoco.mj_sizeModel(model), dtype=np.uint8)
    mujoco.mj_saveModel(model, None, buf)
    return buf.tobytes()


def owned_envs(num_envs: int, num_threads: int) -> List[List[int]]:
    """The fixed assignment: thread k runs envs k, k + T, k + 2T, ... (env i on thread i mod T)."""
    t = min(num_threads, num_envs)
    return [list(range(k, num_envs, t)) for k in range(t)]
