"""A run put together from its config, with every start-up check in one place and one order.

    config ──▶ with_given ──▶ checks on the config (choices, processes, trackers, engine, push)
           ──▶ checkpoint? (resume=; queued groups need async_steps) ──▶ finished: nothing to do
           ──▶ data, rewards, agent ──▶ model and tokenizer ──▶ checks on data and model
               (async_steps off CUDA, images, prompt lengths, lr, selection, batch, rewards on one row)
           ──▶ the policy GRPO starts from (resumed weights, or the cold start)
           ──▶ learner (reference, sampler, optimizer) ──▶ resumed state ──▶ group source
               (inline for async_steps=0, the pipeline's rollout workers otherwise)

`train.py` runs the loop on the `Run` this returns; `grpo explain` builds its own from the same
parts (make_learner, cold_start).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from grpo import build, sft
from grpo.config import TrainConfig, sampler_own_keys
from grpo.config.plan import plan_of
from grpo.data import PromptStream
from grpo.models import frozen_copy, merge_adapter, whole_model
from grpo.pipeline import Groups, Work, split_threads
from grpo.pipeline.inline import InlineGroups, draw_groups, sample_scored_groups, score_rollout
from grpo.rewards import RewardFn
from grpo.run import distributed, resume
from grpo.run.checkpoint import save_model_dir
from grpo.run.progress import Progress
from grpo.run.tracking import check_trackers
from grpo.sampling import HFSampler
from grpo.sampling.episodes import EpisodeSampler
from grpo.sft import supervised_finetune
from grpo.step import GroupSource, Learner
from grpo.update import make_optimizer, make_scheduler


@dataclass
class Run:
    """What the loop needs, assembled. A finished run (`resume` on a run at `steps`) has only
    its config, log and checkpoint: there is nothing to train."""
    config: TrainConfig                  # with the rows and model given from Python (with_given)
    world: distributed.World
    log: Callable[[str], None]           # quiet on every rank but 0
    write_files: bool                    # rank 0's, unless the caller asked for no files
    checkpoint: Path | None              # the one resumed from
    finished: bool = False
    data: build.Data | None = None       # rows, rewards and the agent (tools, environment)
    tokenizer: object = None
    learner: Learner | None = None       # policy, reference, sampler, optimizer, the Plan
    stream: PromptStream | None = None   # the prompts' order, resumed
    source: GroupSource | None = None    # where each step's groups come from
    groups: Groups | None = None         # the pipeline, when async_steps > 0 (also `source`)
    client_model: object = None          # async_steps on an engine client: the copy it loads versions into
    engine: object = None                # an engine given from Python (train(engine=))
    first: int = 1                       # the first step to take
    accuracy: float = math.nan           # the last held-out accuracy (a resumed run's)

    @property
    def run_dir(self) -> Path:
        return Path(self.config.run.output_dir)

    @property
    def kept(self) -> int:
        """The last step whose records stay: none from step 0, whose evaluation is written again."""
        return self.first - 1 if self.checkpoint is not None else -1


def assemble(config: TrainConfig, *, reward_fns: list[RewardFn] | None = None,
             tools: list[Callable] | None = None, environment: Callable[[], object] | None = None,
             dataset=None, eval_dataset=None, model=None, tokenizer=None, engine=None,
             log: Callable[[str], None] = print, write_files: bool = True) -> Run:
    """The run `train` takes, every check said before any work (the arguments are train's)."""
    given = {"dataset": dataset, "eval_dataset": eval_dataset}
    c = build.with_given(config, given, model, tokenizer)
    if c.run.threads:
        torch.set_num_threads(c.run.threads)
    check_push(c)
    world = distributed.setup()
    build.seed_everything(c.run.seed)
    build.check_choices(c)
    check_world(c, world)
    check_trackers(c.run.report_to)
    build.check_engine(c, engine)
    write_files = write_files and world.is_main   # only rank 0 writes; the others stay quiet
    if not world.is_main:
        log = lambda line: None  # noqa: E731
    run_dir = Path(c.run.output_dir)
    checkpoint = resume.find(c, log) if write_files or c.run.resume else None
    if c.run.resume:
        resume.found_everywhere(checkpoint, world)
    check_pipeline(c, checkpoint)
    run = Run(c, world, log, write_files, checkpoint)
    if checkpoint is not None and resume.finished(checkpoint, c.run.steps, run_dir):
        run.finished = True
        return run
    data = build.load_data(c, reward_fns, tools=tools, environment=environment, log=log, given=given)
    if checkpoint is not None:
        resume.check_data(checkpoint, data.fingerprints, log)
    if model is not None:
        policy, tokenizer = build.given_model(c, model, tokenizer, log)
    else:
        policy, tokenizer = build.load_model_and_tokenizer(c, run_dir if write_files else None, log,
                                                           world)
    distributed.broadcast_parameters(policy, world)
    check_pipeline(c, None, policy)
    build.check_images(c, tokenizer, data)
    build.fit_prompts(c, tokenizer, getattr(policy.config, "max_position_embeddings", None), data, log)
    build.check_lr(c, policy, log)
    build.check_selection(c, log, data.agent)
    build.check_batch(c, data, log)
    build.check_rewards(c, tokenizer, data)
    policy = resume_or_cold_start(c, policy, tokenizer, data, checkpoint, log,
                                  run_dir if write_files else None, world)
    if uses_client(c):   # unsharded, and on the CPU when an engine holds the weights it samples with
        run.client_model = copy.deepcopy(policy)
        if c.sampling.sampler != "hf" or engine is not None:
            run.client_model.to("cpu")
        run.engine = engine
    learner = make_learner(c, policy, tokenizer, data.agent, world, resume.reference_state(checkpoint),
                           engine)
    if c.run.parallel == "fsdp" and not distributed.initialized():
        log("parallel=fsdp shards only under torchrun; this one process trains the whole model")
    run.data, run.tokenizer, run.learner = data, tokenizer, learner
    run.stream = PromptStream(data.train_rows, c.run.seed)
    if checkpoint is not None:
        state = resume.restore(learner, run.stream, checkpoint)
        run.first, run.accuracy = state["step"] + 1, state["accuracy"]
        log(f"resuming from {checkpoint} at step {run.first}/{c.run.steps}")
    return run


def start_groups(run: Run) -> None:
    """The group source: with async_steps, rollout workers forked now (before any thread of
    the run starts); else the synchronous loop's sampling, inline."""
    c = run.config
    run.groups = start_pipeline(c, run.learner, run.tokenizer, run.data, run.stream, run.first,
                                run.checkpoint, run.world, run.log, run.client_model, run.engine)
    run.source = run.groups if run.groups is not None else InlineGroups(c, run.learner, run.tokenizer,
                                                                        run.data, run.stream)


def check_push(c: TrainConfig) -> None:
    """push_to_hub needs the hub and a token: said at start, not after the run."""
    if not c.run.push_to_hub:
        return
    from huggingface_hub import constants, get_token
    if constants.HF_HUB_OFFLINE:
        raise build.ConfigError("config key 'push_to_hub' uploads final/ to the hub, and HF_HUB_OFFLINE "
                                "is set; unset it, or leave push_to_hub empty")
    if not get_token():
        raise build.ConfigError("config key 'push_to_hub' needs a hub token with write access: set "
                                "HF_TOKEN or run `hf auth login`")


def resume_or_cold_start(c: TrainConfig, policy, tokenizer, data: build.Data, checkpoint: Path | None,
                         log, save_to: Path | None = None,
                         world: distributed.World = distributed.World()):
    """The policy GRPO starts from: the checkpoint's weights when resuming (its config compared
    with this one), else the cold start when `sft_steps` asks for it. With LoRA the cold start's
    adapter is merged into the base under a fresh adapter (with_fresh_adapter), so the reference,
    the adapter off, is the policy at the start of GRPO; a resumed run merges it again."""
    if checkpoint is not None:
        for line in resume.changes_said(c, checkpoint):
            log(line)
        if (cold := resume.cold_start_under(policy, checkpoint)) is not None:
            policy = with_fresh_adapter(c, merge_adapter(policy.merge_and_unload(), cold), cold, world)
        resume.load_weights(policy, checkpoint)
    elif c.run.sft_steps:
        cold_start(c, policy, tokenizer, data, log, save_to, world)
        if hasattr(policy, "peft_config"):     # LoRA: its adapter, kept, merged into the base
            where = save_model_dir(policy, tokenizer, save_to / "cold_start") if save_to else None
            policy = with_fresh_adapter(c, policy.merge_and_unload(), where, world)
    elif c.data.dataset:
        column = ("its 'completion' column is imitated with sft_steps=N" if data.demonstrations
                  else "it has no 'completion' column to imitate")
        log(f"cold start: off (sft_steps=0, the default with dataset=); {column}")
    return policy


def with_fresh_adapter(c: TrainConfig, base, named: Path | str | None = None,
                       world: distributed.World = distributed.World()):
    """A fresh LoRA adapter (B = 0) on `base`, a model with the cold start's adapter merged in:
    policy, reference (the adapter off), sampler and evaluation all start from the cold-started
    weights. `named` (the cold start's adapter directory) is recorded as the base of the adapter
    GRPO trains, so loading final/ merges both (models.load_policy). Every rank takes rank 0's
    new adapter."""
    if named is not None:
        base.name_or_path = str(Path(named).resolve())
    policy = build.add_lora(base, c)
    distributed.broadcast_parameters(policy, world)
    return policy


def uses_client(c: TrainConfig) -> bool:
    """async_steps samples in an engine client, a thread of each trainer process (no fork): on
    vLLM (in this process or servers), or with grpo's own sampler when rollout_workers=0."""
    return bool(c.pipeline.async_steps) and (c.sampling.sampler != "hf" or not c.pipeline.rollout_workers)


def start_pipeline(c: TrainConfig, learner: Learner, tokenizer, data: build.Data, stream: PromptStream,
                   first: int, checkpoint: Path | None, world: distributed.World, log,
                   client_model=None, engine=None) -> Groups | None:
    """With async_steps = k > 0, where this trainer process's groups come from (pipeline/): an
    engine client (a thread) or forked rollout workers, which sample step t's groups from the
    weights after step t-1-k with step t's draws. With forked workers the machine's cores are
    split between the trainer and them (torch threads per role). `client_model`: the copy of the
    policy (unsharded) that the client loads each version into."""
    p = c.pipeline
    if not p.async_steps:          # check_pipeline has refused a checkpoint with queued groups
        return None
    ahead = resume.pipeline_state(checkpoint, world)
    client = uses_client(c)
    workers = 0 if client else p.rollout_workers
    trainer_threads, worker_threads = split_threads(c.run.threads or torch.get_num_threads(), workers)
    trainer_threads, worker_threads = p.trainer_threads or trainer_threads, p.worker_threads or worker_threads
    torch.set_num_threads(trainer_threads)
    if workers:
        log(f"async_steps={p.async_steps}: {p.rollout_workers} rollout worker(s) with {worker_threads} "
            f"torch thread(s) each, the trainer with {trainer_threads}")

    def sample(sampler, stream, step, share):
        timer = {"sample": 0.0, "reward": 0.0}
        rollout, extra = sample_scored_groups(c, sampler, tokenizer, data, stream, timer, share, step)
        return rollout, extra, timer

    def draw(sampler, stream, step, share):   # without dynamic sampling, scoring can wait
        return draw_groups(c, sampler, tokenizer, stream, c.sampling.prompts_per_step, share, step,
                           agent=data.agent)

    work = Work(policy=learner.policy, rows=data.train_rows, seed=c.run.seed, steps=c.run.steps,
                k=p.async_steps, make_sampler=lambda model: make_sampler(c, model, tokenizer, data.agent),
                sample=sample, pad_token_id=tokenizer.pad_token_id, threads=worker_threads,
                timeout_s=p.transfer_timeout_s,
                draw=None if c.sampling.dynamic_sampling else draw,
                score=lambda rollout: score_rollout(c, rollout, data))
    pair = None
    if client:
        model = client_model if client_model is not None else copy.deepcopy(learner.policy)
        barrier = None
        if world.size > 1:
            # the processes' clients meet in a group of their own, away from the trainers'
            # collectives: around each weight load of the servers they share, and in each round
            # of dynamic sampling
            import datetime
            import torch.distributed as dist
            group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=p.transfer_timeout_s))
            world = distributed.World(world.rank, world.size, group)
            if c.sampling.sampler == "vllm_server":
                barrier = lambda: dist.barrier(group=group)  # noqa: E731
        sampler = make_sampler(c, model, tokenizer, data.agent, engine, sync=False, barrier=barrier,
                               world=world, log=log)
        where = getattr(getattr(sampler, "engine", None), "name", None) or "grpo's own sampler"
        log(f"async_steps={p.async_steps}: step t's groups are sampled on {where} from the weights "
            f"after step t-{1 + p.async_steps}, by a thread of this process")
        pair = (model, sampler, engine is None)
    return Groups(work, workers=workers, world=world, first=first,
                  stream_state=stream.state_dict(), queued=ahead["queued"] if ahead else None,
                  restarts=p.worker_restarts, log=log, client=pair)


