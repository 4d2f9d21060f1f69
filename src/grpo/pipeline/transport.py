"""What travels between a trainer and a rollout worker, over torch.distributed point to point.

Each worker and its trainer share a private two-member gloo group (the trainer is rank 0), made
from a TCP store the trainer opens on a free local port: no service to install, and a worker
that dies breaks its own group only. Three streams, each in order:

    weights   trainer -> worker   a version number, then the trained parameters in buckets
    parts     worker -> trainer   one step's share of groups, as pickled bytes
    control   trainer -> worker   where to start, and when to stop

Every receive waits at most `timeout` seconds; a transfer that times out or whose peer went away
raises an error that names the peer, the tensor and the step.
"""

from __future__ import annotations

import datetime
import pickle

import torch

WEIGHTS, PARTS, CONTROL = 0, 1, 2          # gloo tags of the three streams
BUCKET_BYTES = 32 << 20                    # weights travel in buckets of at most 32 MiB
# A worker waiting for the trainer's next version waits as long as the trainer lives (a step, an
# evaluation or a checkpoint may take long; the worker dies with the trainer): a day.
TRAINER_PATIENCE_S = 86400.0


class PipelineError(RuntimeError):
    """The pipeline cannot go on; the message names the worker or the transfer, the step and what
    to change. The command ends the run with it in one line (exit status 2)."""


class TransferTimeout(PipelineError):
    """A transfer did not finish within transfer_timeout_s."""


class PeerLost(PipelineError):
    """The process at the other end closed its connection (it died or was killed)."""


def trained_parameters(model) -> list[torch.Tensor]:
    """The parameters an update changes, in a fixed order: with LoRA the adapter alone."""
    return [p for p in model.parameters() if p.requires_grad]


def buckets(params: list[torch.Tensor], limit: int = BUCKET_BYTES) -> list[list[int]]:
    """Parameter indices grouped into buckets of one dtype and at most `limit` bytes each (a
    larger parameter is a bucket of its own). Both ends compute the same buckets from the same
    model, so no layout travels."""
    out: list[list[int]] = []
    size, dtype = 0, None
    for i, p in enumerate(params):
        nbytes = p.numel() * p.element_size()
        if not out or p.dtype != dtype or size + nbytes > limit:
            out.append([])
            size, dtype = 0, p.dtype
        out[-1].append(i)
        size += nbytes
    return out


def snapshot(model) -> list[torch.Tensor]:
    """The trained parameters as flat CPU buckets: one version, kept while a worker may need it."""
    params = trained_parameters(model)
    with torch.no_grad():
        return [torch.cat([params[i].detach().reshape(-1).cpu() for i in bucket])
                for bucket in buckets(params)]


def load_snapshot(model, flat: list[torch.Tensor]) -> None:
    """Copy a snapshot's buckets into the model's trained parameters."""
    params = trained_parameters(model)
    with torch.no_grad():
        for bucket, values in zip(buckets(params), flat):
            offset = 0
            for i in bucket:
                n = params[i].numel()
                params[i].copy_(values[offset:offset + n].view_as(params[i]))
                offset += n


class Channel:
    """One trainer-worker pair. `peer` names the other end in errors ("rollout worker 1")."""

    def __init__(self, group, peer_rank: int, peer: str, timeout_s: float):
        self.group, self.peer_rank, self.peer = group, peer_rank, peer
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.timeout_s = timeout_s
        self.pending: list[tuple[object, object]] = []   # (work, buffer): sends in flight

    def _failed(self, error: RuntimeError, what: str, timeout_s: float | None = None) -> RuntimeError:
        text = str(error)
        if "Timed out" in text or "timed out" in text:
            return TransferTimeout(
                f"{what} from {self.peer}: nothing arrived within {timeout_s or self.timeout_s:g} s "
                "(transfer_timeout_s); the peer is stuck or the machine is overloaded")
        reason = next((r for r in ("Connection reset by peer", "Connection closed by peer", "Broken pipe")
                       if r in text), text.splitlines()[0][:160] if text else "no reason given")
        return PeerLost(f"{what}: {self.peer} closed the connection ({reason.lower()})")

    def send(self, tensor: torch.Tensor, tag: int) -> None:
        """Start sending; the tensor is kept alive until the send is known to have finished."""
        try:
            work = self.group.send([tensor], self.peer_rank, tag)
        except RuntimeError as e:   # the peer is already gone
            raise self._failed(e, f"sending to {self.peer}") from None
        self.pending.append((work, tensor))

    def recv(self, tensor: torch.Tensor, tag: int, what: str, timeout_s: float | None = None) -> None:
        timeout = self.timeout if timeout_s is None else datetime.timedelta(seconds=timeout_s)
        try:
            self.group.recv([tensor], self.peer_rank, tag).wait(timeout)
        except RuntimeError as e:
            raise self._failed(e, what, timeout_s) from None

    def flush(self, what: str = "a send") -> None:
        """Wait for every send in flight (their buffers may then be freed)."""
        pending, self.pending = self.pending, []
        for work, _ in pending:
            try:
                work.wait(self.timeout)
            except RuntimeError as e:
                raise self._failed(e, what) from None

    def reap(self) -> None:
        """Forget the sends that have finished."""
        self.pending = [(w, t) for w, t in self.pending if not w.is_completed()]

    # objects: a length, then the pickled bytes

    def send_object(self, obj, tag: int) -> None:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        self.send(torch.tensor([len(data)], dtype=torch.int64), tag)
        self.send(torch.frombuffer(bytearray(data), dtype=torch.uint8), tag)
        self.reap()

    def recv_object(self, tag: int, what: str):
        size = torch.zeros(1, dtype=torch.int64)
        self.recv(size, tag, what)
        data = torch.empty(int(size.item()), dtype=torch.uint8)
        self.recv(data, tag, f"{what} ({int(size.item())} bytes)")
        return pickle.loads(data.numpy().tobytes())

    # weights: the version, then the buckets

    def send_weights(self, version: int, flat: list[torch.Tensor]) -> None:
        self.send(torch.tensor([version, len(flat)], dtype=torch.int64), WEIGHTS)
        for bucket in flat:
            self.send(bucket, WEIGHTS)
        self.reap()

    def recv_weights(self, model) -> int:
        """Receive one version into the model's trained parameters; returns its number."""
        header = torch.zeros(2, dtype=torch.int64)
        self.recv(header, WEIGHTS, "the next weight version", TRAINER_PATIENCE_S)
        version, n = int(header[0]), int(header[1])
        params = trained_parameters(model)
        names = [name for name, p in model.named_parameters() if p.requires_grad]
        layout = buckets(params)
        if n != len(layout):
            raise RuntimeError(f"weights of version {version} from {self.peer} came in {n} buckets, "
                               f"this model has {len(layout)}: the two ends hold different models")
        flat = []
        for k, bucket in enumerate(layout):
            numel = sum(params[i].numel() for i in bucket)
            values = torch.empty(numel, dtype=params[bucket[0]].dtype)
            first, last = names[bucket[0]], names[bucket[-1]]
            span = first if first == last else f"{first} .. {last}"
            self.recv(values, WEIGHTS, f"weights of version {version}, bucket {k + 1}/{n} ({span})")
            flat.append(values)
        load_snapshot(model, flat)
        return version
