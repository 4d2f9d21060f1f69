"""A rollout worker: it samples and scores its share of each step's groups, from the weight
version the schedule names, and sends them to its trainer.

    for step s = start, start + 1, ...:
        wait for version v(s) = max(0, s - 1 - k)      (receive weights until it has arrived)
        sample and score this worker's share of step s's groups, with step s's draws
        send them, tagged with v(s) on every token, with the data position after s

The worker is a fork of the trainer made when the run starts (it inherits the data, the reward
functions, the tokenizer and the model, and loads each version it is sent). A replacement is
forked from a spare process made at the same moment, never from the busy trainer (`Zygote`).
"""

from __future__ import annotations

import ctypes
import datetime
import os
import pickle
import signal
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import torch

from grpo.run.checkpoint import fault_point
from grpo.data import PromptStream
from grpo.run.distributed import World
from grpo.pipeline.transport import CONTROL, PARTS, Channel, PipelineError
from grpo.rewards import faults

HOST = "127.0.0.1"


def version_for(step: int, k: int) -> int:
    """The weight version whose samples step `step` trains on: the weights after step - 1 - k
    (k = async_steps; before step 1 there is version 0, the starting weights)."""
    return max(0, step - 1 - k)


@dataclass
class Work:
    """What every worker of a run needs, inherited through fork (nothing here is pickled)."""
    policy: torch.nn.Module
    rows: list[dict]                    # the training prompts, for this worker's PromptStream
    seed: int
    steps: int                          # the run's last step
    k: int                              # async_steps
    make_sampler: Callable              # model -> sampler
    sample: Callable                    # (sampler, stream, step, share) -> (rollout, extra, timer)
    pad_token_id: int
    threads: int                        # torch threads per worker
    timeout_s: float
    draw: Callable | None = None        # (sampler, stream, step, share) -> rollout, not scored;
    score: Callable | None = None       # with these two a step is scored while the next is drawn
    floor: int = 0                      # the oldest version there is: a run resumed from a
                                        # checkpoint of its last k steps and extended has none older

    def version_of(self, step: int) -> int:
        """The version step `step` samples from: the schedule's (version_for), or the oldest
        there is where the schedule's is older (the first steps after an extension)."""
        return max(self.floor, version_for(step, self.k))


def tag(rollout, version: int) -> None:
    """Every token the rollout holds was drawn by `version`; padding is -1."""
    rollout.versions = torch.where(rollout.real_mask.bool(), version, -1).long()


@dataclass
class Part:
    """One worker's share of one step's groups, as it reaches the trainer and as a checkpoint
    keeps it (pipeline.pt's queued steps)."""
    step: int
    version: int                       # the weights that drew every token
    rollout: object                    # a Rollout, scored once `scored` has run
    stream: dict                       # the worker's data position after this step
    sample_s: float                    # drawing, in the worker
    reward_s: float = 0.0              # scoring, in the worker
    extra: dict = field(default_factory=dict)   # the worker's metrics, summed over workers
    faults: dict = field(default_factory=dict)  # why built-in rewards scored 0, counted
    work: tuple = (0.0, 0.0)           # wall clock: drawing began, scoring ended
    wait: tuple = (0.0, 0.0)           # wall clock: the wait for this step's weights

    @classmethod
    def of(cls, part) -> "Part":
        """`part` itself, or a Part from the dict a checkpoint of an older grpo holds."""
        if isinstance(part, cls):
            return part
        return cls(step=part["step"], version=part["version"], rollout=part["rollout"],
                   stream=part["stream"], sample_s=part["timer"]["sample"],
                   reward_s=part["timer"]["reward"], extra=part["extra"],
                   faults=part.get("faults", {}), work=tuple(part["work"]),
                   wait=tuple(part.get("wait", part["work"])))


@dataclass(frozen=True)
class Failed:
    """What a worker sends instead of a Part when it fails: the trainer raises `error`."""
    error: BaseException
    trace: str


def part_of(work: Work, sampler, stream: PromptStream, step: int, version: int,
            share: World) -> Part:
    """This worker's share of step `step`'s groups, scored, every token tagged with `version`."""
    started = time.time()
    with faults.counting() as counts:
        rollout, extra, timer = work.sample(sampler, stream, step, share)
    tag(rollout, version)
    return Part(step, version, rollout, stream.state_dict(), timer["sample"], timer["reward"],
                extra, counts.metrics(), (started, time.time()))


def drawn_part(work: Work, sampler, stream: PromptStream, step: int, version: int,
               share: World) -> Part:
    """The same share, sampled but not yet scored (`scored` finishes it)."""
    started = time.time()
    with faults.counting() as counts:     # what drawing counts (a tool's, an environment's)
        rollout = work.draw(sampler, stream, step, share)
    tag(rollout, version)
    sampled = time.time()
    return Part(step, version, rollout, stream.state_dict(), sampled - started,
                faults=counts.metrics(), work=(started, sampled))


