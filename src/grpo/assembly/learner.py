"""The policy GRPO starts from (a resumed checkpoint's weights, or the cold start; with LoRA a
fresh adapter over the merged base), and the learner around it: reference, sampler (grpo's own,
episodes, or an engine), optimizer and schedule, with the Plan decided once."""

from __future__ import annotations

from pathlib import Path

from grpo import sft
from grpo.assembly.model import add_lora, load_teacher
from grpo.inputs import Agent, Data, call_format_of, prompt_texts
from grpo.config import ConfigError, TrainConfig, sampler_own_keys
from grpo.config.plan import plan_of
from grpo.models import frozen_copy, merge_adapter, whole_model
from grpo.run import distributed, resume
from grpo.run.checkpoint import save_model_dir
from grpo.run.progress import Progress
from grpo.sampling import own_sampler
from grpo.sampling.episodes import EpisodeSampler
from grpo.sft import supervised_finetune
from grpo.step import Learner
from grpo.update import make_optimizer, make_scheduler


def resume_or_cold_start(c: TrainConfig, policy, tokenizer, data: Data, checkpoint: Path | None,
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
    policy = add_lora(base, c)
    distributed.broadcast_parameters(policy, world)
    return policy


def cold_start(c: TrainConfig, policy, tokenizer, data: Data, log, save_to: Path | None = None,
               world: distributed.World = distributed.World()) -> None:
    """`sft_steps` supervised steps on the demonstrations. SIGTERM or Ctrl-C finishes the step,
    keeps the model in `save_to`/cold_start (sft.stopped) and raises resume.Stopped."""
    if not data.demonstrations:
        raise ConfigError(f"config key 'sft_steps' asks for a cold start, but the dataset "
                          f"{c.data.dataset} has no 'completion' column to imitate; add one, "
                          "or leave sft_steps out (with dataset= it is 0 unless set)")
    rows = [row for row, _, _ in data.demonstrations]
    prompts = prompt_texts(c, tokenizer, rows, data.agent)
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


def make_learner(c: TrainConfig, policy, tokenizer, agent: Agent | None = None,
                 world: distributed.World = distributed.World(),
                 ref_state: dict | None = None, engine=None, log=print) -> Learner:
    """The reference (none when beta = 0), the distillation teacher (with `teacher`), the sampler
    (on `engine` when one is given), AdamW and its schedule; with `parallel=fsdp` on several
    processes, policy and reference sharded first."""
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
    own = "hf" if plan.groups != "inline" else None
    return Learner(
        policy=policy, ref=ref,
        sampler=make_sampler(c, policy, tokenizer, agent, None if own else engine, kind=own,
                             world=world),
        optimizer=optimizer,
        scheduler=make_scheduler(optimizer, c.optim.warmup_steps, c.run.steps, c.optim.lr_schedule),
        world=world, plan=plan,
        teacher=load_teacher(c, policy, tokenizer, log) if c.model.teacher else None,
    )


def single_turn_only(s) -> None:
    """Refuse, for an agent run, the sampling keys only single-turn sampling applies."""
    cut = sampler_own_keys(s)
    if cut:
        raise ConfigError(f"config key {cut[0]}: single-turn sampling applies it; multi-turn "
                          "episodes (tools, environment, a task with tools) do not yet")
    if s.decode not in ("auto", "eager"):
        raise ConfigError(f"config key 'decode': decode={s.decode} decodes single-turn "
                          "completions; multi-turn episodes (tools, environment, a task with "
                          "tools) decode eagerly. Use decode=auto")


def make_sampler(c: TrainConfig, policy, tokenizer, agent: Agent | None = None, engine=None,
                 *, kind: str | None = None, sync: bool = True, meet=None,
                 world: distributed.World | None = None, log=print):
    """The HF sampler on the policy itself, or an engine with weights of its own (vLLM in this
    process: `sampling/vllm.py`, vLLM servers, or `engine` when one is given) loaded from the
    same weights (`sync`); with tools or an environment, either samples episodes. `kind`: the
    sampler, when not the config's. Servers are shared by every trainer process: process 0
    sends the weights, and `meet` (default: all processes' gather) holds the others around it and
    makes every process leave out the servers any has left out."""
    s = c.sampling
    kind = kind or s.sampler
    made = engine is None       # an engine made here is closed with the sampler; a given one is not
    if agent is not None:              # a task's own tools make an agent run without `tools`
        single_turn_only(s)
    if agent is not None and kind == "hf":
        return EpisodeSampler(policy, tokenizer, limits=agent.limits, tools=agent.tools,
                              call_format=call_format_of(c, tokenizer, agent),
                              make_env=agent.make_env,
                              temperature=s.temperature, top_p=s.top_p)
    if kind == "hf":
        return own_sampler(policy, tokenizer, max_new_tokens=s.max_new_tokens,
                           temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p,
                           stop=tuple(s.stop), repetition_penalty=s.repetition_penalty,
                           decode=s.decode, decode_slots=s.decode_slots, log=log)
    from grpo.sampling.engine import EngineSampler
    if engine is None and kind == "vllm_server":
        engine = _servers(c, world or distributed.World(), meet, log)
    if engine is None:
        from grpo.sampling.vllm import VLLMEngine, VLLMUnavailable
        base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
        try:
            engine = VLLMEngine(whole_model(base.name_or_path), seed=c.run.seed, dtype=c.compute_dtype,
                                gpu_memory_utilization=s.vllm_gpu_memory_utilization,
                                sleep=s.vllm_sleep, lora_rank=c.model.lora_r)
        except VLLMUnavailable as e:
            raise ConfigError(f"config key 'sampler': {e}") from None
    sampler = EngineSampler(engine, tokenizer, max_new_tokens=s.max_new_tokens,
                            temperature=s.temperature, top_p=s.top_p, seed=c.run.seed,
                            sleep=s.vllm_sleep, agent=agent)
    sampler.owns_engine = made
    if agent is not None:
        sampler.call_format = call_format_of(c, tokenizer, agent)
    if sync:
        try:
            sampler.sync(policy)   # a cold start or a resumed checkpoint changed the weights it loaded
        except BaseException:
            sampler.close()        # the files it wrote for the engine go with it
            raise
    return sampler


def _servers(c: TrainConfig, world: distributed.World, meet, log):
    """The config's vLLM servers as one engine (`Engines`), after sweeping what killed runs on this
    machine left in the weights directory; a server that takes no adapter of a LoRA run's rank
    is said once (the merged weights go to it)."""
    from grpo.sampling.engine import EngineError
    from grpo.sampling.engines import Engines
    from grpo.sampling.vllm_server import VLLMServerEngine, sweep_weights
    s = c.sampling
    try:
        if s.vllm_weights_dir:
            Path(s.vllm_weights_dir).mkdir(parents=True, exist_ok=True)
        if world.is_main:          # what runs killed on this machine left in RAM or on disk
            for left in sweep_weights(s.vllm_weights_dir or "/dev/shm"):
                log(f"removed the weights a run no longer running left: {left}")
        servers = [VLLMServerEngine(url, timeout_s=s.vllm_timeout_s, dtype=c.compute_dtype,
                                    weights_dir=s.vllm_weights_dir or None, lora_rank=c.model.lora_r)
                   for url in s.vllm_url]
    except EngineError as e:
        raise ConfigError(f"config key 'vllm_url': {e}") from None
    for why in {e.merged_why for e in servers if e.merged_why and world.is_main}:
        log(f"LoRA: the merged weights go to the servers at every update, not the adapter alone: {why}")
    if meet is None and world.size > 1:     # in `world`'s group (the clients' own, async)
        def meet(up):
            return distributed.gather_objects(up, world)
    return Engines(servers, sends=world.is_main, meet=meet, log=log)
