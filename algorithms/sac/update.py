"""The SAC update in plain torch: networks, tanh-Gaussian sampling and one fused step.

No Ray or RLlib here, so the same step runs inside ``RaylabSACLearner`` and in standalone
checks and benchmarks (for example on a GPU machine without Ray). One step trains the twin
critics, the actor and the temperature with a single backward pass: the critic loss reaches
only the critics, the actor loss only the policy (the critics are frozen while it is formed)
and the temperature loss only log(alpha).
"""

from __future__ import annotations

import contextlib
import math
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "silu": nn.SiLU, "elu": nn.ELU}


def mlp(
    inputs: int, hidden: Sequence[int], outputs: int, activation: str = "relu"
) -> nn.Sequential:
    layers, width = [], inputs
    for h in hidden:
        layers += [nn.Linear(width, h), _ACTIVATIONS[activation]()]
        width = h
    layers.append(nn.Linear(width, outputs))
    return nn.Sequential(*layers)


def policy_inputs(
    pi: nn.Module,
    obs: torch.Tensor,
    log_std_min: float = LOG_STD_MIN,
    mean_bound: Optional[float] = None,
) -> torch.Tensor:
    """[mean, log_std] of the Gaussian before tanh, log_std clamped to [log_std_min,
    LOG_STD_MAX]. With ``mean_bound`` the mean is ``bound * tanh(mean / bound)``, a soft bound
    that keeps a gradient: without one, a policy that saturates an action can grow its pre-tanh
    mean without limit, and the tanh's change of variables (about 2|u| per action) with it."""
    mean, log_std = pi(obs.flatten(1)).chunk(2, dim=-1)
    if mean_bound is not None:
        mean = mean_bound * torch.tanh(mean / mean_bound)
    return torch.cat([mean, log_std.clamp(log_std_min, LOG_STD_MAX)], dim=-1)


def q_pair(q1: nn.Module, q2: nn.Module, obs: torch.Tensor, actions: torch.Tensor):
    x = torch.cat([obs.flatten(1), actions], dim=-1)
    return q1(x).squeeze(-1), q2(x).squeeze(-1)


