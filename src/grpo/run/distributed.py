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
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    group: object = field(default=None, compare=False, repr=False)
    """The process group its gathers use (None: the default one; the pipeline's engine clients
    have one of their own, away from the trainers' collectives)."""

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

    def part(self, items: int) -> slice:
        """This rank's contiguous part of `items` that need not divide evenly: the first
        `items % size` ranks take one more (a rank may take none). Equal to `rows` when it divides."""
        n, extra = divmod(items, self.size)
        start = self.rank * n + min(self.rank, extra)
        return slice(start, start + n + (self.rank < extra))


def setup(timeout_s: float | None = None) -> World:
    """Join the process group torchrun describes in the environment (each collective waiting at
    most `timeout_s`, torch's default when None); a single process otherwise. Every process
    learns where the others run (`PEERS`), to name them if they are lost."""
    if "WORLD_SIZE" not in os.environ:   # not under torchrun
        return World()
    import datetime

    import torch.distributed as dist
    if not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        wait = {"timeout": datetime.timedelta(seconds=timeout_s)} if timeout_s else {}
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo", **wait)
        global _joined
        _joined = True
        PEERS[:] = [None] * dist.get_world_size()
        dist.all_gather_object(PEERS, where_i_run())
        global COLLECTIVE_TIMEOUT_S
        COLLECTIVE_TIMEOUT_S = timeout_s
    return World(rank=dist.get_rank(), size=dist.get_world_size())


PEERS: list[tuple[str, str]] = []   # (host name, address) of each rank
COLLECTIVE_TIMEOUT_S: float | None = None


def where_i_run() -> tuple[str, str]:
    """This machine's host name, and its address on the way to the rendezvous (MASTER_ADDR): the
    one its peers see, not 127.0.1.1 from its own /etc/hosts."""
    import socket
    host, address = socket.gethostname(), "?"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:   # no packet is sent
            s.connect((os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "1"))))
            address = s.getsockname()[0]
    except OSError:
        pass
    return host, address


def on_this_machine(host: str | None) -> bool:
    """True when `host` names this machine: a loopback address or one of its own (an address a
    socket here can bind). A name that does not resolve counts as this machine's: the connection
    says what is wrong with it."""
    import ipaddress
    import socket
    try:
        found = socket.getaddrinfo(host or "localhost", None, proto=socket.IPPROTO_TCP)
    except OSError:
        return True
    for family, _, _, _, address in found:
        if ipaddress.ip_address(address[0].split("%")[0]).is_loopback:
            return True
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            try:
                s.bind((address[0], 0))
                return True
            except OSError:
                pass
    return False


def lost_peer(error: BaseException) -> str | None:
    """One line for a collective that failed because other processes went away (a peer closed
    its connection: it died; no answer within collective_timeout_s: its machine was cut off,
    stopped or stuck), naming them; None for any other error."""
    import re
    import torch.distributed as dist
    text = str(error)
    from_torch = type(error) is RuntimeError or isinstance(error, getattr(dist, "DistError", ()))
    if not PEERS or not from_torch or not re.search(r"gloo|nccl|NCCL|c10d", text):
        return None
    me = dist.get_rank() if dist.is_initialized() else 0
    peers, timeout_s = PEERS, COLLECTIVE_TIMEOUT_S
    named = lambda r: f"process {r} on {peers[r][0]} ({peers[r][1]})"   # noqa: E731
    closed = re.search(r"(?:Connection closed by peer|Connection reset by peer|Broken pipe)"
                       r"(?: \[([^\]]+)\])?", text)
    if closed:
        by = ([r for r, (_, address) in enumerate(peers) if address == closed.group(1)] if closed.group(1)
              else [r for r in range(len(peers)) if r != me])   # gloo did not say: any other
        who = (named(by[0]) if len(by) == 1 else "one of " + ", ".join(map(named, by)) if by
               else f"a process at {closed.group(1)}")
        what = f"{who} closed its connection: it stopped, or its machine did"
    elif re.search(r"[Tt]imed? ?out|Timeout", text):
        others = ", ".join(named(r) for r in range(len(peers)) if r != me)
        limit = f"{timeout_s:g} s (collective_timeout_s)" if timeout_s else "torch's timeout"
        what = f"no answer from {others} within {limit}: a machine cut off from the network, stopped or stuck"
    else:
        return None
    host = peers[me][0] if me < len(peers) else "?"
    return (f"process {me} on {host} lost its peers: {what}. Every process stops; once all machines "
            "are back, start every process again with resume=auto (the last checkpoint is kept)")


