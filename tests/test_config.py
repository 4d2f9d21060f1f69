import dataclasses

import pytest

from grpo.config import (KEYS, ConfigError, TrainConfig, build_config, field_docs, help_text,
                         load_config)


def test_defaults_are_the_demo():
    c = build_config({})
    assert c.model.model == "tiny" and c.data.task == "largest" and c.run.sft_steps > 0


def test_overrides_are_typed():
    c = load_config(None, ["group_size=4", "lr=1e-5", "rewards=[math_accuracy,think_format]",
                           "reward_weights=[1,0.5]", "beta=0"])
    assert c.sampling.group_size == 4
    assert c.optim.lr == 1e-5
    assert c.reward.rewards == ["math_accuracy", "think_format"]
    assert c.reward.reward_weights == [1.0, 0.5]
    assert c.loss.beta == 0.0


def test_config_is_frozen():
    c = build_config({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.sampling.group_size = 3


def test_unknown_key_names_it_and_the_nearest():
    with pytest.raises(ConfigError, match=r"unknown config key 'group_sise'.*'group_size'"):
        load_config(None, ["group_sise=4"])


@pytest.mark.parametrize("arg, message", [
    ("group_size=four", "config key 'group_size' expects an integer"),
    ("lr=fast", "config key 'lr' expects a number"),
    ("group_size=0", "config key 'group_size' must be at least 2"),
    ("group_size=1", "config key 'group_size' must be at least 2, got 1: advantages compare"),
    ("lr=-1e-5", "config key 'lr' must be 0 or more, got -1e-05"),
    ("chat_template=always", "config key 'chat_template' must be auto, required or none"),
    ("temperature=0", "config key 'temperature' must be above 0"),
    ("lr_schedule=linear", "config key 'lr_schedule' must be constant or cosine"),
    ("algorithm=ppo", "config key 'algorithm': unknown preset"),
    ("reward_weights=[1,2]", "config key 'reward_weights' has 2 weights for 0 reward functions"),
])
def test_bad_values_name_the_key(arg, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [arg])


def test_yaml_file_and_override_order(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("group_size: 6\nlr: 3.0e-4\n")
    c = load_config(str(f), ["group_size=2"])
    assert c.sampling.group_size == 2 and c.optim.lr == 3e-4


def test_words_that_yaml_1_1_reads_as_booleans_reach_word_keys_as_words(tmp_path):
    """`packing=off`, `packing: on`, `mixed_precision=no`: PyYAML alone reads these as booleans;
    a key of words takes them as the words, and a key of true/false still takes yes/no/on/off."""
    f = tmp_path / "run.yaml"
    f.write_text("packing: on\nmixed_precision: no\ngradient_checkpointing: yes\n")
    c = load_config(str(f))
    assert (c.optim.packing, c.optim.mixed_precision, c.optim.gradient_checkpointing) == ("on", "no", True)
    c = load_config(None, ["packing=off", "mixed_precision=no", "gradient_checkpointing=Off"])
    assert (c.optim.packing, c.optim.mixed_precision, c.optim.gradient_checkpointing) == ("off", "no", False)
    assert load_config(None, ["gradient_checkpointing=TRUE"]).optim.gradient_checkpointing is True
    with pytest.raises(ConfigError, match="'gradient_checkpointing' expects true or false, got 'maybe'"):
        load_config(None, ["gradient_checkpointing=maybe"])


def test_yaml_error_names_file_and_line(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("group_size: 6\nlr: [1\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:\d+: not valid YAML"):
        load_config(str(f))


def test_yaml_unknown_key(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("gruop_size: 6\n")
    with pytest.raises(ConfigError, match="unknown config key 'gruop_size'"):
        load_config(str(f))


def test_every_key_has_a_docstring_and_appears_in_help():
    docs = field_docs()
    text = help_text()
    for key in KEYS:
        assert docs.get(key), f"{key} has no docstring"
        assert f"  {key}=" in text


def test_flat_round_trip():
    c = build_config({"group_size": 3, "rewards": ["think_format"]})
    assert build_config(c.flat()) == c
    assert isinstance(c, TrainConfig)


def test_the_config_reference_in_docs_is_current():
    from pathlib import Path
    from grpo.config import reference_markdown
    current = (Path(__file__).parent.parent / "docs" / "config.md").read_text()
    assert current == reference_markdown() + "\n", "regenerate: python -m grpo.config > docs/config.md"


def test_the_config_reference_refuses_a_key_without_documentation(monkeypatch):
    import dataclasses
    from grpo.config import load

    @dataclasses.dataclass(frozen=True)
    class ExtraConfig:
        documented: int = 1
        """This one has its docstring."""
        forgotten: int = 2

    monkeypatch.setattr(load, "SECTIONS", (*load.SECTIONS, ExtraConfig))
    with pytest.raises(ValueError, match="config key 'forgotten' \\(ExtraConfig\\) has no docstring"):
        load.reference_markdown()


def test_k1_as_a_loss_term_is_refused_naming_what_to_use_instead():
    # d k1 / d theta = grad log pi and E_pi[grad log pi] = 0: as a loss term k1 does nothing
    with pytest.raises(ConfigError, match=r"config key 'kl_estimator': k1 as a loss term .* expected "
                       r"gradient of exactly 0.*kl_in_reward=true.*kl_estimator=k2 or kl_estimator=k3"):
        load_config(None, ["kl_estimator=k1", "beta=0.04"])
    with pytest.raises(ConfigError, match="kl_in_reward=true"):
        load_config(None, ["algorithm=rloo", "kl_in_reward=false"])
    # in the reward (RLOO's preset), or with no KL at all, k1 is fine
    assert load_config(None, ["algorithm=rloo"]).loss.kl_estimator == "k1"
    assert load_config(None, ["kl_estimator=k1", "beta=0"]).loss.beta == 0.0
    assert load_config(None, ["kl_estimator=k1", "kl_in_reward=true"]).loss.kl_in_reward


def test_cispo_resolves_epsilon_to_no_lower_bound_unless_it_is_set():
    # 1 - epsilon is the lower bound of CISPO's weight; epsilon 1.0 puts it at 0, below any ratio
    bare = build_config({"loss_type": "cispo"}).loss
    assert (bare.epsilon, bare.epsilon_high) == (1.0, 0.2)      # the upper bound stays at 1.2
    assert build_config({"loss_type": "cispo", "epsilon": 0.1}).loss.epsilon == 0.1
    assert build_config({"algorithm": "cispo"}).loss.epsilon == 1.0
    # a preset's epsilon is not the user's
    assert build_config({"algorithm": "gspo", "loss_type": "cispo"}).loss.epsilon == 1.0
    assert build_config({"loss_type": "clip"}).loss.epsilon == 0.2   # other losses keep theirs


def test_every_unknown_key_is_in_one_error_with_what_it_most_likely_meant():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["learning_rate=1e-5", "gruop_size=4", "num_train_epochs=3"])
    assert str(e.value) == (
        "3 unknown config keys: 'learning_rate': it is called 'lr' here; 'gruop_size': the nearest "
        "valid key is 'group_size'; 'num_train_epochs': it has no equivalent here: steps counts GRPO "
        "steps of prompts_per_step prompts each (an epoch of the dataset is its rows / "
        "prompts_per_step steps). `grpo train --help` lists them all")
    # before: "the nearest valid key is 'eval_temperature'"
    with pytest.raises(ConfigError, match=r"^unknown config key 'learning_rate': it is called 'lr' here"):
        load_config(None, ["learning_rate=1e-5"])


def test_names_from_trl_and_transformers_point_at_keys_that_exist():
    from grpo.config import FOREIGN_KEYS
    for name, meaning in FOREIGN_KEYS.items():
        assert name not in KEYS, name                       # a key of ours is never refused
        assert meaning in KEYS or meaning.startswith(("has no", "is ")), (name, meaning)
    for same in ("beta", "epsilon", "epsilon_high", "num_iterations", "temperature", "top_p", "seed",
                 "output_dir", "max_grad_norm", "weight_decay", "warmup_steps", "report_to"):
        assert same in KEYS                                 # TRL's name is ours: nothing to map


def test_a_dataset_turns_the_demo_cold_start_off_unless_it_is_set():
    assert build_config({}).run.sft_steps == 10
    assert build_config({"dataset": "mine.jsonl"}).run.sft_steps == 0
    assert build_config({"dataset": "mine.jsonl", "sft_steps": 5}).run.sft_steps == 5


def test_a_preset_name_given_as_a_loss_type_names_the_preset():
    # refused when the config is built (config/rules.py), with TRL's meaning of the value first
    with pytest.raises(ConfigError, match=r"config key 'loss_type': unknown choice 'dr_grpo'; choose one "
                                          r"of .*algorithm=dr_grpo is the whole dr_grpo preset here"):
        build_config({"loss_type": "dr_grpo"})


def test_the_demo_lr_on_a_large_model_is_noted_at_start():
    import torch
    from grpo.assembly import check_lr

    class Big:   # 30M parameters that take no memory
        def parameters(self):
            return [torch.empty(30_000_000, device="meta")]

    lines = []
    check_lr(build_config({}), Big(), lines.append)
    check_lr(build_config({"lr": 1e-6}), Big(), lines.append)             # chosen: no note
    assert lines == ["lr=0.0005 is the demo's default, for its tiny model trained from scratch; this "
                     "model has 30M parameters: a pretrained model wants about lr=1e-6 "
                     "(docs/guides/troubleshooting.md)"]


@pytest.mark.parametrize("arg, message", [
    # a clip range: 1 - epsilon is the lowest ratio kept, so epsilon above 1 keeps none below 0
    ("epsilon=2", r"^config key 'epsilon' must be in \[0, 1\], got 2.0"),
    ("epsilon_high=-0.1", r"^config key 'epsilon_high' must be 0 or more, got -0.1"),
    # a probability or a share
    ("top_p=1.5", r"^config key 'top_p' must be in \(0, 1\], got 1.5"),
    ("kl_cov_fraction=-0.1", r"^config key 'kl_cov_fraction' must be in \[0, 1\], got -0.1"),
    ("ref_update_rate=0", r"^config key 'ref_update_rate' must be in \(0, 1\], got 0.0"),
    ("overlong_buffer=1", r"^config key 'overlong_buffer' must be in \[0, 1\), got 1.0"),
    ("vllm_gpu_memory_utilization=1", r"^config key 'vllm_gpu_memory_utilization' must be in \(0, 1\), got 1.0"),
    # a temperature or a deadline
    ("eval_temperature=0", r"^config key 'eval_temperature' must be above 0, got 0.0"),
    ("sapo_tau_neg=-1", r"^config key 'sapo_tau_neg' must be above 0, got -1.0"),
    ("tool_deadline_s=0", r"^config key 'tool_deadline_s' must be above 0, got 0.0"),
    ("advantage_eps=-0.1", r"^config key 'advantage_eps' must be 0 or more, got -0.1"),
    # counts of at least 1, and of 0 or more
    ("max_turns=0", r"^config key 'max_turns' must be at least 1, got 0"),
    ("code_workers=0", r"^config key 'code_workers' must be at least 1, got 0"),
    ("episode_tokens=-1", r"^config key 'episode_tokens' must be 0 or more, got -1"),
    ("eval_size=-5", r"^config key 'eval_size' must be 0 or more, got -5"),
    # a threshold above 1
    ("clip_c=0.5", r"^config key 'clip_c' must be above 1, got 0.5"),
    ("lora_alpha=0", r"^config key 'lora_alpha' must be above 0, got 0.0"),
    # each element of a list
    ("eval_k=[0]", r"^config key 'eval_k' must be at least 1, got 0"),
])
def test_each_kind_of_bound_names_the_key_the_value_and_the_range(arg, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [arg])


def test_every_numeric_key_has_a_declared_bound_or_is_deliberately_unbounded():
    import typing
    from grpo.config import BOUNDS, UNBOUNDED
    numeric = [key for key, (_, _, hint) in KEYS.items()
               if hint in (int, float) or typing.get_args(hint) in ((int,), (float,))]
    assert len(numeric) > 50
    missing = [key for key in numeric if key not in BOUNDS and key not in UNBOUNDED]
    assert not missing, f"declare a bound in config.BOUNDS (or why none in UNBOUNDED) for {missing}"
    assert not set(BOUNDS) & set(UNBOUNDED)
    assert set(BOUNDS) | set(UNBOUNDED) <= set(numeric)     # no entry for a key that is gone
    assert all(why for why in UNBOUNDED.values())
    # every bound admits its key's default: the demo itself passes
    defaults = build_config({}).flat()
    for key, bound in BOUNDS.items():
        values = defaults[key] if isinstance(defaults[key], list) else [defaults[key]]
        assert all(bound.holds(v) for v in values), key


def test_a_misspelt_name_from_trl_suggests_the_key_it_is_called_here():
    # before: "the nearest valid key is 'long_prompts'"
    with pytest.raises(ConfigError, match=r"^unknown config key 'learnig_rate'; the nearest valid "
                                          r"key is 'lr' \('learning_rate' is called 'lr' here\)"):
        load_config(None, ["learnig_rate=1e-5"])
    with pytest.raises(ConfigError, match=r"the nearest valid key is 'group_size' \('num_generation"):
        load_config(None, ["num_generation=8"])
    # a key of ours that is a near miss still wins over a foreign name
    with pytest.raises(ConfigError, match=r"the nearest valid key is 'epsilon_high'$|'epsilon_high' \("):
        load_config(None, ["epsilon_hihg=0.28"])


@pytest.mark.parametrize("name, ours", [
    ("kl_coef", "beta"), ("clip_ratio_low", "epsilon"), ("clip_ratio_high", "epsilon_high"),
    ("kl_loss_coef", "beta"), ("ppo_epochs", "num_iterations"), ("total_training_steps", "steps"),
    ("rollout_rs_threshold_lower", "correction_cap_low"), ("lora_rank", "lora_r"),
])
def test_names_from_verl_point_at_our_key(name, ours):
    with pytest.raises(ConfigError, match=rf"^unknown config key '{name}': it is called '{ours}' here"):
        load_config(None, [f"{name}=1"])


def test_a_nested_section_says_the_config_is_flat_and_names_the_keys(tmp_path):
    f = tmp_path / "verl.yaml"
    f.write_text("actor_rollout_ref:\n  model:\n    path: Qwen/Qwen2.5-0.5B\n  actor:\n"
                 "    optim:\n      lr: 1.0e-6\n    clip_ratio_high: 0.28\n  rollout:\n    n: 8\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(f))
    assert str(e.value) == (
        "config key 'actor_rollout_ref' holds a nested section, and the config is flat: write each "
        "key at the top level: 'model.path' as 'model', 'actor.optim.lr' as 'lr', "
        "'actor.clip_ratio_high' as 'epsilon_high', 'rollout.n' as 'group_size' "
        "(`grpo train --help` lists them all)")
    # one of our own keys given as a section
    f.write_text("model:\n  name: Qwen/Qwen2.5-0.5B\n  lora_r: 8\n  seeds: 3\n")
    with pytest.raises(ConfigError, match=r"^config key 'model' holds a nested section, and the config "
                                          r"is flat: write each key at the top level: 'name' as "
                                          r"'model', 'lora_r' as 'lora_r', 'seeds' is not a key here"):
        load_config(str(f))


def test_a_dotted_key_says_the_config_is_flat():
    with pytest.raises(ConfigError, match=r"^unknown config key 'trainer.lr': the config is flat: "
                                          r"write 'lr'"):
        load_config(None, ["trainer.lr=1e-6"])
    with pytest.raises(ConfigError, match=r"^unknown config key 'actor_rollout_ref.rollout.n': the "
                                          r"config is flat: write 'group_size'"):
        load_config(None, ["actor_rollout_ref.rollout.n=8"])


def test_a_duplicate_yaml_key_is_an_error_naming_both_lines(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("group_size: 4\nlr: 1.0e-5\n# later\ngroup_size: 16\n")
    with pytest.raises(ConfigError, match=r"^.*run.yaml:4: config key 'group_size' is given twice "
                                          r"\(lines 1 and 4\); keep one"):
        load_config(str(f))


def test_the_kl_cov_preset_sets_the_second_update_its_term_needs():
    # |log pi_theta - log pi_old| is 0 at a batch's first update: with one update per batch the
    # preset would be the plain policy gradient (and said so at start)
    from grpo.assembly import check_selection
    c = build_config({"algorithm": "kl_cov"})
    assert c.optim.num_iterations == 2
    notes = []
    check_selection(c, notes.append)
    assert not [n for n in notes if "num_iterations" in n]
    # a user's own choice still wins, and is still told
    c1 = build_config({"algorithm": "kl_cov", "num_iterations": 1})
    check_selection(c1, notes.append)
    assert c1.optim.num_iterations == 1 and any("num_iterations=1" in n for n in notes)


# One hand-made config per rule of config.RULES that breaks that rule and no earlier one.
BREAKS_ONE_RULE = {
    "table_choices": {"loss_type": "dapo"},
    "mixed_precision_choice": {"mixed_precision": "fp16"},
    "packing_choice": {"packing": "yes"},
    "bf16_needs_float32": {"mixed_precision": "bf16", "dtype": "bfloat16"},
    "tool_format_choice": {"tool_format": "xml"},
    "eval_k_within_samples": {"eval_k": [4], "eval_samples": 2},
    "lr_schedule_choice": {"lr_schedule": "linear"},
    "chat_template_kind": {"chat_template": "no-such-template.jinja"},
    "push_to_hub_repo_id": {"push_to_hub": "not a repo"},
    "no_empty_stop": {"stop": ["</answer>", ""]},
    "own_sampler_keys_need_hf": {"top_k": 5, "sampler": "vllm"},
    "own_sampler_keys_single_turn": {"min_p": 0.1, "tools": ["calculator"]},
    "long_prompts_choice": {"long_prompts": "truncate"},
    "dtype_choice": {"dtype": "int8"},
    "k1_not_a_loss_term": {"kl_estimator": "k1", "beta": 0.04},
    "clip_cov_band": {"clip_cov_low": 6.0},
    "reinforce_pp_or_turn_rewards": {"advantage": "reinforce_pp", "turn_rewards": True},
    "gmpo_one_advantage_per_completion": {"loss_type": "gmpo", "advantage": "reinforce_pp_baseline",
                                          "kl_in_reward": True},
    "correction_choice": {"correction": "vtrace"},
    "correction_cap_low_needs_a_mask": {"correction": "tis", "correction_cap_low": 0.5},
    "tis_cap_or_correction": {"tis_cap": 2.0, "correction": "icepop"},
    "proximal_choice": {"proximal": "latest"},
    "async_correction_needs_decoupled": {"async_steps": 1, "correction": "tis"},
    "async_tis_cap_needs_decoupled": {"async_steps": 1, "tis_cap": 2.0},
    "sampler_choice": {"sampler": "sglang"},
    "vllm_server_needs_url": {"sampler": "vllm_server"},
    "decode_choice": {"decode": "cudagraph"},
    "decode_is_own_sampler": {"decode": "static", "sampler": "vllm"},
    "parallel_choice": {"parallel": "tp"},
    "lora_keeps_its_reference": {"lora_r": 8, "ref_reset_every": 2},
    "lora_not_sharded": {"lora_r": 8, "parallel": "fsdp"},
    "async_dynamic_sampling_one_worker": {"async_steps": 1, "dynamic_sampling": True,
                                          "rollout_workers": 2},
    "unscorable_choice": {"unscorable": "none"},
    "reward_on_error_choice": {"reward_on_error": "ignore"},
    "one_weight_per_reward": {"rewards": ["think_format"], "reward_weights": [1.0, 0.5]},
    "distill_choice": {"teacher": "t", "distill": "both"},
    "teacher_dtype_choice": {"teacher": "t", "teacher_dtype": "int8"},
    "distill_needs_a_teacher": {"distill": "alone"},
    "curriculum_not_async": {"task_args": {"curriculum": 0.8}, "async_steps": 1},
}


def test_the_rules_are_one_table_of_uniquely_named_checks_each_with_a_case_here():
    from grpo.config import RULES
    names = [rule.name for rule in RULES]
    assert len(names) == len(set(names)) and all(name.isidentifier() for name in names)
    assert list(BREAKS_ONE_RULE) == names          # in table order, one case each
    defaults = build_config({}).flat()
    assert [rule.name for rule in RULES if rule.check(defaults) is not None] == []


@pytest.mark.parametrize("name", list(BREAKS_ONE_RULE))
def test_each_rule_fires_for_its_bad_config_and_is_the_error(name):
    from grpo.config import RULES
    values = BREAKS_ONE_RULE[name]
    flat = {**build_config({}).flat(), **values}
    failed = [(rule.name, message) for rule in RULES if (message := rule.check(flat)) is not None]
    assert failed and failed[0][0] == name, failed
    with pytest.raises(ConfigError) as e:
        build_config(values)
    assert str(e.value) == failed[0][1]