def check_pipeline(c: TrainConfig, checkpoint: Path | None, policy=None) -> None:
    """A checkpoint whose groups are queued resumes only with async_steps; async_steps forks
    rollout workers, which a CUDA model cannot be (`policy` given once it is loaded)."""
    if not c.pipeline.async_steps:
        if checkpoint is not None and (checkpoint / "pipeline.pt").is_file():
            raise build.ConfigError(
                f"config key 'async_steps': checkpoint {checkpoint} was written with async_steps "
                f"(its groups for the next steps are queued in it); resume it with the async_steps "
                f"of its config.yaml")
        return
    if policy is not None and not uses_client(c) and any(t.is_cuda for t in policy.parameters()):
        raise build.ConfigError(
            "config key 'rollout_workers': the rollout workers are forks of the trainer, and a CUDA "
            "context does not survive fork; set rollout_workers=0 (a thread of the trainer samples "
            "on the GPU) or sample on vLLM (sampler=vllm or vllm_server; docs/guides/async.md)")


def check_world(c: TrainConfig, world: distributed.World) -> None:
    """What several processes cannot do yet, or cannot split evenly, said before any work."""
    shares = world.size * (1 if uses_client(c) else max(1, c.pipeline.rollout_workers))
    if c.pipeline.async_steps and c.sampling.prompts_per_step % shares:
        raise build.ConfigError(
            f"config key 'prompts_per_step' ({c.sampling.prompts_per_step}) must be divisible by the "
            f"number of rollout workers ({shares}: "
            + ("one engine client" if uses_client(c) else f"rollout_workers={c.pipeline.rollout_workers}")
            + f" per trainer process x {world.size}): each worker samples whole groups")
    if c.model.train_vision and c.run.parallel == "fsdp" and distributed.initialized():
        raise build.ConfigError("config key 'train_vision': a trained vision tower with parallel=fsdp is "
                                "not supported yet (the tower runs once per prompt, before the sharded "
                                "forward, and is gathered only for it); use parallel=ddp, or keep the "
                                "tower frozen")
    if c.pipeline.async_steps and not uses_client(c) and c.run.parallel == "fsdp" and distributed.initialized():
        raise build.ConfigError("config key 'parallel': fsdp with forked rollout workers is not "
                                "supported (a fork cannot take part in the shards' collectives); set "
                                "rollout_workers=0 (a thread of each trainer samples) or sample on vLLM")
    if world.size == 1:
        return
    if c.sampling.prompts_per_step % world.size:
        raise build.ConfigError(
            f"config key 'prompts_per_step' ({c.sampling.prompts_per_step}) must be divisible by the "
            f"number of processes ({world.size}): each process takes whole groups")
    if c.sampling.dynamic_sampling and c.pipeline.async_steps and not uses_client(c):
        preset = f" (set by algorithm={c.run.algorithm})" if c.run.algorithm == "dapo" else ""
        raise build.ConfigError(f"config key 'dynamic_sampling'{preset} with async_steps is not supported "
                                "and forked rollout workers on more than one process (each trainer's "
                                "workers would refill only their own share); set rollout_workers=0 (a "
                                "thread of each trainer samples, and they refill together) or sample on vLLM")
    if c.loss.advantage == "batch_norm":
        raise build.ConfigError("config key 'advantage': batch_norm needs the whole batch's rewards "
                                "and is not supported with more than one process yet")


