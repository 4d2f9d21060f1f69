"""A TRL user's config here: every name of TRL's GRPOConfig and the TrainingArguments a GRPO config
sets is either a key of ours or explained (config/foreign.py), never guessed at by spelling; TRL's
values of `loss_type` say what they are here; and a bad choice is refused when the config is built,
before --print-config prints it."""

import dataclasses
import re

import pytest
import torch

from grpo.config import KEYS, ConfigError, build_config
from grpo.config.foreign import FOREIGN_KEYS, named_key
from grpo.config.load import _explain_unknown

# The fields of TRL 1.x's GRPOConfig (trl/trainer/grpo_config.py), in its order. TRL is not
# installed in the tests; a new TRL field is added here with its entry in config/foreign.py.
TRL_GRPO_FIELDS = (
    "learning_rate", "model_init_kwargs", "trust_remote_code", "router_aux_loss_coef",
    "disable_dropout", "cast_lm_head_to_fp32", "remove_unused_columns", "num_generations",
    "num_generations_eval", "max_completion_length", "ds3_gather_for_generation", "shuffle_dataset",
    "pad_to_multiple_of", "generation_batch_size", "steps_per_generation", "temperature", "top_p",
    "top_k", "min_p", "generation_kwargs", "chat_template_kwargs", "repetition_penalty",
    "cache_implementation", "use_vllm", "vllm_mode", "vllm_model_impl", "vllm_enable_sleep_mode",
    "vllm_structured_outputs_regex", "vllm_server_base_url", "vllm_server_host", "vllm_server_port",
    "vllm_server_timeout", "vllm_group_port", "vllm_gpu_memory_utilization", "vllm_max_model_length",
    "vllm_tensor_parallel_size", "beta", "num_iterations", "epsilon", "delta", "epsilon_high",
    "sapo_temperature_neg", "sapo_temperature_pos", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg",
    "vespo_lambda_neg", "importance_sampling_level", "reward_weights", "multi_objective_aggregation",
    "scale_rewards", "loss_type", "mask_truncated_completions", "sync_ref_model",
    "ref_model_mixup_alpha", "ref_model_sync_steps", "top_entropy_quantile", "entropy_coef",
    "use_adaptive_entropy", "entropy_coef_min", "entropy_coef_max", "entropy_coef_delta",
    "entropy_target", "max_tool_calling_iterations", "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_clip_min", "off_policy_mask_threshold", "use_bias_correction_kl",
    "log_completions", "log_multimodal", "num_completions_to_print", "log_unique_prompts",
    "log_completions_hub_repo", "use_transformers_continuous_batching",
    "transformers_continuous_batching_config", "use_transformers_paged",
    "vllm_importance_sampling_cap",
)

# The fields of transformers' TrainingArguments that GRPO configs commonly set.
TRAINING_ARGUMENTS = (
    "output_dir", "seed", "report_to", "push_to_hub", "gradient_checkpointing", "max_grad_norm",
    "weight_decay", "warmup_steps", "warmup_ratio", "num_train_epochs", "max_steps",
    "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
    "lr_scheduler_type", "lr_scheduler_kwargs", "logging_steps", "save_steps", "save_total_limit",
    "eval_steps", "bf16", "fp16", "tf32", "optim", "adam_beta1", "adam_beta2", "adam_epsilon",
    "run_name", "logging_dir", "logging_strategy", "logging_first_step", "log_level",
    "resume_from_checkpoint", "save_strategy", "eval_strategy", "eval_on_start",
    "gradient_checkpointing_kwargs", "dataloader_num_workers", "deepspeed", "fsdp", "fsdp_config",
    "hub_model_id", "hub_token", "hub_private_repo", "hub_strategy", "data_seed", "local_rank",
    "ddp_backend", "auto_find_batch_size", "optim_target_modules",
)


@pytest.mark.parametrize("name", [n for n in TRL_GRPO_FIELDS + TRAINING_ARGUMENTS if n not in KEYS])
def test_every_trl_and_training_arguments_name_is_explained_not_guessed(name):
    # before: delta -> "the nearest valid key is 'beta'", vllm_mode -> 'vllm_sleep',
    # top_entropy_quantile -> 'entry_point_column', cast_lm_head_to_fp32 -> 'tool_deadline_s'
    assert name in FOREIGN_KEYS
    said = _explain_unknown(name)
    assert not said.startswith(("the nearest valid key", "no key here")), (name, said)


