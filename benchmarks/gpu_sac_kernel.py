"""SAC update kernel and device replay on a GPU, without Ray (for a machine that lacks Ray).

Loads algorithms/sac/update.py and algorithms/sac/replay.py by path and checks, on CUDA:
the replay ring (pinned, non-blocking ingress; sampling), that torch.compile gives the same
parameters as eager mode for the same seed, that bf16 autocast trains to finite values close to
fp32, and the updates/s of each variant for a Pendulum-sized and a Microduck-sized problem.

    python benchmarks/gpu_sac_kernel.py OUT.json
"""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


K = load("sac_update", ROOT / "algorithms" / "sac" / "update.py")
R = load("replay", ROOT / "algorithms" / "sac" / "replay.py")


def parts(obs_dim, act_dim, hidden, device, seed=0, fused=True):
    torch.manual_seed(seed)
    pi = K.mlp(obs_dim, hidden, 2 * act_dim).to(device)
    qf = K.mlp(obs_dim + act_dim, hidden, 1).to(device)
    qf_twin = K.mlp(obs_dim + act_dim, hidden, 1).to(device)
    tq, tq2 = copy.deepcopy(qf), copy.deepcopy(qf_twin)
    log_alpha = torch.zeros(1, device=device, requires_grad=True)
    kw = {"fused": True} if (fused and device.type == "cuda") else {"foreach": True}
    opts = [
        torch.optim.Adam(
            list(qf.parameters()) + list(qf_twin.parameters()), lr=3e-4, eps=1e-7, **kw
        ),
        torch.optim.Adam(pi.parameters(), lr=3e-4, eps=1e-7, **kw),
        torch.optim.Adam([log_alpha], lr=3e-4, eps=1e-7, **kw),
    ]
    return K.SACParts(pi, qf, qf_twin, tq, tq2, log_alpha, opts)


def replay_with_data(obs_dim, act_dim, batch, device, n=20000):
    rng = np.random.default_rng(0)
    r = R.DeviceReplay(100_000, obs_dim, act_dim, batch, device)
    data = {
        "obs": rng.normal(size=(n, obs_dim)).astype(np.float32),
        "actions": rng.uniform(-1, 1, size=(n, act_dim)).astype(np.float32),
        "rewards": rng.normal(size=n).astype(np.float32),
        "next_obs": rng.normal(size=(n, obs_dim)).astype(np.float32),
        "terminateds": (rng.uniform(size=n) < 0.01).astype(np.float32),
    }
    t0 = time.perf_counter()
    r.add(data)
    torch.cuda.synchronize() if device.type == "cuda" else None
    return r, data, time.perf_counter() - t0


def rate(step_fn, replay, n=300, warm=30):
    for _ in range(warm):
        step_fn(replay.sample())
    if replay.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step_fn(replay.sample())
    if replay.device.type == "cuda":
        torch.cuda.synchronize()
    return n / (time.perf_counter() - t0)


def main(out_path: str) -> None:
    dev = torch.device("cuda")
    out = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "checks": {},
        "rates": [],
    }

    # 1. Replay ring on the GPU: contents survive the pinned, non-blocking copies.
    r, data, secs = replay_with_data(48, 14, 256, dev)
    ok = torch.equal(r.storage["obs"][:20000].cpu(), torch.from_numpy(data["obs"]))
    b = r.sample()
    out["checks"]["replay_roundtrip_equal"] = bool(ok)
    out["checks"]["replay_ingress_20k_ms"] = secs * 1000
    out["checks"]["replay_sample_on_device"] = str(b["obs"].device)

    # 2. torch.compile == eager for the same seed (fp32).
    kw = dict(gamma=0.99, tau=0.005, target_entropy=-14.0, grad_clip=1.0)
    eager, comp = parts(48, 14, [256, 256], dev), parts(48, 14, [256, 256], dev)
    compiled_update = torch.compile(K.sac_update)
    fixed = {k: v.clone() for k, v in r.sample().items()}
    for _ in range(5):
        torch.manual_seed(1)
        K.sac_update(eager, fixed, **kw)
        torch.manual_seed(1)
        compiled_update(comp, fixed, **kw)
    diff = max(
        (a - c).abs().max().item() for a, c in zip(eager.pi.parameters(), comp.pi.parameters())
    )
    out["checks"]["compile_vs_eager_max_abs_param_diff"] = diff
    # 3. bf16 autocast: finite and close to fp32 after a few steps.
    bf = parts(48, 14, [256, 256], dev)
    ref = parts(48, 14, [256, 256], dev)
    for _ in range(5):
        torch.manual_seed(2)
        s_bf = K.sac_update(bf, fixed, bf16=True, **kw)
        torch.manual_seed(2)
        s_ref = K.sac_update(ref, fixed, **kw)
    out["checks"]["bf16_losses_finite"] = all(torch.isfinite(v).all().item() for v in s_bf.values())
    out["checks"]["bf16_vs_fp32_critic_loss"] = [s_bf["critic"].item(), s_ref["critic"].item()]

    # 4. Updates per second.
    for label, obs_dim, act_dim, batch in (
        ("pendulum", 3, 1, 256),
        ("microduck", 48, 14, 256),
        ("microduck_b4096", 48, 14, 4096),
    ):
        rp, _, _ = replay_with_data(obs_dim, act_dim, batch, dev)
        te = -float(act_dim)
        for variant in ("eager", "bf16", "compile"):
            p = parts(obs_dim, act_dim, [256, 256], dev)
            fn = compiled_update if variant == "compile" else K.sac_update

            def step(bb, p=p, fn=fn, v=variant, te=te):
                return fn(
                    p,
                    bb,
                    gamma=0.99,
                    tau=0.005,
                    target_entropy=te,
                    grad_clip=1.0,
                    bf16=(v == "bf16"),
                )

            out["rates"].append(
                {
                    "problem": label,
                    "batch": batch,
                    "variant": variant,
                    "updates_per_s": rate(step, rp),
                }
            )
            print(out["rates"][-1], flush=True)
    # CPU reference on this machine (1 thread, foreach Adam).
    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    rp, _, _ = replay_with_data(3, 1, 256, cpu)
    p = parts(3, 1, [256, 256], cpu)
    out["rates"].append(
        {
            "problem": "pendulum",
            "batch": 256,
            "variant": "cpu_1_thread",
            "updates_per_s": rate(
                lambda bb: K.sac_update(
                    p, bb, target_entropy=-1.0, gamma=0.99, tau=0.005, grad_clip=1.0
                ),
                rp,
                n=100,
            ),
        }
    )
    Path(out_path).write_text(json.dumps(out, indent=2))
    print(json.dumps(out["checks"], indent=2))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gpu_sac_kernel.json")