def make_learner(c: TrainConfig, policy, tokenizer, agent: build.Agent | None = None,
                 world: distributed.World = distributed.World(),
                 ref_state: dict | None = None, engine=None) -> Learner:
    """The reference (none when beta = 0), the sampler (on `engine` when one is given), AdamW
    and its schedule; with `parallel=fsdp` on several processes, policy and reference sharded
    first."""
    # With LoRA the reference is the policy with its adapter switched off: the base, into which
    # a cold start was merged (resume_or_cold_start), so the policy at the start of GRPO.
    # A frozen image encoder is shared with the reference, except under FSDP2, which shards each
    # model's parameters on its own (a module cannot belong to two sharded models).
    sharding = c.run.parallel == "fsdp" and distributed.initialized()
    plan = plan_of(c)
    ref = frozen_copy(policy, share_tower=not sharding) if plan.reference == "copy" else None
    if ref is not None and ref_state is not None:   # a resumed run's reference
        ref.load_state_dict(ref_state, strict=False)
    if sharding:                                                 # under torchrun, any size
        bf16 = c.optim.mixed_precision == "bf16"
        policy = distributed.shard(policy, world, bf16)
        ref = distributed.shard(ref, world, bf16) if ref is not None else None
    optimizer = make_optimizer(policy, c.optim.lr, c.optim.weight_decay)
    # with async_steps the engines sample in the pipeline's client; the learner's sampler only
    # evaluates, with grpo's own sampler on the policy
    own = "hf" if c.pipeline.async_steps else None
    return Learner(
        policy=policy, ref=ref,
        sampler=make_sampler(c, policy, tokenizer, agent, None if own else engine, kind=own,
                             world=world),
        optimizer=optimizer,
        scheduler=make_scheduler(optimizer, c.optim.warmup_steps, c.run.steps, c.optim.lr_schedule),
        world=world, plan=plan,
    )


