"""End to end on the tiny model: the loop learns, files land where DESIGN.md says, seeds repeat."""

import json
import statistics

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo.config import build_config
from grpo.train import train
from grpo.run.tracking import read_metrics


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    config = build_config({"steps": 60, "eval_every": 30, "eval_size": 100, "output_dir": str(out)})
    lines = []
    result = train(config, log=lines.append)
    return result, lines


def test_reward_rises_on_a_learnable_task(demo_run):
    result, _ = demo_run
    rewards = [m["reward/mean"] for m in result.history if "reward/mean" in m]
    first, last = statistics.mean(rewards[:10]), statistics.mean(rewards[-10:])
    assert last > first + 0.15, (first, last)


def test_run_directory_layout(demo_run):
    result, _ = demo_run
    run = result.run_dir
    for name in ("config.yaml", "metrics.jsonl", "samples.jsonl", "curves.png"):
        assert (run / name).is_file(), name
    assert any((run / "tb").iterdir())
    model = AutoModelForCausalLM.from_pretrained(run / "final")
    assert model.config.model_type == "llama"


def test_metric_names(demo_run):
    result, _ = demo_run
    metrics = read_metrics(result.run_dir)
    step = next(m for m in metrics if "reward/mean" in m)
    for key in ["step", "reward/mean", "reward/std", "reward/exact_answer/mean",
                "advantage/zero_std_frac", "kl", "clip/frac", "entropy", "completion/len_mean",
                "completion/truncated_frac", "time/step_s", "time/sample_s", "time/update_s",
                "tokens/s"]:
        assert key in step, key
    evals = [m for m in metrics if "eval/accuracy" in m]
    assert [m["step"] for m in evals] == [0, 30, 60]
    assert all(m["eval/n"] == 100 for m in evals)


def test_each_timer_measures_what_its_name_says(tmp_path, monkeypatch):
    # time/reward_s held the advantages' time too (and the correction's, the selection's); a slow
    # stage 3 now shows in time/advantage_s alone, and the parts add up to the step.
    import time
    import grpo.step as step_module
    real = step_module.set_advantages

    def slow(*args, **kwargs):
        time.sleep(0.25)
        return real(*args, **kwargs)

    monkeypatch.setattr(step_module, "set_advantages", slow)
    from grpo.sampling import HFSampler      # an engine's weight load is time/sync_s, not update's
    monkeypatch.setattr(HFSampler, "sync", lambda self, policy: time.sleep(0.2))
    c = build_config({"steps": 2, "sft_steps": 0, "eval_every": 0, "prompts_per_step": 2,
                      "group_size": 2, "max_new_tokens": 4, "output_dir": str(tmp_path)})
    for m in train(c, log=lambda s: None, write_files=False).history:
        assert m["time/advantage_s"] >= 0.25 and m["time/reward_s"] < 0.2, m
        assert m["time/sync_s"] >= 0.2 and m["time/update_s"] < 0.2, m
        parts = sum(m[f"time/{k}_s"] for k in ("sample", "reward", "reference", "advantage", "update",
                                                "sync"))
        assert parts <= m["time/step_s"] < parts + 0.1


def test_samples_carry_rewards_and_advantages(demo_run):
    result, _ = demo_run
    first = json.loads((result.run_dir / "samples.jsonl").read_text().splitlines()[0])
    assert set(first) >= {"step", "prompt", "completion", "reward", "advantage"}


def test_progress_line_per_step(demo_run):
    _, lines = demo_run
    steps = [line for line in lines if line.startswith("step ") and "reward" in line]
    assert len(steps) == 60 and "left" in steps[-1] and "eval/accuracy" in steps[-1]


def test_same_seed_same_numbers(tmp_path):
    def run(where):
        c = build_config({"steps": 3, "sft_steps": 3, "eval_every": 3, "eval_size": 20,
                          "output_dir": str(where)})
        return [{k: v for k, v in m.items() if not k.startswith(("time/", "tokens/s"))}
                for m in train(c, log=lambda s: None, write_files=False).history]
    assert run(tmp_path / "a") == run(tmp_path / "b")


def test_beta_zero_loads_no_reference(tmp_path, monkeypatch):
    import grpo.assembly.learner as assemble_module
    calls = []
    monkeypatch.setattr(assemble_module, "frozen_copy", lambda m: calls.append(m))
    c = build_config({"steps": 1, "sft_steps": 0, "beta": 0.0, "eval_every": 0,
                      "output_dir": str(tmp_path)})
    history = train(c, log=lambda s: None, write_files=False).history
    assert calls == [] and history[-1]["kl"] == 0.0


