"""The values a configuration may hold: each numeric key's range (BOUNDS), then the rules across keys
(RULES), one table of named checks run in order; `validate` raises the first that fails."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from grpo.config.foreign import choice_hint
from grpo.config.sections import ConfigError, TrainConfig


@dataclass(frozen=True)
class Bound:
    """The values a numeric key may take: from `low` to `high` (None: no limit above), each end
    included unless `open_low` / `open_high`; `why` follows the error. A list key's every element."""
    low: float
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    why: str = ""

    def holds(self, value) -> bool:
        above = value > self.low if self.open_low else value >= self.low
        below = self.high is None or (value < self.high if self.open_high else value <= self.high)
        return above and below

    def describe(self) -> str:
        def num(x) -> str:
            return str(int(x)) if float(x).is_integer() else f"{x:g}"
        if self.high is None:
            if self.open_low:
                return f"above {num(self.low)}"
            return "0 or more" if self.low == 0 else f"at least {num(self.low)}"
        return (f"in {'(' if self.open_low else '['}{num(self.low)}, {num(self.high)}"
                f"{')' if self.open_high else ']'}")


_COUNT, _AT_LEAST_1, _ABOVE_0 = Bound(0), Bound(1), Bound(0, open_low=True)
_SHARE = Bound(0, 1, why="a share of the batch's tokens")

def sampler_own_keys(sampling) -> list[str]:
    """The sampling keys set away from their defaults that only grpo's own single-turn sampler
    applies (to the sampled and the trained distribution alike); `sampling` is a flat config dict
    or a SamplingConfig."""
    get = sampling.get if isinstance(sampling, dict) else lambda k: getattr(sampling, k)
    return [k for k, off in (("top_k", 0), ("min_p", 0.0), ("repetition_penalty", 1.0), ("stop", []))
            if get(k) != off]


# key -> the range its values must lie in, checked before any other rule; every int and float key
# has an entry here or in UNBOUNDED (a test walks them).
BOUNDS: dict[str, Bound] = {
    "lora_r": _COUNT,
    "lora_alpha": Bound(0, open_low=True, why="the adapter's update is scaled by lora_alpha / lora_r"),
    "eval_size": _COUNT,
    "group_size": Bound(2, why="advantages compare completions of the same prompt, so one has "
                              "nothing to compare with"),
    "prompts_per_step": _AT_LEAST_1,
    "vllm_timeout_s": Bound(0, open_low=True, why="a request or a weight update waits this long"),
    "max_new_tokens": _AT_LEAST_1,
    "temperature": Bound(0, open_low=True, why="the logits are divided by it (evaluation is already "
                                                "greedy)"),
    "top_p": Bound(0, 1, open_low=True, why="the probability mass sampled from"),
    "top_k": Bound(0, why="the number of most likely tokens sampled from (0: all)"),
    "min_p": Bound(0, 1, open_high=True, why="a fraction of the most likely token's probability"),
    "repetition_penalty": Bound(0, open_low=True, why="positive logits are divided by it"),
    "vllm_gpu_memory_utilization": Bound(0, 1, open_low=True, open_high=True,
                                         why="a fraction of the GPU's memory"),
    "max_sampling_rounds": _COUNT,
    "decode_slots": _COUNT,
    "code_timeout_s": _ABOVE_0,
    "code_workers": _AT_LEAST_1,
    "reward_server_timeout_s": _ABOVE_0,
    "beta": _COUNT,
    "epsilon": Bound(0, 1, why="rho is clipped below at 1 - epsilon, and no ratio is below 0"),
    "epsilon_high": _COUNT,
    "advantage_eps": Bound(0, why="0 divides by the std alone (a group whose rewards are all "
                                  "equal gets 0 whatever eps)"),
    "distill_coef": Bound(0, open_low=True, why="it scales the teacher's per-token advantage; "
                          "distill=add with no teacher weight is no teacher (teacher= empty)"),
    "clip_cov_fraction": _SHARE,
    "kl_cov_fraction": _SHARE,
    "kl_cov_coef": _COUNT,
    "sapo_tau_pos": Bound(0, open_low=True, why="a gate temperature"),
    "sapo_tau_neg": Bound(0, open_low=True, why="a gate temperature"),
    "clip_c": Bound(1, open_low=True, why="dual_clip bounds a negative advantage's objective below "
                                           "at clip_c * A, beyond the clip at 1 + epsilon_high"),
    "overlong_buffer": Bound(0, 1, open_high=True, why="a fraction of max_new_tokens"),
    "overlong_penalty": _COUNT,
    "tis_cap": _COUNT,
    "correction_cap": Bound(1, open_low=True, why="the correction's upper threshold on the ratio"),
    "correction_cap_low": Bound(0, 1, open_high=True, why="the correction's lower threshold on "
                                                          "the ratio (0: the method's own)"),
    "lr": _COUNT,
    "warmup_steps": _COUNT,
    "weight_decay": _COUNT,
    "max_grad_norm": _COUNT,
    "num_iterations": _AT_LEAST_1,
    "max_skipped_updates": _COUNT,
    "micro_batch_size": _AT_LEAST_1,
    "micro_batch_tokens": _COUNT,
    "steps": _COUNT,
    "sft_steps": _COUNT,
    "sft_lr": _COUNT,
    "sft_batch_size": _AT_LEAST_1,
    "ref_reset_every": _COUNT,
    "ref_update_rate": Bound(0, 1, open_low=True, why="the share of the policy in a reference refresh"),
    "eval_every": _COUNT,
    "save_every": _COUNT,
    "keep_last": _COUNT,
    "seed": Bound(-2**63, 2**64 - 1, why="torch's seeds are 64 bits"),
    "threads": _COUNT,
    "log_every": _AT_LEAST_1,
    "eval_samples": _AT_LEAST_1,
    "eval_temperature": Bound(0, open_low=True, why="the logits are divided by it"),
    "eval_k": _AT_LEAST_1,
    "max_turns": _AT_LEAST_1,
    "turn_tokens": _COUNT,
    "episode_tokens": _COUNT,
    "tool_deadline_s": _ABOVE_0,
    "async_steps": _COUNT,
    "rollout_workers": _COUNT,
    "transfer_timeout_s": _ABOVE_0,
    "collective_timeout_s": _ABOVE_0,
    "trainer_threads": _COUNT,
    "worker_threads": _COUNT,
    "worker_restarts": _COUNT,
}

