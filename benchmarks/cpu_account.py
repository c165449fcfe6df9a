"""Where the CPU seconds of a training run go, per env step.

    python benchmarks/cpu_account.py [--algo appo] [--task microduck_balance] [--seconds 300]
        [--skip 60] [--out benchmarks/results/cpu_account_appo.json]
        [--plot benchmarks/plots/cpu_account_appo.png] [KEY=VALUE ...]

Runs ``raylab train`` (its defaults, the local Ray it starts itself, tracing
on) and, once a second, reads the CPU time of every thread of every process of the run from
``/proc`` (the driver and all its descendants: Ray's own processes and every actor) and of the
whole machine. Over a steady window (from ``--skip`` seconds after the first report to the last
report) the CPU seconds are split into:

- **physics**: the physics worker threads of the EnvRunners (named ``physics-k``) plus the
  EnvRunner main thread's own share of the envs inside Backend Step;
- **env Python**: the rest of Env Step on the EnvRunner main thread (actions in, state out,
  resets), from its trace;
- **policy forward**: MLP Infer on the main thread, from its trace;
- **EnvRunner loop**: the rest of the main thread (fragments, episodes, metrics, weights in);
- **Ray threads** of each actor (the native threads Ray names: RPC, object transfers);
- **learner**: the Learner process's Python and torch threads;
- **algorithm actor** (which also runs the evaluation: its env's physics worker threads are a
  row of their own, the rest of an evaluation is in this row), **driver and Tune**, **Ray system
  processes** (GCS, raylet, dashboard, agents), **idle Ray workers**;
- **other processes** on the machine, and **idle**: cores x wall not used by anything.

Each is reported as CPU seconds per 1,000 env steps and as a share of the machine (cores x
wall). Saved as JSON with the command, the machine and its load; a PNG bar when ``--plot`` is
given.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")

# Account rows, in the order they are printed and stacked.
ROWS = [
    ("physics", "physics (EnvRunner physics threads + Backend Step)"),
    ("env_python", "env Python (Env Step less Backend Step)"),
    ("policy_forward", "policy forward (MLP Infer)"),
    ("env_runner_loop", "EnvRunner loop (rest of its main thread)"),
    ("env_runner_ray", "EnvRunner Ray threads"),
    ("learner", "learner (Python + torch threads)"),
    ("learner_ray", "learner Ray threads"),
    ("algorithm", "algorithm actor"),
    ("eval_env_runner", "evaluation's physics threads"),
    ("driver", "driver and Tune"),
    ("ray_system", "Ray system processes"),
    ("ray_idle_workers", "idle Ray workers"),
    ("other_ray", "other Ray workers"),
    ("other_processes", "other processes on the machine"),
    ("idle", "idle"),
]
SYSTEM = ("gcs_server", "raylet", "dashboard", "log_monitor", "monitor.py", "runtime_env", "agent")


def role(pid: int, cmdline: str, driver_pid: int) -> str:
    """The part of the run a process is, from its Ray process title."""
    if pid == driver_pid:
        return "driver"
    if cmdline.startswith("ray::"):
        title = cmdline.split()[0]
        if "EnvRunner" in title and "StateServer" not in title:
            return "eval_env_runner" if "Eval" in title else "env_runner"
        if "Learner" in title or "_WrappedExecutable" in title or "TrainWorker" in title:
            return "learner"
        if "Raylab" in title or "ImplicitFunc" in title:
            return "algorithm"
        if "Agent" in title:  # Ray's dashboard and runtime-env agents
            return "ray_system"
        if "IDLE" in title:
            return "ray_idle_workers"
        return "other_ray"
    if any(s in cmdline for s in SYSTEM):
        return "ray_system"
    return "driver"  # the driver's own helpers (e.g. its Tune / terminal subprocesses)


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _cpu_s(stat: str) -> float:
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def descendants(root: int) -> List[int]:
    children = defaultdict(list)
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _read(f"/proc/{name}/stat")
            if stat:
                ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
                children[ppid].append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def snapshot(driver_pid: int, roles: Dict[int, str], titles: Dict[int, str]) -> Dict:
    """CPU seconds of every thread of the run's processes, and of the whole machine."""
    threads: Dict[Tuple[int, int], Tuple[str, str, float]] = {}
    for pid in descendants(driver_pid):
        # Read every time: a Ray worker's title changes from its command line to ray::<Class>
        # once it holds an actor (and to ray::IDLE when it holds none).
        raw = _read(f"/proc/{pid}/cmdline")
        if raw is None:
            continue
        title = raw.replace("\0", " ").strip()
        roles[pid] = role(pid, title, driver_pid)
        titles[pid] = title.split()[0] if title.startswith("ray::") else title[:80]
        proc_comm = (_read(f"/proc/{pid}/comm") or "").strip()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            stat = _read(f"/proc/{pid}/task/{tid}/stat")
            comm = (_read(f"/proc/{pid}/task/{tid}/comm") or "").strip()
            if stat is None:
                continue
            if int(tid) == pid:
                kind = "main"
            elif comm.startswith("physics-"):
                kind = "physics"
            elif comm == proc_comm:
                kind = "python"  # a thread of the process's own code (Python, torch, OpenMP)
            else:
                kind = "ray"  # a native thread Ray named (RPC, object transfer, ...)
            threads[(pid, int(tid))] = (roles[pid], kind, _cpu_s(stat))
    cpu = _read("/proc/stat").splitlines()[0].split()[1:]
    busy = sum(int(x) for i, x in enumerate(cpu) if i not in (3, 4)) / TICK  # less idle, iowait
    return {"t": time.time(), "threads": threads, "machine_busy_s": busy}


