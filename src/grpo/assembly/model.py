"""The model and tokenizer a run trains: a hub name, a directory, a run's own weights or the tiny
models (built on rank 0 and seen by every process), made ready (frozen tower, checkpointing,
mixed precision, LoRA) the same way whether loaded here or given from Python."""

from __future__ import annotations

import os
import random
import re
import tempfile
from pathlib import Path
from typing import Callable

import torch

from grpo import vision
from grpo.assembly.checks import appears, unseen_model
from grpo.assembly.rewards import _first_line
from grpo.config import ConfigError, TrainConfig
from grpo.data.tasks import get_task
from grpo.models import ModelError, build_tiny, load_policy, load_tokenizer, model_source
from grpo.models.tiny import build_tiny_vlm
from grpo.run import distributed
from grpo.run.progress import to_stderr


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def resolve_model(config: TrainConfig, run_dir: Path | None,
                  world: distributed.World = distributed.World()) -> str:
    """The model path; `tiny` builds a fresh tiny model in the run directory (or a temporary one),
    `tiny-vlm` (or `tiny` for a task with images) a tiny LLaVA-architecture vision-language model.
    Under torchrun rank 0 writes it into `output_dir`/base_model and every rank reads it from there
    after a barrier (transformers writes model files on rank 0 only): a process that does not see
    it (machines that do not share `output_dir`) stops every process, in one line."""
    name = config.model.model
    d = config.data
    if name == "tiny" and not d.dataset and getattr(get_task(d.task, d.task_args), "vision", False):
        name = "tiny-vlm"             # a task whose prompts hold images gets the tiny vision model
    if name in ("tiny", "tiny-vlm"):
        make = build_tiny_vlm if name == "tiny-vlm" else build_tiny
        if world.size > 1:
            where = Path(config.run.output_dir) / "base_model"
            if world.is_main:
                make(where, seed=config.run.seed)
            distributed.barrier(world)
            problem = unseen_model(distributed.gather_objects((str(where), appears(where)), world))
            if problem:
                raise ConfigError(problem)
            return str(where)
        where = run_dir / "base_model" if run_dir is not None else Path(tempfile.mkdtemp(prefix="grpo-tiny-"))
        return str(make(where, seed=config.run.seed))
    return name


RUN_FILES = ("final", "checkpoints", "metrics.jsonl")   # beside config.yaml, they make a run directory


def run_dir_of(path: str | Path) -> Path | None:
    """The run directory `path` names (the directory, or the config.yaml in it): one that holds
    config.yaml and a run's files; None for anything else."""
    path = Path(path).expanduser()
    where = path.parent if path.name == "config.yaml" and path.is_file() else path
    if (where / "config.yaml").is_file() and any((where / name).exists() for name in RUN_FILES):
        return where
    return None


def run_weights(run_dir: Path, log: Callable[[str], None] = to_stderr) -> Path:
    """A run's trained weights, for load_model_and_tokenizer as `model`: final/merged (lora_merge),
    else final/ (with LoRA, the adapter the loader puts on its base), else the newest checkpoint
    whose manifest verifies, said in `log`."""
    from grpo.run.checkpoint import newest_valid
    final = run_dir / "final"
    if (final / "merged").is_dir():
        return final / "merged"
    if final.is_dir():
        return final
    newest = newest_valid(run_dir / "checkpoints", log)
    if newest is None:
        raise ConfigError(f"config key 'model': cannot load '{run_dir}': a run directory with no "
                          "trained weights yet (no final/, no valid checkpoints/step-N/); continue "
                          "the run with resume=auto")
    log(f"run {run_dir} has no final/ (it stopped before its end): using its newest checkpoint, "
        f"{newest}")
    return newest


def run_settings(run_dir: Path, log: Callable[[str], None] = to_stderr) -> dict:
    """The keys a run was trained with (its config.yaml), less any this version does not know."""
    from grpo.config import KEYS, load_yaml
    saved = load_yaml(run_dir / "config.yaml")
    unknown = sorted(k for k in saved if k not in KEYS)
    if unknown:
        log(f"{run_dir / 'config.yaml'}: leaving out keys this version does not have: {unknown}")
    return {k: v for k, v in saved.items() if k in KEYS}