def test_custom_reward_function_and_dataset(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(json.dumps({"prompt": f"{i}+0=", "answer": str(i)}) for i in range(8)))
    seen = {}

    def ends_with_answer(prompts, completions, answer, **columns):
        seen["answer"] = answer
        return [1.0 if c.endswith(a) else 0.0 for c, a in zip(completions, answer)]

    c = build_config({"dataset": str(f), "sft_steps": 0, "steps": 1, "eval_every": 0,
                      "prompts_per_step": 2, "group_size": 3, "output_dir": str(tmp_path / "r")})
    result = train(c, reward_fns=[ends_with_answer], log=lambda s: None)
    assert len(seen["answer"]) == 6 and seen["answer"][0] == seen["answer"][2]
    assert "reward/ends_with_answer/mean" in result.history[0]


def test_the_zeros_a_reward_counts_by_cause_are_logged_each_step(tmp_path):
    from grpo.rewards import faults

    def strict(prompts, completions, **columns):
        faults.count("strict", "too_long", sum(len(c) > 0 for c in completions))
        return [0.0] * len(completions)

    c = build_config({"sft_steps": 0, "steps": 2, "eval_every": 0, "prompts_per_step": 2,
                      "group_size": 3, "output_dir": str(tmp_path / "r")})
    result = train(c, reward_fns=[strict], log=lambda s: None)
    logged = read_metrics(tmp_path / "r")
    counts = [m.get("reward/strict/zero/too_long", 0) for m in logged if "eval/accuracy" not in m]
    assert counts == [m["reward/strict/zero/too_long"] for m in result.history]
    assert all(0 < n <= 6 for n in counts)


def test_held_out_scorings_counts_are_no_steps_and_each_step_counts_its_own(tmp_path, monkeypatch):
    """Evaluation (before step 1, and after each step) scores in a scope of its own: a step's
    `reward/<fn>/zero/<cause>` counts that step's completions alone."""
    import grpo.assembly.data as assembly_data
    from grpo.rewards import faults

    def strict(prompts, completions, **columns):
        faults.count("strict", "counted", len(completions))
        return [0.0] * len(completions)

    def held_out(prompts, completions, **columns):
        faults.count("held_out", "counted", len(completions))
        return [0.0] * len(completions)

    monkeypatch.setattr(assembly_data, "choose_accuracy", lambda *a, **k: (held_out, "held_out"))
    c = build_config({"sft_steps": 0, "steps": 2, "eval_every": 1, "eval_size": 4,
                      "prompts_per_step": 2, "group_size": 3, "output_dir": str(tmp_path / "r"),
                      "report_to": []})
    result = train(c, reward_fns=[strict], log=lambda s: None, write_files=False)
    steps = [m for m in result.history if "reward/mean" in m]
    assert [m["reward/strict/zero/counted"] for m in steps] == [6, 6]
    assert not [k for m in result.history for k in m if k.startswith("reward/held_out")]
    assert len(result.history) == 5     # the evaluations did score: steps 0, 1 and 2


def test_lr_schedule_counts_steps_not_updates(tmp_path):
    # cosine over 4 steps, mu = 2 updates each: the factor at step k is (1 + cos(pi k / 4)) / 2,
    # i.e. 1, 0.853553, 0.5, 0.146447, whatever mu is.
    c = build_config({"steps": 4, "sft_steps": 0, "eval_every": 0, "num_iterations": 2, "lr": 1e-3,
                      "lr_schedule": "cosine", "prompts_per_step": 2, "group_size": 2,
                      "output_dir": str(tmp_path)})
    lrs = [m["lr"] for m in train(c, log=lambda s: None, write_files=False).history]
    assert lrs == pytest.approx([1e-3, 8.53553e-4, 5e-4, 1.46447e-4], rel=1e-5)


def test_reference_resets_each_outer_iteration(tmp_path):
    # With mu = 1 the KL of a step is measured before its update. Right after the reference is
    # set to the policy (steps 1 and 3 with ref_reset_every=2) the two agree and k3 is exactly 0;
    # at step 2 the policy has moved one update away from the reference.
    c = build_config({"steps": 3, "sft_steps": 0, "eval_every": 0, "ref_reset_every": 2,
                      "beta": 0.04, "lr": 1e-2, "prompts_per_step": 4, "group_size": 4,
                      "output_dir": str(tmp_path)})
    def length(prompts, completions, **columns):  # differs within groups, so every step updates
        return [float(len(x)) for x in completions]
    kls = [m["kl"] for m in train(c, reward_fns=[length], log=lambda s: None,
                                  write_files=False).history]
    assert kls[0] == 0.0 and kls[1] > 0.0 and kls[2] == 0.0