def trace_wall(trace_dir: Path, t0: float, t1: float) -> Dict[int, Dict[str, float]]:
    """Wall seconds per EnvRunner process and phase label, of the events inside [t0, t1]."""
    from raylab.metrics.trace_merge import load_events

    out: Dict[int, Dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for path in sorted(trace_dir.glob("env_runner-*.trace.json")):
        for ev in load_events(path):
            if ev.get("ph") == "X" and t0 * 1e6 <= ev["ts"] <= t1 * 1e6:
                out[int(ev["pid"])][ev["name"]] += ev["dur"] / 1e6
    return out


def processes(a: Dict, b: Dict, titles: Dict[int, str]) -> List[Dict]:
    """Every process of the run in the window: pid, title, role and CPU seconds."""
    out: Dict[int, Dict] = {}
    for key, (rl, _, end) in b["threads"].items():
        start = a["threads"][key][2] if key in a["threads"] else 0.0
        row = out.setdefault(key[0], {"pid": key[0], "title": titles.get(key[0], "?"), "role": rl})
        row["cpu_s"] = round(row.get("cpu_s", 0.0) + max(0.0, end - start), 2)
    return sorted(out.values(), key=lambda r: -r["cpu_s"])


def nearest(snaps: List[Dict], t: float) -> Dict:
    return min(snaps, key=lambda s: abs(s["t"] - t))


def account(a: Dict, b: Dict, walls: Dict[int, Dict[str, float]]) -> Dict[str, float]:
    """CPU seconds per account row between snapshots ``a`` and ``b``.

    An EnvRunner's main thread is split with its trace: MLP Infer and Env Step less Backend Step
    run on it without waiting (their wall time is its CPU time); in Backend Step it steps its
    own share of the envs (env i runs on thread i mod T, so an equal share: the mean of its T-1
    physics threads' CPU) and waits for the others; the rest is the EnvRunner loop."""
    cpu: Dict[str, float] = defaultdict(float)
    runner: Dict[int, Dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for key, (rl, kind, end) in b["threads"].items():
        # a thread born inside the window (a restarted actor): all its CPU is in the window
        start = a["threads"][key][2] if key in a["threads"] else 0.0
        delta = max(0.0, end - start)
        if rl == "env_runner":
            runner[key[0]][kind] += delta
            runner[key[0]]["n_physics"] += kind == "physics"
        elif rl == "learner":
            cpu["learner_ray" if kind == "ray" else "learner"] += delta
        elif rl == "algorithm" and kind == "physics":
            cpu["eval_env_runner"] += delta  # the evaluation env's threads (in this actor)
        else:
            cpu[rl] += delta
    for pid, r in runner.items():
        wall = walls.get(pid, {})
        infer, step = wall.get("MLP Infer", 0.0), wall.get("Env Step", 0.0)
        backend = wall.get("Backend Step", 0.0)
        if r["n_physics"]:
            own_physics = r["physics"] / r["n_physics"]
        else:
            own_physics = backend  # one thread: Backend Step is all physics
        main = r["main"] + r["python"]
        cpu["physics"] += r["physics"] + own_physics
        cpu["policy_forward"] += infer
        cpu["env_python"] += max(0.0, step - backend)
        cpu["env_runner_loop"] += max(0.0, main - infer - (step - backend) - own_physics)
        cpu["env_runner_ray"] += r["ray"]
    return dict(cpu)


def main(argv=None) -> int:
    from raylab.bench.common import command_line, machine_check, machine_info

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algo", default="appo", choices=["appo", "ppo", "sac"])
    p.add_argument("--task", default="microduck_balance")
    p.add_argument("--seconds", type=float, default=300.0, help="the run's time budget")
    p.add_argument("--skip", type=float, default=60.0, help="seconds after the first report")
    p.add_argument("--out", type=Path, default=None, help="write the JSON here")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG bar here")
    p.add_argument("--keep", type=Path, default=None, help="keep the run directory here")
    p.add_argument("overrides", nargs="*", help="raylab KEY=VALUE overrides for the run")
    args = p.parse_args(argv)
    if args.skip >= args.seconds:
        print(
            f"cpu_account: --skip={args.skip} must be below --seconds={args.seconds}",
            file=sys.stderr,
        )
        return 2
    command = command_line("benchmarks/cpu_account.py", sys.argv[1:] if argv is None else argv)
    print(command)
    check = machine_check(threads_needed=os.cpu_count() or 1)
    tmp = None
    if args.keep is None:
        tmp = tempfile.TemporaryDirectory(prefix="cpu_account_")
    run_dir = (args.keep or Path(tmp.name)) / "run"
    raylab = str(Path(sys.executable).with_name("raylab"))
    cmd = [
        raylab, "train", "--algo", args.algo, "--task", args.task,
        f"training.time_budget_s={args.seconds}", "training.terminal=plain",
        "training.trace_enabled=true",
        "resources.dashboard=false", f"training.log_dir={run_dir}", *args.overrides,
    ]  # fmt: skip
    log_path = run_dir.parent / "train.log"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        roles: Dict[int, str] = {}
        titles: Dict[int, str] = {}
        snaps = []
        while proc.poll() is None:
            snaps.append(snapshot(proc.pid, roles, titles))
            time.sleep(1.0)
    if proc.returncode != 0:
        print(
            f"cpu_account: the run failed (exit {proc.returncode}); its output: {log_path}",
            file=sys.stderr,
        )
        return 1

    from raylab.metrics.extract import extract

    table = extract(run_dir)
    steps = sorted(table.wall_time.items())
    first_t = steps[0][1]
    in_window = [(s, t) for s, t in steps if t >= first_t + args.skip]
    if len(in_window) < 2:
        print("cpu_account: fewer than two reports after --skip; run longer", file=sys.stderr)
        return 1
    (s0, t0), (s1, t1) = in_window[0], in_window[-1]
    a, b = nearest(snaps, t0), nearest(snaps, t1)
    wall = b["t"] - a["t"]
    env_steps = s1 - s0
    walls = trace_wall(run_dir / "traces", a["t"], b["t"])
    cpu = account(a, b, walls)
    cores = os.cpu_count() or 1
    ours = sum(cpu.values())
    cpu["other_processes"] = max(0.0, (b["machine_busy_s"] - a["machine_busy_s"]) - ours)
    cpu["idle"] = max(0.0, cores * wall - ours - cpu["other_processes"])
    per_k = {k: 1000.0 * v / env_steps for k, v in cpu.items()}
    result = {
        "kind": "cpu_account",
        "command": command,
        "train_command": " ".join(cmd[1:]),
        "machine": machine_info(),
        "machine_check": check,
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "cores": cores,
        "window": {
            "wall_s": round(wall, 2),
            "env_steps": env_steps,
            "from_step": s0,
            "to_step": s1,
        },
        "env_steps_per_s": round(env_steps / wall, 1),
        "cpu_s": {k: round(cpu.get(k, 0.0), 3) for k, _ in ROWS},
        "cpu_ms_per_1k_env_steps": {k: round(1000 * per_k.get(k, 0.0), 2) for k, _ in ROWS},
        "share_of_machine": {k: round(cpu.get(k, 0.0) / (cores * wall), 4) for k, _ in ROWS},
        "processes": processes(a, b, titles),
        "env_runner_trace_wall_s": {
            str(pid): {k: round(v, 3) for k, v in sorted(w.items())} for pid, w in walls.items()
        },
    }
    print(
        f"{args.algo} on {args.task}: {result['env_steps_per_s']:,.0f} env steps/s over "
        f"{wall:.0f} s ({env_steps:,} env steps), {cores} cores"
    )
    print(f"{'':52s} {'CPU ms / 1k steps':>18s} {'share':>7s}")
    for key, name in ROWS:
        print(
            f"{name:52s} {result['cpu_ms_per_1k_env_steps'][key]:18.1f} "
            f"{100 * result['share_of_machine'][key]:6.1f}%"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"saved {args.out}")
    if args.plot:
        plot(result, args.plot)
        print(f"saved {args.plot}")
    return 0


def plot(result: Dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shares = result["share_of_machine"]
    names = dict(ROWS)
    keys = [k for k, _ in ROWS if shares.get(k, 0.0) >= 0.002]
    fig, ax = plt.subplots(figsize=(7.5, 0.32 * len(keys) + 1.2))
    y = list(range(len(keys)))[::-1]
    ax.barh(y, [100 * shares[k] for k in keys], color="#4c72b0")
    ax.set_yticks(y, [names[k] for k in keys], fontsize=8)
    ax.set_xlabel("share of the machine's CPU time (cores x wall), %")
    ax.set_title(
        f"where the CPU goes: {result['train_command'].split(' training.')[0]}\n"
        f"{result['env_steps_per_s']:,.0f} env steps/s on {result['cores']} cores",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    sys.exit(main())