def test_foreign_entries_name_only_keys_that_exist():
    for name, meaning in FOREIGN_KEYS.items():
        assert name not in KEYS, name                       # a key of ours is never refused
        if " " not in meaning:
            assert meaning in KEYS, (name, meaning)
            continue
        assert meaning.startswith(("is called '", "is ", "has no ")), (name, meaning)
        assert named_key(meaning) in set(KEYS) | {""}, (name, meaning)
        for key in re.findall(r"\b(\w+)=", meaning) + re.findall(r"'(\w+)'", meaning):
            assert key in KEYS, (name, key, meaning)


def test_the_named_trl_names_say_what_they_are_here():
    def said(name):
        with pytest.raises(ConfigError) as e:
            build_config({name: 1})
        return str(e.value)
    assert "it is loss_type=dual_clip with clip_c=DELTA here" in said("delta")
    assert "every completion token is in the loss" in said("top_entropy_quantile")
    assert "logged as `entropy`" in said("top_entropy_quantile")
    assert ("server is sampler=vllm_server with vllm_url=http://HOST:PORT (grpo launch starts "
            "one), colocate is sampler=vllm") in said("vllm_mode")
    assert build_config({}).sampling.vllm_sleep is True          # what the hint says of its default
    assert "it is called 'vllm_sleep' here, and is on by default (TRL's is off)" in \
        said("vllm_enable_sleep_mode")
    assert "it is called 'sapo_tau_neg' here" in said("sapo_temperature_neg")
    assert "it is called 'sapo_tau_pos' here" in said("sapo_temperature_pos")
    assert "it is called 'vllm_url' here" in said("vllm_server_base_url")
    assert "vllm_timeout_s (seconds too) bounds each request" in said("vllm_server_timeout")
    assert "there is no entropy bonus" in said("entropy_coef")
    assert "samples.jsonl" in said("log_completions")
    assert "it is called 'resume' here" in said("resume_from_checkpoint")
    assert "betas (0.9, 0.999) and eps 1e-8" in said("adam_beta1")


def test_trls_delta_is_our_dual_clip_with_clip_c_delta():
    # TRL (INTELLECT-2's two-sided clip): -min(min(rho, delta) A, clip(rho, 1 - eps, 1 + eps_high) A)
    from grpo.algorithm.loss import dual_clip
    eps, delta = 0.2, 3.0
    rho = torch.tensor([[0.5, 0.9, 1.1, 2.0, 5.0, 0.5, 1.1, 5.0]], dtype=torch.float64)
    adv = torch.tensor([[-1.0, -1.0, -1.0, -1.0, -1.0, 2.0, 2.0, 2.0]], dtype=torch.float64)
    trl = torch.min(rho.clamp(max=delta) * adv, rho.clamp(1 - eps, 1 + eps) * adv)
    ours = dual_clip(rho.log(), torch.zeros_like(rho), adv, torch.ones_like(rho), eps_low=eps,
                     eps_high=eps, clip_c=delta).objective
    assert torch.equal(ours, trl)
    # by hand: A = -1 at ratio 5 counts 3 (delta); at ratio 2, 2; A = 2 at ratio 5 is clipped at 1.2
    assert ours[0].tolist() == [-0.8, -0.9, -1.1, -2.0, -3.0, 1.0, 2.2, 2.4]


@pytest.mark.parametrize("typo, key", [("learnig_rate", "lr"), ("group_sise", "group_size"),
                                       ("lrr", "lr"), ("sede", "seed"), ("grup_size", "group_size")])
def test_a_typo_gets_the_nearest_key(typo, key):
    assert _explain_unknown(typo).startswith(f"the nearest valid key is '{key}'")


@pytest.mark.parametrize("name", ["nosuchkey", "foo_bar_baz", "vllm_thing"])
def test_a_name_near_no_key_gets_no_guess(name):
    with pytest.raises(ConfigError, match=rf"^unknown config key '{name}'; no key here is close to "
                                          r"it \(`grpo train --help` lists them all\)$"):
        build_config({name: 1})


