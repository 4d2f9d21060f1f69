"""LoRA through peft: only the adapter trains, the reference is the policy at the start of GRPO
with the adapter off (no second copy; a cold start is merged into the base first), and the run
directory holds the adapter, which loads merged into its recorded base, and, on request, the
merged model."""

import json

import pytest
import torch
from safetensors.torch import load_file

from grpo.config import build_config
from grpo.train import train

pytest.importorskip("peft")


def distinct(prompts, completions, **columns):
    """Varies between a random model's completions, so the advantages are not all 0."""
    return [len(set(c)) / 4 for c in completions]


def lora_config(model_dir, out, **extra):
    return build_config({"model": str(model_dir), "task": "addition", "lora_r": 4, "lora_alpha": 8,
                         "steps": 2, "sft_steps": 0, "eval_every": 0, "prompts_per_step": 2,
                         "group_size": 4, "max_new_tokens": 4, "lr": 1e-2, "output_dir": str(out),
                         "threads": 1, **extra})


def test_lora_trains_the_adapter_only_and_saves_adapter_and_merged_model(tiny_model_dir, tmp_path,
                                                                       monkeypatch):
    import grpo.assembly.learner as assemble_module
    monkeypatch.setattr(assemble_module, "frozen_copy", lambda m: pytest.fail("LoRA made a reference copy"))
    out = tmp_path / "run"
    result = train(lora_config(tiny_model_dir, out, lora_merge=True, beta=0.04),
                   reward_fns=[distinct], log=lambda s: None)
    # Step 1: the adapter's B starts at 0, so policy and reference (adapter off) agree exactly.
    assert result.history[0]["kl"] == 0.0
    assert (out / "final" / "adapter_config.json").is_file()
    adapter = load_file(out / "final" / "adapter_model.safetensors")
    assert adapter and all("lora_" in k for k in adapter)
    assert any(v.abs().max() > 0 for k, v in adapter.items() if "lora_B" in k)  # the adapter trained
    base = load_file(tiny_model_dir / "model.safetensors")
    merged = load_file(out / "final" / "merged" / "model.safetensors")
    assert merged.keys() == base.keys()
    changed = [k for k in base if not torch.equal(base[k], merged[k])]
    assert changed and all(k.split(".")[-2] in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                 "up_proj", "down_proj") for k in changed)


def test_lora_reference_is_the_base_model(tiny_model_dir, tmp_path):
    # After training, the reference log-probs (adapter off) must equal a fresh base model's.
    from grpo.models import load_policy, token_logprobs
    result = train(lora_config(tiny_model_dir, tmp_path / "run", beta=0.04, steps=3),
                   reward_fns=[distinct], log=lambda s: None, write_files=False)
    assert result.history[-1]["kl"] > 0  # the policy moved away from the base
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    mask = torch.ones_like(ids)
    with torch.no_grad(), result.policy.disable_adapter():
        ref, _ = token_logprobs(result.policy, ids, mask, 3)
    base, _ = token_logprobs(load_policy(str(tiny_model_dir)), ids, mask, 3)
    torch.testing.assert_close(ref, base.detach(), rtol=1e-5, atol=1e-6)
    moved, _ = token_logprobs(result.policy, ids, mask, 3)
    assert (moved.detach() - base.detach()).abs().max() > 1e-4


def test_lora_errors_name_the_key(tiny_model_dir, tmp_path):
    from grpo.assembly import ConfigError
    with pytest.raises(ConfigError, match="'lora_target_modules'.*no layers named \\['wq'\\]"):
        train(lora_config(tiny_model_dir, tmp_path, lora_target_modules=["wq"]), log=lambda s: None,
              write_files=False)
    with pytest.raises(ConfigError, match="'ref_reset_every' cannot be used with LoRA"):
        train(lora_config(tiny_model_dir, tmp_path, ref_reset_every=2), log=lambda s: None,
              write_files=False)


