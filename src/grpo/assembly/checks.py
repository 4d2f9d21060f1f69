"""Every start-up check, in one place. `assemble` runs them in this order, each before the work
it guards, so a run that cannot finish stops in one line before any costly step:

    on loading the config      config/rules.py: each key's range and the rules across keys
    on the config alone        check_push (hub and token), check_choices (table entries),
                               check_world (processes and shares), run.tracking.check_trackers,
                               check_engine (vLLM importable, or an engine given)
    on the checkpoint          check_pipeline (queued groups need async_steps)
    on reading the rows        check_golds, check_code_tests (data.load_data: every row, once)
    on the model               check_pipeline (forked workers and CUDA), check_images,
                               fit_prompts (chat messages need a template, coverage, answer
                               lengths, prompt lengths), check_lr, check_selection,
                               check_batch, check_rewards (one dry call)
    under torchrun             unseen_model (the tiny model every process must see)

Notes (check_lr, check_selection, check_batch, check_answer_lengths) are said and the run goes on;
the rest stop it with an error that names the key, the file and row, or the function."""

from __future__ import annotations

import time
from pathlib import Path

from grpo.algorithm.loss import COVARIANCE_LOSSES
from grpo.inputs import Agent, Data, agent_of, prompt_texts, source_of
from grpo.config import ConfigError, OptimConfig, TrainConfig
from grpo.config.plan import plan_of
from grpo.config.rules import unknown_choice
from grpo.data import DataError, check_messages_templated, coverage_note
from grpo.rewards import REWARDS, RewardError, RewardFn, faults, score
from grpo.rewards.answers import parsed_gold
from grpo.rewards.code import CodeTests, CodeTestsError, spec_from_row
from grpo.rewards.sources import RewardModel, RewardServer
from grpo.run import distributed


def check_push(c: TrainConfig) -> None:
    """push_to_hub needs the hub and a token: said at start, not after the run."""
    if not c.run.push_to_hub:
        return
    from huggingface_hub import constants, get_token
    if constants.HF_HUB_OFFLINE:
        raise ConfigError("config key 'push_to_hub' uploads final/ to the hub, and HF_HUB_OFFLINE "
                          "is set; unset it, or leave push_to_hub empty")
    if not get_token():
        raise ConfigError("config key 'push_to_hub' needs a hub token with write access: set "
                          "HF_TOKEN or run `hf auth login`")


def check_choices(config: TrainConfig) -> None:
    """Names that pick a table entry must name one: build_config refuses them already (the rule
    `table_choices` of config/rules.py), and this holds a config changed since
    (dataclasses.replace) to the same rule."""
    message = unknown_choice(config.flat())
    if message:
        raise ConfigError(message)


def check_world(c: TrainConfig, world: distributed.World) -> None:
    """What several processes cannot do yet, or cannot split evenly, said before any work."""
    groups = plan_of(c).groups
    client = groups == "client"
    shares = world.size * (1 if client else max(1, c.pipeline.rollout_workers))
    if groups != "inline" and c.sampling.prompts_per_step % shares:
        raise ConfigError(
            f"config key 'prompts_per_step' ({c.sampling.prompts_per_step}) must be divisible by the "
            f"number of rollout workers ({shares}: "
            + ("one engine client" if client else f"rollout_workers={c.pipeline.rollout_workers}")
            + f" per trainer process x {world.size}): each worker samples whole groups")
    if c.model.train_vision and c.run.parallel == "fsdp" and distributed.initialized():
        raise ConfigError("config key 'train_vision': a trained vision tower with parallel=fsdp is "
                          "not supported yet (the tower runs once per prompt, before the sharded "
                          "forward, and is gathered only for it); use parallel=ddp, or keep the "
                          "tower frozen")
    if groups == "workers" and c.run.parallel == "fsdp" and distributed.initialized():
        raise ConfigError("config key 'parallel': fsdp with forked rollout workers is not "
                          "supported (a fork cannot take part in the shards' collectives); set "
                          "rollout_workers=0 (a thread of each trainer samples) or sample on vLLM")
    if world.size == 1:
        return
    if c.sampling.sampler == "vllm":
        raise ConfigError(f"config key 'sampler': vllm starts an engine inside each trainer process, "
                          f"and this run has {world.size}: each would hold a whole model and its "
                          "cache on the same devices. Serve it once and share it: grpo launch "
                          f"--nproc-per-node {world.size} (sampler=vllm_server), or sampler=hf")
    if c.sampling.prompts_per_step % world.size:
        raise ConfigError(
            f"config key 'prompts_per_step' ({c.sampling.prompts_per_step}) must be divisible by the "
            f"number of processes ({world.size}): each process takes whole groups")
    if c.sampling.dynamic_sampling and groups == "workers":
        preset = f" (set by algorithm={c.run.algorithm})" if c.run.algorithm == "dapo" else ""
        raise ConfigError(f"config key 'dynamic_sampling'{preset} with async_steps is not supported "
                          "and forked rollout workers on more than one process (each trainer's "
                          "workers would refill only their own share); set rollout_workers=0 (a "
                          "thread of each trainer samples, and they refill together) or sample on vLLM")
    if c.loss.advantage == "batch_norm":
        raise ConfigError("config key 'advantage': batch_norm needs the whole batch's rewards "
                          "and is not supported with more than one process yet")


