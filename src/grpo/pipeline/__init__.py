"""Asynchronous GRPO: rollout workers sample while the trainer updates (`async_steps=k`).

    trainer                                   rollout worker(s)
    step t: take step t's groups      <----   sample step t+j from version t+j-1-k as soon as
            update -> version t                it has arrived, with step t+j's draws
            publish version t         ---->   (weights in buckets, tagged with their version)

Staleness is bounded by schedule, not by timing: the groups trained at step t are sampled from
the weights after step t-1-k exactly, with the draws of step t, so a run repeats bit for bit,
resumes bit for bit (a checkpoint keeps the groups already sampled for the next k steps), and N
workers give what one gives (each samples a fixed share of every step). k = 0 is the synchronous
loop itself (inline.py), with no worker.

    inline.py      k = 0: the learner's own engine samples and scores each step's groups
    worker.py      the worker process, the spare it is forked from, and the schedule (version_for)
    groups.py      the trainer's end: take, publish, ahead (for checkpoints), replace dead workers
    transport.py   torch.distributed point to point (gloo), with timeouts that name peer and tensor
"""

from grpo.pipeline.groups import Groups
from grpo.pipeline.transport import PeerLost, PipelineError, TransferTimeout
from grpo.pipeline.worker import Work, version_for


def split_threads(cores: int, workers: int) -> tuple[int, int]:
    """(trainer threads, threads per worker): the cores shared out, at least one each. On two
    cores with one worker, one each: two processes that each took both would run many times
    slower than either alone."""
    if workers == 0:
        return cores, cores
    per_worker = max(1, cores // (workers + 1))
    return max(1, cores - per_worker * workers), per_worker


__all__ = ["Groups", "PeerLost", "PipelineError", "TransferTimeout", "Work", "split_threads",
           "version_for"]