def test_the_lean_decoder_computes_lora_layers_as_peft_does(tiny_model_dir):
    # The adapter's B made non-zero so LoRA changes the output; with the adapter on and off.
    from peft import LoraConfig, get_peft_model
    from grpo.models.decoder import Decoder, supports
    from grpo.models import load_policy
    model = get_peft_model(load_policy(str(tiny_model_dir)), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0))
    torch.manual_seed(0)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.5)
    base = model.get_base_model()
    assert supports(base)
    ids = torch.tensor([[0, 5, 6, 7, 8], [9, 10, 11, 12, 13]])
    mask = (ids != 0).long()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    real = mask.bool()
    for adapter_on in (True, False):
        if adapter_on:
            want = base.model(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
            got = Decoder(base).hidden(ids, mask, pos)
        else:
            with model.disable_adapter():
                want = base.model(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
                got = Decoder(base).hidden(ids, mask, pos)
        torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)
    with model.disable_adapter():
        off = Decoder(base).hidden(ids, mask, pos)
    assert (Decoder(base).hidden(ids, mask, pos) - off)[real].abs().max() > 1e-3


def test_a_lora_run_resumes_exactly_from_its_adapter_checkpoint(tiny_model_dir, tmp_path):
    whole = train(lora_config(tiny_model_dir, tmp_path / "whole", steps=3, beta=0.04, save_every=0),
                  reward_fns=[distinct], log=lambda s: None)
    train(lora_config(tiny_model_dir, tmp_path / "cut", steps=2, beta=0.04, save_every=2),
          reward_fns=[distinct], log=lambda s: None)
    assert (tmp_path / "cut" / "checkpoints" / "step-2" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "cut" / "checkpoints" / "step-2" / "reference.safetensors").exists()
    resumed = train(lora_config(tiny_model_dir, tmp_path / "cut", steps=3, beta=0.04, save_every=0,
                                resume="auto"), reward_fns=[distinct], log=lambda s: None)
    a = load_file(tmp_path / "whole" / "final" / "adapter_model.safetensors")
    b = load_file(tmp_path / "cut" / "final" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    same = {k: v for k, v in whole.history[-1].items() if not k.startswith("time/") and k != "tokens/s"}
    assert same == {k: resumed.history[-1][k] for k in same}


def test_after_a_cold_start_sampler_reference_and_evaluation_are_the_cold_started_policy(
        tiny_model_dir, tmp_path):
    # The cold start trains the adapter; it is merged into the base before GRPO, so the reference
    # (adapter off) is the cold-started policy and KL at step 1 is exactly 0, as with full weights.
    from grpo.models import load_policy, load_tokenizer, token_logprobs
    from grpo.sampling import HFSampler
    out = tmp_path / "run"
    result = train(lora_config(tiny_model_dir, out, sft_steps=4, sft_lr=1e-2, beta=0.04, steps=1,
                               eval_every=1, eval_size=4), log=lambda s: None)
    assert next(h["kl"] for h in result.history if "kl" in h) == 0.0
    # run/cold_start is the cold-started policy (its adapter over the base), loaded merged
    assert (out / "cold_start" / "adapter_config.json").is_file()
    cold = load_policy(str(out / "cold_start"))
    base = load_policy(str(tiny_model_dir))
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        want, _ = token_logprobs(cold, ids, mask, 5)
        untrained, _ = token_logprobs(base, ids, mask, 5)
        with result.policy.disable_adapter():
            reference, _ = token_logprobs(result.policy, ids, mask, 5)
    assert (want - untrained).abs().max() > 1e-3       # the cold start moved the policy
    assert torch.equal(reference, want)                # the reference is that policy, bit for bit
    # step 0's evaluation sampled (greedy, on the training sampler) what the cold-started policy says
    rows = [json.loads(line) for line in (out / "eval" / "step-0.jsonl").read_text().splitlines()]
    tokenizer = load_tokenizer(str(tiny_model_dir))
    greedy = HFSampler(cold, tokenizer, max_new_tokens=4).sample([r["prompt"] for r in rows], 1,
                                                                  greedy=True)
    assert [r["completions"][0] for r in rows] == greedy.completions


def test_a_lora_run_with_a_cold_start_resumes_exactly(tiny_model_dir, tmp_path):
    settings = dict(sft_steps=3, sft_lr=1e-2, beta=0.04)
    train(lora_config(tiny_model_dir, tmp_path / "whole", steps=3, save_every=0, **settings),
          reward_fns=[distinct], log=lambda s: None)
    train(lora_config(tiny_model_dir, tmp_path / "cut", steps=2, save_every=2, **settings),
          reward_fns=[distinct], log=lambda s: None)
    train(lora_config(tiny_model_dir, tmp_path / "cut", steps=3, save_every=0, resume="auto",
                      **settings), reward_fns=[distinct], log=lambda s: None)
    a = load_file(tmp_path / "whole" / "final" / "adapter_model.safetensors")
    b = load_file(tmp_path / "cut" / "final" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def grpo_command(*args, cwd=None):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "grpo.commands.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def test_a_lora_runs_final_adapter_is_evaluated_and_trained_further_without_merging(
        tiny_model_dir, tmp_path):
    from grpo.assembly import load_model_and_tokenizer
    from grpo.models import load_policy, token_logprobs
    out = tmp_path / "run"
    result = train(lora_config(tiny_model_dir, out, beta=0.04), reward_fns=[distinct],
                   log=lambda s: None)
    assert not (out / "final" / "config.json").exists()       # final/ is the adapter alone
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        trained, _ = token_logprobs(result.policy, ids, mask, 5)
        untrained, _ = token_logprobs(load_policy(str(tiny_model_dir)), ids, mask, 5)
    assert (trained - untrained).abs().max() > 1e-4
    # model=RUN/final and model=RUN: the recorded base with the adapter merged in
    for model in (out / "final", out):
        policy, _ = load_model_and_tokenizer(build_config({"model": str(model)}), None)
        assert not hasattr(policy, "peft_config")
        with torch.no_grad():
            loaded, _ = token_logprobs(policy, ids, mask, 5)
        torch.testing.assert_close(loaded, trained, rtol=0, atol=2e-6)
    # grpo eval on it scores the trained weights: greedy completions as the trained policy's
    from grpo.sampling import HFSampler
    evaluated = grpo_command("eval", f"model={out / 'final'}", "task=addition", "eval_size=4",
                             "max_new_tokens=4", f"eval_output={tmp_path / 'eval.jsonl'}")
    assert evaluated.returncode == 0, evaluated.stderr
    rows = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    greedy = HFSampler(result.policy, result.tokenizer, max_new_tokens=4).sample(
        [r["prompt"] for r in rows], 1, greedy=True)
    assert [r["completions"][0] for r in rows] == greedy.completions
    # and trains further from them, with a fresh adapter whose reference is the trained policy
    # a reward that varies between completions, so the one step has advantages to follow (the
    # task's exact answer may score every completion of a random model 0, and then nothing moves)
    (tmp_path / "varied.py").write_text("def distinct(prompts, completions, **columns):\n"
                                        "    return [len(set(c)) / 4 for c in completions]\n")
    more = grpo_command("train", f"model={out / 'final'}", "task=addition", "lora_r=4", "beta=0.04",
                        "steps=1", "sft_steps=0", "eval_every=0", "prompts_per_step=2",
                        "group_size=4", "max_new_tokens=4", "rewards=[varied:distinct]",
                        f"output_dir={tmp_path / 'more'}", cwd=tmp_path)
    assert more.returncode == 0, more.stderr
    first = json.loads((tmp_path / "more" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["kl"] == 0.0
    recorded = json.loads((tmp_path / "more" / "final" / "adapter_config.json").read_text())
    assert recorded["base_model_name_or_path"] == str(out / "final")
    policy, _ = load_model_and_tokenizer(build_config({"model": str(tmp_path / "more")}), None)
    with torch.no_grad():
        further, _ = token_logprobs(policy, ids, mask, 5)
    assert (further - trained).abs().max() > 0             # the second adapter is in it too
    # every weight trains when going on without lora_r
    full = train(build_config({"model": str(out / "final"), "task": "addition", "steps": 1,
                               "sft_steps": 0, "eval_every": 0, "prompts_per_step": 2,
                               "group_size": 4, "max_new_tokens": 4, "lr": 1e-2, "threads": 1,
                               "output_dir": str(tmp_path / "full")}),
                 reward_fns=[distinct], log=lambda s: None, write_files=False)
    assert all(p.requires_grad for p in full.policy.parameters())


def test_an_adapter_whose_base_is_missing_is_one_line_naming_both(tiny_model_dir, tmp_path):
    from grpo.models import ModelError, model_source
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_model.safetensors").write_bytes(b"")
    (tmp_path / "adapter" / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": str(tmp_path / "gone" / "base_model")}))
    with pytest.raises(ModelError) as e:
        model_source("model", str(tmp_path / "adapter"))
    assert str(e.value) == (
        f"config key 'model': cannot load '{tmp_path / 'adapter'}', a LoRA adapter: its base model "
        f"{tmp_path / 'gone' / 'base_model'} (base_model_name_or_path in its adapter_config.json) "
        "cannot be loaded: no such directory; give a Hugging Face model directory (a run's final/) "
        "or a hub name")
    # a run moved elsewhere: the base is found by its name beside the adapter
    (tmp_path / "base_model").symlink_to(tiny_model_dir)
    assert model_source("model", str(tmp_path / "adapter"))[0] == str(tmp_path / "adapter")


def test_explain_with_lora_after_a_cold_start_measures_kl_from_the_cold_started_policy(tiny_model_dir):
    from grpo.commands.explain import explain_group
    result = explain_group(build_config({"model": str(tiny_model_dir), "task": "addition",
                                         "lora_r": 4, "lora_alpha": 8, "sft_steps": 4,
                                         "sft_lr": 1e-2, "beta": 0.04, "group_size": 3,
                                         "max_new_tokens": 4, "threads": 1}))
    assert result["iterations"][0]["kl"] == 0.0


# ---- push_to_hub of a LoRA run, against a stand-in of the hub API on loopback (hub_standin.py) ----

def standin_hub(monkeypatch):
    import huggingface_hub.constants
    from hub_standin import Hub
    hub = Hub()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_TOKEN", "hf_standin")
    return hub


def test_push_to_hub_of_a_lora_run_after_a_cold_start_uploads_the_merged_model(tiny_model_dir, tmp_path,
                                                                              monkeypatch):
    """final/ is an adapter whose recorded base is the run's cold_start/ (itself an adapter over a
    local directory): uploaded alone, no one who downloads it could load it. The hub gets the
    merged model instead, which loads by itself as the weights `model=RUN/final` gives."""
    from transformers import AutoModelForCausalLM
    from grpo.models import load_policy
    hub = standin_hub(monkeypatch)
    out, lines = tmp_path / "run", []
    train(lora_config(tiny_model_dir, out, sft_steps=2, sft_lr=1e-2, steps=1,
                      push_to_hub="someone/tiny-lora"), reward_fns=[distinct], log=lines.append)
    recorded = json.loads((out / "final" / "adapter_config.json").read_text())
    assert recorded["base_model_name_or_path"] == str((out / "cold_start").resolve())
    assert hub.repos == {"someone/tiny-lora"}
    assert "adapter_config.json" not in hub.files and "config.json" in hub.files
    merged = out / "final" / "merged"
    assert hub.files == {p.relative_to(merged).as_posix(): p.read_bytes()
                         for p in merged.rglob("*") if p.is_file()}
    pulled = tmp_path / "pulled"
    for name, data in hub.files.items():
        (pulled / name).parent.mkdir(parents=True, exist_ok=True)
        (pulled / name).write_bytes(data)
    model = AutoModelForCausalLM.from_pretrained(pulled).state_dict()
    want = load_policy(str(out / "final")).state_dict()
    assert model.keys() == want.keys() and all(torch.equal(model[k], want[k]) for k in want)
    base = load_policy(str(tiny_model_dir)).state_dict()
    assert any(not torch.equal(model[k], base[k]) for k in base)    # the adapters are in it
    assert any("uploading the merged model" in line for line in lines)


def test_a_lora_adapter_over_a_hub_model_is_uploaded_as_it_is(tmp_path):
    """An adapter whose base is a hub name loads anywhere: push_to_hub uploads final/ itself."""
    from grpo.train import hub_folder
    final = tmp_path / "final"
    final.mkdir()
    (final / "adapter_model.safetensors").write_bytes(b"")
    (final / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "someone/base"}))
    assert hub_folder(final, tokenizer=None, dtype="float32", log=pytest.fail) == final
    assert not (final / "merged").exists()