def _device() -> torch.device:
    """Where collectives' tensors live: this rank's GPU under NCCL, else the CPU (gloo)."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


_joined = False   # whether `setup` made the process group (a caller's own group is left to it)


def teardown() -> None:
    """Leave the process group `setup` made, while the interpreter is whole: left to the exit,
    gloo's threads can outlive it and abort the process (SIGABRT, "terminate called without an
    active exception") after a run that succeeded."""
    global _joined
    if not _joined:
        return
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    _joined = False


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
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=_device())
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))


def gather_objects(obj, world: World) -> list:
    """Every rank's `obj`, in rank order, on every rank."""
    if world.size == 1:
        return [obj]
    import torch.distributed as dist
    out = [None] * world.size
    dist.all_gather_object(out, obj, group=world.group)
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


# FSDP2: parameters, gradients and optimizer state sharded over the ranks (`parallel=fsdp`).

def shard(model, world: World, bf16_compute: bool = False):
    """`fully_shard` each decoder layer, then the whole model, over all ranks; `bf16_compute`:
    FSDP2's MixedPrecisionPolicy, bfloat16 parameters in the forward and backward, gradients
    reduced in float32, the sharded master weights float32."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh("cuda" if torch.cuda.is_available() else "cpu", (world.size,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if bf16_compute else MixedPrecisionPolicy()
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    backbone = getattr(inner, inner.base_model_prefix)
    language = getattr(backbone, "language_model", backbone)     # a vision-language model's
    for layer in getattr(language, "layers", []):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    # A vision-language model's features are computed before the root's forward, once per prompt
    # (vision.encoder_outputs): the projector, which trains, is a unit of its own, so that the
    # backward gathers it again; the frozen tower stays in the root's unit, gathered first.
    for name in ("multi_modal_projector", "connector"):
        part = getattr(backbone, name, None)
        if isinstance(part, torch.nn.Module):
            fully_shard(part, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def undo_gradient_mean(params: list[torch.Tensor], world: World) -> None:
    """FSDP2's reduce-scatter averages gradients over ranks; the loss weights are already global,
    so the whole batch's gradient is the sum. (A divide factor of 1 would need PREMUL_SUM, which
    gloo lacks.)"""
    for p in params:
        if p.grad is not None:
            p.grad.mul_(world.size)


def is_sharded(model) -> bool:
    """True for a module `shard` has wrapped."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return isinstance(model, FSDPModule)


@contextmanager
def full_parameters(model):
    """Inside, every rank holds the whole of a sharded model's parameters as plain tensors (one
    all-gather), so sampling and no-gradient passes run without collectives per forward and
    ranks may run different numbers of them. Outside, the shards are back. No-op when not sharded."""
    if model is None or not is_sharded(model):
        yield
        return
    wrapped = [m for m in model.modules() if is_sharded(m)]
    for m in wrapped:
        m.unshard()
    try:
        yield
    finally:
        for m in wrapped:
            m.reshard()


def max_over(value: int, world: World) -> int:
    """The largest `value` over ranks."""
    if world.size == 1:
        return value
    import torch.distributed as dist
    t = torch.tensor([value], dtype=torch.int64, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def full_state_dict(model) -> dict:
    """The whole model's state on CPU, gathered to rank 0 when sharded (other ranks get {});
    a tied weight (an output head that is the embedding) appears once."""
    if not is_sharded(model):
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                     cpu_offload=True))
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    return {k: v for k, v in state.items() if k not in tied or tied[k] not in state}


def initialized() -> bool:
    """True inside a process group (under torchrun, even with one process)."""
    import torch.distributed as dist
    return dist.is_available() and dist.is_initialized()
