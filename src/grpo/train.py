"""The GRPO loop, as Algorithm 1 of DeepSeekMath (arXiv:2402.03300) lays it out.

    for each outer iteration:                       reference <- policy  (every `ref_reset_every`)
        for each step:
            1. sample G completions for each of B prompts        (sampling.py)
            2. score them with the reward functions              (rewards/)
            3. normalize rewards within each group               (advantages.py)
            4. mu times: clipped-surrogate update, pi_old fixed  (loss.py, update.py)

The variants (Dr. GRPO, DAPO, GSPO, CISPO, RLOO) change which table entry steps 3 and 4 use and
switch on the extras in `grpo_step` (dynamic sampling, overlong shaping, KL in the reward,
truncated importance sampling); docs/algorithms.md lists them.

Departures, on purpose: with mu = 1 the old log-probs equal the current ones, so no extra forward
pass computes them (the ratio is 1 and the gradient is the same); `beta = 0` loads no reference.
"""

from __future__ import annotations

import json
import math
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from grpo import build, distributed, resume, sft
from grpo.advantages import (ADVANTAGES, TOKEN_RETURNS, batch_token_normalized, groups_with_contrast,
                             process_supervision, token_returns)
from grpo.checkpoint import fault_point, save_model_dir
from grpo.config import TrainConfig, sampler_own_keys, to_yaml
from grpo.data import PromptStream, columns_of, first_line
from grpo.episodes import EpisodeSampler
from grpo.evaluate import evaluate, progress as eval_progress
from grpo.loss import (AGGREGATIONS, COVARIANCE_LOSSES, CORRECTIONS, clip_cov_tokens, kl_cov_tokens,
                       kl_penalized_rewards, token_covariance, token_kl)
from grpo.metrics import (RunawayWatch, everyones_faults, everyones_rows, metrics_line,
                          sample_records, step_metrics, unscored_warning)
from grpo.models import frozen_copy, merge_adapter, update_reference, whole_model
from grpo.pipeline import Groups, Work, split_threads
from grpo.rewards import RewardFn, faults, score
from grpo.rewards.shaping import overlong_penalty
from grpo.progress import Progress
from grpo.rollout import Rollout, concat
from grpo.sampling import HFSampler
from grpo.sft import supervised_finetune
from grpo.tracking import NullTracker, RunTracker, check_trackers
from grpo.update import accumulate_gradients, logprobs_of, make_optimizer, make_scheduler, optimizer_step


@dataclass
class RunResult:
    run_dir: Path
    history: list[dict]
    policy: torch.nn.Module
    tokenizer: object


@dataclass
class Learner:
    """What a GRPO step changes or reads: the policy, its frozen reference, sampler and optimizer."""
    policy: torch.nn.Module
    ref: torch.nn.Module | None
    sampler: HFSampler
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    skipped_in_a_row: int = 0    # updates skipped for a non-finite loss or gradient, consecutive
    skipped_total: int = 0
    world: distributed.World = distributed.World()   # this process's rank among `size`
    step: int = 0                # the GRPO step being taken (it seeds the sampling draws)


class TrainingError(RuntimeError):
    """Training cannot go on; the message says why and what to change."""


