"""Weights too coarse for the learning rate: an AdamW step of about lr a weight rounds away in
bfloat16 weights at the learning rates RL uses, and nothing trains. The share of weights an
lr-sized step moves is measured at start; a run that would train less than half is refused, one
under 90% is told, both naming float32 weights with mixed_precision=bf16. And config.yaml records
the dtype a model given to train() trained in."""

from pathlib import Path

import pytest
import torch
import yaml

from grpo.assembly.model import ROUNDED_AWAY_NOTED, ROUNDED_AWAY_REFUSED, check_precision
from grpo.config import ConfigError, build_config, load_config
from grpo.train import train
from grpo.update import moved_fraction

EXAMPLES = Path(__file__).parent.parent / "examples"


def _rows(n: int) -> list[dict]:
    return [{"prompt": f"{i}+0=", "answer": str(i)} for i in range(n)]


def _lengths(prompts, completions, **columns):
    return [float(len(c)) for c in completions]


def test_moved_fraction_by_hand():
    # bfloat16 keeps 8 significant bits: the values next to x in [2^e, 2^(e+1)) are 2^(e-7) apart,
    # so a step of 1e-6 moves x only where 2^(e-8) <= 1e-6 (or below it, at a power of two).
    #   0.0:     the spacing at 0 is a subnormal's: moves
    #   2^-13:   spacing above 2^-20 ~ 9.5e-7, half 4.8e-7 < 1e-6: moves
    #   0.02:    in [2^-6, 2^-5): spacing 2^-13 ~ 1.2e-4, half 6.1e-5 > 1e-6: stays
    #   1.0:     spacing above 2^-7, below 2^-8; halves 3.9e-3 and 2e-3 > 1e-6: stays
    w = torch.tensor([0.0, 2.0 ** -13, 0.02, 1.0], dtype=torch.bfloat16)
    assert moved_fraction([w], 1e-6) == 0.5
    assert moved_fraction([w.float()], 1e-6) == 1.0       # float32: 24 bits, all four move
    assert moved_fraction([w], 1e-2) == 1.0               # 1e-2 is past every half-spacing
    # a tensor of 5 more elements that stay: 2 of 9
    assert moved_fraction([w, torch.full((5,), 0.5, dtype=torch.bfloat16)], 1e-6) == 2 / 9


def test_moved_fraction_is_what_adamw_moves():
    """One real AdamW step on bfloat16 weights of a pretrained model's scale: the weights it
    changed are the share the rule predicts (the rule takes both directions of a step, AdamW one:
    they differ only at powers of two)."""
    g = torch.Generator().manual_seed(0)
    weight = torch.nn.Parameter((torch.randn(200_000, generator=g) * 0.02).to(torch.bfloat16))
    before = weight.detach().clone()
    predicted = moved_fraction([weight], 1e-6)
    weight.grad = torch.randn(200_000, generator=g).to(torch.bfloat16)
    torch.optim.AdamW([weight], lr=1e-6, weight_decay=0.0).step()
    measured = (weight.detach() != before).float().mean().item()
    assert 0.005 < predicted < 0.05                       # only the weights below 2^-11 move
    assert measured == pytest.approx(predicted, abs=0.002)


def test_the_recipes_settings_in_bfloat16_weights_are_refused_naming_mixed_precision(tiny_model_dir):
    """examples/*.yaml used dtype=bfloat16 with lr=1e-6: on the tiny model 2% of the weights move
    (measured: benchmarks/bf16_rounding.py). Refused at start, before any step."""
    c = build_config({"model": str(tiny_model_dir), "dtype": "bfloat16", "lr": 1e-6, "sft_steps": 0,
                      "steps": 1})
    with pytest.raises(ConfigError, match=r"config key 'lr': a step of lr=1e-06 changes only 2\.\d% "
                                          r"of the trainable weights: dtype=bfloat16 loads bfloat16 "
                                          r".*dtype=float32 mixed_precision=bf16.*or raise lr"):
        train(c, dataset=_rows(4), reward_fns=[_lengths], log=lambda line: None, write_files=False)


def test_a_share_between_the_bounds_is_said_and_the_run_goes_on(tiny_model_dir):
    from grpo.models import load_policy
    policy = load_policy(str(tiny_model_dir), "bfloat16")
    params = [p for p in policy.parameters() if p.requires_grad]
    # the tiny model in bfloat16: 57% move at lr=5e-5 (between the bounds), 99.9% at the default
    assert ROUNDED_AWAY_REFUSED < moved_fraction(params, 5e-5) < ROUNDED_AWAY_NOTED
    lines = []
    check_precision(build_config({"dtype": "bfloat16", "lr": 5e-5, "sft_steps": 0}), policy,
                    lines.append)
    assert len(lines) == 1 and "a step of lr=5e-05 changes only 5" in lines[0]
    assert "mixed_precision=bf16" in lines[0]
    lines.clear()
    check_precision(build_config({"dtype": "bfloat16", "sft_steps": 0}), policy, lines.append)
    assert lines == []