# numeric keys with no range of their own, and why
UNBOUNDED: dict[str, str] = {
    "clip_cov_low": "a covariance, of either sign; clip_cov_low <= clip_cov_high is checked",
    "clip_cov_high": "a covariance, of either sign; clip_cov_low <= clip_cov_high is checked",
    "reward_weights": "a weight may be negative (a penalty) or 0 (a reward logged, not trained on)",
}


@dataclass(frozen=True)
class Rule:
    """A check across keys: `check` takes the flat config (key -> value) and returns the error
    message, or None when the config passes."""
    name: str
    check: Callable[[dict], str | None]


# The keys that name an entry of a table in grpo.algorithm (ADVANTAGES, POLICY_LOSSES,
# AGGREGATIONS, KL_ESTIMATORS), with the tables' names in their order: this layer may not import
# that one, and tests/test_foreign_names.py holds the two equal.
TABLE_CHOICES: dict[str, tuple[str, ...]] = {
    "advantage": ("group_norm", "group_mean", "batch_norm", "rloo", "reinforce_pp",
                  "reinforce_pp_baseline"),
    "loss_type": ("clip", "dual_clip", "gspo", "cispo", "sapo", "gmpo", "clip_cov", "kl_cov"),
    "aggregation": ("sequence_mean", "token_mean", "constant", "sequence_sum"),
    "kl_estimator": ("k1", "k2", "k3"),
}


def unknown_choice(c: dict) -> str | None:
    """A key of TABLE_CHOICES that names no entry: the choices, and what the value most likely
    meant (TRL's meaning of it, a preset of that name)."""
    for key, choices in TABLE_CHOICES.items():
        if c[key] not in choices:
            return (f"config key '{key}': unknown choice {c[key]!r}; choose one of "
                    f"{sorted(choices)}{choice_hint(key, c[key])}")
    return None


def _curriculum_not_async(c: dict) -> str | None:
    if (c["task_args"] or {}).get("curriculum") and c["async_steps"]:
        return ("config key 'task_args': a curriculum changes the rows as held-out accuracy rises, "
                "and with async_steps the rollout workers hold the rows; use async_steps=0")
    return None


def _distill_needs_a_teacher(c: dict) -> str | None:
    if c["distill"] == "alone" and not c["teacher"]:
        return ("config key 'teacher': distill=alone (algorithm=distill) trains on a teacher's "
                "per-token log-probs, so it needs teacher=MODEL (a model directory, hub name or "
                "run directory sharing the policy's tokenizer)")
    return None