def train(config: TrainConfig, *, reward_fns: list[RewardFn] | None = None,
          tools: list[Callable] | None = None, environment: Callable[[], object] | None = None,
          dataset=None, eval_dataset=None, model=None, tokenizer=None,
          log: Callable[[str], None] = print, write_files: bool = True) -> RunResult:
    """Cold start (if `sft_steps`), then `steps` GRPO steps; returns the policy and every metric.
    With `resume`, continues a stopped run from its checkpoint instead (`resume.py`).
    `tools` (functions) and `environment` (a zero-argument factory) add to or stand for the
    config's `tools` and `environment` keys: the run samples multi-turn episodes.
    `dataset` and `eval_dataset` (a list of row dicts or a datasets.Dataset) stand for the keys
    of the same names; `model` and `tokenizer` (loaded, together) for the key `model`: that
    model is the policy, trained in place (docs/guides/python-api.md)."""
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
    build.check_engine(c)
    write_files = write_files and world.is_main   # only rank 0 writes; the others stay quiet
    if not world.is_main:
        log = lambda line: None  # noqa: E731
    run_dir = Path(c.run.output_dir)
    checkpoint = resume.find(c, log) if write_files or c.run.resume else None
    if checkpoint is not None and resume.finished(checkpoint, c.run.steps, run_dir):
        return finished_run(c, checkpoint, log)
    data = build.load_data(c, reward_fns, tools=tools, environment=environment, log=log, given=given)
    if model is not None:
        policy, tokenizer = build.given_model(c, model, tokenizer, log)
    else:
        policy, tokenizer = build.load_model_and_tokenizer(c, run_dir if write_files else None, log,
                                                           world)
    distributed.broadcast_parameters(policy, world)
    build.check_images(c, tokenizer, data)
    build.fit_prompts(c, tokenizer, getattr(policy.config, "max_position_embeddings", None), data, log)
    build.check_lr(c, policy, log)
    build.check_selection(c, log)
    build.check_batch(c, data, log)
    build.check_rewards(c, tokenizer, data)
    policy = resume_or_cold_start(c, policy, tokenizer, data, checkpoint, log,
                                  run_dir if write_files else None, world)
    learner = make_learner(c, policy, tokenizer, world, resume.reference_state(checkpoint))
    if c.run.parallel == "fsdp" and not distributed.initialized():
        log("parallel=fsdp shards only under torchrun; this one process trains the whole model")
    stream = PromptStream(data.train_rows, c.run.seed)
    first, accuracy = 1, math.nan
    if checkpoint is not None:
        state = resume.restore(learner, stream, checkpoint)
        first, accuracy = state["step"] + 1, state["accuracy"]
        log(f"resuming from {checkpoint} at step {first}/{c.run.steps}")
    # the last step whose records stay: none from step 0, whose evaluation is written again
    kept = first - 1 if checkpoint is not None else -1
    if write_files:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(build.rewards_comment(data) + to_yaml(c))
        resume.cut_run_files(run_dir, kept)
    faults.take()   # counts from before this run (another run in this process) are not its own
    # async_steps: rollout workers forked now (before any thread starts), or None (today's loop)
    groups = start_pipeline(c, learner, tokenizer, data, stream, first, checkpoint, world, log)
    tracker = (RunTracker(run_dir, purge_step=kept + 1, report_to=c.run.report_to, config=c.flat())
               if write_files else NullTracker())
    history: list[dict] = []

    def record(metrics: dict, step: int) -> None:
        tracker.log(metrics, step)
        history.append({"step": step, **metrics})

    evaluating = bool(data.eval_rows and c.run.eval_every)
    runaway = RunawayWatch()

    def evaluate_now(step: int, steps_bar: Progress | None = None) -> float:
        with distributed.full_parameters(policy):   # every rank gathers; rank 0 evaluates
            if groups is not None and hasattr(learner.sampler, "sync"):
                learner.sampler.sync(policy)   # async_steps: only evaluation uses this engine
            if world.is_main:
                rows_file = run_dir / "eval" / f"step-{step}.jsonl" if write_files else None
                # its own bar, as `grpo eval` shows, in place of the steps' while it runs
                with (steps_bar.paused() if steps_bar is not None else nullcontext()), \
                        eval_progress(len(data.eval_rows), log) as shown:
                    try:
                        return evaluate(c, learner.sampler, tokenizer, data, record, step=step,
                                        rows_file=rows_file, on_batch=lambda done, accuracy:
                                        shown.update(done, f"pass@1 {accuracy:.3f}"))
                    finally:
                        faults.take()   # zeros of held-out completions are not the next step's
        return math.nan

    if evaluating and first == 1:
        accuracy = evaluate_now(0)
        log(f"step 0/{c.run.steps}  eval/accuracy {accuracy:.3f}")
    with closing_on_error(tracker, groups), resume.StopOnSignal(log) as stop, \
            Progress("step", c.run.steps, log, c.run.log_every, start=first - 1) as bar:
        for step in range(first, c.run.steps + 1):
            if learner.ref is not None and c.run.ref_reset_every and step > 1 \
                    and (step - 1) % c.run.ref_reset_every == 0:
                update_reference(learner.ref, policy, c.run.ref_update_rate)  # a new outer iteration
            learner.step = step
            rollout, metrics = grpo_step(c, learner, tokenizer, data, stream, groups)
            fault_point("step")
            record(metrics, step)
            if (warning := unscored_warning(metrics, step)) is not None:
                log(warning)
            tracker.samples(sample_records(rollout, step))
            if evaluating and (step % c.run.eval_every == 0 or step == c.run.steps):
                accuracy = evaluate_now(step, bar)
            signum = stop.requested(world)
            if (c.run.save_every and (step % c.run.save_every == 0 or step == c.run.steps)) or signum:
                ahead, position = None, stream
                if groups is not None:   # steps step+1 .. step+k were sampled from older weights
                    queued, workers_at = groups.ahead(step)
                    ahead, position = {"queued": queued}, resume.Position(workers_at)
                resume.save(run_dir, c, learner, tokenizer, position, step, accuracy, write_files, ahead)
            bar.update(step, metrics_line(metrics, accuracy) + runaway.note(metrics))
            if signum:
                raise resume.Stopped.after(signum, step, c.run.steps, run_dir)
    if groups is not None:
        groups.close()
        if write_files:
            resume.write_timeline(run_dir, groups.timeline)
    write_final(c, policy, tokenizer, run_dir, write_files)
    tracker.close()
    if write_files:
        from grpo.report import write_report
        write_report(run_dir)
        if c.run.push_to_hub:
            push_final(c.run.push_to_hub, run_dir / "final", log)
    distributed.barrier(world)
    return RunResult(run_dir, history, policy, tokenizer)


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


def push_final(repo_id: str, final: Path, log) -> None:
    """final/ uploaded to `repo_id` (created private when it does not exist) in one commit;
    HF_ENDPOINT, read now, names the hub. A failure is one line: the run itself is saved."""
    import os
    from huggingface_hub import HfApi
    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)
    try:
        api.create_repo(repo_id, exist_ok=True, private=True)
        api.upload_folder(folder_path=str(final), repo_id=repo_id,
                          commit_message="grpo: final/ of the run")
    except Exception as e:  # noqa: BLE001 - the hub client's errors have no common base
        raise TrainingError(f"push_to_hub: {final} could not be uploaded to {repo_id}: {first_line(e)}; "
                            f"the run is saved: upload it later with `hf upload {repo_id} {final}`") from None
    log(f"push_to_hub: {final} uploaded to {repo_id}")


def finished_run(c: TrainConfig, checkpoint: Path, log) -> RunResult:
    """`resume` on a run whose checkpoint is at (or past) `steps`: nothing to train. Said, and the
    run as it is returned (its metrics, and the checkpoint's model); no file is written."""
    from grpo.models import load_policy, load_tokenizer
    done, run_dir = resume.step_of(checkpoint), Path(c.run.output_dir)
    log(f"resume: the run in {run_dir} is finished: its checkpoint {checkpoint.name} is at step "
        f"{done} of steps={c.run.steps}; nothing to do. Set steps= above {done} to train on from it")
    metrics_file = run_dir / "metrics.jsonl"
    history = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()] \
        if metrics_file.is_file() else []
    return RunResult(run_dir, history, load_policy(str(checkpoint), c.model.dtype),
                     load_tokenizer(str(checkpoint), c.model.chat_template))


