"""A replay ring of preallocated tensors on the learner's device.

Transitions arrive as batches of arrays (obs, actions, rewards, next_obs, terminateds) and are
written at the insert position with wrap-around; sampling draws uniform indices on the device
and gathers into preallocated output tensors, so a sample allocates nothing and (on a GPU)
never waits for the host.

:meth:`DeviceReplay.get_state` / :meth:`DeviceReplay.from_state` carry a ring through a
checkpoint (``algo.store_buffer_in_checkpoints``): the valid rows, the insert position and the
sampler's random state, so a restored ring samples what the saved one would have.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np
import torch

FIELDS = ("obs", "actions", "rewards", "next_obs", "terminateds")


class DeviceReplay:
    def __init__(
        self,
        capacity: int,
        obs_dim: int,
        action_dim: int,
        batch_size: int,
        device: torch.device,
        seed: int = 0,
    ):
        if capacity < batch_size:
            raise ValueError(
                f"replay capacity {capacity} is smaller than the batch size {batch_size}"
            )
        self.capacity = int(capacity)
        self.batch_size = int(batch_size)
        self.device = device
        shapes = {
            "obs": (obs_dim,),
            "actions": (action_dim,),
            "rewards": (),
            "next_obs": (obs_dim,),
            "terminateds": (),
        }
        self.storage = {
            k: torch.zeros((self.capacity, *s), dtype=torch.float32, device=device)
            for k, s in shapes.items()
        }
        self.out = {
            k: torch.zeros((self.batch_size, *s), dtype=torch.float32, device=device)
            for k, s in shapes.items()
        }
        self.pos = 0  # next insert position
        self.size = 0  # valid transitions
        self.total_added = 0
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(int(seed))
        self._idx = torch.zeros(self.batch_size, dtype=torch.long, device=device)

    def add(self, batch: Dict[str, np.ndarray]) -> int:
        """Insert a batch of transitions (the newest overwrite the oldest when full)."""
        n = int(np.asarray(batch["rewards"]).shape[0])
        if n == 0:
            return 0
        if n > self.capacity:  # keep only what fits: the newest capacity transitions
            batch = {k: np.asarray(v)[-self.capacity :] for k, v in batch.items()}
            n = self.capacity
        first = min(n, self.capacity - self.pos)
        non_blocking = self.device.type == "cuda"
        for key in FIELDS:
            src = torch.from_numpy(np.array(batch[key], dtype=np.float32))  # writable copy
            if non_blocking:
                src = src.pin_memory()
            dst = self.storage[key]
            dst[self.pos : self.pos + first].copy_(src[:first], non_blocking=non_blocking)
            if first < n:
                dst[: n - first].copy_(src[first:], non_blocking=non_blocking)
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)
        self.total_added += n
        return n

    def sample(self, out: Optional[Dict[str, torch.Tensor]] = None) -> Dict[str, torch.Tensor]:
        """A uniform batch, gathered into ``out`` (default: this ring's own output tensors)."""
        if self.size == 0:
            raise RuntimeError("sampling from an empty replay buffer")
        out = self.out if out is None else out
        torch.randint(0, self.size, (self.batch_size,), generator=self.generator, out=self._idx)
        for key in FIELDS:
            torch.index_select(self.storage[key], 0, self._idx, out=out[key])
        return out

    def new_output(self) -> Dict[str, torch.Tensor]:
        """A second set of output tensors (for prefetching the next batch)."""
        return {k: torch.empty_like(v) for k, v in self.out.items()}

    def get_state(self) -> Dict[str, Any]:
        """The ring as host arrays (copies: the ring may be written on after this returns)."""
        n = self.size
        return {
            "capacity": self.capacity,
            "pos": self.pos,
            "size": n,
            "total_added": self.total_added,
            "storage": {k: v[:n].detach().cpu().numpy().copy() for k, v in self.storage.items()},
            "generator": self.generator.get_state().numpy().copy(),
        }

    @classmethod
    def from_state(
        cls, state: Dict[str, Any], batch_size: int, device: torch.device
    ) -> "DeviceReplay":
        """A ring holding what :meth:`get_state` saved (its capacity, rows and sampler state)."""
        storage = state["storage"]
        ring = cls(
            capacity=int(state["capacity"]),
            obs_dim=int(storage["obs"].shape[-1]),
            action_dim=int(storage["actions"].shape[-1]),
            batch_size=batch_size,
            device=device,
        )
        n = int(state["size"])
        for key in FIELDS:
            ring.storage[key][:n].copy_(torch.from_numpy(np.asarray(storage[key])))
        ring.pos, ring.size = int(state["pos"]), n
        ring.total_added = int(state["total_added"])
        ring.generator.set_state(torch.from_numpy(np.asarray(state["generator"])))
        return ring