def _vllm_server_needs_url(c: dict) -> str | None:
    if c["sampler"] != "vllm_server":
        return None
    if not c["vllm_url"]:
        return ("config key 'vllm_url': sampler=vllm_server needs the server's address, "
                "http://HOST:PORT, or a list of them (or start one with the run: grpo launch)")
    for url in c["vllm_url"]:
        if not url.startswith(("http://", "https://")):
            return (f"config key 'vllm_url': sampler=vllm_server needs each server's address as "
                    f"http://HOST:PORT, got {url!r} (or start one with the run: grpo launch)")
    if len(set(c["vllm_url"])) != len(c["vllm_url"]):
        return f"config key 'vllm_url' names a server twice: {c['vllm_url']}"
    return None


def _one_of(key: str, *choices: str, after: str = "") -> Callable[[dict], str | None]:
    """`key` must be one of `choices`; `after` follows the error."""
    said = f"{', '.join(choices[:-1])} or {choices[-1]}"

    def check(c: dict) -> str | None:
        if c[key] not in choices:
            return f"config key '{key}' must be {said}, got {c[key]!r}{after}"
        return None
    return check


def _bf16_needs_float32(c: dict) -> str | None:
    if c["mixed_precision"] != "no" and c["dtype"] != "float32":
        return ("config key 'mixed_precision': bf16 keeps float32 master weights, so it needs "
                f"dtype=float32, got dtype={c['dtype']}; use one or the other")
    return None


def _eval_k_within_samples(c: dict) -> str | None:
    bad_k = [k for k in c["eval_k"] if not 1 <= k <= c["eval_samples"]]
    if bad_k:
        return (f"config key 'eval_k': {bad_k} out of range; each k must be from 1 to "
                f"eval_samples ({c['eval_samples']}): raise eval_samples=N")
    return None


def _chat_template_kind(c: dict) -> str | None:
    if c["chat_template"] not in ("auto", "required", "none") and "{" not in c["chat_template"] \
            and not Path(c["chat_template"]).is_file():
        return (f"config key 'chat_template' must be auto, required or none, a Jinja "
                f"template or the path of a file holding one; {c['chat_template']!r} is "
                "none of these (no such file)")
    return None


def _push_to_hub_repo_id(c: dict) -> str | None:
    if c["push_to_hub"] and not re.fullmatch(r"[\w.-]+/[\w.-]+", c["push_to_hub"]):
        return f"config key 'push_to_hub' must be a hub repo id, user/name, got {c['push_to_hub']!r}"
    return None


def _no_empty_stop(c: dict) -> str | None:
    if "" in c["stop"]:
        return ("config key 'stop': an empty stop string would end every completion at "
                "its first token; remove it")
    return None


def _own_sampler_keys_need_hf(c: dict) -> str | None:
    cut = sampler_own_keys(c)
    if cut and c["sampler"] != "hf":
        return (f"config key{'s' if len(cut) > 1 else ''} {', '.join(cut)}: grpo's own "
                "sampler (sampler=hf) applies them to the sampled and the trained "
                f"distribution alike; sampler={c['sampler']} does not yet. Use sampler=hf, "
                "or leave them unset")
    return None


def _own_sampler_keys_single_turn(c: dict) -> str | None:
    cut = sampler_own_keys(c)
    if cut and (c["tools"] or c["environment"]):
        return (f"config key{'s' if len(cut) > 1 else ''} {', '.join(cut)}: single-turn "
                "sampling applies them; multi-turn episodes (tools, environment) do not "
                "yet. Leave them unset for an agent run")
    return None


def _decode_is_own_sampler(c: dict) -> str | None:
    static = c["decode"] in ("static", "graphs", "compiled")
    if static and c["sampler"] != "hf":
        return (f"config key 'decode': decode={c['decode']} is how grpo's own sampler decodes; "
                f"sampler={c['sampler']} decodes in its engine. Leave decode unset")
    if static and (c["tools"] or c["environment"]):
        return (f"config key 'decode': decode={c['decode']} decodes single-turn completions; "
                "multi-turn episodes (tools, environment) decode eagerly. Use decode=auto")
    if c["decode_slots"] and c["decode"] == "eager":
        return ("config key 'decode_slots': slots are the static decoder's "
                "(decode=static, graphs, compiled, or auto on CUDA); decode=eager has none")
    return None


