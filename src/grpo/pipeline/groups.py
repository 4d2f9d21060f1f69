"""The trainer's end of the pipeline: step t's groups, and the new weights after it.

    take(t)      the groups of step t: from the queue a checkpoint kept, or each worker's share
                 received and joined in worker order (so N workers give what one gives)
    publish(t)   version t (the weights after step t) to every worker that will need it
    ahead(t)     at a checkpoint: the parts of steps t+1 .. t+k, which only need versions up to
                 t-1, received now and saved with it, so a resumed run re-samples nothing

A worker that dies (its connection closes) is replaced by a fork of the spare process and
restarted at the first step not yet received, from the data position after the one before, with
the same version: it draws what the dead one would have drawn.

Longer than about 400 lines: the trainer's side of both sources of groups, forked workers and
the engine client thread, which share the schedule, the versions kept and the queue.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import queue
import signal
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import torch

from grpo.data import PromptStream
from grpo.run import distributed
from grpo.run.distributed import World
from grpo.run.checkpoint import fault_point
from grpo.pipeline.transport import (CONTROL, PARTS, Channel, PeerLost, PipelineError, snapshot,
                                    trained_parameters)
from grpo.pipeline.worker import (HOST, Failed, Part, Work, Zygote, drawn_part, part_of, scored,
                                  version_for)
from grpo.rollout import concat
from grpo.step import Taken


CONNECT_S = 120.0   # the longest a new rollout worker may take to join its trainer's group


class _Remote:
    """A worker process and its channel."""

    def __init__(self, index: int, generation: int, pid: int, channel: Channel):
        self.index, self.generation, self.pid, self.channel = index, generation, pid, channel
        self.sent = -1   # the last version sent to it

    def send_weights(self, version: int, flat) -> None:
        self.channel.send_weights(version, flat)
        self.sent = version

    def part(self, step: int) -> Part | Failed:
        return self.channel.recv_object(PARTS, f"the groups of step {step}")

    def stop(self) -> None:
        try:
            self.channel.send_object({"stop": True}, CONTROL)
            deadline = time.time() + 2.0
            while time.time() < deadline and _alive(self.pid):
                time.sleep(0.01)
        finally:
            _kill(self.pid)


class _Client:
    """An engine client: a thread of this trainer process (no fork, so a CUDA context and FSDP2
    are fine) that samples and scores this process's share of each step on an engine, in step
    order, from the version the schedule names: vLLM in this process, vLLM servers (`Engines`),
    or, with sampler=hf and rollout_workers=0, grpo's own sampler on a copy of the policy that
    holds the lagged version. Versions arrive with `send_weights`; the parts leave through a
    queue, or the error that stopped the thread does."""

    def __init__(self, work: Work, share: World, model, sampler, *, timeout_s: float,
                 owns_engine: bool = True):
        self.work, self.share, self.model, self.sampler = work, share, model, sampler
        self.owns_engine = owns_engine
        self.timeout_s = timeout_s
        self.versions: dict[int, list] = {}
        self.ready = threading.Condition()
        self.parts: queue.Queue = queue.Queue()
        self.sent, self.pid, self.generation = -1, os.getpid(), 0
        self.closing = False
        self.sync_s = 0.0    # the engine's last weight load, in seconds
        self.thread: threading.Thread | None = None

    def start(self, step: int, stream_state: dict) -> None:
        stream = PromptStream(self.work.rows, self.work.seed)
        stream.load_state_dict(stream_state)
        self.thread = threading.Thread(target=self._run, args=(step, stream), daemon=True,
                                       name="grpo-engine-client")
        self.thread.start()

    def send_weights(self, version: int, flat) -> None:
        with self.ready:
            self.versions[version] = flat
            self.sent = version
            self.ready.notify_all()

    def _version(self, need: int) -> list:
        with self.ready:
            while need not in self.versions:
                if self.closing:
                    raise _Closing()
                self.ready.wait(1.0)
            for old in [v for v in self.versions if v < need]:
                del self.versions[old]
            return self.versions[need]

    def _run(self, first: int, stream: PromptStream) -> None:
        device = next(self.model.parameters()).device
        # on a GPU the client's kernels go on a stream of their own, beside the trainer's
        on_gpu = torch.cuda.stream(torch.cuda.Stream(device)) if device.type == "cuda" else None
        with on_gpu if on_gpu is not None else contextlib.nullcontext():
            self._loop(first, stream)

    @staticmethod
    def _whole() -> None:
        """On a GPU, the client's kernels so far have finished: the part's tensors are whole
        before the trainer (or the scoring thread) reads them."""
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.current_stream().synchronize()

    def _loop(self, first: int, stream: PromptStream) -> None:
        scorer = ThreadPoolExecutor(1, "grpo-scorer") if self.work.draw is not None else None
        scoring: list = []
        loaded = -1
        try:
            for step in range(first, self.work.steps + 1):
                need = self.work.version_of(step)
                waited = time.time()
                if loaded != need:
                    version = self._version(need)
                    if version is not None:    # None: another process sends the servers this one
                        load_parameters(self.model, version)
                    synced = time.perf_counter()   # the engine's own numbering may be another's
                    if getattr(self.sampler, "engine", None) is not None:
                        self.sampler.sync(self.model, need)
                    else:
                        self.sampler.sync(self.model)
                    self.sync_s = time.perf_counter() - synced
                    loaded = need
                else:
                    self.sync_s = 0.0
                fault_point("rollout")
                for done in [f for f in scoring if f.done()]:
                    done.result()
                    scoring.remove(done)
                if scorer is None:
                    part = part_of(self.work, self.sampler, stream, step, need, self.share)
                    part.wait = (waited, part.work[0])
                    part.extra["time/engine_sync_s"] = self.sync_s
                    self._whole()
                    self.parts.put(part)
                    continue
                part = drawn_part(self.work, self.sampler, stream, step, need, self.share)
                part.wait = (waited, part.work[0])
                part.extra["time/engine_sync_s"] = self.sync_s
                self._whole()
                scoring.append(scorer.submit(self._score, part))
            for f in scoring:
                f.result()
        except _Closing:
            pass
        except BaseException as e:   # noqa: BLE001 - raised in the trainer's thread by part()
            self.parts.put(Failed(e, traceback.format_exc()))
        finally:
            if scorer is not None:
                scorer.shutdown(wait=False, cancel_futures=True)

    def _score(self, part: Part) -> None:
        try:
            self.parts.put(scored(self.work, part))
        except BaseException as e:   # noqa: BLE001
            self.parts.put(Failed(e, traceback.format_exc()))
            raise

    def part(self, step: int) -> Part | Failed:
        """Step `step`'s part, waiting at most `timeout_s` (transfer_timeout_s) for it: every
        version it needs has been sent by the time the trainer asks."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                return self.parts.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                if self.thread is None or not self.thread.is_alive():
                    try:
                        return self.parts.get_nowait()
                    except queue.Empty:
                        raise PipelineError(f"the engine client stopped before sending step "
                                            f"{step}'s groups") from None
                if time.monotonic() >= deadline:
                    engine = getattr(self.sampler, "engine", None)
                    on = engine.name if engine is not None else "grpo's own sampler"
                    raise PipelineError(f"the groups of step {step} from the engine client ({on}): "
                                        f"nothing arrived within {self.timeout_s:g} s (transfer_timeout_s)")

    def stop(self) -> None:
        with self.ready:
            self.closing = True
            self.ready.notify_all()
        if self.thread is not None:
            self.thread.join(timeout=5.0)
        engine = getattr(self.sampler, "engine", None)
        if engine is not None and self.owns_engine:   # one given to train() is its caller's
            engine.close()
        if hasattr(self.sampler, "drop_adapters"):     # the LoRA adapters' files it wrote
            self.sampler.drop_adapters()