def resume_or_cold_start(c: TrainConfig, policy, tokenizer, data: build.Data, checkpoint: Path | None,
                         log, save_to: Path | None = None,
                         world: distributed.World = distributed.World()):
    """The policy GRPO starts from: the checkpoint's weights when resuming (its config compared
    with this one), else the cold start when `sft_steps` asks for it. With LoRA the cold start's
    adapter is merged into the base under a fresh adapter (with_fresh_adapter), so the reference,
    the adapter off, is the policy at the start of GRPO; a resumed run merges it again."""
    if checkpoint is not None:
        for change in resume.changed_keys(c, checkpoint):
            log(f"resuming with a changed key: {change}")
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


def write_final(c: TrainConfig, policy, tokenizer, run_dir: Path, write_files: bool) -> None:
    """final/ (the adapter alone, with LoRA) and, with lora_merge, final/merged; every rank takes
    part in gathering a sharded model, rank 0 writes."""
    gathered = distributed.full_state_dict(policy) if distributed.is_sharded(policy) else None
    if write_files:
        save_model_dir(policy, tokenizer, run_dir / "final", gathered)
        if c.model.lora_r and c.model.lora_merge:
            save_model_dir(policy.merge_and_unload(), tokenizer, run_dir / "final" / "merged")


@contextmanager
def closing_on_error(tracker, groups=None):
    """Close the trackers (finishing a W&B or MLflow run) and stop the rollout workers when the
    loop stops on an error."""
    try:
        yield
    except BaseException:
        if groups is not None:
            groups.close()
        tracker.close()
        raise


def start_pipeline(c: TrainConfig, learner: Learner, tokenizer, data: build.Data, stream: PromptStream,
                   first: int, checkpoint: Path | None, world: distributed.World, log) -> Groups | None:
    """With async_steps = k > 0, the rollout workers of this trainer process (pipeline/): they
    sample step t's groups from the weights after step t-1-k with step t's draws. The machine's
    cores are split between the trainer and its workers (torch threads per role)."""
    p = c.pipeline
    ahead = resume.pipeline_state(checkpoint, world)
    if not p.async_steps:
        if ahead is not None:
            raise build.ConfigError(
                f"config key 'async_steps': checkpoint {checkpoint} was written with async_steps "
                f"(its groups for the next steps are queued in it); resume it with the async_steps "
                f"of its config.yaml")
        return None
    if any(t.is_cuda for t in learner.policy.parameters()):
        raise build.ConfigError(
            "config key 'async_steps': the rollout workers are forks of the trainer, and a CUDA "
            "context does not survive fork, so async_steps runs on CPUs for now "
            "(docs/guides/async.md); set async_steps=0 on a GPU")
    trainer_threads, worker_threads = split_threads(c.run.threads or torch.get_num_threads(),
                                                    p.rollout_workers)
    trainer_threads, worker_threads = p.trainer_threads or trainer_threads, p.worker_threads or worker_threads
    torch.set_num_threads(trainer_threads)
    if p.rollout_workers:
        log(f"async_steps={p.async_steps}: {p.rollout_workers} rollout worker(s) with {worker_threads} "
            f"torch thread(s) each, the trainer with {trainer_threads}")

    def sample(sampler, stream, step, share):
        timer = {"sample": 0.0, "reward": 0.0}
        rollout, extra = sample_scored_groups(c, sampler, tokenizer, data, stream, timer, share, step)
        return rollout, extra, timer

    def draw(sampler, stream, step, share):   # without dynamic sampling, scoring can wait
        return draw_groups(c, sampler, tokenizer, stream, c.sampling.prompts_per_step, share, step)

    work = Work(policy=learner.policy, rows=data.train_rows, seed=c.run.seed, steps=c.run.steps,
                k=p.async_steps, make_sampler=lambda model: make_sampler(c, model, tokenizer),
                sample=sample, pad_token_id=tokenizer.pad_token_id, threads=worker_threads,
                timeout_s=p.transfer_timeout_s,
                draw=None if c.sampling.dynamic_sampling else draw,
                score=lambda rollout: score_rollout(c, rollout, data))
    return Groups(work, workers=p.rollout_workers, world=world, first=first,
                  stream_state=stream.state_dict(), queued=ahead["queued"] if ahead else None,
                  restarts=p.worker_restarts, log=log)


