"""A discrete-event model of synchronous and asynchronous GRPO: how long a run takes, who waits
for whom, and what asynchrony buys, from a few measured costs.

    python benchmarks/pipeline_sim.py --inputs FILE.json [flags that override the file]
    python benchmarks/pipeline_sim.py --decode-step-s 0.1 --length 10 --train-s-per-token 0.1 ...
    python benchmarks/pipeline_sim.py --published verl-qwen2.5-7b

The system modelled
-------------------
A step trains on `prompts_per_step` groups of `group_size` completions. Its work is: sample
(decode), score (reward), a log-prob pass (reference / old policy) and the update.

* Synchronous (async_steps = 0): the step's phases run one after the other. With `colocated` the
  sampler and the trainer share their devices (one process, no weight transfer); otherwise the
  new weights are sent to the sampler after each update (the weight sync), and that too is serial.
* Asynchronous, policy "schedule" (grpo's design): the groups trained at step t (0-indexed) are
  sampled from weights version max(0, t - k), where version v means "after v updates" and
  k = async_steps. Rollout workers sample and score; the trainer computes log-probs and updates.
  A worker that is ahead waits for the version it needs; the trainer waits for its step's groups.
  After each update the trainer sends the new weights: it cannot compute for the first
  `weight_sync_trainer_s` seconds, the version reaches the workers after `weight_sync_s`, and a
  worker then spends `weight_load_s` loading it before it decodes with it.
* Asynchronous, policy "timing" (verl's fully-async trainer): workers stream groups with
  continuous batching and always use the newest weights they have; a new group may start only
  while fewer than (v + 1 + k) * prompts_per_step groups have been started, v being the workers'
  version (so k may be fractional, like verl's staleness_threshold). The trainer takes finished
  groups in the order they finish and updates every prompts_per_step / updates_per_step groups
  (verl's require_batches * ppo_mini_batch_size); after `updates_per_step` updates it sends the
  weights. With `partial_rollout` the workers pause to load and their unfinished rows continue with
  the new weights; without it they stop starting rows and load once every row has finished.

Decoding. A worker decodes rows together; each decode step gives every live row one token and
costs decode_step_s + decode_row_s * rows (a per-batch-size cost model, seconds per decode step on
one worker). Ragged batches (grpo's sampler today): a worker's share of the step is cut into
batches of at most `max_batch_rows` rows, each running until its longest row ends; ended rows
leave the batch (`drop_finished_rows`), so a batch costs decode_step_s * max(length) +
decode_row_s * sum(length). With `continuous_batching` a freed slot takes the next row at once, so
the time follows the total tokens rather than each batch's longest row.

Scoring. Each completion takes `reward_s_per_completion` (e.g. a remote judge answering after
0.5 s) with at most `reward_concurrency` calls at once per worker (0: unlimited), plus
`reward_s_per_batch` once per worker batch. Scoring starts after generation unless
`reward_overlaps_generation` (each completion is sent when it ends).

Training. A pass over N tokens (prompt + completion) on `trainer_devices` devices takes
N * cost / trainer_devices: `logprob_s_per_token` for the log-prob pass, `train_s_per_token` for
forward + backward; `train_fixed_s` per update and `step_overhead_s` per step are added.

Shared cores. With `shared_cores_slowdown` f (not colocated: worker and trainer processes split one
machine's cores), every decode, log-prob and update phase takes f times as long; measure f as a
phase's time with the process's share of the cores over its time with all of them. Reward latency
and weight sync are taken as given.

Inputs (JSON, one object; every key optional, unknown keys are errors)
-----------------------------------------------------------------------
  prompts_per_step, group_size, steps, async_steps (k), policy ("schedule" | "timing"), seed,
  colocated, rollout_workers, trainer_devices, split ("groups": a step's groups are dealt across
  the workers | "steps": worker t % R samples all of step t; schedule policy only),
  decode_step_s, decode_row_s, max_batch_rows (null: a worker's whole share in one batch),
  continuous_batching, drop_finished_rows,
  lengths: {"kind": "constant", "value": 256}
         | {"kind": "samples", "values": [measured lengths...], "max": cap}
         | {"kind": "lognormal", "median": 400, "sigma": 1.0, "max": 4096},
  prompt_tokens, logprob_s_per_token, train_s_per_token, train_fixed_s, step_overhead_s,
  updates_per_step, reward_s_per_completion, reward_s_per_batch, reward_concurrency,
  reward_overlaps_generation, weight_sync_s, weight_sync_trainer_s, weight_load_s,
  shared_cores_slowdown, partial_rollout,
  baseline: {overrides for the synchronous run the speedup is measured against; by default the
             same inputs with async_steps 0, policy "schedule", colocated true}.

Output: the median step time (between update ends), total time, the trainer's and the workers'
idle fractions, the time each side waited for the other, the speedup of the run over its baseline,
and with --timeline the segments of the first steps. The same inputs and seed give the same numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import math
import random
import statistics
import sys
from collections import deque
from dataclasses import dataclass, field

INF = float("inf")


# ---------------------------------------------------------------------------------------------
# Inputs


@dataclass
class Inputs:
    """Everything the model takes. Times in seconds, lengths in tokens."""
    prompts_per_step: int = 8
    group_size: int = 8
    steps: int = 20
    async_steps: float = 1            # k; an integer for the schedule policy
    policy: str = "schedule"          # "schedule" (grpo) or "timing" (verl fully async)
    seed: int = 0
    colocated: bool = False           # sampler and trainer on the same devices (synchronous only)
    rollout_workers: int = 1
    trainer_devices: int = 1
    split: str = "groups"             # schedule policy: "groups" or "steps" (see the module doc)
    decode_step_s: float = 0.01       # a: seconds per decode step, whatever the batch
    decode_row_s: float = 0.0         # b: seconds per decode step per row in the batch
    max_batch_rows: int | None = None
    continuous_batching: bool = False
    drop_finished_rows: bool = True
    lengths: dict = field(default_factory=lambda: {"kind": "constant", "value": 64})
    prompt_tokens: int = 0
    logprob_s_per_token: float = 0.0  # on one trainer device
    train_s_per_token: float = 0.0    # forward + backward, on one trainer device
    train_fixed_s: float = 0.0        # per update (optimizer step and the like)
    step_overhead_s: float = 0.0      # per step, on the trainer (anything else measured)
    updates_per_step: int = 1
    reward_s_per_completion: float = 0.0
    reward_s_per_batch: float = 0.0
    reward_concurrency: int = 0       # calls at once per worker; 0: unlimited
    reward_overlaps_generation: bool = False
    weight_sync_s: float = 0.0        # update end -> the version can be loaded by the workers
    weight_sync_trainer_s: float = 0.0  # the part of it the trainer cannot compute
    weight_load_s: float = 0.0        # a worker loading a version (no decoding meanwhile)
    score_beside_decode: bool = False  # schedule policy: a worker scores step t in a thread of its
    #                                   own while it decodes step t+1 (grpo's worker without dynamic
    #                                   sampling); one scoring at a time
    shared_cores_slowdown: float = 1.0
    partial_rollout: bool = True      # timing policy
    baseline: dict = field(default_factory=dict)

    def check(self) -> "Inputs":
        if self.policy not in ("schedule", "timing"):
            raise ValueError(f"policy must be 'schedule' or 'timing', not {self.policy!r}")
        if self.split not in ("groups", "steps"):
            raise ValueError(f"split must be 'groups' or 'steps', not {self.split!r}")
        if self.async_steps < 0:
            raise ValueError("async_steps must be >= 0")
        if self.policy == "schedule" and self.async_steps != int(self.async_steps):
            raise ValueError("the schedule policy takes a whole number of async_steps")
        if self.colocated and (self.async_steps > 0 or self.policy == "timing"):
            raise ValueError("a colocated run is synchronous: async_steps 0, policy 'schedule'")
        if self.prompts_per_step % self.updates_per_step:
            raise ValueError("updates_per_step must divide prompts_per_step")
        if min(self.prompts_per_step, self.group_size, self.steps, self.rollout_workers,
               self.trainer_devices) < 1:
            raise ValueError("prompts_per_step, group_size, steps and device counts must be >= 1")
        if self.policy == "timing" and self.max_batch_rows is None:
            raise ValueError("the timing policy needs max_batch_rows (each worker's slots)")
        return self


def load_inputs(data: dict) -> Inputs:
    """An Inputs from a JSON object; unknown keys are an error (a typo would otherwise be silent)."""
    names = {f.name for f in dataclasses.fields(Inputs)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown input(s) {unknown}; known: {sorted(names)}")
    return Inputs(**data).check()


def baseline_of(inp: Inputs) -> Inputs:
    """The synchronous run a speedup is measured against: one process on the same devices
    (colocated, no weight transfer, all cores), unless `baseline` overrides any of it."""
    over = {"async_steps": 0, "policy": "schedule", "colocated": True, "shared_cores_slowdown": 1.0,
            **inp.baseline, "baseline": {}}
    return dataclasses.replace(inp, **over).check()


def draw_lengths(inp: Inputs) -> list[list[int]]:
    """Completion lengths, [step][row] (row = prompt * group_size + completion), drawn once from
    the seed so that every policy and the baseline decode the same completions."""
    spec, rng = inp.lengths, random.Random(inp.seed)
    kind, cap = spec.get("kind"), spec.get("max")
    if kind == "constant":
        draw = lambda: int(spec["value"])                                   # noqa: E731
    elif kind == "samples":
        values = [int(v) for v in spec["values"]]
        draw = lambda: rng.choice(values)                                   # noqa: E731
    elif kind == "lognormal":                  # median exp(mu); sigma ~ 1 gives a long tail
        mu, sigma = math.log(spec["median"]), spec["sigma"]
        draw = lambda: max(1, round(rng.lognormvariate(mu, sigma)))         # noqa: E731
    else:
        raise ValueError(f"lengths kind must be constant, samples or lognormal, not {kind!r}")
    rows = inp.prompts_per_step * inp.group_size
    return [[min(draw(), cap) if cap else draw() for _ in range(rows)] for _ in range(inp.steps)]


# ---------------------------------------------------------------------------------------------
# Pieces of work


class Engine:
    """One rollout worker's decoder. Every live row gains one token per decode step, and a step
    costs (decode_step_s + decode_row_s * rows) * slowdown, rows being the live rows (or the batch's
    rows when ended rows are not dropped). Between two row ends the cost per step is constant, so
    time is linear in tokens there. `progress` counts the tokens each live row has gained since
    the engine started: a row started at progress p with length L ends when progress is p + L.

    With `refill` a freed slot takes the next waiting row at once (continuous batching); without,
    waiting rows start only when the batch is empty (ragged batches of up to `slots` rows)."""

    def __init__(self, inp: Inputs, slots: int | None, refill: bool, slowdown: float):
        self.a, self.b = inp.decode_step_s * slowdown, inp.decode_row_s * slowdown
        self.drop = inp.drop_finished_rows
        self.slots, self.refill = slots or INF, refill
        self.live: list[tuple[float, int, object]] = []     # heap of (end progress, seq, row)
        self.waiting: deque[tuple[object, int]] = deque()  # (row, length)
        self.progress, self.now, self.paused_until = 0.0, 0.0, 0.0
        self.batch_rows, self.busy_s, self._seq = 0, 0.0, 0

    def step_s(self) -> float:
        return self.a + self.b * (len(self.live) if self.drop else self.batch_rows)

    def advance(self, t: float) -> None:
        """Decode until time t (nothing while paused)."""
        run_from = max(self.now, self.paused_until)
        if self.live and t > run_from:
            self.progress += (t - run_from) / self.step_s()
            self.busy_s += t - run_from
        self.now = max(self.now, t)

    def next_end(self) -> float:
        """When the next live row ends, if nothing changes before."""
        if not self.live:
            return INF
        start = max(self.now, self.paused_until)
        return start + max(0.0, self.live[0][0] - self.progress) * self.step_s()

    def pop_ended(self) -> list:
        """The rows that have ended by now (call advance first)."""
        ended = []
        while self.live and self.live[0][0] <= self.progress + 1e-9:
            ended.append(heapq.heappop(self.live)[2])
        return ended

    def fill(self) -> list:
        """Start waiting rows while slots allow; the rows started."""
        if not self.refill and self.live:
            return []
        started = []
        while self.waiting and len(self.live) < self.slots:
            row, length = self.waiting.popleft()
            self._seq += 1
            heapq.heappush(self.live, (self.progress + length, self._seq, row))
            started.append(row)
        if started:
            self.batch_rows = len(self.live)     # the cost per step when ended rows stay (padding)
        return started

    def load(self) -> int:
        """Rows live or waiting."""
        return len(self.live) + len(self.waiting)


def decode(inp: Inputs, lengths: list[int], slowdown: float) -> list[float]:
    """One worker decoding `lengths` from time 0, ragged or continuous as the inputs say; the time
    each row ends."""
    eng = Engine(inp, inp.max_batch_rows, inp.continuous_batching, slowdown)
    eng.waiting.extend((i, n) for i, n in enumerate(lengths))
    ends, t = [0.0] * len(lengths), 0.0
    eng.fill()
    while eng.live:
        t = eng.next_end()
        eng.advance(t)
        for i in eng.pop_ended():
            ends[i] = t
        eng.fill()
    return ends


class Judge:
    """The reward: `reward_concurrency` servers (0: unlimited), each call taking
    reward_s_per_completion. Calls must arrive in time order; each is served first come, first
    served, so its answer time is known when it arrives."""

    def __init__(self, inp: Inputs):
        self.s, self.free = inp.reward_s_per_completion, [0.0] * inp.reward_concurrency

    def call(self, arrive: float) -> float:
        if not self.free:
            return arrive + self.s
        start = max(arrive, heapq.heappop(self.free))
        heapq.heappush(self.free, start + self.s)
        return start + self.s


def score(inp: Inputs, ends: list[float]) -> float:
    """When a worker's batch is scored, from its rows' end times: each completion is sent when it
    ends (reward_overlaps_generation) or all once generation is done, then one per-batch call."""
    if not ends:
        return 0.0
    judge, done = Judge(inp), max(ends)
    arrivals = sorted(ends) if inp.reward_overlaps_generation else [done] * len(ends)
    answered = max([done] + [judge.call(t) for t in arrivals])
    return answered + inp.reward_s_per_batch


def train_s(inp: Inputs, lengths: list[int], slowdown: float) -> tuple[float, float]:
    """(log-prob pass, update) seconds for the rows with these completion lengths."""
    tokens = sum(lengths) + inp.prompt_tokens * len(lengths)
    per_device = tokens / inp.trainer_devices * slowdown
    return per_device * inp.logprob_s_per_token, per_device * inp.train_s_per_token


# ---------------------------------------------------------------------------------------------
# Results


@dataclass
class Result:
    step_end: list[float]             # time each update of a step ends
    trainer_busy_s: float
    worker_busy_s: list[float]
    trainer_wait_s: float             # waiting for groups
    worker_wait_s: float              # waiting for weights (summed over workers)
    phases: dict[str, list[float]]    # per-step seconds of each phase
    timeline: list[tuple[float, float, str, str]]   # (start, end, who, what)
    staleness: list[float] = field(default_factory=list)   # per group trained: version lag

    @property
    def total_s(self) -> float:
        return self.step_end[-1]

    @property
    def step_times(self) -> list[float]:
        return [b - a for a, b in zip([0.0] + self.step_end, self.step_end)]

    @property
    def median_step_s(self) -> float:
        return statistics.median(self.step_times)

    @property
    def trainer_idle(self) -> float:
        return 1 - self.trainer_busy_s / self.total_s

    @property
    def worker_idle(self) -> float:
        return 1 - statistics.mean(self.worker_busy_s) / self.total_s

    def summary(self) -> dict:
        out = {"median_step_s": self.median_step_s, "total_s": self.total_s,
               "trainer_idle": self.trainer_idle, "worker_idle": self.worker_idle,
               "trainer_wait_s": self.trainer_wait_s, "worker_wait_s": self.worker_wait_s,
               "phase_median_s": {k: statistics.median(v) for k, v in self.phases.items() if v}}
        if self.staleness:
            out["staleness"] = {"mean": statistics.mean(self.staleness), "max": max(self.staleness)}
        return out


# ---------------------------------------------------------------------------------------------
# The schedule policy (and synchronous runs)


def simulate_schedule(inp: Inputs, lengths: list[list[int]]) -> Result:
    """Synchronous and schedule-bounded asynchronous GRPO.

    Every resource serves its work in an order fixed in advance (a worker its jobs in step order,
    the trainer its steps in order), and every piece of work waits only for work of earlier steps
    or of the same step. So the event times follow by a recurrence in step order: each piece
    starts at the latest of the times it waits for and ends after its duration; no event queue
    is needed. For step t:

      worker job:  start = max(worker free, [colocated: trainer free],
                               time version max(0, t - k) reaches the worker)   (+ load)
                   end   = start + decode + score
      trainer:     start = max(trainer free, last of step t's jobs)
                   update end U[t] = start + log-prob pass + update (+ overheads)
                   trainer free   = U[t] + weight_sync_trainer_s
                   version t + 1 reaches the workers at U[t] + weight_sync_s
    A colocated run has no versions to move: it is the same recurrence with one clock.
    """
    k, R, P, G = int(inp.async_steps), inp.rollout_workers, inp.prompts_per_step, inp.group_size
    slow = 1.0 if inp.colocated else inp.shared_cores_slowdown
    worker_free, worker_version = [0.0] * R, [0] * R
    worker_busy = [0.0] * R
    scorer_free = [0.0] * R
    version_at_workers = [0.0]            # [v]: when version v can be loaded by a worker
    trainer_free, trainer_busy, trainer_wait, worker_wait = 0.0, 0.0, 0.0, 0.0
    step_end, timeline = [], []
    phases = {"decode": [], "score": [], "logprob": [], "update": []}
    for t in range(inp.steps):
        need = max(0, t - k)
        if inp.split == "groups":        # prompt p of the step goes to worker p % R
            jobs = [(w, [r for p in range(w, P, R) for r in range(p * G, (p + 1) * G)])
                    for w in range(min(R, P))]
        else:
            jobs = [(t % R, list(range(P * G)))]
        ready, ready_from, dec, sco = 0.0, 0, 0.0, 0.0
        for w, rows in jobs:
            start = max(worker_free[w], trainer_free) if inp.colocated else worker_free[w]
            if not inp.colocated and worker_version[w] < need:
                arrive = version_at_workers[need]
                if arrive > start:
                    timeline.append((start, arrive, f"worker {w}", f"waits for weights v{need}"))
                    worker_wait += arrive - start
                    start = arrive
                if inp.weight_load_s:
                    timeline.append((start, start + inp.weight_load_s, f"worker {w}", f"loads v{need}"))
                start += inp.weight_load_s
                worker_busy[w] += inp.weight_load_s
                worker_version[w] = need
            ends = decode(inp, [lengths[t][r] for r in rows], slow)
            decoded = max(ends)
            scored = score(inp, ends)
            timeline.append((start, start + decoded, f"worker {w}", f"decodes step {t}"))
            if inp.score_beside_decode and not inp.colocated:
                # grpo's worker: one scoring thread scores this step while the next one decodes
                score_start = max(start + decoded, scorer_free[w])
                done = score_start + (scored - decoded)
                if done > score_start:
                    timeline.append((score_start, done, f"worker {w} scorer", f"scores step {t}"))
                scorer_free[w] = done
                worker_free[w] = start + decoded
                worker_busy[w] += decoded
            else:
                if scored > decoded:
                    timeline.append((start + decoded, start + scored, f"worker {w}", f"scores step {t}"))
                done = worker_free[w] = start + scored
                worker_busy[w] += scored
            dec, sco = max(dec, decoded), max(sco, scored - decoded)
            if done > ready:
                ready, ready_from = done, w
        start = max(trainer_free, ready)
        if ready > trainer_free and not inp.colocated:
            timeline.append((trainer_free, ready, "trainer",
                             f"waits for step {t}'s groups (worker {ready_from})"))
            trainer_wait += ready - trainer_free
        logprob, update = train_s(inp, lengths[t], slow)
        update += inp.updates_per_step * inp.train_fixed_s + inp.step_overhead_s
        timeline.append((start, start + logprob, "trainer", f"log-probs step {t}"))
        timeline.append((start + logprob, start + logprob + update, "trainer", f"updates step {t}"))
        end = start + logprob + update
        step_end.append(end)
        trainer_free = end
        trainer_busy += logprob + update
        if not inp.colocated:
            if inp.weight_sync_trainer_s:
                timeline.append((end, end + inp.weight_sync_trainer_s, "trainer", f"sends v{t + 1}"))
            trainer_free += inp.weight_sync_trainer_s
            trainer_busy += inp.weight_sync_trainer_s
            version_at_workers.append(end + inp.weight_sync_s)
        for name, value in zip(phases, (dec, sco, logprob, update)):
            phases[name].append(value)
    if inp.colocated:   # the same devices do both: busy while either side works on them
        sampling = sum(a + b for a, b in zip(phases["decode"], phases["score"]))
        worker_busy = [w + trainer_busy for w in worker_busy]
        trainer_busy += sampling
    timeline = sorted(seg for seg in timeline if seg[1] > seg[0])
    return Result(step_end, trainer_busy, worker_busy, trainer_wait, worker_wait, phases, timeline)


# ---------------------------------------------------------------------------------------------
# The timing policy


def simulate_timing(inp: Inputs, lengths: list[list[int]]) -> Result:
    """Timing-driven asynchronous GRPO with streaming and continuous batching (verl's fully
    async trainer), as an event loop: the order of events depends on their times here.

    Events: a worker's next row ends; a group's last reward arrives (it joins the trainer's
    queue); the trainer finishes an update or its part of a weight sync; a version reaches the
    workers. Groups are started in index order, each on the least loaded worker with a free slot,
    while fewer than (v + 1 + k) * prompts_per_step have been started (v: the workers' version).
    A group's staleness is the trainer's version when it trains on it minus the oldest version
    any of its rows started with.
    """
    k, P, G = inp.async_steps, inp.prompts_per_step, inp.group_size
    per_update = P // inp.updates_per_step
    slow = inp.shared_cores_slowdown
    engines = [Engine(inp, inp.max_batch_rows, True, slow) for _ in range(inp.rollout_workers)]
    judges = [Judge(inp) for _ in engines]
    epoch = [0] * len(engines)             # an engine's pending event is stale if its epoch moved
    events: list = []
    seq = 0

    def push(t, kind, data=None):
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, data))

    total_groups = inp.steps * P
    next_group, version, pending, draining = 0, 0, None, False
    rows_left = [G] * total_groups
    group_version = [INF] * total_groups
    group_done = [0.0] * total_groups
    queue: deque[int] = deque()            # finished, scored groups, in the order they finished
    tr = {"step": 0, "update": 0, "working": False, "idle_from": 0.0}
    trainer_busy, trainer_wait, worker_wait = 0.0, 0.0, 0.0
    blocked_since = [None] * len(engines)   # engine idle because admission is closed
    step_end, timeline, staleness = [], [], []

    def reschedule(e):
        epoch[e] += 1
        push(engines[e].next_end(), "engine", (e, epoch[e]))

    def start_rows(e, now):
        for g in engines[e].fill():
            group_version[g] = min(group_version[g], version)

    def admit(now):
        """Start groups while the staleness bound and the workers' slots allow."""
        nonlocal next_group
        while (not draining and next_group < total_groups
               and next_group < (version + 1 + k) * P):
            e = min(range(len(engines)), key=lambda i: engines[i].load())
            if engines[e].load() >= engines[e].slots:
                break
            engines[e].advance(now)
            g, step, first = next_group, next_group // P, (next_group % P) * G
            engines[e].waiting.extend((g, n) for n in lengths[step][first:first + G])
            start_rows(e, now)
            reschedule(e)
            next_group += 1
        for e, eng in enumerate(engines):      # note who is idle because of the bound
            if not eng.load() and blocked_since[e] is None and next_group < total_groups:
                blocked_since[e] = now

    def unblock(now):
        nonlocal worker_wait
        for e, since in enumerate(blocked_since):
            if since is not None and engines[e].load():
                if now > since:
                    timeline.append((since, now, f"worker {e}", f"waits for weights v{version}"))
                    worker_wait += now - since
                blocked_since[e] = None

    def load_version(v, now):
        """The workers take version v: they pause for weight_load_s, rows keep their tokens."""
        nonlocal version, draining, pending
        version, draining, pending = v, False, None
        for e, eng in enumerate(engines):
            eng.advance(now)
            eng.paused_until = now + inp.weight_load_s
            eng.busy_s += inp.weight_load_s
            if inp.weight_load_s:
                timeline.append((now, now + inp.weight_load_s, f"worker {e}", f"loads v{v}"))
            reschedule(e)
        admit(now)
        unblock(now)

    def train(now):
        """Start the next update if the trainer is free and enough groups are queued."""
        nonlocal trainer_busy, trainer_wait
        if tr["working"] or tr["step"] >= inp.steps or len(queue) < per_update:
            return
        if now > tr["idle_from"]:
            timeline.append((tr["idle_from"], now, "trainer", "waits for groups"))
            trainer_wait += now - tr["idle_from"]
        groups = [queue.popleft() for _ in range(per_update)]
        rows = []
        for g in groups:
            step, first = g // P, (g % P) * G
            rows += lengths[step][first:first + G]
            staleness.append(tr["step"] - group_version[g])
        logprob, update = train_s(inp, rows, slow)
        cost = logprob + update + inp.train_fixed_s
        last = tr["update"] == inp.updates_per_step - 1
        if last:
            cost += inp.step_overhead_s
        timeline.append((now, now + cost, "trainer", f"updates step {tr['step']}.{tr['update']}"))
        trainer_busy += cost
        tr["working"] = True
        push(now + cost, "trainer", "update")

    def trainer_done(now, what):
        nonlocal trainer_busy
        tr["working"] = False
        if what == "update":
            tr["update"] += 1
            if tr["update"] == inp.updates_per_step:        # the step's last update: send weights
                step_end.append(now)
                tr["update"] = 0
                tr["step"] += 1
                push(now + inp.weight_sync_s, "version", tr["step"])
                if inp.weight_sync_trainer_s:
                    timeline.append((now, now + inp.weight_sync_trainer_s, "trainer",
                                     f"sends v{tr['step']}"))
                    trainer_busy += inp.weight_sync_trainer_s
                    tr["working"] = True
                    push(now + inp.weight_sync_trainer_s, "trainer", "sync")
                    return
        tr["idle_from"] = now
        train(now)

    admit(0.0)
    while events and tr["step"] < inp.steps:
        now, _, kind, data = heapq.heappop(events)
        if kind == "engine":
            e, ep = data
            if ep != epoch[e]:
                continue
            eng = engines[e]
            eng.advance(now)
            for g in eng.pop_ended():
                answered = judges[e].call(now)
                group_done[g] = max(group_done[g], answered)
                rows_left[g] -= 1
                if not rows_left[g]:
                    push(group_done[g] + inp.reward_s_per_batch, "ready", g)
            start_rows(e, now)
            reschedule(e)
            if draining and not any(x.load() for x in engines):
                load_version(pending, now)
            else:
                admit(now)
                unblock(now)
        elif kind == "ready":
            queue.append(data)
            train(now)
        elif kind == "trainer":
            trainer_done(now, data)
        elif kind == "version":
            if inp.partial_rollout or not any(x.load() for x in engines):
                load_version(data, now)
            else:                                   # stop starting rows; load once all have ended
                draining, pending = True, data
    if len(step_end) < inp.steps:
        raise RuntimeError(f"the timing model stalled after {len(step_end)} steps")
    end = step_end[-1]
    for e, eng in enumerate(engines):
        eng.advance(end)
    return Result(step_end, trainer_busy, [min(x.busy_s, end) for x in engines], trainer_wait,
                  worker_wait, {}, sorted(seg for seg in timeline if seg[1] > seg[0]), staleness)


def simulate(inp: Inputs, lengths: list[list[int]] | None = None) -> Result:
    """Run the model the inputs ask for."""
    lengths = lengths if lengths is not None else draw_lengths(inp)
    return (simulate_timing if inp.policy == "timing" else simulate_schedule)(inp, lengths)


def compare(inp: Inputs) -> dict:
    """The run and its synchronous baseline on the same completions."""
    lengths = draw_lengths(inp)
    run, base = simulate(inp, lengths), simulate(baseline_of(inp), lengths)
    return {"run": run, "baseline": base, "speedup_total": base.total_s / run.total_s,
            "speedup_step": base.median_step_s / run.median_step_s}


# ---------------------------------------------------------------------------------------------
# A published setting: verl's fully-async trainer, Qwen2.5-Math-7B on 128 H20 GPUs.
# Source: github.com/volcengine/verl, docs/advance/fully_async.md (last updated 12/25/2025),
# "Asynchronous Training on 7B Model" and "128-card 7B Asynchronous Mode Experiment"; the 64:64
# launch script verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_64_64.sh.

VERL_SOURCE = ("volcengine/verl docs/advance/fully_async.md (12/25/2025), "
               "shell/dapo_7b_math_fsdp2_64_64.sh")
VERL_PROMPTS_PER_STEP = 512          # colocate train_batch_size; fully async: 4 syncs x 4 x 32
VERL_GROUP_SIZE = 16                 # rollout.n
VERL_MAX_RESPONSE = 28 * 1024        # max_response_length (1024 * 28 in the script)
VERL_GEN_TP = 4                      # gen_tp: one vLLM engine per 4 GPUs
VERL_SYNC_GPUS = 128                 # colocate sync: every phase on all 128 GPUs
VERL_ROLLOUT_GPUS, VERL_TRAINER_GPUS = 64, 64   # fully_async_policy 64:64
VERL_UPDATES_PER_SYNC = 4            # trigger_parameter_sync_step = 4 (require_batches 4 x mini 32)
VERL_WEIGHT_SYNC_S = 0.02            # checkpoint-engine table: Qwen2.5-Math-7B, 4:4 ranks, 0.02 s
VERL_ENGINE_SLOTS = 16 * 16          # fully_async_rollouter.py: at most 16 samples (prompts of
# rollout.n = 16 rows) in flight per server, i.e. 256 rows per engine. The rollouter starts a
# sample while the samples in flight, queued or started since the last sync stay below
# (1 + staleness_threshold) * 4 * 128: the timing policy's bound (v + 1 + k) * 512 groups started.
# Per-step seconds the doc reports (means over 400 steps): step, gen, old_log_prob, update_actor.
VERL_COLOCATE_128 = {"step": 356.30, "gen": 177.85, "old_log_prob": 53.92, "update_actor": 113.81}
VERL_COLOCATE_64 = {"step": 365.28, "gen": 150.72, "old_log_prob": 70.26, "update_actor": 133.41}
VERL_COLOCATE_128_TOTAL_400 = "1d 16h 48m"
VERL_SYNC_OTHER_S = (VERL_COLOCATE_128["step"] - VERL_COLOCATE_128["gen"]   # 10.72 s of the step
                     - VERL_COLOCATE_128["old_log_prob"] - VERL_COLOCATE_128["update_actor"])
# The 128-card mode and staleness tables (64:64): staleness_threshold -> (step s, 400-step total).
# Staleness 0 is the "stream off policy pipeline" (no partial rollout); the others use
# partial_rollout=True. 2.67x is the 100-step total ratio of the 0.5 run (3h 13m vs 8h 36m).
VERL_ASYNC_64_64 = {0.0: (231.34, "1d 1h 53m"), 0.1: (171.30, "19h 59m"),
                    0.3: (146.11, "17h 20m"), 0.5: (150.63, "17h 22m")}
VERL_HEADLINE = "2.35x-2.67x"

# Not in the doc: assumptions, each stated here.
ASSUMED_VERL_LENGTHS = {"kind": "lognormal", "median": 1500, "sigma": 1.0, "max": VERL_MAX_RESPONSE}
# ^ DAPO responses on this model: mean ~2,500 tokens with a long tail; ~0.2% reach the 28K cap,
#   so most steps' longest completion is at the cap. The doc gives no length statistics.
ASSUMED_VERL_PROMPT_TOKENS = 200     # DAPO-Math-17k prompts with the template (max_prompt_length 2K)
ASSUMED_VERL_DECODE_STEP_S = 0.005   # a: one decode step of a TP-4 7B engine on H20 at small batch
# ^ The prediction leans on this most: the colocate gen time fixes a * (longest row) + b * (an
#   engine's tokens), not a and b apart, and the async rollout's throughput follows b. Over 20
#   steps (staleness 0.5, 'measured' trainer): a = 3 ms -> 1.57x, 5 ms -> 2.19x, 6 ms -> 2.67x.
#   The lengths matter less: median 1000 -> 2.35x, 2500 -> 2.01x; sigma 0.8 -> 2.22x, 1.2 -> 2.08x.
ASSUMED_VERL_ASYNC_TRAINER_OTHER_S = 0.0   # the colocate residual (reward, resharding, vLLM
# wake/sleep: step - gen - old_log_prob - update_actor = 10.72 s) is taken off the async trainer.
VERL_STEPS = 40                      # simulated steps (the doc's runs have 400; step times settle)


def _parse_hm(text: str) -> float:
    """'1d 16h 48m' -> hours."""
    units = {"d": 24.0, "h": 1.0, "m": 1 / 60}
    return sum(float(part[:-1]) * units[part[-1]] for part in text.split())


def verl_inputs(steps: int = VERL_STEPS) -> tuple[Inputs, dict]:
    """The colocate-sync run (128 GPUs, 32 engines) calibrated to the doc's per-step phase times:
    decode_row_s so that the median generation time is the reported gen (a is assumed), the
    log-prob and update costs per token so that their median times are the reported ones, and the
    rest of the step as step_overhead_s. Returns the sync inputs and the calibration."""
    engines = VERL_SYNC_GPUS // VERL_GEN_TP
    sync = Inputs(prompts_per_step=VERL_PROMPTS_PER_STEP, group_size=VERL_GROUP_SIZE, steps=steps,
                  async_steps=0, colocated=True, rollout_workers=engines,
                  trainer_devices=VERL_SYNC_GPUS, decode_step_s=ASSUMED_VERL_DECODE_STEP_S,
                  lengths=ASSUMED_VERL_LENGTHS, prompt_tokens=ASSUMED_VERL_PROMPT_TOKENS,
                  max_batch_rows=None).check()
    lengths = draw_lengths(sync)
    # A ragged batch that drops ended rows costs a * max + b * sum; a step waits for its slowest
    # engine, so the step's gen time is the max over engines: piecewise linear in b, bisected.
    shares = [[[lengths[t][r] for p in range(w, sync.prompts_per_step, engines)
                for r in range(p * sync.group_size, (p + 1) * sync.group_size)]
               for w in range(engines)] for t in range(steps)]

    def gen(b):
        return statistics.median(max(sync.decode_step_s * max(s) + b * sum(s) for s in step)
                                 for step in shares)
    lo, hi = 0.0, 1e-2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gen(mid) < VERL_COLOCATE_128["gen"] else (lo, mid)
    tokens = statistics.median(sum(step) + sync.prompt_tokens * len(step) for step in lengths)
    per_token = lambda seconds, gpus: seconds * gpus / tokens              # noqa: E731
    sync = dataclasses.replace(
        sync, decode_row_s=lo,
        logprob_s_per_token=per_token(VERL_COLOCATE_128["old_log_prob"], VERL_SYNC_GPUS),
        train_s_per_token=per_token(VERL_COLOCATE_128["update_actor"], VERL_SYNC_GPUS),
        step_overhead_s=VERL_SYNC_OTHER_S)
    calib = {"decode_row_s": lo, "median_tokens_per_step": tokens,
             "update_s_per_token_64gpu_row": per_token(VERL_COLOCATE_64["update_actor"],
                                                       VERL_TRAINER_GPUS)}
    return sync, calib


def verl_async_inputs(sync: Inputs, calib: dict, staleness: float, trainer_cost: str) -> Inputs:
    """The fully-async 64:64 run: 16 engines of 256 slots, 64 trainer GPUs, old log-probs from the
    rollout (use_rollout_log_probs=True: no log-prob pass on the trainer). trainer_cost 'linear':
    the 128-GPU row's per-GPU update cost (perfect scaling); 'measured': the doc's 64-GPU colocate
    row's update time (scaling as measured there)."""
    train = (sync.train_s_per_token if trainer_cost == "linear"
             else calib["update_s_per_token_64gpu_row"])
    return dataclasses.replace(
        sync, policy="timing", colocated=False, async_steps=staleness,
        rollout_workers=VERL_ROLLOUT_GPUS // VERL_GEN_TP, trainer_devices=VERL_TRAINER_GPUS,
        max_batch_rows=VERL_ENGINE_SLOTS, continuous_batching=True,
        logprob_s_per_token=0.0, train_s_per_token=train,
        step_overhead_s=ASSUMED_VERL_ASYNC_TRAINER_OTHER_S, updates_per_step=VERL_UPDATES_PER_SYNC,
        weight_sync_s=VERL_WEIGHT_SYNC_S, weight_sync_trainer_s=VERL_WEIGHT_SYNC_S,
        weight_load_s=VERL_WEIGHT_SYNC_S,   # NCCL sync: both sides take part; rollout paused
        partial_rollout=staleness > 0).check()


def published_verl(steps: int = VERL_STEPS) -> dict:
    """Predicted speedups of the fully-async 64:64 runs over colocate sync, next to the doc's."""
    sync, calib = verl_inputs(steps)
    lengths = draw_lengths(sync)
    base = simulate(sync, lengths)
    rows = []
    for staleness, (step_s, total) in VERL_ASYNC_64_64.items():
        for cost in ("measured", "linear"):
            run = simulate(verl_async_inputs(sync, calib, staleness, cost), lengths)
            rows.append({"staleness": staleness, "trainer_cost": cost,
                         "sim_step_s": run.median_step_s,
                         "sim_speedup_step": base.median_step_s / run.median_step_s,
                         "sim_speedup_total": base.total_s / run.total_s,
                         "sim_trainer_idle": run.trainer_idle, "sim_worker_idle": run.worker_idle,
                         "sim_staleness_max": max(run.staleness),
                         "pub_step_s": step_s,
                         "pub_speedup_step": VERL_COLOCATE_128["step"] / step_s,
                         "pub_speedup_total_400":
                             _parse_hm(VERL_COLOCATE_128_TOTAL_400) / _parse_hm(total)})
    return {"sync": base, "calib": calib, "rows": rows}


def print_published(out: dict) -> None:
    base, calib = out["sync"], out["calib"]
    ph = base.summary()["phase_median_s"]
    print(f"verl fully-async vs colocate sync, Qwen2.5-Math-7B, 128 H20 GPUs ({VERL_SOURCE})")
    print(f"calibrated: decode_row_s {calib['decode_row_s'] * 1e6:.1f} us (decode_step_s "
          f"{ASSUMED_VERL_DECODE_STEP_S * 1e3:.1f} ms assumed), "
          f"{calib['median_tokens_per_step'] / 1e6:.1f}M tokens/step from the assumed lengths")
    print(f"colocate sync 128 GPUs, sim vs published per step: step {base.median_step_s:.1f} vs "
          f"{VERL_COLOCATE_128['step']:.2f} s; gen {ph['decode']:.1f} vs {VERL_COLOCATE_128['gen']}; "
          f"old_log_prob {ph['logprob']:.1f} vs {VERL_COLOCATE_128['old_log_prob']}; update + other "
          f"{ph['update']:.1f} vs {VERL_COLOCATE_128['update_actor']} + {VERL_SYNC_OTHER_S:.2f}")
    print("fully_async 64:64 (16 engines x 256 slots, 64 trainer GPUs), trainer cost per token from "
          "'measured' = the doc's 64-GPU colocate update row, 'linear' = the 128-GPU row scaled")
    print("x/step: ratio of median step times; x/total: of total times over the simulated steps")
    print(f"{'staleness':>9} {'trainer':>9} {'sim step':>9} {'sim x/step':>10} {'sim x/total':>11} "
          f"{'tr idle':>7} {'wk idle':>7} {'max stale':>9} | "
          f"{'pub step':>8} {'pub x/step':>10} {'pub x/400':>9}")
    for r in out["rows"]:
        print(f"{r['staleness']:>9} {r['trainer_cost']:>9} {r['sim_step_s']:>9.1f} "
              f"{r['sim_speedup_step']:>9.2f}x {r['sim_speedup_total']:>10.2f}x "
              f"{r['sim_trainer_idle']:>7.2f} {r['sim_worker_idle']:>7.2f} "
              f"{r['sim_staleness_max']:>9.0f} | {r['pub_step_s']:>8.2f} "
              f"{r['pub_speedup_step']:>9.2f}x {r['pub_speedup_total_400']:>8.2f}x")
    print(f"published headline: {VERL_HEADLINE} (staleness 0.5, partial rollout; "
          "400- and 100-step totals)")


# ---------------------------------------------------------------------------------------------
# Command line

FLAGS = [  # flag, input, type, help
    ("--prompts", "prompts_per_step", int, "prompts (groups) per step"),
    ("--group-size", "group_size", int, "completions per prompt"),
    ("--steps", "steps", int, "steps to simulate"),
    ("--async-steps", "async_steps", float, "k: staleness bound (0: synchronous)"),
    ("--policy", "policy", str, "schedule (grpo) or timing (verl fully async)"),
    ("--seed", "seed", int, "seed for the completion lengths"),
    ("--rollout-workers", "rollout_workers", int, "R: rollout workers (devices or processes)"),
    ("--trainer-devices", "trainer_devices", int, "D: trainer devices"),
    ("--split", "split", str, "groups or steps: how a step's work is dealt to the workers"),
    ("--decode-step-s", "decode_step_s", float, "a: seconds per decode step"),
    ("--decode-row-s", "decode_row_s", float, "b: seconds per decode step per row in the batch"),
    ("--max-batch-rows", "max_batch_rows", int, "rows a worker decodes at once"),
    ("--length", None, int, "every completion this long"),
    ("--lengths", None, str, "measured lengths to resample from, comma-separated"),
    ("--lognormal", None, str, "MEDIAN,SIGMA,MAX: lognormal lengths capped at MAX"),
    ("--prompt-tokens", "prompt_tokens", int, "prompt tokens per row (for the trainer's passes)"),
    ("--logprob-s-per-token", "logprob_s_per_token", float, "log-prob pass, one trainer device"),
    ("--train-s-per-token", "train_s_per_token", float, "forward + backward, one trainer device"),
    ("--train-fixed-s", "train_fixed_s", float, "per update"),
    ("--step-overhead-s", "step_overhead_s", float, "per step, on the trainer"),
    ("--updates-per-step", "updates_per_step", int, "updates per step (timing: streamed)"),
    ("--reward-s", "reward_s_per_completion", float, "reward latency per completion"),
    ("--reward-s-per-batch", "reward_s_per_batch", float, "reward latency per batch"),
    ("--reward-concurrency", "reward_concurrency", int, "reward calls at once per worker (0: any)"),
    ("--weight-sync-s", "weight_sync_s", float, "update end -> weights at the workers"),
    ("--weight-sync-trainer-s", "weight_sync_trainer_s", float, "trainer blocked by the sync"),
    ("--weight-load-s", "weight_load_s", float, "worker loading new weights"),
    ("--shared-cores-slowdown", "shared_cores_slowdown", float,
     "phase slowdown when worker and trainer split one machine's cores"),
]
SWITCHES = [("continuous-batching", "continuous_batching"),
            ("drop-finished-rows", "drop_finished_rows"),
            ("reward-overlaps-generation", "reward_overlaps_generation"),
            ("colocated", "colocated"), ("partial-rollout", "partial_rollout")]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__[__doc__.index("The system modelled"):],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", help="JSON file of inputs (flags override it)")
    ap.add_argument("--published", choices=["verl-qwen2.5-7b"], help="reproduce a published setting")
    for flag, _, kind, text in FLAGS:
        ap.add_argument(flag, type=kind, help=text)
    for flag, _ in SWITCHES:
        ap.add_argument(f"--{flag}", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--timeline", type=int, default=0, metavar="N",
                    help="print the first N steps' timeline")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    return ap.parse_args(argv)


def inputs_from_args(args: argparse.Namespace) -> Inputs:
    data = {}
    if args.inputs:
        with open(args.inputs) as f:
            data = json.load(f)
    for flag, name, _, _ in FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if name and value is not None:
            data[name] = value
    for flag, name in SWITCHES:
        if getattr(args, flag.replace("-", "_")) is not None:
            data[name] = getattr(args, flag.replace("-", "_"))
    if args.length is not None:
        data["lengths"] = {"kind": "constant", "value": args.length}
    if args.lengths:
        data["lengths"] = {"kind": "samples", "values": [int(x) for x in args.lengths.split(",")]}
    if args.lognormal:
        median, sigma, cap = (float(x) for x in args.lognormal.split(","))
        data["lengths"] = {"kind": "lognormal", "median": median, "sigma": sigma, "max": int(cap)}
    return load_inputs(data)


def print_run(name: str, res: Result) -> None:
    s = res.summary()
    print(f"{name:>9}: median step {s['median_step_s']:.3f} s, total {s['total_s']:.3f} s, "
          f"trainer idle {s['trainer_idle']:.1%}, worker idle {s['worker_idle']:.1%}, trainer waited "
          f"{s['trainer_wait_s']:.3f} s for groups, workers waited {s['worker_wait_s']:.3f} s "
          "for weights"
          + (f", staleness mean {s['staleness']['mean']:.2f} max {s['staleness']['max']:.0f}"
             if "staleness" in s else ""))


def print_timeline(res: Result, steps: int) -> None:
    until = res.step_end[min(steps, len(res.step_end)) - 1]
    for start, end, who, what in res.timeline:
        if start < until:
            print(f"  {start:10.3f} - {end:10.3f}  {who:>10}  {what}")


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.published:
        out = published_verl(args.steps or VERL_STEPS)
        if args.json:
            out = {"sync": out["sync"].summary(), "calib": out["calib"], "rows": out["rows"]}
            print(json.dumps(out, indent=1))
        else:
            print_published(out)
        return
    inp = inputs_from_args(args)
    out = compare(inp)
    if args.json:
        print(json.dumps({"run": out["run"].summary(), "baseline": out["baseline"].summary(),
                          "speedup_total": out["speedup_total"], "speedup_step": out["speedup_step"]},
                         indent=1))
        return
    print_run("run", out["run"])
    print_run("baseline", out["baseline"])
    print(f"speedup over the baseline: {out['speedup_step']:.2f}x per step (median), "
          f"{out['speedup_total']:.2f}x in total")
    if args.timeline:
        print("run timeline:")
        print_timeline(out["run"], args.timeline)


if __name__ == "__main__":
    sys.exit(main())