def scored(work: Work, part: Part) -> Part:
    """Score a drawn part (in the worker's scoring thread, while the next step is drawn)."""
    started = time.time()
    with faults.counting() as counts:
        work.score(part.rollout)
    part.reward_s = time.time() - started
    for key, n in counts.metrics().items():       # added to what drawing counted
        part.faults[key] = part.faults.get(key, 0) + n
    part.work = (part.work[0], time.time())
    return part


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when its parent exits, so no worker outlives its run."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def serve(work: Work, index: int, generation: int, port: int, share: World) -> None:
    """The worker process's whole life (it never returns: os._exit)."""
    for sig in (signal.SIGINT, signal.SIGTERM):   # the trainer finishes its step and stops us
        signal.signal(sig, signal.SIG_IGN)
    _die_with_parent()
    if generation:   # a replacement is not killed again by the test hook that killed the first
        os.environ.pop("GRPO_FAULT_KILL_AT", None)
    torch.set_num_threads(work.threads)
    import torch.distributed as dist
    timeout = datetime.timedelta(seconds=work.timeout_s)
    store = dist.TCPStore(HOST, port, is_master=False, timeout=timeout)
    group = dist.ProcessGroupGloo(dist.PrefixStore(f"worker{index}.{generation}", store), 1, 2, timeout)
    channel = Channel(group, 0, "the trainer", work.timeout_s)
    code = 0
    try:
        start = channel.recv_object(CONTROL, "the start message")
        stream = PromptStream(work.rows, work.seed)
        stream.load_state_dict(start["stream"])
        model = work.policy
        sampler = work.make_sampler(model)
        version = -1
        # Scoring (sandboxed tests, a reward server, a verifier) runs in one thread of its own
        # while the next step is drawn: it is what the schedule lets overlap inside a worker.
        scorer = ThreadPoolExecutor(1, "scorer") if work.draw is not None else None
        scoring = []
        for step in range(start["step"], work.steps + 1):
            need = work.version_of(step)
            waited = time.time()
            while version < need:
                version = channel.recv_weights(model)
            if version != need:
                raise RuntimeError(f"step {step} needs weight version {need}, the trainer sent {version}")
            sampler.sync(model)   # an engine of its own (vLLM) takes the version's weights
            fault_point("rollout")
            for done in [f for f in scoring if f.done()]:
                done.result()   # a scoring thread's error stops the worker here
                scoring.remove(done)
            if scorer is None:
                part = part_of(work, sampler, stream, step, version, share)
                part.wait = (waited, part.work[0])
                channel.send_object(part, PARTS)
                continue
            part = drawn_part(work, sampler, stream, step, version, share)
            part.wait = (waited, part.work[0])
            scoring.append(scorer.submit(_score_and_send, work, channel, part))
        for f in scoring:
            f.result()
        channel.recv_object(CONTROL, "the stop message")   # the trainer has every part
    except BaseException as e:   # noqa: BLE001 - the trainer reports it; we only pass it on
        code = 1
        try:
            channel.send_object(Failed(_portable(e), traceback.format_exc()), PARTS)
            channel.recv_object(CONTROL, "the stop message")
        except BaseException:   # noqa: BLE001 - the trainer is gone too
            pass
    try:
        channel.flush()
    finally:
        os._exit(code)


def _score_and_send(work: Work, channel: Channel, part: Part) -> None:
    """The scoring thread's job: score the part and send it, or send what went wrong (the main
    thread may be waiting for weights that only come once the trainer has this part)."""
    try:
        part = scored(work, part)
    except BaseException as e:   # noqa: BLE001 - passed on to the trainer, which raises it
        part = Failed(_portable(e), traceback.format_exc())
    channel.send_object(part, PARTS)


def _portable(e: BaseException) -> BaseException:
    """The exception itself when it survives pickling, else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:   # noqa: BLE001
        return RuntimeError(f"{type(e).__name__}: {e}")


class Zygote:
    """A spare fork of the trainer, made before training starts, that forks rollout workers on
    request: the first ones and any replacement, each from the same clean state."""

    def __init__(self, work: Work, shares: list[World]):
        to_child, self._send = os.pipe()
        self._recv, from_child = os.pipe()
        pid = os.fork()
        if pid == 0:   # the spare
            os.close(self._send)
            os.close(self._recv)
            self._serve(work, shares, to_child, from_child)
        os.close(to_child)
        os.close(from_child)
        self.pid = pid

    @staticmethod
    def _serve(work: Work, shares: list[World], inbox: int, outbox: int) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        _die_with_parent()
        code = 0
        try:
            with os.fdopen(inbox, "r") as requests, os.fdopen(outbox, "w") as replies:
                for line in requests:
                    index, generation, port = (int(x) for x in line.split())
                    child = os.fork()
                    if child == 0:
                        requests.close()
                        replies.close()
                        serve(work, index, generation, port, shares[index])
                    replies.write(f"{child}\n")
                    replies.flush()
                    _reap()
        except BaseException:   # noqa: BLE001
            code = 1
        os._exit(code)

    def start(self, index: int, generation: int, port: int) -> int:
        """Fork worker `index`; returns its process id."""
        reply = b""
        try:
            os.write(self._send, f"{index} {generation} {port}\n".encode())
            while not reply.endswith(b"\n"):
                chunk = os.read(self._recv, 64)
                if not chunk:
                    raise EOFError("it closed its pipe")
                reply += chunk
        except (OSError, EOFError) as e:   # BrokenPipeError when it was killed
            reason = (e.strerror or str(e)) if isinstance(e, OSError) else str(e)
            raise PipelineError(
                f"rollout worker {index} cannot be started: the spare process that starts rollout "
                f"workers (pid {self.pid}) has exited ({reason.lower()}); the run cannot go on "
                "without it: run the command again (resume=auto continues from the last "
                "checkpoint)") from None
        return int(reply)

    def close(self) -> None:
        for fd in (self._send, self._recv):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _reap() -> None:
    """Collect the workers that have exited (the spare is their parent)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