def note_unused_server(c: TrainConfig, log) -> None:
    """vllm_url without sampler=vllm_server samples elsewhere: said, not silently ignored."""
    if c.sampling.vllm_url and c.sampling.sampler != "vllm_server":
        log(f"note: vllm_url is read with sampler=vllm_server only; this run samples with "
            f"sampler={c.sampling.sampler} (add sampler=vllm_server to sample on the server)")


def check_engine(config: TrainConfig, engine=None) -> None:
    """`sampler=vllm` needs vLLM importable here (found at start, not after the cold start), or
    an engine given from Python (with async_steps the pipeline's client samples on it);
    `sampler=vllm_server` with a server on another machine, a weights directory they share."""
    if engine is not None:
        if config.sampling.sampler == "hf":
            raise ConfigError("config key 'sampler': an engine was given (train(engine=...)), and "
                        "sampler=hf samples from the policy itself: set sampler=vllm")
        return
    if config.sampling.sampler == "vllm_server":    # HTTP, nothing to import; the weights by path
        from grpo.sampling.vllm_server import unshared_weights
        if (why := unshared_weights(config.sampling.vllm_url, config.sampling.vllm_weights_dir)):
            raise ConfigError(why)
    if config.sampling.sampler != "vllm":
        return
    from grpo.sampling.vllm import VLLMUnavailable, import_vllm
    try:
        import_vllm()
    except VLLMUnavailable as e:
        raise ConfigError(f"config key 'sampler': {e}") from None


def check_pipeline(c: TrainConfig, checkpoint: Path | None, policy=None) -> None:
    """A checkpoint whose groups are queued resumes only with async_steps; async_steps forks
    rollout workers, which a CUDA model cannot be (`policy` given once it is loaded)."""
    if not c.pipeline.async_steps:
        if checkpoint is not None and (checkpoint / "pipeline.pt").is_file():
            raise ConfigError(
                f"config key 'async_steps': checkpoint {checkpoint} was written with async_steps "
                f"(its groups for the next steps are queued in it); resume it with the async_steps "
                f"of its config.yaml")
        return
    if policy is not None and plan_of(c).groups == "workers" and any(t.is_cuda for t in policy.parameters()):
        raise ConfigError(
            "config key 'rollout_workers': the rollout workers are forks of the trainer, and a CUDA "
            "context does not survive fork; set rollout_workers=0 (a thread of the trainer samples "
            "on the GPU) or sample on vLLM (sampler=vllm or vllm_server; docs/guides/async.md)")


def first_bad_row(path: str, problems: dict[int, str], total: int) -> str:
    """`problems` (a file row, from 0, and what is wrong with it) as one line: the first row in
    the file's order, whatever order the rows were shuffled in, and how many rows are bad."""
    first = min(problems)
    text = problems[first]
    if not text.startswith(f"{path} row {first + 1}"):     # else the message names its row already
        text = f"{path} row {first + 1}: {text}"
    more = f"; {len(problems)} of the {total} rows are like this" if len(problems) > 1 else ""
    return text + more