def test_the_choices_config_checks_are_the_algorithm_tables():
    from grpo.algorithm.advantages import ADVANTAGES
    from grpo.algorithm.loss import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
    from grpo.config.rules import TABLE_CHOICES
    assert TABLE_CHOICES == {"advantage": tuple(ADVANTAGES), "loss_type": tuple(POLICY_LOSSES),
                             "aggregation": tuple(AGGREGATIONS), "kl_estimator": tuple(KL_ESTIMATORS)}


@pytest.mark.parametrize("value, meaning", [
    ("grpo", r"TRL's loss_type=grpo names its aggregation.*aggregation=sequence_mean here, with "
             r"loss_type=clip.*algorithm=grpo is the whole grpo preset here, more than loss_type"),
    ("dr_grpo", r"TRL's loss_type=dr_grpo .*max_completion_length.*aggregation=constant here, with "
                r"loss_type=clip, whose constant is max_new_tokens times the step's completions. "
                r"algorithm=dr_grpo is the whole dr_grpo preset"),
    ("dapo", r"TRL's loss_type=dapo .*aggregation=token_mean here, with loss_type=clip, which "
             r"divides by the whole step's tokens, every process's.*algorithm=dapo is the whole "
             r"dapo preset here, more than loss_type: it sets .*dynamic_sampling=true, "
             r"overlong_buffer=0.2"),
    ("bnpo", r"TRL's loss_type=bnpo .*local batch.*the nearest here is aggregation=token_mean with "
             r"loss_type=clip, which divides by the whole step's tokens, every process's, instead$"),
    ("luspo", r"TRL's loss_type=luspo .*has no equivalent here"),
    ("vespo", r"TRL's loss_type=vespo .*has no equivalent here$"),
])
def test_trls_loss_types_say_what_they_are_here(value, meaning):
    # before: loss_type=dapo pointed at algorithm=dapo alone (dynamic sampling, clip-higher and
    # overlong shaping: not TRL's meaning, token-mean aggregation), and bnpo had no hint at all
    with pytest.raises(ConfigError, match=rf"^config key 'loss_type': unknown choice '{value}'; "
                                          rf"choose one of \[.*'cispo'.*\]\. {meaning}"):
        build_config({"loss_type": value})


def test_a_preset_name_as_another_key_names_the_whole_preset():
    with pytest.raises(ConfigError, match=r"^config key 'loss_type': unknown choice 'rloo'; choose "
                                          r"one of .*\]\. algorithm=rloo is the whole rloo preset "
                                          r"here, more than loss_type: it sets advantage=rloo, "):
        build_config({"loss_type": "rloo"})
    with pytest.raises(ConfigError, match=r"^config key 'aggregation': unknown choice 'ppo'; choose "
                                          r"one of \['constant', 'sequence_mean', 'sequence_sum', "
                                          r"'token_mean'\]$"):
        build_config({"aggregation": "ppo"})


def test_print_config_refuses_a_bad_choice_before_printing(capsys):
    # before: `grpo train loss_type=dapo --print-config` printed the config and exited 0
    from grpo.commands.cli import main
    assert main(["train", "loss_type=dapo", "--print-config"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("grpo train: error: config key 'loss_type': unknown choice 'dapo'")


def test_a_config_changed_after_it_was_built_is_held_to_the_same_choices():
    from grpo.assembly import check_choices
    c = build_config({})
    bad = dataclasses.replace(c, loss=dataclasses.replace(c.loss, kl_estimator="k4"))
    with pytest.raises(ConfigError, match=r"^config key 'kl_estimator': unknown choice 'k4'; "
                                          r"choose one of \['k1', 'k2', 'k3'\]$"):
        check_choices(bad)
    check_choices(c)


def test_foreign_keys_are_still_importable_from_load():
    from grpo.config import FOREIGN_KEYS as face
    from grpo.config.load import FOREIGN_KEYS as from_load
    assert face is from_load is FOREIGN_KEYS


def test_a_word_of_a_keys_name_gets_the_keys_that_hold_it():
    with pytest.raises(ConfigError, match=r"^unknown config key 'warmup': the keys with 'warmup' in "
                                          r"their name are 'warmup_steps' \("):
        build_config({"warmup": 10})