class _Closing(Exception):
    """The run is over: the client stops waiting for a version."""


def clone_parameters(model) -> list[torch.Tensor]:
    """A version for an engine client: the trained parameters, each copied (the client's copy
    may hold another dtype, so no flat buckets). On a GPU the copies go to pinned CPU memory:
    k + 1 whole versions would otherwise sit on the GPU beside the policy; the client copies a
    version back when it loads it."""
    with torch.no_grad():
        params = [p.detach() for p in trained_parameters(model)]
        if not params or not params[0].is_cuda:
            return [p.clone() for p in params]
        copies = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in params]
        for copy, p in zip(copies, params):
            copy.copy_(p, non_blocking=True)
    torch.cuda.current_stream().synchronize()   # whole before the client reads them
    return copies


def keeps_versions(client) -> bool:
    """Whether this process's engine client needs the versions' weights: not where it shares
    servers that another process sends every version to (`Engines` with sends=False)."""
    engine = getattr(client[1], "engine", None) if client is not None else None
    return getattr(engine, "sends", True)


def load_parameters(model, params: list[torch.Tensor]) -> None:
    with torch.no_grad():
        for mine, theirs in zip(trained_parameters(model), params, strict=True):
            mine.copy_(theirs.to(mine.device))


class Groups:
    """Where a trainer process's groups come from with async_steps = k > 0."""

    def __init__(self, work: Work, *, workers: int, world: World, first: int, stream_state: dict,
                 queued: dict[int, list] | None, restarts: int, log=print, client=None):
        """`client`: (model, sampler, owns_engine) of an engine client, a thread of this process
        that samples on the sampler's engine (closed at the end when it owns it), loading each
        version into `model` first; else `workers` forked rollout workers."""
        self.work, self.k, self.world, self.log = work, work.k, world, log
        self.restarts_left, self.restarts = restarts, 0
        # a checkpoint's queued steps (an older grpo's hold dicts)
        self.queue: dict[int, list[Part]] = {s: [Part.of(p) for p in parts]
                                             for s, parts in (queued or {}).items()}
        self.version = first - 1                    # the trainer's weights now
        self.next = first + len(self.queue)         # the first step no worker has sent yet
        self.stream_state = stream_state            # the data position before step `next`
        self.snap = clone_parameters if client is not None else snapshot
        if not keeps_versions(client):   # process 0 sends the shared servers each version
            self.snap = lambda policy: None
        with distributed.full_parameters(work.policy):   # FSDP2: gathered on every process
            self.snapshots = {self.version: self.snap(work.policy)}
        scheduled = version_for(self.next, self.k)
        if self.next <= work.steps and scheduled < self.version and len(self.queue) < self.k:
            # written in the last k steps of a run that ended there, and extended (a larger
            # steps=): no older version is left, so the next steps sample from this one
            work.floor = self.version
            fresher = [s for s in range(self.next, work.steps + 1) if version_for(s, self.k) < self.version]
            log(f"async_steps={self.k}: the checkpoint was written {len(self.queue)} step(s) before "
                f"the end of the run it belonged to, which kept no older weights: step(s) "
                f"{fresher[0]}-{fresher[-1]} sample from version {self.version} (staleness "
                f"{', '.join(str(s - 1 - self.version) for s in fresher)} instead of {self.k}); "
                f"from step {fresher[-1] + 1} on, as scheduled")
        need = self.work.version_of(self.next)
        if self.next <= work.steps and need not in self.snapshots:
            raise PipelineError(
                f"step {self.next} trains on weight version {need}, which this checkpoint does not "
                f"hold (it holds {self.version}): resume with the async_steps it was written with")
        self.timeline: list[dict] = []
        n = max(workers, 1)
        self.shares = [World(rank=world.rank * n + j, size=world.size * n) for j in range(n)]
        self.workers: list = []
        self.zygote = None
        if client is not None:
            model, sampler, owns = client
            engine = _Client(work, world, model, sampler, timeout_s=work.timeout_s, owns_engine=owns)
            self.workers.append(engine)
            self._catch_up(engine)
            if self.next <= work.steps:
                engine.start(self.next, stream_state)
            return
        import torch.distributed as dist
        timeout = datetime.timedelta(seconds=work.timeout_s)
        self.store = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False, timeout=timeout)
        self.zygote = Zygote(work, self.shares)
        for j in range(workers):
            self.workers.append(self._start(j, 0))

    # ---------------------------------------------------------------- workers

    def _start(self, index: int, generation: int) -> _Remote:
        import torch.distributed as dist
        pid = self.zygote.start(index, generation, self.store.port)
        connect_s = min(self.work.timeout_s, CONNECT_S)   # a fork connects in well under a second
        try:
            group = dist.ProcessGroupGloo(dist.PrefixStore(f"worker{index}.{generation}", self.store),
                                          0, 2, datetime.timedelta(seconds=connect_s))
        except RuntimeError as e:
            _kill(pid)
            raise PipelineError(f"rollout worker {index} did not connect within {connect_s:g} s: "
                                f"{str(e).splitlines()[0][:200]}") from None
        remote = _Remote(index, generation, pid, Channel(group, 1, f"rollout worker {index}",
                                                          self.work.timeout_s))
        if self.next <= self.work.steps:
            remote.channel.send_object({"step": self.next, "stream": self.stream_state}, CONTROL)
            self._catch_up(remote)
        return remote

    def _catch_up(self, worker) -> None:
        """Send a (new) worker the version its first step needs and every later one held."""
        need = self.work.version_of(self.next)
        for v in sorted(self.snapshots):
            if need <= v <= self.last_needed:
                worker.send_weights(v, self.snapshots[v])

    @property
    def last_needed(self) -> int:
        """The newest version any step of the run samples from."""
        return self.work.version_of(self.work.steps)

    def _replace(self, j: int, error: Exception) -> None:
        old = self.workers[j]
        _kill(old.pid)
        if self.restarts_left <= 0:
            raise PipelineError(f"{error}; rollout worker {j} has died {self.restarts + 1} times, "
                                f"more than worker_restarts={self.restarts}") from None
        self.restarts_left -= 1
        self.restarts += 1
        self.log(f"rollout worker {j} died ({error}); replacing it: step {self.next} is sampled "
                 f"again from version {self.work.version_of(self.next)} with the same draws "
                 f"(replacement {self.restarts})")
        self.workers[j] = self._start(j, old.generation + 1)

    # ---------------------------------------------------------------- the trainer's calls

    colocated = False   # the workers' engines sample; the trainer's engine only evaluates

    def take(self, step: int) -> Taken:
        """Step `step`'s groups, the workers' metrics and timers (the slowest's: they run side by
        side) and the counts of why built-in rewards scored 0 in them."""
        waited = time.time()
        if step not in self.queue:
            self._receive(step)
        got = time.time()
        parts = self.queue.pop(step)
        self.timeline.append({"step": step, "trainer_wait": (waited, got),
                              "workers": [{"wait": p.wait, "work": p.work} for p in parts]})
        # trimmed: the same columns however the rows were split among workers (shapes change float sums)
        rollout = concat([p.rollout for p in parts], self.work.pad_token_id).trimmed()
        extra: dict = {}
        worker_faults: dict = {}
        for p in parts:
            for key, value in p.extra.items():
                extra[key] = extra.get(key, 0) + value
            for key, n in p.faults.items():
                worker_faults[key] = worker_faults.get(key, 0) + n
        extra["pipeline/trainer_wait_s"] = got - waited
        extra["pipeline/worker_wait_s"] = max(p.wait[1] - p.wait[0] for p in parts)
        extra["pipeline/worker_restarts"] = self.restarts
        # workers run side by side: the step waited for the slowest
        return Taken(rollout, extra, max(p.sample_s for p in parts), max(p.reward_s for p in parts),
                     worker_faults)

    def send_weights(self, step: int, policy) -> float:
        """publish, timed: the weights after `step` are version `step`."""
        started = time.perf_counter()
        self.publish(step, policy)
        return time.perf_counter() - started

    def _receive(self, step: int) -> None:
        """Every worker's part of step `step` (the next one due), replacing workers that die."""
        if step != self.next:
            raise PipelineError(f"the trainer asked for step {step}, the workers are at {self.next}")
        parts = []
        for j in range(len(self.workers)):
            while True:
                try:
                    part = self.workers[j].part(step)
                    break
                except PeerLost as e:
                    self._replace(j, e)
            if isinstance(part, Failed):   # its traceback in the worker, shown under the trainer's
                part.error.add_note(f"in rollout worker {j}:\n{part.trace.rstrip()}")
                raise part.error
            if part.step != step:
                raise PipelineError(f"rollout worker {j} sent step {part.step}, expected {step}")
            parts.append(part)
        self.queue[step] = parts
        self.stream_state = parts[0].stream
        self.next = step + 1

    def publish(self, step: int, policy) -> None:
        """The weights after step `step` are version `step`: kept, and sent where needed."""
        self.version = step
        for old in [v for v in self.snapshots if v < self.work.version_of(step + 1)]:
            del self.snapshots[old]
        if step > self.last_needed:
            return
        self.snapshots[step] = flat = self.snap(policy)
        for j, worker in enumerate(self.workers):
            try:
                worker.send_weights(step, flat)
            except PeerLost as e:   # noticed again (and the worker replaced) when its part is due
                self.log(f"rollout worker {j}: sending version {step} failed ({e})")

    def ahead(self, step: int) -> tuple[dict[int, list], dict]:
        """The parts of steps step+1 .. step+k (received now if not yet) and the data position
        after the last of them: what a checkpoint after `step` keeps."""
        for s in range(step + 1, min(step + self.k, self.work.steps) + 1):
            if s not in self.queue:
                self._receive(s)
        return {s: parts for s, parts in self.queue.items() if s > step}, self.stream_state

    def close(self) -> None:
        for worker in self.workers:
            try:
                worker.stop()
            except Exception:   # noqa: BLE001 - a worker already gone
                _kill(worker.pid)
        if self.zygote is not None:
            self.zygote.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _kill(pid: int) -> None:
    if pid == os.getpid():
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