def check_world(c: TrainConfig, world: distributed.World) -> None:
    """What several processes cannot do yet, or cannot split evenly, said before any work."""
    if c.model.lora_r and c.run.ref_reset_every:
        raise build.ConfigError("config key 'ref_reset_every' cannot be used with LoRA ('lora_r' > 0): "
                                "the reference is the policy at the start of GRPO with the adapter off")
    if c.model.lora_r and c.run.parallel == "fsdp":
        raise build.ConfigError("config key 'parallel': fsdp with LoRA ('lora_r' > 0) is not supported; "
                                "use parallel=ddp (the base model is frozen, so only the adapter is synced)")
    if c.pipeline.async_steps and c.sampling.dynamic_sampling and c.pipeline.rollout_workers > 1:
        raise build.ConfigError("config key 'dynamic_sampling' with async_steps needs one rollout worker "
                                f"(rollout_workers={c.pipeline.rollout_workers}): each worker would "
                                "refill only its own share of the groups; set rollout_workers=1")
    shares = world.size * max(1, c.pipeline.rollout_workers)
    if c.pipeline.async_steps and c.sampling.prompts_per_step % shares:
        raise build.ConfigError(
            f"config key 'prompts_per_step' ({c.sampling.prompts_per_step}) must be divisible by the "
            f"number of rollout workers ({shares}: rollout_workers={c.pipeline.rollout_workers} per "
            f"trainer process x {world.size}): each worker samples whole groups")
    if c.model.train_vision and c.run.parallel == "fsdp" and distributed.initialized():
        raise build.ConfigError("config key 'train_vision': a trained vision tower with parallel=fsdp is "
                                "not supported yet (the tower runs once per prompt, before the sharded "
                                "forward, and is gathered only for it); use parallel=ddp, or keep the "
                                "tower frozen")
    if c.pipeline.async_steps and c.run.parallel == "fsdp" and distributed.initialized():
        raise build.ConfigError("config key 'parallel': fsdp with async_steps is not supported yet (a "
                                "rollout worker needs whole weights); use parallel=ddp")
    if world.size == 1:
        return
    if c.sampling.prompts_per_step % world.size:
        raise build.ConfigError(
            f"config key 'prompts_per_step' ({c.sampling.prompts_per_step}) must be divisible by the "
            f"number of processes ({world.size}): each process takes whole groups")
    if c.sampling.dynamic_sampling and c.pipeline.async_steps:
        preset = f" (set by algorithm={c.run.algorithm})" if c.run.algorithm == "dapo" else ""
        raise build.ConfigError(f"config key 'dynamic_sampling'{preset} with async_steps is not supported "
                                "with more than one process yet (each trainer's worker would refill only "
                                "its own share); set dynamic_sampling=false, async_steps=0, or run one process")
    if c.loss.advantage == "batch_norm":
        raise build.ConfigError("config key 'advantage': batch_norm needs the whole batch's rewards "
                                "and is not supported with more than one process yet")


def make_learner(c: TrainConfig, policy, tokenizer, world: distributed.World = distributed.World(),
                 ref_state: dict | None = None) -> Learner:
    """The reference (none when beta = 0), the sampler, AdamW and its schedule; with
    `parallel=fsdp` on several processes, policy and reference sharded first."""
    # With LoRA the reference is the policy with its adapter switched off: the base, into which
    # a cold start was merged (resume_or_cold_start), so the policy at the start of GRPO.
    # A frozen image encoder is shared with the reference, except under FSDP2, which shards each
    # model's parameters on its own (a module cannot belong to two sharded models).
    sharding = c.run.parallel == "fsdp" and distributed.initialized()
    ref = frozen_copy(policy, share_tower=not sharding) if c.loss.beta > 0 and not c.model.lora_r else None
    if ref is not None and ref_state is not None:   # a resumed run's reference
        ref.load_state_dict(ref_state, strict=False)
    if sharding:                                                 # under torchrun, any size
        bf16 = c.optim.mixed_precision == "bf16"
        policy = distributed.shard(policy, world, bf16)
        ref = distributed.shard(ref, world, bf16) if ref is not None else None
    optimizer = make_optimizer(policy, c.optim.lr, c.optim.weight_decay)
    return Learner(
        policy=policy, ref=ref, sampler=make_sampler(c, policy, tokenizer),
        optimizer=optimizer,
        scheduler=make_scheduler(optimizer, c.optim.warmup_steps, c.run.steps, c.optim.lr_schedule),
        world=world,
    )


def make_sampler(c: TrainConfig, policy, tokenizer):
    """The HF sampler on the policy itself, or a colocated vLLM engine loaded from the same
    weights (`vllm_sampler.py`); with tools or an environment, either samples episodes."""
    s = c.sampling
    agent = build.agent_of(c)
    cut = sampler_own_keys(s)
    if agent is not None and cut:      # a task's own tools make an agent run without `tools`
        raise build.ConfigError(f"config key {cut[0]}: single-turn sampling applies it; multi-turn "
                                "episodes (tools, environment, a task with tools) do not yet")
    if agent is not None and s.sampler == "hf":
        return EpisodeSampler(policy, tokenizer, limits=agent.limits, tools=agent.tools,
                              call_format=build.call_format_of(c, tokenizer, agent),
                              make_env=agent.make_env,
                              temperature=s.temperature, top_p=s.top_p)
    if s.sampler == "hf":
        return HFSampler(policy, tokenizer, max_new_tokens=s.max_new_tokens,
                         temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p,
                         stop=tuple(s.stop), repetition_penalty=s.repetition_penalty)
    from grpo.vllm_sampler import VLLMSampler, VLLMUnavailable
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    try:
        sampler = VLLMSampler(whole_model(base.name_or_path), tokenizer, max_new_tokens=s.max_new_tokens,
                              temperature=s.temperature, top_p=s.top_p,
                              gpu_memory_utilization=s.vllm_gpu_memory_utilization, seed=c.run.seed,
                              dtype=c.model.dtype, sleep=s.vllm_sleep, agent=agent)
    except VLLMUnavailable as e:
        raise build.ConfigError(f"config key 'sampler': {e}") from None
    if agent is not None:
        sampler.call_format = build.call_format_of(c, tokenizer, agent)
    sampler.sync(policy)   # a cold start or a resumed checkpoint changed the weights it loaded
    return sampler