def make_sampler(c: TrainConfig, policy, tokenizer, agent: build.Agent | None = None, engine=None,
                 *, kind: str | None = None, sync: bool = True, barrier=None,
                 world: distributed.World | None = None, log=print):
    """The HF sampler on the policy itself, or an engine with weights of its own (vLLM in this
    process: `sampling/vllm.py`, vLLM servers, or `engine` when one is given) loaded from the
    same weights (`sync`); with tools or an environment, either samples episodes. `kind`: the
    sampler, when not the config's. Servers are shared by every trainer process: process 0
    sends the weights, and `barrier` (default: all processes') holds the others around it."""
    s = c.sampling
    kind = kind or s.sampler
    cut = sampler_own_keys(s)
    if agent is not None and cut:      # a task's own tools make an agent run without `tools`
        raise build.ConfigError(f"config key {cut[0]}: single-turn sampling applies it; multi-turn "
                                "episodes (tools, environment, a task with tools) do not yet")
    if agent is not None and kind == "hf":
        return EpisodeSampler(policy, tokenizer, limits=agent.limits, tools=agent.tools,
                              call_format=build.call_format_of(c, tokenizer, agent),
                              make_env=agent.make_env,
                              temperature=s.temperature, top_p=s.top_p)
    if kind == "hf":
        return HFSampler(policy, tokenizer, max_new_tokens=s.max_new_tokens,
                         temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p,
                         stop=tuple(s.stop), repetition_penalty=s.repetition_penalty)
    from grpo.sampling.engine import EngineError, EngineSampler
    if engine is None and kind == "vllm_server":
        from grpo.sampling.engine import Engines
        from grpo.sampling.vllm import VLLMServerEngine
        world = world or distributed.World()
        try:
            if s.vllm_weights_dir:
                Path(s.vllm_weights_dir).mkdir(parents=True, exist_ok=True)
            servers = [VLLMServerEngine(url, timeout_s=s.vllm_timeout_s,
                                        weights_dir=s.vllm_weights_dir or None) for url in s.vllm_url]
        except EngineError as e:
            raise build.ConfigError(f"config key 'vllm_url': {e}") from None
        if barrier is None and world.size > 1:
            import torch.distributed as dist
            barrier = dist.barrier
        engine = Engines(servers, sends=world.is_main, barrier=barrier, log=log)
    if engine is None:
        from grpo.sampling.vllm import VLLMEngine, VLLMUnavailable
        base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
        try:
            engine = VLLMEngine(whole_model(base.name_or_path), seed=c.run.seed, dtype=c.model.dtype,
                                gpu_memory_utilization=s.vllm_gpu_memory_utilization,
                                sleep=s.vllm_sleep, lora_rank=c.model.lora_r)
        except VLLMUnavailable as e:
            raise build.ConfigError(f"config key 'sampler': {e}") from None
    sampler = EngineSampler(engine, tokenizer, max_new_tokens=s.max_new_tokens,
                            temperature=s.temperature, top_p=s.top_p, seed=c.run.seed,
                            sleep=s.vllm_sleep, agent=agent)
    if agent is not None:
        sampler.call_format = build.call_format_of(c, tokenizer, agent)
    if sync:
        sampler.sync(policy)   # a cold start or a resumed checkpoint changed the weights it loaded
    return sampler