def _k1_not_a_loss_term(c: dict) -> str | None:
    if c["kl_estimator"] == "k1" and c["beta"] > 0 and not c["kl_in_reward"]:
        # d k1 / d theta = grad log pi, whose expectation under pi is 0: the term does nothing
        return ("config key 'kl_estimator': k1 as a loss term (beta > 0 with "
                "kl_in_reward=false) has an expected gradient of exactly 0, so it would "
                "not regularize at all; set kl_in_reward=true to put k1 in the reward "
                "(PPO-RLHF, RLOO), or kl_estimator=k2 or kl_estimator=k3 for a loss term")
    return None


def _clip_cov_band(c: dict) -> str | None:
    if c["clip_cov_low"] > c["clip_cov_high"]:
        return (f"config keys 'clip_cov_low' ({c['clip_cov_low']}) and 'clip_cov_high' "
                f"({c['clip_cov_high']}) bound the covariance of the tokens clip_cov may "
                "select: the low bound must not be above the high one")
    return None


def _reinforce_pp_or_turn_rewards(c: dict) -> str | None:
    if c["advantage"] in ("reinforce_pp", "reinforce_pp_baseline") and c["turn_rewards"]:
        return (f"config key 'advantage': {c['advantage']} builds each token's return from "
                "the outcome and the KL of the later tokens; with turn_rewards=true the "
                "turns' rewards give per-token advantages of their own. Use one or the other")
    return None


def _gmpo_one_advantage_per_completion(c: dict) -> str | None:
    if (c["loss_type"] == "gmpo" and c["advantage"] in ("reinforce_pp", "reinforce_pp_baseline")
            and c["kl_in_reward"] and c["beta"] > 0):
        return (f"config key 'loss_type': gmpo takes one advantage per completion, and "
                f"advantage={c['advantage']} with kl_in_reward=true gives each token its own "
                "(the KL of the tokens after it); set kl_in_reward=false, or another loss_type")
    return None


def _correction_cap_low_needs_a_mask(c: dict) -> str | None:
    if c["correction_cap_low"] > 0 and (c["correction"] in ("none", "is", "tis")):
        return (f"config key 'correction_cap_low' masks ratios below it, and "
                f"correction={c['correction']} masks none: choose token_mis, seq_mis, "
                "icepop or geo_mask, or correction_cap_low=0")
    return None


def _tis_cap_or_correction(c: dict) -> str | None:
    if c["tis_cap"] > 0 and c["correction"] not in ("none", "tis"):
        return (f"config keys 'tis_cap' and 'correction' ({c['correction']}) both choose a "
                "correction; keep one (tis_cap=C is correction=tis correction_cap=C)")
    return None


def _async_correction_needs_decoupled(c: dict) -> str | None:
    if c["async_steps"] and c["proximal"] == "behaviour" and c["correction"] != "none":
        return (f"config key 'correction' ({c['correction']}) weighs pi_prox / pi_behaviour, "
                "and with proximal=behaviour pi_old is the behaviour policy itself: set "
                "proximal=decoupled to correct, or correction=none")
    return None


def _async_tis_cap_needs_decoupled(c: dict) -> str | None:
    if c["async_steps"] and c["tis_cap"] > 0 and c["proximal"] == "behaviour":
        return ("config key 'tis_cap' weighs pi_prox / pi_behaviour, and with async_steps and "
                "proximal=behaviour pi_old is the behaviour policy itself: set "
                "proximal=decoupled with correction=tis, or tis_cap=0")
    return None


def _one_weight_per_reward(c: dict) -> str | None:
    if c["reward_weights"] and len(c["reward_weights"]) != len(c["rewards"]):
        return (f"config key 'reward_weights' has {len(c['reward_weights'])} weights for "
                f"{len(c['rewards'])} reward functions in 'rewards'; give one per function")
    return None


def _lora_keeps_its_reference(c: dict) -> str | None:
    if c["lora_r"] and c["ref_reset_every"]:
        return ("config key 'ref_reset_every' cannot be used with LoRA ('lora_r' > 0): "
                "the reference is the policy at the start of GRPO with the adapter off")
    return None


def _lora_not_sharded(c: dict) -> str | None:
    if c["lora_r"] and c["parallel"] == "fsdp":
        return ("config key 'parallel': fsdp with LoRA ('lora_r' > 0) is not supported; "
                "use parallel=ddp (the base model is frozen, so only the adapter is synced)")
    return None