def frozen_forward(net: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """``net(x)`` with its weights detached: the gradient reaches ``x`` but none of the
    weights. Unlike switching ``requires_grad`` off, this changes nothing another thread could
    see while it trains the same weights."""
    for layer in net:
        if isinstance(layer, nn.Linear):
            bias = layer.bias.detach() if layer.bias is not None else None
            x = nn.functional.linear(x, layer.weight.detach(), bias)
        else:
            x = layer(x)
    return x


def squashed_gaussian_sample(
    dist_inputs: torch.Tensor, noise: Optional[torch.Tensor] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Reparameterised tanh-Gaussian sample in [-1, 1] and its log-probability (``noise``: the
    standard normal draw, drawn here when not given)."""
    mean, log_std = dist_inputs.chunk(2, dim=-1)
    if noise is None:
        noise = torch.randn_like(mean)
    pre_tanh = mean + log_std.exp() * noise
    action = torch.tanh(pre_tanh)
    log_prob = (-0.5 * noise.pow(2) - log_std - 0.5 * math.log(2.0 * math.pi)).sum(-1)
    # Change of variables for tanh, in the stable form 2 * (log 2 - u - softplus(-2u)).
    log_prob = log_prob - (
        2.0 * (math.log(2.0) - pre_tanh - nn.functional.softplus(-2.0 * pre_tanh))
    ).sum(-1)
    return action, log_prob


@dataclass
class SACParts:
    """What one SAC step touches."""

    pi: nn.Module
    qf: nn.Module
    qf_twin: nn.Module
    target_qf: nn.Module
    target_qf_twin: nn.Module
    log_alpha: torch.Tensor
    optimizers: List[torch.optim.Optimizer]
    log_std_min: float = LOG_STD_MIN  # the policy's bounds (policy_inputs)
    mean_bound: Optional[float] = None

    def policy(self, obs: torch.Tensor) -> torch.Tensor:
        """The policy's [mean, log_std] for ``obs``, within its bounds."""
        return policy_inputs(self.pi, obs, self.log_std_min, self.mean_bound)

    def __post_init__(self):
        self.action_dim = self.pi[-1].out_features // 2  # the policy outputs mean, log std
        self.critic_params = list(self.qf.parameters()) + list(self.qf_twin.parameters())
        self.target_pairs = [
            (list(self.qf.parameters()), list(self.target_qf.parameters())),
            (list(self.qf_twin.parameters()), list(self.target_qf_twin.parameters())),
        ]


CRITIC_LOSSES = ("huber", "mse")


def critic_half(
    p: SACParts,
    b: Dict[str, torch.Tensor],
    alpha: torch.Tensor,
    noise_next: torch.Tensor,
    *,
    gamma: float,
    critic_loss: str,
) -> torch.Tensor:
    """The twin critics' loss against the soft target: it reaches only the critics."""
    with torch.no_grad():
        next_action, next_logp = squashed_gaussian_sample(p.policy(b["next_obs"]), noise_next)
        tq1, tq2 = q_pair(p.target_qf, p.target_qf_twin, b["next_obs"], next_action)
        next_v = torch.min(tq1, tq2) - alpha * next_logp
        target = b["rewards"] + gamma * (1.0 - b["terminateds"]) * next_v
    q1, q2 = q_pair(p.qf, p.qf_twin, b["obs"], b["actions"])
    # Huber (delta 1) learns like stock RLlib SAC with the same hyperparameters (Pendulum-v1,
    # return -250 after 4,020 env steps against RLlib's 4,200:
    # benchmarks/results/sac_pendulum_sample_efficiency.json).
    if critic_loss == "mse":
        td = nn.functional.mse_loss
        return td(q1.float(), target.float()) + td(q2.float(), target.float())
    huber = nn.functional.huber_loss
    return huber(q1.float(), target.float(), delta=1.0) + huber(
        q2.float(), target.float(), delta=1.0
    )


def actor_half(
    p: SACParts,
    b: Dict[str, torch.Tensor],
    alpha: torch.Tensor,
    noise: torch.Tensor,
    *,
    target_entropy: float,
) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """The actor's loss (through the critics with their weights detached: it reaches only the
    policy) plus the temperature's (only log(alpha)), and their statistics."""
    action, logp = squashed_gaussian_sample(p.policy(b["obs"]), noise)
    x = torch.cat([b["obs"].flatten(1), action], dim=-1)
    pq1 = frozen_forward(p.qf, x).squeeze(-1)
    pq2 = frozen_forward(p.qf_twin, x).squeeze(-1)
    q_pi = torch.min(pq1, pq2).float()
    logp = logp.float()
    actor_loss = (alpha * logp - q_pi).mean()
    alpha_loss = -(p.log_alpha * (logp.detach() + target_entropy)).mean()
    stats = {
        "actor": actor_loss.detach(),
        "alpha": alpha_loss.detach(),
        "q_mean": q_pi.detach().mean(),
        "alpha_value": alpha[0],
        "logp": logp.detach().mean(),
    }
    return actor_loss + alpha_loss, stats


def _noises(p: SACParts, b: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """The step's two standard normal draws, the next actions' first (one generator, one order,
    whichever thread computes which half)."""
    shape = (b["obs"].shape[0], p.action_dim)
    kw = {"device": b["obs"].device, "dtype": b["obs"].dtype}
    return torch.randn(shape, **kw), torch.randn(shape, **kw)


def sac_losses(
    parts: SACParts,
    b: Dict[str, torch.Tensor],
    *,
    gamma: float,
    target_entropy: float,
    critic_loss: str = "huber",
) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """The SAC losses of batch ``b`` (keys obs, actions, rewards, next_obs, terminateds): their
    sum, whose one backward pass trains the critics, the actor and the temperature, and
    detached statistics. ``critic_loss``: ``huber`` (delta 1, RLlib's SAC learner's) or ``mse``
    (the mean squared TD error of the SAC papers and CleanRL)."""
    p = parts
    alpha = p.log_alpha.exp().detach()
    noise_next, noise = _noises(p, b)
    critic = critic_half(p, b, alpha, noise_next, gamma=gamma, critic_loss=critic_loss)
    actor, stats = actor_half(p, b, alpha, noise, target_entropy=target_entropy)
    return critic + actor, {"critic": critic.detach(), **stats}


def sac_update(
    parts: SACParts,
    b: Dict[str, torch.Tensor],
    *,
    gamma: float,
    tau: float,
    target_entropy: float,
    grad_clip: Optional[float] = None,
    bf16: bool = False,
    all_reduce: Optional[Callable[[], None]] = None,
    critic_loss: str = "huber",
    helper: Optional[Executor] = None,
) -> Dict[str, torch.Tensor]:
    """One fused SAC step on batch ``b``: :func:`sac_losses`, one backward pass, the optional
    gradient all-reduce and clip, the optimizer steps, the polyak target update. Returns the
    losses' detached statistics (still on the device).

    ``helper`` (a one-thread executor; CPU, without ``all_reduce`` or ``bf16``): the actor's
    half (:func:`actor_half`, its forward and backward) runs there while the calling thread
    runs the critics' (:func:`critic_half`). The two graphs share no trained weight, torch
    releases the GIL inside its kernels, and both noises are drawn first in the fused step's
    order, so the step computes what the fused one does, on two cores."""
    p = parts
    if helper is not None and all_reduce is None and not bf16:
        alpha = p.log_alpha.exp().detach()
        noise_next, noise = _noises(p, b)
        for opt in p.optimizers:
            opt.zero_grad(set_to_none=True)

        def actor_backward() -> Dict[str, torch.Tensor]:
            loss, half_stats = actor_half(p, b, alpha, noise, target_entropy=target_entropy)
            loss.backward()
            return half_stats

        future = helper.submit(actor_backward)
        try:
            critic = critic_half(p, b, alpha, noise_next, gamma=gamma, critic_loss=critic_loss)
            critic.backward()
        finally:
            actor_stats = future.result()  # no thread touches a gradient after this
        stats = {"critic": critic.detach(), **actor_stats}
    else:
        autocast = (
            torch.autocast("cuda", dtype=torch.bfloat16)
            if bf16 and b["obs"].is_cuda
            else contextlib.nullcontext()
        )
        with autocast:
            total, stats = sac_losses(
                p, b, gamma=gamma, target_entropy=target_entropy, critic_loss=critic_loss
            )
        for opt in p.optimizers:
            opt.zero_grad(set_to_none=True)
        total.backward()
    if all_reduce is not None:
        all_reduce()
    if grad_clip:
        for opt in p.optimizers:
            params = [q for g in opt.param_groups for q in g["params"] if q.grad is not None]
            nn.utils.clip_grad_norm_(params, grad_clip, foreach=True)
    for opt in p.optimizers:
        opt.step()
    with torch.no_grad():
        for main, target_params in p.target_pairs:
            torch._foreach_lerp_(target_params, main, tau)
    return stats