def grpo_step(c: TrainConfig, learner: Learner, tokenizer, data: build.Data,
              stream: PromptStream, groups: Groups | None = None) -> tuple[Rollout, dict]:
    """One GRPO step: the four steps of Algorithm 1's inner loop, with the variants' switches.
    With `groups` (async_steps), step 1-2's groups come from the rollout workers instead."""
    t0 = time.perf_counter()
    # 1-2. group sampling and rewards (dynamic sampling keeps only groups with contrast)
    timer = {"sample": 0.0, "reward": 0.0}
    worker_faults: dict = {}
    if groups is None:
        with distributed.full_parameters(learner.policy):
            rollout, extra = sample_scored_groups(c, learner.sampler, tokenizer, data, stream, timer,
                                                  learner.world, learner.step)
    else:
        rollout, extra, timer, worker_faults = groups.take(learner.step)
        extra.update(staleness(rollout, learner.step))
    t1 = time.perf_counter()
    fixed_logprobs(c, learner, rollout)
    t_ref = time.perf_counter()
    if c.loss.mask_truncated:
        rollout.loss_mask = rollout.completion_mask * (~rollout.truncated).long().unsqueeze(-1)
    # 3. advantages
    extra.update(set_advantages(c, rollout, data.agent, learner.world))
    is_weights = None
    if (correction := correction_of(c)) is not None:
        is_weights, correction_stats = off_policy_weights(rollout, *correction)
        extra.update(correction_stats)
    selected = None
    if c.loss.loss_type in COVARIANCE_LOSSES:
        selected, selection_stats = covariance_selection(c, rollout, learner.world, learner.step)
        extra.update(selection_stats)
    t2 = time.perf_counter()
    # 4. mu policy updates against the fixed pi_old and pi_ref
    colocated = groups is None   # with async_steps the workers' engines sample, not this one
    if colocated and hasattr(learner.sampler, "sleep"):
        learner.sampler.sleep()          # vLLM frees its memory for the update ...
    updates = update_policy(c, learner, rollout, is_weights, selected)
    if colocated and hasattr(learner.sampler, "sync"):
        learner.sampler.sync(learner.policy)   # ... and samples from the new weights next step
    t_update = time.perf_counter()
    if groups is not None:   # the new weights are version `step`: to the workers that need them
        with distributed.full_parameters(learner.policy):
            groups.publish(learner.step, learner.policy)
        extra["pipeline/publish_s"] = time.perf_counter() - t_update
    lr = learner.scheduler.get_last_lr()[0]
    learner.scheduler.step()  # once per GRPO step: warmup and decay count steps, not updates
    t3 = time.perf_counter()
    metrics = step_metrics(everyones_rows(rollout, learner.world), updates, sample_s=timer["sample"],
                           reward_s=timer["reward"] + t2 - t_ref, reference_s=t_ref - t1,
                           update_s=t_update - t2, step_s=t3 - t0)
    metrics.update(extra, lr=lr)
    metrics.update(everyones_faults(learner.world, worker_faults))   # why built-in rewards scored 0
    metrics["update/skipped_steps"] = learner.skipped_total
    metrics["data/skipped_long_prompts"] = data.skipped_long_prompts
    return rollout, metrics


def set_advantages(c: TrainConfig, rollout: Rollout, agent, world: distributed.World) -> dict:
    """Step 3: the rewards (with the KL in them under kl_in_reward) -> rollout.advantages, [N] or
    [N, T]; returns the step's metrics of it. Batch statistics (reinforce_pp_batch_norm) are over
    every process's tokens."""
    extra: dict = {}
    rewards = rollout.rewards
    per_token = c.loss.advantage in TOKEN_RETURNS
    kl = None
    if c.loss.kl_in_reward and rollout.ref_logprobs is not None:
        if per_token:   # REINFORCE++: each token's KL is a reward at that token
            kl = token_kl(rollout.old_logprobs, rollout.ref_logprobs, rollout.tokens_in_loss,
                          c.loss.kl_estimator)
            penalty = c.loss.beta * kl.sum(-1)
        else:
            rewards = kl_penalized_rewards(rewards, rollout.old_logprobs, rollout.ref_logprobs,
                                           rollout.completion_mask, c.loss.beta, c.loss.kl_estimator)
            penalty = rollout.rewards - rewards
        scorable = ~torch.isnan(rollout.rewards)     # the mean over every process's scored rows
        sums = distributed.sum_values({"sum": float(penalty[scorable].sum()),
                                       "n": float(scorable.sum())}, world)
        extra["kl_reward/mean"] = sums["sum"] / sums["n"] if sums["n"] else math.nan
    if agent is not None and agent.turn_rewards:
        rollout.advantages = turn_advantages(rollout, rewards, c.loss.advantage_eps)
    elif per_token:
        outcome = ADVANTAGES[c.loss.advantage](rewards, rollout.group_ids, c.loss.advantage_eps)
        scored = rollout.scored_tokens
        returns = token_returns(outcome, kl, c.loss.beta, scored)
        if c.loss.reinforce_pp_batch_norm:
            returns = batch_token_normalized(returns, scored, c.loss.advantage_eps,
                                             lambda sums: distributed.sum_values(sums, world))
        rollout.advantages = returns.float()
    else:
        rollout.advantages = ADVANTAGES[c.loss.advantage](rewards, rollout.group_ids,
                                                          c.loss.advantage_eps)
    return extra