def check_golds(path: str, rows: list[dict], column: str = "answer", key: str = "dataset") -> None:
    """Parse every gold answer once, at load; those that hold no value are an error naming the
    first in the file's order and how many there are.
    Held-out rows (`key` eval_dataset) are checked when eval/accuracy is math_accuracy."""
    why = ("which math_accuracy compares with" if key == "dataset" else
           "which eval/accuracy compares with (math_accuracy, for rows from a file; code scores "
           "with rewards=[code_tests])")
    problems = {}
    for row in rows:
        if row["answer"] is None:
            problems[row["_row"]] = (f"no value in the answer column '{column}', {why}; set "
                                     "answer_column=NAME or choose rewards that need no answer")
        elif not parsed_gold(row["answer"]):
            problems[row["_row"]] = (f"answer {str(row['answer'])[:80]!r} holds no value "
                                     "math_accuracy can compare with; fix the row or drop it")
    if problems:
        raise DataError(f"config key '{key}': {first_bad_row(path, problems, len(rows))}")


def check_code_tests(path: str, rows: list[dict]) -> None:
    """Read every row's tests once, at load; those that cannot be read are an error naming the
    first in the file's order and how many there are."""
    problems = {}
    for row in rows:
        try:
            spec_from_row(row, f"{path} row {row['_row'] + 1}")
        except CodeTestsError as e:
            problems[row["_row"]] = str(e)
    if problems:
        raise DataError(first_bad_row(path, problems, len(rows)))


def check_images(config: TrainConfig, tokenizer, data: Data) -> None:
    """Rows with images need a model with an image processor: refused, never dropped."""
    if getattr(tokenizer, "grpo_processor", None) is not None:
        return
    for key, rows in (("dataset", data.train_rows), ("eval_dataset", data.eval_rows)):
        with_images = [r for r in rows if r.get("images")]
        if with_images:
            where = getattr(config.data, key) or f"task {config.data.task}"
            row = with_images[0].get("_row", rows.index(with_images[0]))
            raise ConfigError(
                f"config key 'model': {config.model.model} is a text-only model, but {where} has "
                f"images ({len(with_images)} of {len(rows)} rows, the first row {row + 1}); use a "
                "vision-language model (one transformers loads as image-text-to-text, with its "
                "processor), or a dataset without an image column. Images are never dropped")


def fit_prompts(config: TrainConfig, tokenizer, context: int | None, data: Data,
                log=print) -> None:
    """Rows whose templated prompt plus `max_new_tokens` exceed the model's context: an error
    naming the first and counting them all (long_prompts=error), or left out and counted (skip),
    said louder when that is most of them. Never truncated. Characters the tokenizer cannot
    represent are reported first (data.coverage_note), after prompts of chat messages without a
    template (refused, all counted); then `check_answer_lengths`."""
    for name in ("train_rows", "eval_rows"):
        check_messages_templated(tokenizer, getattr(data, name), config.model.chat_template,
                                 source_of(config, name))
    note = coverage_note(tokenizer, {"train": data.train_rows, "held-out": data.eval_rows},
                         f"model {config.model.model}")
    if note:
        log(note)
    check_answer_lengths(config, tokenizer, data, log)
    if not context:
        return
    limit = context - config.sampling.max_new_tokens
    fix = (f"a model with a longer context, or a lower max_new_tokens (now "
           f"{config.sampling.max_new_tokens}), fits more")
    had_train_rows = bool(data.train_rows)     # none at all: grpo eval, which reads no training rows
    for name in ("train_rows", "eval_rows"):
        rows, where = getattr(data, name), source_of(config, name)
        lengths = [len(ids) for ids in tokenizer(prompt_texts(config, tokenizer, rows, data.agent),
                                                 add_special_tokens=False).input_ids] if rows else []
        too_long = [i for i, n in enumerate(lengths) if n > limit]
        if too_long and config.data.long_prompts == "error":
            first = too_long[0]
            raise DataError(f"{where} row {rows[first].get('_row', first) + 1}: the prompt has "
                            f"{lengths[first]} tokens; with max_new_tokens="
                            f"{config.sampling.max_new_tokens} it exceeds the model's context of "
                            f"{context} ({len(too_long)} of {len(rows)} prompts do). Shorten it, lower "
                            "max_new_tokens, or set long_prompts=skip")
        kept = [row for row, n in zip(rows, lengths) if n <= limit]
        if len(kept) < len(rows):
            data.skipped_long_prompts += len(rows) - len(kept)
            if name == "eval_rows":
                data.skipped_long_eval_prompts += len(rows) - len(kept)
            most = f": most of {where}; {fix}" if len(kept) < len(rows) / 2 else ""
            log(f"long_prompts=skip: left out {len(rows) - len(kept)} of {len(rows)} "
                f"{name.replace('_rows', '')} prompts longer than {limit} tokens{most}")
        setattr(data, name, kept)
    if had_train_rows and not data.train_rows:
        raise DataError(f"{source_of(config, 'train_rows')}: every prompt is longer than {limit} "
                        f"tokens; nothing to train on: {fix}")


