"""Many processes under `torchrun`: rank setup, prompt shards, and the reductions GRPO needs.

    torchrun --nproc-per-node 2 -m grpo train prompts_per_step=16 ...

`prompts_per_step` is the global batch. Every rank draws the same prompt order and takes its own
contiguous share of whole groups, samples and scores them, and computes its part of the loss
with weights from the global token counts, so the summed gradient is that of one process with
the whole batch. Gradients are summed with one all-reduce per update; metrics are computed from
all ranks' rows. Only rank 0 writes files. One process (no torchrun) is world size 1 and runs the
same code with every reduction an identity.

gloo on CPUs, NCCL on GPUs (torch.distributed chooses by device).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def share(self, items: list) -> list:
        """This rank's contiguous share of a global list whose length `size` divides."""
        if len(items) % self.size:
            raise ValueError(f"{len(items)} items cannot be split evenly over {self.size} processes")
        n = len(items) // self.size
        return items[self.rank * n:(self.rank + 1) * n]

    def rows(self, global_rows: int) -> slice:
        n = global_rows // self.size
        return slice(self.rank * n, (self.rank + 1) * n)


def setup() -> World:
    """Join the process group torchrun describes in the environment; a single process otherwise."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World()
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return World(rank=dist.get_rank(), size=dist.get_world_size())


def teardown(world: World) -> None:
    if world.size > 1:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()


def broadcast_parameters(model, world: World) -> None:
    """Every rank starts from rank 0's weights."""
    if world.size == 1:
        return
    import torch.distributed as dist
    with torch.no_grad():
        for p in model.parameters():
            dist.broadcast(p.data, src=0)


def sum_gradients(params: list[torch.Tensor], world: World) -> None:
    """Sum each parameter's gradient over ranks (one flat all-reduce). The loss weights are
    global, so the sum, not the mean, is the whole batch's gradient."""
    if world.size == 1:
        return
    import torch.distributed as dist
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = flat[offset:offset + n].view_as(g).clone()
        offset += n


def sum_values(values: dict[str, float], world: World) -> dict[str, float]:
    """Sum each number over ranks."""
    if world.size == 1:
        return dict(values)
    import torch.distributed as dist
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))


def gather_objects(obj, world: World) -> list:
    """Every rank's `obj`, in rank order, on every rank."""
    if world.size == 1:
        return [obj]
    import torch.distributed as dist
    out = [None] * world.size
    dist.all_gather_object(out, obj)
    return out


def gather_rows(x: torch.Tensor, world: World, pad: float = 0.0) -> torch.Tensor:
    """Concatenate each rank's [n, T_rank] rows in rank order, right-padded to the longest T."""
    if world.size == 1:
        return x
    parts = gather_objects(x.cpu(), world)
    width = max(p.shape[1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1]), value=pad) for p in parts])


def barrier(world: World) -> None:
    if world.size > 1:
        import torch.distributed as dist
        dist.barrier()