def load_model_and_tokenizer(config: TrainConfig, run_dir: Path | None,
                             log: Callable[[str], None] = to_stderr,
                             world: distributed.World = distributed.World()):
    """The policy and its tokenizer from `model`; every failure to load is one line naming the
    key and the path (models.model_source checks the directory first)."""
    try:
        path, note = model_source("model", resolve_model(config, run_dir, world))
    except ModelError as e:
        raise ConfigError(str(e)) from None
    if note:
        log(note)
    try:
        tokenizer = load_tokenizer(path, config.model.chat_template)
        policy = load_policy(path, config.model.dtype)
    except ModelError as e:         # the tokenizer's own checks: EOS, chat template
        raise ConfigError(str(e)) from None
    except (OSError, ValueError, KeyError, ImportError) as e:
        where = "" if Path(path).is_dir() else " (no directory here, so it was read as a hub name)"
        raise ConfigError(f"config key 'model': cannot load '{path}'{where}: {_first_line(e)}") from None
    if torch.cuda.is_available():   # this process's GPU under torchrun (LOCAL_RANK), else the first
        policy = policy.to(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}")
    if vision.is_vision_model(policy) and not config.model.train_vision:
        vision.freeze_tower(policy)   # the reference model then shares it (models.frozen_copy)
    if config.optim.gradient_checkpointing:
        set_checkpointing(policy, True)
    if config.optim.mixed_precision == "bf16":
        policy.grpo_autocast = torch.bfloat16     # models.token_logprobs computes under autocast
    set_packing(policy, config)
    if config.model.lora_r > 0:
        policy = add_lora(policy, config)
    return policy, tokenizer


def given_model(config: TrainConfig, model, tokenizer, log: Callable[[str], None] = to_stderr):
    """A model and tokenizer loaded by the caller, made ready as load_model_and_tokenizer makes
    its own, in place: train mode and no dropout, the tokenizer's padding on the left (EOS pads
    when it has no pad token), the config's chat template, checkpointing, mixed precision and
    LoRA. The model stays on the device the caller put it on."""
    from grpo.models import prepare_tokenizer, ready_for_training
    try:
        tokenizer = prepare_tokenizer(tokenizer, config.model.model, config.model.chat_template)
    except ModelError as e:
        raise ConfigError(str(e)) from None
    policy = ready_for_training(model)
    if vision.is_vision_model(policy) and not config.model.train_vision:
        vision.freeze_tower(policy)
    if config.optim.gradient_checkpointing:
        set_checkpointing(policy, True)
    if config.optim.mixed_precision == "bf16":
        policy.grpo_autocast = torch.bfloat16
    set_packing(policy, config)
    if config.model.lora_r > 0:
        policy = add_lora(policy, config)
    return policy, tokenizer


def set_packing(model, config: TrainConfig) -> None:
    """`packing`: models.token_logprobs packs a micro-batch's rows (models/packed.py) where the
    model reads `grpo_packing`; `auto` packs on CUDA where this torch has a variable-length
    attention kernel (packed.has_varlen_kernel)."""
    from grpo.models.packed import has_varlen_kernel
    on_cuda = next(model.parameters()).device.type == "cuda"
    model.grpo_packing = config.optim.packing == "on" or (
        config.optim.packing == "auto" and on_cuda and has_varlen_kernel())


ROUNDED_AWAY_REFUSED = 0.5   # fewer weights than this share moved by an lr-sized step: refused
ROUNDED_AWAY_NOTED = 0.9     # fewer than this: said at start


def check_precision(config: TrainConfig, policy, log: Callable[[str], None] = to_stderr,
                    given: bool = False, keys: tuple[str, ...] = ("lr", "sft_lr")) -> None:
    """Weights whose dtype is too coarse for the learning rate: AdamW's step (at most about lr a
    weight) is below half the spacing between neighbouring values of most bfloat16 weights at the
    learning rates RL uses, so the update rounds away and nothing trains, silently. The share of
    trainable weights an lr-sized step moves (update.moved_fraction, measured on these weights) is
    refused under ROUNDED_AWAY_REFUSED and said under ROUNDED_AWAY_NOTED, with the fix: float32
    weights and bfloat16 compute (mixed_precision=bf16). `given`: a model given to train();
    `keys`: the rates the command uses (sft_lr only where sft_steps is set)."""
    from grpo.update import moved_fraction
    params = [p for p in policy.parameters() if p.requires_grad]
    coarse = sorted({str(p.dtype).removeprefix("torch.") for p in params if p.dtype != torch.float32})
    if not coarse:
        return
    rates = [("lr", config.optim.lr)] + ([("sft_lr", config.run.sft_lr)] if config.run.sft_steps else [])
    for key, lr in [(key, lr) for key, lr in rates if key in keys]:
        moved = moved_fraction(params, lr)
        if moved >= ROUNDED_AWAY_NOTED:
            continue
        held, fix = (("the model given to train() holds", "give train() model.float() and set "
                      "mixed_precision=bf16") if given else
                     (f"dtype={config.model.dtype} loads", "dtype=float32 mixed_precision=bf16"))
        said = (f"config key '{key}': a step of {key}={lr:g} changes only {moved:.1%} of the "
                f"trainable weights: {held} {'/'.join(coarse)} weights, and for the rest the step "
                "is below half the spacing between neighbouring values, so it rounds away and they "
                f"never train. Train float32 weights with bfloat16 compute: {fix} "
                "(docs/performance.md)")
        if moved < ROUNDED_AWAY_REFUSED:
            raise ConfigError(f"{said}, or raise {key}")
        log(said)


