"""Names that users bring from other trainers, and what each one is here.

TRL's GRPOConfig, transformers' TrainingArguments (which GRPOConfig extends) and verl call many of
grpo's settings by other names, and hold some that grpo has no key for. The config is strict: these
names stay unknown keys, and the error says what each one is here instead of guessing the nearest
spelling (load._explain_unknown). An entry of FOREIGN_KEYS is read after "it", and is one of:

    KEY                       a key of ours that holds the same setting: "it is called 'lr' here"
    "is called 'KEY' here..."  a key of ours, and what differs (its default, its unit, its values)
    "is KEY=VALUE here..."     a value of one of our keys, or which value each of theirs is
    "has no equivalent here..." why none is, and what comes nearest

FOREIGN_CHOICES does the same for TRL's values of `loss_type`, a key whose name is ours and whose
choices are not. tests/test_foreign_names.py holds every field of TRL 1.x's GRPOConfig to a key of
ours or an entry here, and each KEY=VALUE an entry names to a key of ours.
"""

from __future__ import annotations

import re

from grpo.config.presets import ALGORITHMS

_PER_STEP = ("a step samples prompts_per_step prompts with group_size completions each, so set "
             "those two (micro_batch_size or micro_batch_tokens split the step's passes)")
_NO_ENTROPY_BONUS = "has no equivalent here: there is no entropy bonus (the entropy is logged as `entropy`)"
_SAMPLES = "has no equivalent here: every completion is written to samples.jsonl in the run directory"
_ADAM = ("has no equivalent here: AdamW keeps torch's defaults, betas (0.9, 0.999) and eps 1e-8, "
         "which are transformers' defaults too")
_OPTIMIZER = "has no equivalent here: the optimizer is torch's AdamW on every trained weight"
_NO_CONTINUOUS = ("has no equivalent here: grpo's own sampler (sampler=hf) batches each step's "
                  "prompts itself, and vLLM (sampler=vllm or vllm_server) batches continuously")
_EVERY_STEP = ("has no equivalent here: every step's metrics go to metrics.jsonl; log_every=N "
               "prints the progress line every N steps")