def covariance_selection(c: TrainConfig, rollout: Rollout, world: distributed.World,
                         step: int) -> tuple[torch.Tensor, dict]:
    """Clip-Cov's or KL-Cov's tokens among this process's rows, [N, T] bool, chosen over the
    whole batch: every process gathers every process's log-probs, advantages and masks, so the
    means, the ranking and Clip-Cov's draw (from the seed and the step) are those of one process.
    The log-probs are pi_old's, the policy that the step's first update starts from. Counted
    tokens: the policy's own (no environment tokens) in rows that could be scored."""
    T = rollout.completion_ids.shape[1]
    adv = rollout.advantages if rollout.advantages.dim() == 2 else rollout.advantages.unsqueeze(-1)
    mask = rollout.scored_tokens
    logp = distributed.gather_rows(rollout.old_logprobs.float(), world)
    adv = distributed.gather_rows(adv.expand(-1, T).float().contiguous(), world)
    mask = distributed.gather_rows(mask, world)
    cov = token_covariance(logp, adv, mask)
    if c.loss.loss_type == "clip_cov":
        draws = torch.Generator().manual_seed(hash((c.run.seed, step, 2505)) & 0x7FFFFFFF)
        chosen = clip_cov_tokens(cov, mask, c.loss.clip_cov_fraction, c.loss.clip_cov_low,
                                 c.loss.clip_cov_high, draws)
    else:
        chosen = kl_cov_tokens(cov, mask, c.loss.kl_cov_fraction)
    n = max(int(mask.sum()), 1)
    stats = {"cov/selected_frac": int(chosen.sum()) / n, "cov/mean": float(cov.sum()) / n}
    return chosen[world.rows(len(chosen)), :T], stats


def turn_advantages(rollout: Rollout, rewards: torch.Tensor, eps: float) -> torch.Tensor:
    """Process supervision over turns (advantages.process_supervision): each turn's reward from
    the environment (0 where it gave none), the reward functions' total added to the last turn.
    The environment's episode reward is already inside `rewards`, so it is not counted twice.

    Every turn is a step with its own reward, the cut last turn of a truncated episode included:
    the environment never saw that turn (reward 0), and as the final turn it carries the outcome
    (the reward functions' total with any overlong penalty), so its tokens get an advantage of
    their own instead of 0, and the outcome is not moved to the turn before it."""
    e = rollout.episodes
    per_turn, ends = [], []
    for i in range(len(rollout)):
        turn_ends = e["turn_ends"][i]
        given = e["turn_rewards"][i]
        given = list(given) + [None] * (len(turn_ends) - len(given))   # a turn without an entry: 0
        turn = [0.0 if r is None else float(r) for r in given] or [0.0]
        outcome = float(rewards[i]) if not math.isnan(float(rewards[i])) else 0.0
        env_total = e["env_reward"][i] or 0.0
        turn[-1] += outcome - env_total
        per_turn.append(turn)
        ends.append(turn_ends[:len(turn)] or [int(rollout.completion_mask[i].sum()) - 1])
    return process_supervision(per_turn, ends, rollout.group_ids, rollout.completion_ids.shape[1], eps)


def fixed_logprobs(c: TrainConfig, learner: Learner, rollout: Rollout) -> None:
    """pi_old (when the ratio can differ from 1 or its values are read) and pi_ref (when beta > 0;
    with LoRA, the policy with its adapter off), held fixed for the step's updates."""
    mb, mb_tokens = c.optim.micro_batch_size, c.optim.micro_batch_tokens
    if rollout.versions is not None and c.pipeline.proximal == "behaviour":
        # async_steps: the workers' weights sampled these tokens; their log-probs are pi_old
        rollout.old_logprobs = rollout.sampler_logprobs.clone()
    elif (c.optim.num_iterations > 1 or correction_of(c) is not None or c.loss.kl_in_reward
          or c.loss.loss_type in COVARIANCE_LOSSES   # their covariance reads log pi_old
          or rollout.versions is not None):   # proximal=decoupled: pi_prox, the weights now
        with distributed.full_parameters(learner.policy):
            rollout.old_logprobs = logprobs_of(learner.policy, rollout, mb, mb_tokens)
    if learner.ref is not None:
        with distributed.full_parameters(learner.ref):
            rollout.ref_logprobs = logprobs_of(learner.ref, rollout, mb, mb_tokens)
    elif c.loss.beta > 0 and c.model.lora_r:
        with learner.policy.disable_adapter():
            rollout.ref_logprobs = logprobs_of(learner.policy, rollout, mb, mb_tokens)


def loss_settings(c: TrainConfig) -> dict:
    """The keyword arguments of `loss.policy_loss` (via `update.accumulate_gradients`) that the
    config sets. With the KL in the reward, the loss has no KL term."""
    return dict(loss_type=c.loss.loss_type, beta=0.0 if c.loss.kl_in_reward else c.loss.beta,
                kl_estimator=c.loss.kl_estimator, eps_low=c.loss.epsilon,
                eps_high=c.loss.epsilon_high or c.loss.epsilon, clip_c=c.loss.clip_c,
                tau_pos=c.loss.sapo_tau_pos, tau_neg=c.loss.sapo_tau_neg,
                kl_cov_coef=c.loss.kl_cov_coef)


def selection_for_update(c: TrainConfig, selected: torch.Tensor | None,
                         on_policy: bool) -> torch.Tensor | None:
    """The batch's selection as one update uses it. kl_cov's term |log pi_theta - log pi_old| is 0,
    with a gradient of 0, at an update where pi_theta = pi_old (the first of a batch the current
    weights sampled). pi_old's log-probs come from a pass of their own, whose rounding differs
    from the update's by about 1e-7, and the gradient of |x| at such an x is +-1: so the term is
    left out there instead of adding that noise."""
    return None if c.loss.loss_type == "kl_cov" and on_policy else selected