def set_checkpointing(model, on: bool) -> None:
    """Activation checkpointing per decoder layer in the passes that build a graph: the lean
    decoder reads `grpo_checkpointing`; Hugging Face's forward (heads that are more than a linear
    layer, FSDP2) gets its own gradient checkpointing. Passes without gradients are unchanged."""
    model.grpo_checkpointing = on
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):      # transformers >= 5.x's names
        enable = lambda: model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)  # noqa: E731
        disable = model.activation_checkpointing_disable
    else:
        enable = lambda: model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # noqa: E731
        disable = model.gradient_checkpointing_disable
    if on and getattr(model, "supports_gradient_checkpointing", False):
        enable()
    elif not on and getattr(model, "is_gradient_checkpointing", False):
        disable()


def add_lora(policy, config: TrainConfig):
    """Wrap the policy with a fresh LoRA adapter (peft); only the adapter's weights train."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ConfigError("config key 'lora_r' needs peft: pip install 'peft>=0.13' (in a clone of "
                          "grpo: pip install -e '.[lora]')") from None
    m = config.model
    present = {name.rsplit(".", 1)[-1] for name, _ in policy.named_modules()}
    missing = [t for t in m.lora_target_modules if t not in present]
    if missing:
        raise ConfigError(f"config key 'lora_target_modules': the model has no layers named {missing}")
    targets = list(m.lora_target_modules)
    if vision.is_vision_model(policy):   # the language model's layers only, not the image encoder's
        targets = (rf"^(?!.*\b({'|'.join(vision.TOWERS)})\b).*\.({'|'.join(map(re.escape, targets))})$")
    lora = LoraConfig(r=m.lora_r, lora_alpha=m.lora_alpha, target_modules=targets,
                      lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    return get_peft_model(policy, lora)


def load_teacher(c: TrainConfig, policy, tokenizer, log: Callable[[str], None] = to_stderr):
    """The distillation teacher (`teacher`): loaded once, frozen, in `teacher_dtype` on
    `teacher_device` (the policy's when empty). A run directory stands for its final/. Its
    tokenizer must be the policy's, token for token: the advantage compares the two models'
    log-probs of the same token ids, so another vocabulary is refused in one line."""
    path, note = model_source("teacher", c.model.teacher)
    if note:
        log(note)
    theirs = load_tokenizer(path)
    mismatch = tokenizer_difference(tokenizer, theirs)
    if mismatch:
        raise ConfigError(f"config key 'teacher': {c.model.teacher} has another tokenizer than the "
                          f"model ({mismatch}); distillation compares the two models' log-probs of "
                          "the same token ids, so the teacher must share the policy's tokenizer")
    dtype = c.compute_dtype if c.model.teacher_dtype == "auto" else c.model.teacher_dtype
    teacher = load_policy(path, dtype)
    device = c.model.teacher_device or next(policy.parameters()).device
    teacher = teacher.to(device).eval()
    teacher.requires_grad_(False)
    if c.optim.mixed_precision == "bf16" and dtype == "float32":
        teacher.grpo_autocast = torch.bfloat16      # compute as the policy does
    log(f"teacher: {c.model.teacher} ({sum(p.numel() for p in teacher.parameters()):,} parameters, "
        f"{dtype}, on {device}); distill={c.loss.distill}, distill_coef={c.loss.distill_coef:g}")
    return teacher


def tokenizer_difference(ours, theirs) -> str:
    """'' when two tokenizers map every token to the same id (and share EOS), else the first
    difference, said."""
    a, b = ours.get_vocab(), theirs.get_vocab()
    if len(a) != len(b):
        return f"{len(b):,} tokens against {len(a):,}"
    for token, i in a.items():
        if b.get(token) != i:
            return f"token {token!r} is id {b.get(token)} there, {i} here"
    if ours.eos_token_id != theirs.eos_token_id:
        return f"EOS is id {theirs.eos_token_id} there, {ours.eos_token_id} here"
    return ""