FOREIGN_KEYS = {
    # TRL's GRPOConfig, and the fields of transformers' TrainingArguments a GRPO config sets
    "learning_rate": "lr", "num_generations": "group_size", "max_completion_length": "max_new_tokens",
    "max_steps": "steps", "lr_scheduler_type": "lr_schedule", "logging_steps": "log_every",
    "save_steps": "save_every", "save_total_limit": "keep_last", "eval_steps": "eval_every",
    "model_name_or_path": "model", "dataset_name": "dataset", "dataset_train_split": "dataset_split",
    "dataset_test_split": "eval_split", "reward_funcs": "rewards", "torch_dtype": "dtype",
    "mask_truncated_completions": "mask_truncated", "ref_model_sync_steps": "ref_reset_every",
    "ref_model_mixup_alpha": "ref_update_rate", "epsilon_low": "epsilon", "target_modules":
    "lora_target_modules", "sapo_temperature_pos": "sapo_tau_pos", "sapo_temperature_neg":
    "sapo_tau_neg", "vllm_server_base_url": "vllm_url",
    "ddp_timeout": "collective_timeout_s",
    "vllm_importance_sampling_clip_max": "correction_cap",
    "num_train_epochs": "has no equivalent here: steps counts GRPO steps of prompts_per_step "
                        "prompts each (an epoch of the dataset is its rows / prompts_per_step steps)",
    "per_device_train_batch_size": f"has no single equivalent here: {_PER_STEP}",
    "gradient_accumulation_steps": f"has no equivalent here: {_PER_STEP}, and a step's gradients "
                                   "are summed over its passes before its one optimizer step",
    "generation_batch_size": f"has no equivalent here: {_PER_STEP}",
    "steps_per_generation": "has no equivalent here: a step samples once and takes num_iterations "
                            "optimizer steps, each on the whole batch (not on slices of it)",
    "per_device_eval_batch_size": "has no equivalent here: evaluation batches itself; eval_size "
                                  "sets how many held-out prompts are scored",
    "num_generations_eval": "is called 'eval_samples' here: completions per held-out prompt "
                            "(1, the default, decodes greedily)",
    "max_prompt_length": "has no equivalent here: prompts are never truncated; long_prompts=skip "
                         "leaves out those that do not fit the model's context",
    "warmup_ratio": "has no equivalent here: warmup_steps counts steps",
    "model_init_kwargs": "has no equivalent here: a model is loaded with the dtype key alone (TRL's "
                         "torch_dtype); no other from_pretrained keyword is passed",
    "trust_remote_code": "has no equivalent here: models and tokenizers load with transformers' own "
                         "classes only, so one that ships its own code does not load",
    "router_aux_loss_coef": "has no equivalent here: no auxiliary loss is added, so a "
                            "Mixture-of-Experts model trains without its load-balancing loss",
    "disable_dropout": "has no equivalent here: dropout is always off (set to 0 when a model "
                       "loads), so pi_theta and pi_old agree on the same weights",
    "cast_lm_head_to_fp32": "has no equivalent here: the log-probs are computed in float32 "
                            "whatever the dtype; the head's weights stay in dtype (dtype=float32 "
                            "mixed_precision=bf16 keeps every weight in float32)",
    "remove_unused_columns": "has no equivalent here: every column of a row reaches the reward "
                             "functions as a keyword argument",
    "ds3_gather_for_generation": "has no equivalent here: there is no DeepSpeed; parallel=fsdp "
                                 "shards the model with FSDP2",
    "shuffle_dataset": "has no equivalent here: the training rows are always shuffled, from seed, "
                       "and again each pass",
    "pad_to_multiple_of": "has no equivalent here: a pass pads its rows to its longest one",
    "generation_kwargs": "has no equivalent here: the sampling keys are temperature, top_p, top_k, "
                         "min_p, repetition_penalty, stop and max_new_tokens",
    "chat_template_kwargs": "has no equivalent here: the template is given no keywords; "
                            "chat_template=FILE (or the template's text) replaces it",
    "cache_implementation": "has no equivalent here: grpo's own sampler (sampler=hf) keeps a KV "
                            "cache of its own",
    "use_vllm": "is sampler=vllm here (an engine in the training process; sampler=vllm_server "
                "samples on a running server)",
    "vllm_mode": "is a value of 'sampler' here: server is sampler=vllm_server with "
                 "vllm_url=http://HOST:PORT (grpo launch starts one), colocate is sampler=vllm",
    "vllm_model_impl": "has no equivalent here: vLLM chooses its own model implementation",
    "vllm_enable_sleep_mode": "is called 'vllm_sleep' here, and is on by default (TRL's is off): "
                              "sampler=vllm frees the engine's memory during the update",
    "vllm_structured_outputs_regex": "has no equivalent here: completions are not constrained to "
                                     "a regex or grammar",
    "vllm_server_host": "has no equivalent here: vllm_url=http://HOST:PORT gives the host and port",
    "vllm_server_port": "has no equivalent here: vllm_url=http://HOST:PORT gives the host and port",
    "vllm_server_timeout": "has no equivalent here: TRL's is the wait for the server to come up, "
                           "and grpo launch waits for the server it starts; vllm_timeout_s "
                           "(seconds too) bounds each request and weight update sent to a server",
    "vllm_group_port": "has no equivalent here: the weights reach a server as files under "
                       "vllm_weights_dir, not through an NCCL group",
    "vllm_max_model_length": "has no equivalent here: vLLM takes the model's own context length",
    "vllm_tensor_parallel_size": "has no equivalent here: sampler=vllm runs one engine on one "
                                 "device; a server started with vllm serve --tensor-parallel-size "
                                 "N is sampler=vllm_server",
    "delta": "is loss_type=dual_clip with clip_c=DELTA here: for a negative advantage the ratio "
             "counts at most clip_c, as in TRL's two-sided clip (the same whenever delta > 1 + "
             "epsilon_high, as TRL recommends)",
    "vespo_k_pos": "has no equivalent here: there is no VESPO loss",
    "vespo_k_neg": "has no equivalent here: there is no VESPO loss",
    "vespo_lambda_pos": "has no equivalent here: there is no VESPO loss",
    "vespo_lambda_neg": "has no equivalent here: there is no VESPO loss",
    "importance_sampling_level": "is a value of 'loss_type' here: sequence is loss_type=gspo (one "
                                 "ratio per sequence, from the mean of its log-ratios), token the "
                                 "other losses",
    "multi_objective_aggregation": "has no equivalent here: the rewards' weighted sum is what is "
                                   "normalized (TRL's sum_then_normalize)",
    "scale_rewards": "is a value of 'advantage' here: group is advantage=group_norm, batch is "
                     "advantage=batch_norm, none is advantage=group_mean (Dr. GRPO)",
    "sync_ref_model": "has no equivalent here: ref_reset_every=N refreshes the reference every N "
                      "steps (ref_update_rate sets how far)",
    "top_entropy_quantile": "has no equivalent here: every completion token is in the loss, "
                            "whatever its entropy (logged as `entropy`)",
    "entropy_coef": _NO_ENTROPY_BONUS, "use_adaptive_entropy": _NO_ENTROPY_BONUS,
    "entropy_coef_min": _NO_ENTROPY_BONUS, "entropy_coef_max": _NO_ENTROPY_BONUS,
    "entropy_coef_delta": _NO_ENTROPY_BONUS, "entropy_target": _NO_ENTROPY_BONUS,
    "max_tool_calling_iterations": "has no equivalent here: max_turns counts the model's turns "
                                   "of an episode, so N rounds of tool calls and an answer are "
                                   "max_turns=N+1",
    "vllm_importance_sampling_correction": "is a value of 'correction' here: correction=none (the "
                                           "default) applies none; TRL's default is "
                                           "correction=seq_mis correction_cap=3",
    "vllm_importance_sampling_mode": "is a value of 'correction' here: token_truncate is "
                                     "correction=tis, token_mask correction=token_mis, "
                                     "sequence_mask correction=seq_mis; sequence_truncate has no "
                                     "equivalent",
    "vllm_importance_sampling_clip_min": "is called 'correction_cap_low' here, for the corrections "
                                         "that mask (token_mis, seq_mis, icepop, geo_mask); tis "
                                         "has no lower bound",
    "vllm_importance_sampling_cap": "is called 'correction_cap' here: the threshold of the "
                                    "correction that the correction key chooses (TRL's clip_max)",
    "off_policy_mask_threshold": "has no equivalent here: sequences are not masked by their KL "
                                 "(correction=geo_mask masks them by their mean ratio)",
    "use_bias_correction_kl": "has no equivalent here: the KL term is not weighted by the "
                              "importance ratio",
    "log_completions": f"{_SAMPLES}, with its prompt, reward and advantage",
    "log_multimodal": "has no equivalent here: samples.jsonl holds the text of every prompt and "
                      "completion; images are not logged",
    "num_completions_to_print": f"{_SAMPLES}; none is printed",
    "log_unique_prompts": f"{_SAMPLES}, with its prompt",
    "log_completions_hub_repo": f"{_SAMPLES}; push_to_hub=USER/NAME uploads final/, the model",
    "use_transformers_continuous_batching": _NO_CONTINUOUS,
    "transformers_continuous_batching_config": _NO_CONTINUOUS,
    "use_transformers_paged": _NO_CONTINUOUS,
    # TRL's ModelConfig
    "use_peft": "is lora_r=N here (N > 0 trains a LoRA adapter)",
    "lora_dropout": "has no equivalent here: adapters have no dropout",
    "attn_implementation": "has no equivalent here: the model loads with transformers' default",
    # transformers' TrainingArguments
    "bf16": "is mixed_precision=bf16 here (bfloat16 compute, float32 weights; dtype=bfloat16 "
            "holds the weights themselves in bfloat16)",
    "fp16": "has no equivalent here: mixed precision is mixed_precision=bf16 only; dtype=float16 "
            "holds the weights themselves in float16",
    "tf32": "has no equivalent here: TF32 is not switched on (torch's defaults stand); "
            "mixed_precision=bf16 is the fast setting on a GPU",
    "optim": f"{_OPTIMIZER} (fused where torch has it)",
    "optim_args": _OPTIMIZER, "optim_target_modules": _OPTIMIZER,
    "adam_beta1": _ADAM, "adam_beta2": _ADAM, "adam_epsilon": _ADAM,
    "lr_scheduler_kwargs": "has no equivalent here: lr_schedule is constant or cosine (to 0 at the "
                           "last step), after warmup_steps of linear warmup",
    "run_name": "has no equivalent here: the trackers name the run after output_dir's last folder",
    "logging_dir": "has no equivalent here: TensorBoard events are written to OUTPUT_DIR/tb",
    "logging_strategy": _EVERY_STEP, "logging_first_step": _EVERY_STEP,
    "log_level": "has no equivalent here: process 0 prints the progress line every log_every steps",
    "resume_from_checkpoint": "is called 'resume' here: resume=auto continues from the newest "
                              "checkpoint in output_dir, resume=PATH from a checkpoints/step-N",
    "save_strategy": "has no equivalent here: save_every=N writes a checkpoint every N steps and at "
                     "the last (0: final/ alone)",
    "eval_strategy": "has no equivalent here: eval_every=N evaluates every N steps, at step 0 and "
                     "at the end (0: never)",
    "evaluation_strategy": "has no equivalent here: eval_every=N evaluates every N steps, at step 0 "
                           "and at the end (0: never)",
    "eval_on_start": "has no equivalent here: step 0 is evaluated whenever eval_every is above 0",
    "gradient_checkpointing_kwargs": "has no equivalent here: gradient_checkpointing=true "
                                     "checkpoints each decoder layer, and takes no options",
    "auto_find_batch_size": "has no equivalent here: micro_batch_tokens bounds each pass's padded "
                            "tokens (0: sized from the model) and micro_batch_size its rows",
    "dataloader_num_workers": "has no equivalent here: the rows are read once at start and "
                              "batched in the process, with no DataLoader",
    "data_seed": "has no equivalent here: seed sets the data order too",
    "local_rank": "has no equivalent here: torchrun gives each process its rank",
    "ddp_backend": "has no equivalent here: gloo on CPUs, NCCL on GPUs",
    "deepspeed": "has no equivalent here: there is no DeepSpeed; under torchrun, parallel=fsdp "
                 "shards parameters, gradients and optimizer state (FSDP2), parallel=ddp does not",
    "fsdp": "is parallel=fsdp here (FSDP2, under torchrun), which takes no options",
    "fsdp_config": "has no equivalent here: parallel=fsdp takes no options",
    "hub_model_id": "is push_to_hub=USER/NAME here: the repo id itself, which uploads final/ at "
                    "the end of the run",
    "hub_token": "has no equivalent here: the token is read from HF_TOKEN or hf auth login",
    "hub_private_repo": "has no equivalent here: a repo that push_to_hub creates is private",
    "hub_strategy": "has no equivalent here: push_to_hub uploads final/ once, at the end of the run",
    # verl's names (the last part of its nested keys), and the few that only a path makes clear
    "kl_coef": "beta", "kl_loss_coef": "beta", "use_kl_in_reward": "kl_in_reward",
    "kl_loss_type": "kl_estimator", "clip_ratio": "epsilon", "clip_ratio_low": "epsilon",
    "clip_ratio_high": "epsilon_high", "clip_ratio_c": "clip_c", "ppo_epochs": "num_iterations",
    "loss_agg_mode": "aggregation", "adv_estimator": "advantage", "grad_clip": "max_grad_norm",
    "lr_warmup_steps": "warmup_steps", "total_training_steps": "steps", "train_batch_size":
    "prompts_per_step", "ppo_micro_batch_size_per_gpu": "micro_batch_size", "max_response_length":
    "max_new_tokens", "gpu_memory_utilization": "vllm_gpu_memory_utilization", "lora_rank": "lora_r",
    "train_files": "dataset", "val_files": "eval_dataset", "prompt_key": "prompt_column",
    "save_freq": "save_every", "test_freq": "eval_every", "default_local_dir": "output_dir",
    "rollout_is_threshold": "correction_cap", "rollout_rs_threshold": "correction_cap",
    "rollout_rs_threshold_lower": "correction_cap_low", "model.path": "model", "model.name": "model",
    "rollout.n": "group_size",
    "total_epochs": "has no equivalent here: steps counts GRPO steps of prompts_per_step prompts each",
    "ppo_mini_batch_size": f"has no equivalent here: {_PER_STEP}, and num_iterations sets the "
                           "updates per batch",
    "use_kl_loss": "has no equivalent here: beta > 0 is a KL loss term, kl_in_reward=true puts the "
                   "KL in the reward instead",
    "entropy_coeff": _NO_ENTROPY_BONUS,
}