def test_the_cold_starts_rate_is_checked_too(tiny_model_dir):
    from grpo.models import load_policy
    policy = load_policy(str(tiny_model_dir), "bfloat16")
    with pytest.raises(ConfigError, match=r"config key 'sft_lr': a step of sft_lr=1e-06"):
        check_precision(build_config({"dtype": "bfloat16", "sft_lr": 1e-6, "sft_steps": 5}), policy)
    check_precision(build_config({"dtype": "bfloat16", "sft_lr": 1e-6, "sft_steps": 0}), policy)


def test_the_gpu_recipes_train_float32_weights_with_bfloat16_compute(tiny_model_dir):
    from grpo.models import load_policy
    for name in ("qwen2.5-0.5b-gsm8k.yaml", "code-unit-tests.yaml"):
        c = load_config(str(EXAMPLES / name))
        assert (c.model.dtype, c.optim.mixed_precision, c.compute_dtype) == \
            ("float32", "bf16", "bfloat16"), name
        policy = load_policy(str(tiny_model_dir), c.model.dtype)
        lines = []
        check_precision(c, policy, lines.append)           # neither refused nor noted
        assert lines == [] and c.optim.lr == 1e-6, name


def test_a_given_bfloat16_model_is_recorded_as_bfloat16_and_checked(tmp_path, tiny_model_dir):
    """A model loaded in bfloat16 and given to train() trains in bfloat16: config.yaml says so
    (it said float32), and the precision rule speaks in the call's terms."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    c = build_config({"sft_steps": 0, "steps": 1, "eval_every": 0, "prompts_per_step": 2,
                      "group_size": 2, "max_new_tokens": 4, "output_dir": str(tmp_path / "run")})
    train(c, model=model, tokenizer=tokenizer, dataset=_rows(4), reward_fns=[_lengths],
          log=lambda line: None)
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert (saved["dtype"], saved["mixed_precision"]) == ("bfloat16", "no")
    c = build_config({"sft_steps": 0, "steps": 1, "lr": 1e-6})
    with pytest.raises(ConfigError, match=r"the model given to train\(\) holds bfloat16 weights.*"
                                          r"give train\(\) model\.float\(\) and set mixed_precision=bf16"):
        train(c, model=model, tokenizer=tokenizer, dataset=_rows(4), reward_fns=[_lengths],
              log=lambda line: None, write_files=False)
    c = build_config({"sft_steps": 0, "steps": 1, "mixed_precision": "bf16"})
    with pytest.raises(ConfigError, match=r"config key 'mixed_precision': bf16 keeps float32 weights.*"
                                          r"holds bfloat16 weights; give it model\.float\(\)"):
        train(c, model=model, tokenizer=tokenizer, dataset=_rows(4), reward_fns=[_lengths],
              log=lambda line: None, write_files=False)


def test_engines_serve_the_compute_dtype():
    """float32 weights with mixed_precision=bf16 compute in bfloat16, and vLLM serves bfloat16
    (not float32: twice the memory and a slower engine)."""
    from grpo.commands.launch import server_command
    mixed = build_config({"dtype": "float32", "mixed_precision": "bf16"})
    assert mixed.compute_dtype == "bfloat16"
    assert build_config({"dtype": "bfloat16"}).compute_dtype == "bfloat16"
    assert build_config({}).compute_dtype == "float32"
    command = server_command(mixed, "some-model", 8000)
    assert command[command.index("--dtype") + 1] == "bfloat16"


def test_grpo_sft_checks_its_own_rate(tmp_path, tiny_model_dir):
    from grpo.commands.cli import main
    f = tmp_path / "demos.jsonl"
    f.write_text("".join(f'{{"prompt": "{i}+0=", "answer": "{i}", "completion": "{i}"}}\n'
                         for i in range(6)))
    assert main(["sft", f"model={tiny_model_dir}", f"dataset={f}", "sft_steps=2", "dtype=bfloat16",
                 "sft_lr=1e-6", f"output_dir={tmp_path / 'out'}"]) == 2
    # lr (GRPO's) is no rate of the cold start's: not checked by grpo sft
    assert main(["sft", f"model={tiny_model_dir}", f"dataset={f}", "sft_steps=2", "dtype=bfloat16",
                 "lr=1e-6", f"output_dir={tmp_path / 'out2'}"]) == 0