def _async_dynamic_sampling_one_worker(c: dict) -> str | None:
    if c["async_steps"] and c["dynamic_sampling"] and c["rollout_workers"] > 1 and c["sampler"] == "hf":
        return ("config key 'dynamic_sampling' with async_steps needs one rollout worker "
                f"(rollout_workers={c['rollout_workers']}): each worker would "
                "refill only its own share of the groups; set rollout_workers=1")
    return None


# The rules across keys, checked in this order after BOUNDS; the first that fails is the error.
RULES: tuple[Rule, ...] = (
    Rule("table_choices", unknown_choice),
    Rule("mixed_precision_choice", _one_of("mixed_precision", "no", "bf16")),
    Rule("packing_choice", _one_of("packing", "auto", "on", "off")),
    Rule("bf16_needs_float32", _bf16_needs_float32),
    Rule("tool_format_choice", _one_of("tool_format", "plain", "hermes")),
    Rule("eval_k_within_samples", _eval_k_within_samples),
    Rule("lr_schedule_choice", _one_of("lr_schedule", "constant", "cosine")),
    Rule("chat_template_kind", _chat_template_kind),
    Rule("push_to_hub_repo_id", _push_to_hub_repo_id),
    Rule("no_empty_stop", _no_empty_stop),
    Rule("own_sampler_keys_need_hf", _own_sampler_keys_need_hf),
    Rule("own_sampler_keys_single_turn", _own_sampler_keys_single_turn),
    Rule("long_prompts_choice", _one_of("long_prompts", "error", "skip")),
    Rule("dtype_choice", _one_of("dtype", "float32", "bfloat16", "float16")),
    Rule("k1_not_a_loss_term", _k1_not_a_loss_term),
    Rule("clip_cov_band", _clip_cov_band),
    Rule("reinforce_pp_or_turn_rewards", _reinforce_pp_or_turn_rewards),
    Rule("gmpo_one_advantage_per_completion", _gmpo_one_advantage_per_completion),
    Rule("correction_choice", _one_of("correction", "none", "is", "tis", "token_mis", "seq_mis",
                                      "icepop", "geo_mask")),
    Rule("correction_cap_low_needs_a_mask", _correction_cap_low_needs_a_mask),
    Rule("tis_cap_or_correction", _tis_cap_or_correction),
    Rule("proximal_choice", _one_of("proximal", "behaviour", "decoupled")),
    Rule("async_correction_needs_decoupled", _async_correction_needs_decoupled),
    Rule("async_tis_cap_needs_decoupled", _async_tis_cap_needs_decoupled),
    Rule("sampler_choice", _one_of("sampler", "hf", "vllm", "vllm_server")),
    Rule("vllm_server_needs_url", _vllm_server_needs_url),
    Rule("decode_choice", _one_of("decode", "auto", "eager", "static", "graphs", "compiled")),
    Rule("decode_is_own_sampler", _decode_is_own_sampler),
    Rule("parallel_choice", _one_of("parallel", "ddp", "fsdp")),
    Rule("lora_keeps_its_reference", _lora_keeps_its_reference),
    Rule("lora_not_sharded", _lora_not_sharded),
    Rule("async_dynamic_sampling_one_worker", _async_dynamic_sampling_one_worker),
    Rule("unscorable_choice", _one_of("unscorable", "any", "all", after=(
        ": any (a row is unscorable when any reward function returns None for it) or all (only "
        "when every one does)"))),
    Rule("reward_on_error_choice", _one_of("reward_on_error", "raise", "skip")),
    Rule("one_weight_per_reward", _one_weight_per_reward),
    Rule("distill_choice", _one_of("distill", "add", "alone")),
    Rule("teacher_dtype_choice", _one_of("teacher_dtype", "auto", "float32", "bfloat16", "float16")),
    Rule("distill_needs_a_teacher", _distill_needs_a_teacher),
    Rule("curriculum_not_async", _curriculum_not_async),
)


def validate(config: TrainConfig) -> None:
    """Range checks that types alone do not catch: every key's BOUNDS, then the RULES in order."""
    c = config.flat()
    for key, bound in BOUNDS.items():
        for value in c[key] if isinstance(c[key], list) else [c[key]]:
            if not bound.holds(value):
                why = f": {bound.why}" if bound.why else ""
                raise ConfigError(f"config key '{key}' must be {bound.describe()}, got {value}{why}")
    for rule in RULES:
        message = rule.check(c)
        if message is not None:
            raise ConfigError(message)