# A row's reference answer, the first of these columns it has: a demonstration, HumanEval's
# canonical solution, the gold answer (GSM8K's worked solution; MATH's `solution` arrives as it).
REFERENCE_COLUMNS = ("completion", "canonical_solution", "answer")


LENGTH_SAMPLE = 1000    # rows whose reference is tokenized for the check


def check_answer_lengths(config: TrainConfig, tokenizer, data: Data, log) -> None:
    """Said at start when most reference answers are longer than a completion may be: they would
    all be cut at max_new_tokens (turn_tokens in multi-turn runs), so the key to raise is named."""
    key = "turn_tokens" if data.agent is not None and config.agent.turn_tokens else "max_new_tokens"
    budget = config.agent.turn_tokens if key == "turn_tokens" else config.sampling.max_new_tokens
    for name in ("train_rows", "eval_rows"):
        rows = getattr(data, name)[:LENGTH_SAMPLE]
        column = next((c for c in REFERENCE_COLUMNS if any(r.get(c) is not None for r in rows)), None)
        texts = [str(r[column]) for r in rows if column and r.get(column) is not None]
        if not texts:
            continue
        lengths = sorted(len(ids) for ids in tokenizer(texts, add_special_tokens=False).input_ids)
        longer = sum(n > budget for n in lengths)
        if longer > len(lengths) / 2:
            log(f"{key}={budget} cuts most answers: {longer} of {len(lengths)} reference answers "
                f"('{column}' column of {source_of(config, name)}) are longer (median "
                f"{lengths[len(lengths) // 2]} tokens); raise {key}")


# pretrained models past this many parameters meet the demo's lr with a note
LR_NOTE_PARAMETERS = 20_000_000


def check_lr(config: TrainConfig, policy, log) -> None:
    """A note at start when the demo's default lr meets a model much larger than the demo's."""
    if config.optim.lr != OptimConfig.lr:
        return
    n = sum(p.numel() for p in policy.parameters())
    if n > LR_NOTE_PARAMETERS:
        lora = ", or 1e-5 for a LoRA adapter" if config.model.lora_r else ""
        log(f"lr={config.optim.lr:g} is the demo's default, for its tiny model trained from scratch; "
            f"this model has {n / 1e6:.0f}M parameters: a pretrained model wants about lr=1e-6"
            f"{lora} (docs/guides/troubleshooting.md)")


def check_selection(config: TrainConfig, log, agent: Agent | None = None) -> None:
    """A note at start when clip_cov's or kl_cov's share of the batch cannot select one token:
    floor(fraction * tokens) is 0 for every step whose batch holds fewer than 1 / fraction tokens,
    and the run would then be plain policy gradient while its name says otherwise. `agent`: the
    run's (Data.agent); from the config's keys where not given."""
    loss = config.loss
    if loss.loss_type not in COVARIANCE_LOSSES:
        return
    if loss.loss_type == "kl_cov" and config.optim.num_iterations == 1:
        log("kl_cov's term, kl_cov_coef * |log pi_theta - log pi_old|, is 0 while pi_theta = pi_old, "
            "so with num_iterations=1 (one update per batch) it never acts and the run is the plain "
            "policy gradient; set num_iterations=2 or more (docs/algorithms.md)")
    key = "clip_cov_fraction" if loss.loss_type == "clip_cov" else "kl_cov_fraction"
    fraction = getattr(loss, key)
    agent = agent if agent is not None else agent_of(config)
    if agent is not None:   # an episode's own tokens: at most max_turns turns of turn_tokens
        limits = agent.limits
        per_row = min(limits.max_turns * limits.turn_tokens, limits.episode_tokens)
        bound = f"episodes of at most {per_row} tokens of the policy's own"
    else:
        per_row = config.sampling.max_new_tokens
        bound = f"max_new_tokens={per_row}"
    most = config.sampling.prompts_per_step * config.sampling.group_size * per_row
    if fraction * most < 1:
        log(f"{key}={fraction:g} selects floor({fraction:g} x the step's tokens) tokens, and a step "
            f"here has at most {most} ({config.sampling.prompts_per_step} prompts x "
            f"{config.sampling.group_size} x {bound}): {loss.loss_type} will select none. The "
            f"paper's share is for batches of millions of tokens; raise {key} to at least "
            f"{1 / most:.2g} (docs/algorithms.md)")