def update_policy(c: TrainConfig, learner: Learner, rollout: Rollout,
                  is_weights: torch.Tensor | None, selected: torch.Tensor | None = None) -> list[dict]:
    """`num_iterations` optimizer steps on the step's loss; non-finite ones skipped and counted."""
    world = learner.world
    sharded = distributed.is_sharded(learner.policy)
    weights = None
    if world.size > 1:  # the aggregation's normalizers count every process's tokens
        everyone = distributed.gather_rows(rollout.tokens_in_loss, world)
        weights = AGGREGATIONS[c.loss.aggregation](everyone, c.sampling.max_new_tokens)
        weights = weights[world.rows(len(everyone)), :rollout.completion_ids.shape[1]]
    updates = []
    for iteration in range(c.optim.num_iterations):
        on_policy = iteration == 0 and (rollout.versions is None or c.pipeline.proximal == "decoupled")
        stats = accumulate_gradients(
            learner.policy, rollout, weights=weights,
            reduce=lambda totals: distributed.sum_values(totals, world), aggregation=c.loss.aggregation,
            max_tokens=c.sampling.max_new_tokens, is_weights=is_weights,
            selected=selection_for_update(c, selected, on_policy), **loss_settings(c),
            micro_batch_size=c.optim.micro_batch_size, micro_batch_tokens=c.optim.micro_batch_tokens,
            passes=(lambda n: distributed.max_over(n, world)) if sharded else None)
        trained = [p for p in learner.policy.parameters() if p.requires_grad]
        if sharded:  # FSDP2 has already reduce-scattered (averaged) each pass's gradients
            distributed.undo_gradient_mean(trained, world)
        else:
            distributed.sum_gradients(trained, world)
        stats["grad_norm"], stepped = optimizer_step(learner.policy, learner.optimizer,
                                                     c.optim.max_grad_norm, stats["loss"])
        learner.skipped_in_a_row = 0 if stepped else learner.skipped_in_a_row + 1
        learner.skipped_total += not stepped
        if learner.skipped_in_a_row > c.optim.max_skipped_updates:
            raise TrainingError(
                f"{learner.skipped_in_a_row} updates in a row had a loss or gradient norm that is not "
                f"finite (last: loss {stats['loss']}, grad_norm {stats['grad_norm']}); stopping. Lower "
                "'lr', check the reward functions, or raise 'max_skipped_updates'")
        updates.append(stats)
    return updates


def sample_scored_groups(c: TrainConfig, sampler: HFSampler, tokenizer, data: build.Data,
                         stream: PromptStream, timer: dict | None = None,
                         world: distributed.World = distributed.World(),
                         step: int = 0) -> tuple[Rollout, dict]:
    """Sample and score `prompts_per_step` groups. With dynamic sampling (DAPO), groups whose
    rewards are all equal are dropped and more prompts are sampled, at most `max_sampling_rounds`
    extra times; if none has contrast, the last round is kept (its advantages are all 0).
    With several processes each samples and scores its part of a round, and every process
    filters the gathered round, so all keep the same groups and sample the same refills; the
    kept groups are then shared out (`everyones_round`, `my_share`)."""
    G, wanted = c.sampling.group_size, c.sampling.prompts_per_step
    together = c.sampling.dynamic_sampling and world.size > 1
    kept: list[Rollout] = []
    have, dropped, rounds = 0, 0, 0
    while True:
        t0 = time.perf_counter()
        part = draw_groups(c, sampler, tokenizer, stream, wanted - have, world, step, rounds)
        t1 = time.perf_counter()
        if part is not None:
            score_rollout(c, part, data)
        if together:
            part = everyones_round(part, world, tokenizer.pad_token_id)
        if timer is not None:
            timer["sample"] += t1 - t0
            timer["reward"] += time.perf_counter() - t1
        if not c.sampling.dynamic_sampling:
            return part, {}
        contrast = set(groups_with_contrast(part.rewards, part.group_ids))
        dropped += len(part) // G - len(contrast)
        if contrast:
            kept.append(part.rows([i for i, g in enumerate(part.group_ids.tolist()) if g in contrast]))
            have += len(contrast)
        if have >= wanted or rounds >= c.sampling.max_sampling_rounds:
            break
        rounds += 1
    rollout = concat(kept, tokenizer.pad_token_id) if kept else part
    if together:
        rollout, unshared = my_share(rollout, world, G)
        dropped += unshared
    return rollout, {"sampling/dropped_groups": dropped, "sampling/extra_rounds": rounds}


def everyones_round(part: Rollout | None, world: distributed.World, pad_token_id: int) -> Rollout:
    """Every process's scored part of a round of dynamic sampling, in rank order (the order one
    process would have sampled them in), on every process, on this process's device."""
    device = part.completion_ids.device if part is not None else torch.device("cpu")
    parts = distributed.gather_objects(part.to("cpu") if part is not None else None, world)
    return concat([p for p in parts if p is not None], pad_token_id).to(device)


def my_share(rollout: Rollout, world: distributed.World, G: int) -> tuple[Rollout, int]:
    """This process's contiguous share of the kept groups (every process holds them all), and how
    many groups were left out so that the processes' shares are equal: only when the rounds ran
    out with a number of kept groups the number of processes does not divide."""
    groups = len(rollout) // G
    unshared = groups % world.size
    rows = (groups - unshared) * G
    return rollout.rows(world.rows(rows)), unshared