def test_cold_start_from_prompt_completion_pairs(tmp_path):
    from grpo.assembly import Data
    from grpo.models import load_policy, load_tokenizer, build_tiny
    from grpo.sampling import HFSampler
    from grpo.assembly import cold_start

    f = tmp_path / "pairs.jsonl"
    f.write_text("\n".join(json.dumps({"prompt": f"say {c}:", "completion": c * 3}) for c in "abcd"))
    c = build_config({"dataset": str(f), "sft_steps": 60, "sft_batch_size": 4, "sft_lr": 3e-3,
                      "output_dir": str(tmp_path)})
    from grpo.assembly import load_data
    data = load_data(c, check_golds_now=False)   # a cold-start file: no gold answers
    # (the row, context after its prompt that is not imitated, completion)
    assert sorted((row["prompt"], context, target) for row, context, target in data.demonstrations) == [
        ("say a:", "", "aaa"), ("say b:", "", "bbb"), ("say c:", "", "ccc"), ("say d:", "", "ddd")]
    path = build_tiny(tmp_path / "m", hidden_size=32, layers=2, heads=2)
    policy, tok = load_policy(str(path)), load_tokenizer(str(path))
    cold_start(c, policy, tok, data, log=lambda s: None)
    out = HFSampler(policy, tok, max_new_tokens=6).sample(["say a:", "say d:"], 1, greedy=True)
    assert out.completions == ["aaa", "ddd"]
    assert isinstance(data, Data)


def _poisoned(real, bad_calls):
    """accumulate_gradients whose listed calls (1-based) leave NaN gradients and a NaN loss."""
    calls = {"n": 0}

    def wrapper(policy, rollout, **kw):
        calls["n"] += 1
        stats = real(policy, rollout, **kw)
        if calls["n"] in bad_calls:
            for p in policy.parameters():
                if p.grad is not None:
                    p.grad.fill_(float("nan"))
            stats["loss"] = float("nan")
        return stats
    return wrapper


def test_non_finite_updates_are_skipped_and_counted(tmp_path, monkeypatch):
    import grpo.step as step_module
    monkeypatch.setattr(step_module, "accumulate_gradients",
                        _poisoned(step_module.accumulate_gradients, bad_calls={2}))
    c = build_config({"steps": 3, "sft_steps": 0, "eval_every": 0, "prompts_per_step": 2,
                      "group_size": 2, "output_dir": str(tmp_path)})
    result = train(c, log=lambda s: None, write_files=False)
    assert [m["update/skipped_steps"] for m in result.history] == [0, 1, 1]
    assert all(torch.isfinite(p).all() for p in result.policy.parameters())


def test_too_many_non_finite_updates_in_a_row_stop_the_run(tmp_path, monkeypatch):
    import grpo.step as step_module
    import grpo.train as train_module
    monkeypatch.setattr(step_module, "accumulate_gradients",
                        _poisoned(step_module.accumulate_gradients, bad_calls={1, 2, 3}))
    c = build_config({"steps": 5, "sft_steps": 0, "eval_every": 0, "prompts_per_step": 2,
                      "group_size": 2, "max_skipped_updates": 2, "output_dir": str(tmp_path)})
    with pytest.raises(train_module.TrainingError, match=r"3 updates in a row had a loss or gradient "
                                                        r"norm that is not finite.*max_skipped_updates"):
        train(c, log=lambda s: None, write_files=False)


def test_fault_counts_from_before_the_run_are_not_its_first_steps(tmp_path):
    """Zeros counted before a run (another run in this process, held-out scoring) are not
    logged as the run's: each step's `reward/<fn>/zero/<cause>` counts that step's completions."""
    from grpo.rewards import faults
    faults.count("leftover", "bomb")
    c = build_config({"steps": 1, "sft_steps": 0, "eval_every": 0, "prompts_per_step": 2,
                      "group_size": 2, "output_dir": str(tmp_path), "report_to": []})
    result = train(c, log=lambda line: None, write_files=False)
    assert "reward/leftover/zero/bomb" not in result.history[0]
    assert "reward/mean" in result.history[0]