def check_batch(config: TrainConfig, data: Data, log) -> None:
    """A note at start when the dataset holds fewer rows than a step's prompts: every step then
    samples some prompts twice or more, as separate groups."""
    n, wanted = len(data.train_rows), config.sampling.prompts_per_step
    if config.data.dataset and n < wanted:
        log(f"{config.data.dataset} has {n} row{'s' if n != 1 else ''} (after the checks), fewer than "
            f"prompts_per_step={wanted}: every step repeats prompts, each as a group of its own; set "
            f"prompts_per_step={n} or lower for distinct prompts")


def check_rewards(config: TrainConfig, tokenizer, data: Data) -> None:
    """One dry call of each of the user's reward functions, before any training: on the first
    training row, with that row's own completion or answer (else an empty string) standing in for
    a sampled completion. A function that raises (with reward_on_error=raise), has a signature the
    call does not fit, returns the wrong number of values or a value that is not finite stops the
    run here, named, as it would at step 1. Nothing is recorded: no metric, no fault count.
    The built-ins, code_tests, reward models and reward servers are not called: their contract is
    the project's own (a server's first request is step 1's, with its own timeout and retries)."""
    mine = [(fn, w) for fn, w in zip(data.reward_fns, data.reward_weights) if _users_own(fn)]
    if not mine or not data.train_rows:
        return
    row = data.train_rows[0]
    stand_in = next((str(row[k]) for k in ("completion", "answer") if row.get(k) is not None), "")
    where = f"{source_of(config, 'train_rows')} row {row.get('_row', 0) + 1}"
    from grpo.data import columns_of
    try:
        with faults.counting():     # the stand-in's counts are no step's
            score([fn for fn, _ in mine], [w for _, w in mine],
                  prompt_texts(config, tokenizer, [row], data.agent), [stand_in], columns_of([row], 1), on_error=config.reward.reward_on_error,
                  unscorable=config.reward.unscorable)
    except RewardError as e:
        raise RewardError(f"before training, a dry call on {where} (completion {stand_in[:40]!r}): "
                          f"{e}") from None


def _users_own(fn: RewardFn) -> bool:
    """A reward function the project did not write: a user's function given as module:function
    or from Python (not a built-in, code_tests, a reward model or a reward server)."""
    return (fn not in REWARDS.values() and not isinstance(fn, (CodeTests, RewardModel, RewardServer)))


def appears(model_dir: Path, wait_s: float = 10.0) -> bool:
    """True once `model_dir` holds a model's config.json, looked for during `wait_s` seconds: a
    shared file system may show what another machine wrote a moment late."""
    deadline = time.monotonic() + wait_s
    while not (model_dir / "config.json").is_file():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def unseen_model(seen: list[tuple[str, bool]]) -> str | None:
    """What is wrong when a process (of `seen`, each one's (path, whether it sees the tiny model
    there), in rank order) does not see the model rank 0 built; None when every one does."""
    missing = [rank for rank, (_, there) in enumerate(seen) if not there]
    if not missing:
        return None
    rank, where = missing[0], seen[missing[0]][0]
    return (f"config key 'model': process {rank} does not see {where}, where process 0 built the "
            "tiny model: under torchrun on several machines, output_dir must be on a file system "
            "they share")