def cold_start(c: TrainConfig, policy, tokenizer, data: build.Data, log, save_to: Path | None = None,
               world: distributed.World = distributed.World()) -> None:
    """`sft_steps` supervised steps on the demonstrations. SIGTERM or Ctrl-C finishes the step,
    keeps the model in `save_to`/cold_start (sft.stopped) and raises resume.Stopped."""
    if not data.demonstrations:
        raise build.ConfigError(f"config key 'sft_steps' asks for a cold start, but the dataset "
                                f"{c.data.dataset} has no 'completion' column to imitate; add one, "
                                "or leave sft_steps out (with dataset= it is 0 unless set)")
    rows = [row for row, _, _ in data.demonstrations]
    prompts = build.prompt_texts(c, tokenizer, rows, data.agent)
    pairs = [(prompt + context, target, row.get("images") or [])
             for prompt, (row, context, target) in zip(prompts, data.demonstrations)]

    with resume.StopOnSignal(log, "keeping the model as it is") as stop, \
            Progress("cold start", c.run.sft_steps, log, every=10) as bar:
        losses = supervised_finetune(policy, tokenizer, pairs, steps=c.run.sft_steps, lr=c.run.sft_lr,
                                     batch_size=c.run.sft_batch_size, seed=c.run.seed,
                                     on_step=lambda step, loss, seconds: bar.update(
                                         step, f"loss {loss:.3f}  {seconds:.2f}s/step"),
                                     stop=lambda: stop.requested(world))
    signum = stop.requested(world)
    if signum:
        raise sft.stopped(signum, len(losses), c.run.sft_steps, policy, tokenizer, save_to)
