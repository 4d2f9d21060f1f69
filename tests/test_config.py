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
    from grpo import config as config_module

    @dataclasses.dataclass(frozen=True)
    class ExtraConfig:
        documented: int = 1
        """This one has its docstring."""
        forgotten: int = 2

    monkeypatch.setattr(config_module, "SECTIONS", (*config_module.SECTIONS, ExtraConfig))
    with pytest.raises(ValueError, match="config key 'forgotten' \\(ExtraConfig\\) has no docstring"):
        config_module.reference_markdown()


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
        assert meaning in KEYS or meaning.startswith("has no"), (name, meaning)
    for same in ("beta", "epsilon", "epsilon_high", "num_iterations", "temperature", "top_p", "seed",
                 "output_dir", "max_grad_norm", "weight_decay", "warmup_steps", "report_to"):
        assert same in KEYS                                 # TRL's name is ours: nothing to map


def test_a_dataset_turns_the_demo_cold_start_off_unless_it_is_set():
    assert build_config({}).run.sft_steps == 10
    assert build_config({"dataset": "mine.jsonl"}).run.sft_steps == 0
    assert build_config({"dataset": "mine.jsonl", "sft_steps": 5}).run.sft_steps == 5


def test_a_preset_name_given_as_a_loss_type_names_the_preset():
    from grpo.build import check_choices
    with pytest.raises(ConfigError, match=r"config key 'loss_type': unknown choice 'dr_grpo'; choose one "
                                          r"of .* \('dr_grpo' is a preset here: algorithm=dr_grpo"):
        check_choices(build_config({"loss_type": "dr_grpo"}))


def test_the_demo_lr_on_a_large_model_is_noted_at_start():
    import torch
    from grpo.build import check_lr

    class Big:   # 30M parameters that take no memory
        def parameters(self):
            return [torch.empty(30_000_000, device="meta")]

    lines = []
    check_lr(build_config({}), Big(), lines.append)
    check_lr(build_config({"lr": 1e-6}), Big(), lines.append)             # chosen: no note
    assert lines == ["lr=0.0005 is the demo's default, for its tiny model trained from scratch; this "
                     "model has 30M parameters: a pretrained model wants about lr=1e-6 "
                     "(docs/guides/troubleshooting.md)"]