def named_key(meaning: str) -> str:
    """The key an entry of FOREIGN_KEYS names as the same setting: the entry itself, or KEY of
    "is called 'KEY' here ..."; "" when it names none."""
    if " " not in meaning:
        return meaning
    called = re.match(r"is called '(\w+)' here", meaning)
    return called.group(1) if called else ""


_AGGREGATION = "TRL's loss_type={} names its aggregation, {}: that is aggregation={} here, with loss_type=clip"
# TRL's values of loss_type (its default: dapo), each what it is here, read after the choices.
FOREIGN_CHOICES = {"loss_type": {
    "grpo": _AGGREGATION.format("grpo", "each completion's token mean, then the mean over "
                                "completions", "sequence_mean") + " (both the defaults)",
    "dr_grpo": _AGGREGATION.format("dr_grpo", "the token sum over max_completion_length times the "
                                   "completions", "constant") + ", whose constant is "
                                   "max_new_tokens times the step's completions",
    "dapo": _AGGREGATION.format("dapo", "the mean over every completion token of the accumulated "
                                "batch", "token_mean") + ", which divides by the whole step's "
                                "tokens, every process's, as TRL's does",
    "bnpo": "TRL's loss_type=bnpo names its aggregation, the mean over each process's local batch "
            "of tokens: the nearest here is aggregation=token_mean with loss_type=clip, which "
            "divides by the whole step's tokens, every process's, instead",
    "luspo": "TRL's loss_type=luspo (GSPO's loss scaled by each sequence's length) has no "
             "equivalent here; loss_type=gspo is GSPO's",
    "vespo": "TRL's loss_type=vespo (a Gamma weighting of sequence ratios in place of the clip) "
             "has no equivalent here",
}}


def choice_hint(key: str, value) -> str:
    """What an unknown choice of `key` most likely meant, to follow its error: TRL's meaning of the
    value, and the preset of that name where there is one (a whole preset: more than the one key)."""
    said = [FOREIGN_CHOICES.get(key, {}).get(value, "")]
    if value in ALGORITHMS:
        sets = ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                         for k, v in ALGORITHMS[value].items())
        said.append(f"algorithm={value} is the whole {value} preset here, more than {key}: it sets {sets}")
    return "".join(f". {s}" for s in said if s)