def draw_groups(c: TrainConfig, sampler, tokenizer, stream: PromptStream, n: int,
                world: distributed.World = distributed.World(), step: int = 0,
                rounds: int = 0) -> Rollout | None:
    """This process's share of `n` groups, sampled (not scored) with the draws of (seed, step,
    round); None when a refill of dynamic sampling leaves this process no group."""
    G = c.sampling.group_size
    rows = stream.next_batch(n)
    # The draws for every row of the whole batch, from (seed, step, round): a completion is the
    # same whichever process samples it, so N processes reproduce one.
    draws = torch.Generator().manual_seed(hash((c.run.seed, step, rounds)) & 0x7FFFFFFF)
    uniforms = torch.rand(len(rows) * G, sampler.max_new_tokens, generator=draws)
    mine = world.part(len(rows))   # whole groups; uneven only in a refill of dynamic sampling
    rows, uniforms = rows[mine], uniforms[mine.start * G:mine.stop * G]
    if not rows:
        return None
    part = sampler.sample(build.prompt_texts(c, tokenizer, rows), G, uniforms=uniforms, rows=rows)
    part.columns = columns_of(rows, G)
    return part


def score_rollout(c: TrainConfig, rollout: Rollout, data: build.Data) -> None:
    """Weighted sum of the reward functions (plus DAPO's overlong penalty); an unscorable row
    (`unscorable`: any or all of its functions returned None) becomes NaN."""
    totals, rollout.rewards_per_fn = score(data.reward_fns, data.reward_weights, rollout.prompts,
                                           rollout.completions, rollout.columns,
                                           on_error=c.reward.reward_on_error,
                                           unscorable=c.reward.unscorable)
    if rollout.episodes and data.agent is not None and data.agent.make_env is not None:
        # the environment's own episode reward is one more component (0 when it gave none)
        env = [0.0 if r is None else r for r in rollout.episodes["env_reward"]]
        rollout.rewards_per_fn["environment"] = env
        totals = [None if t is None else t + r for t, r in zip(totals, env)]
    if c.loss.overlong_buffer > 0:
        # An episode's budget counts every token after the prompt, the environment's too, so its
        # length does: an episode cut at episode_tokens gets the full penalty.
        budget = data.agent.limits.episode_tokens if data.agent else c.sampling.max_new_tokens
        penalty = overlong_penalty(rollout.real_mask.sum(-1).tolist(), budget,
                                   round(c.loss.overlong_buffer * budget), c.loss.overlong_penalty)
        rollout.rewards_per_fn["overlong"] = penalty
        totals = [None if t is None else t + p for t, p in zip(totals, penalty)]
    rollout.rewards = torch.tensor([math.nan if r is None else r for r in totals])


def correction_of(c: TrainConfig) -> tuple[str, float, float] | None:
    """The off-policy correction, its cap and its lower threshold (0: the method's own):
    `correction`, `tis_cap` (correction=tis), or with async_steps and proximal=decoupled the plain
    ratio pi_prox / pi_behaviour (AReaL); None: none."""
    if c.loss.correction != "none":
        return c.loss.correction, c.loss.correction_cap, c.loss.correction_cap_low
    if c.loss.tis_cap > 0:
        return "tis", c.loss.tis_cap, 0.0
    if c.pipeline.async_steps and c.pipeline.proximal == "decoupled":
        return "is", c.loss.correction_cap, 0.0
    return None


def off_policy_weights(rollout: Rollout, name: str, cap: float, low: float = 0.0) -> tuple[torch.Tensor, dict]:
    """The correction's weights [N, T] from rho = pi_old / pi_sampler, and what they did."""
    mask = rollout.completion_mask.bool()
    log_ratio = rollout.old_logprobs - rollout.sampler_logprobs
    weights = CORRECTIONS[name](log_ratio, mask, cap, low)
    ratio = torch.exp(log_ratio[mask])
    stats = {"offpolicy/ratio_mean": ratio.mean().item() if ratio.numel() else math.nan,
             "offpolicy/ratio_max": ratio.max().item() if ratio.numel() else math.nan,
             "offpolicy/masked_frac": (weights[mask] == 0).float().mean().item() if ratio.numel() else 0.0,
             "sampler/logp_diff": log_ratio.abs()[mask].mean().item() if ratio.numel() else 0.0}
    if name == "tis":   # the names TIS has always logged
        real = weights[mask]
        stats["tis/weight_mean"] = real.mean().item()
        stats["tis/weight_std"] = real.std().item() if real.numel() > 1 else 0.0
    return weights, stats


def staleness(rollout: Rollout, step: int) -> dict:
    """How many optimizer steps behind the trainer's weights (version step - 1) each group's
    tokens were drawn: mean and max over groups."""
    never = torch.iinfo(torch.long).max   # padding (-1) is no token
    row_oldest = rollout.versions.masked_fill(rollout.versions < 0, never).min(-1).values
    oldest = torch.full((int(rollout.group_ids.max()) + 1,), never).scatter_reduce(
        0, rollout.group_ids, row_oldest, "amin")
    behind = (step - 1 - oldest).float()
    return {"pipeline/staleness_mean": behind.mean().item(), "pipeline/staleness_max": behind.max().item()}


def cold_start(c: TrainConfig, policy, tokenizer, data: build.Data, log, save_to: Path | None = None,
               world: distributed.World = distributed.World()) -> None:
    """`sft_steps` supervised steps on the demonstrations. SIGTERM or Ctrl-C finishes the step,
    keeps the model in `save_to`/cold_start (sft.stopped) and raises resume.Stopped."""
    if not data.demonstrations:
        raise build.ConfigError(f"config key 'sft_steps' asks for a cold start, but the dataset "
                                f"{c.data.dataset} has no 'completion' column to imitate; add one, "
                                "or leave sft_steps out (with dataset= it is 0 unless set)")
    rows = [row for row, _, _ in data.demonstrations]
    prompts = build.prompt_texts(c, tokenizer, rows)
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
