"""`grpo explain`: its numbers are those of the advantage and loss functions on the same inputs."""

import json

import pytest
import torch

from grpo.algorithm.advantages import ADVANTAGES
from grpo.commands.cli import main
from grpo.config import build_config
from grpo.commands.explain import explain_group, render
from grpo.algorithm.loss import AGGREGATIONS, LossSettings, policy_loss

SHAPED = '''
def distinct(prompts, completions, **columns):
    return [len(set(c)) / 6 for c in completions]
'''


@pytest.fixture(scope="module")
def result(tiny_model_dir, tmp_path_factory):
    where = tmp_path_factory.mktemp("explain")
    (where / "shaped_explain.py").write_text(SHAPED)
    import sys
    sys.path.insert(0, str(where))
    try:
        config = build_config({"model": str(tiny_model_dir), "sft_steps": 0, "group_size": 6,
                               "max_new_tokens": 6, "num_iterations": 3, "lr": 0.05, "beta": 0.04,
                               "rewards": ["shaped_explain:distinct", "exact_answer"], "threads": 1})
        return explain_group(config, row=3)
    finally:
        sys.path.remove(str(where))


def padded(rows, width, value=0.0):
    return torch.tensor([r + [value] * (width - len(r)) for r in rows])


def test_advantages_are_the_advantage_function_of_the_rewards(result):
    rewards = torch.tensor([c["reward"] for c in result["completions"]])
    assert rewards.std() > 0    # the group has contrast, so the update does something
    want = ADVANTAGES["group_norm"](rewards, torch.zeros(6, dtype=torch.long), result["advantage_eps"])
    got = torch.tensor([c["advantage"] for c in result["completions"]])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert result["group_mean"] == pytest.approx(rewards.mean().item())
    assert result["group_std"] == pytest.approx(rewards.std().item())
    for c in result["completions"]:   # the reward is the sum of its components (weights 1)
        assert c["reward"] == pytest.approx(sum(c["rewards"].values()))


def test_each_update_is_the_loss_function_of_the_shown_tokens(result):
    comps = result["completions"]
    T = max(len(c["tokens"]) for c in comps)
    mask = padded([[1.0] * len(c["tokens"]) for c in comps], T)
    old = padded([c["old_logprobs"] for c in comps], T)
    ref = padded([c["ref_logprobs"] for c in comps], T)
    adv = torch.tensor([c["advantage"] for c in comps])
    weights = AGGREGATIONS[result["aggregation"]](mask, result["max_new_tokens"])
    assert len(result["iterations"]) == 3
    for it in result["iterations"]:
        logp = padded([p["logprobs"] for p in it["completions"]], T)
        loss, stats = policy_loss(logp, old, ref, adv, mask, weights, LossSettings(
            beta=result["beta"], eps_low=result["epsilon"], eps_high=result["epsilon_high"]))
        assert it["loss"] == pytest.approx(loss.item(), rel=1e-4, abs=1e-7)
        ratio = padded([p["ratio"] for p in it["completions"]], T, 1.0)
        torch.testing.assert_close(ratio, torch.exp(logp - old) * mask + (1 - mask), rtol=1e-5, atol=1e-6)
        clipped = sum(side != "" for p in it["completions"] for side in p["clipped"])
        assert clipped == stats["clip_low"].item() + stats["clip_high"].item()
        assert it["clip_frac"] == pytest.approx(clipped / mask.sum().item())
    first = result["iterations"][0]
    assert all(r == pytest.approx(1.0) for p in first["completions"] for r in p["ratio"])  # on-policy
    later = result["iterations"][-1]
    assert any(abs(r - 1) > 1e-3 for p in later["completions"] for r in p["ratio"])       # moved
    for c, p in zip(comps, result["iterations"][0]["completions"]):
        assert c["logprob_before"] == pytest.approx(sum(p["logprobs"]), abs=1e-4)


def test_the_table_and_the_json_from_the_command(tiny_model_dir, capsys):
    args = ["explain", f"model={tiny_model_dir}", "sft_steps=0", "group_size=3", "max_new_tokens=4",
            "threads=1"]
    assert main([*args, "--prompt", "largest of 1 2 3:", "--answer", "3"]) == 0
    table = capsys.readouterr().out
    for part in ("Prompt", "1. sample", "3. normalize", "advantage", "4. update 1/1", "ratio pi/pi_old",
                 "[clipped side]", "With num_iterations=1 every ratio is 1"):
        assert part in table, part
    assert main([*args, "--row", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["completions"]) == 3 and data["iterations"][0]["iteration"] == 1


def test_render_marks_clipped_tokens(result):
    text = render(result)
    sides = [s for it in result["iterations"] for p in it["completions"] for s in p["clipped"] if s]
    assert sides    # lr 0.05 moves the ratio past 1 +- 0.2 by the second update
    assert "4. update 3/3" in text and f"[{sides[0]}]" in text


def test_with_no_model_it_explains_a_cold_started_demo_with_several_updates(tmp_path, monkeypatch,
                                                                             capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["explain", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "No model given" in data["notes"][0] and "num_iterations=4" in data["notes"][0]
    rewards = [c["reward"] for c in data["completions"]]
    assert 0 < sum(rewards) < len(rewards)             # the cold start: some right, some wrong
    assert any(c["advantage"] != 0 for c in data["completions"])
    assert len(data["iterations"]) == 4
    later = data["iterations"][1:]
    assert any(abs(r - 1) > 0.2 for it in later for p in it["completions"] for r in p["ratio"])
    assert any(side for it in later for p in it["completions"] for side in p["clipped"])
    assert main(["explain", "model=tiny", "sft_steps=0", "group_size=2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["notes"] == []   # a model given: its keys only
    assert main(["explain", "--print-config"]) == 0
    shown = capsys.readouterr().out
    assert "num_iterations: 4" in shown and "sft_steps: 20" in shown


def test_rows_are_numbered_as_in_the_file(tiny_model_dir, tmp_path, monkeypatch, capsys):
    rows = [{"question": f"What is {n} + 1?", "answer": f"#### {n + 1}"} for n in range(1, 7)]
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.chdir(tmp_path)
    args = ["explain", "dataset=mine.jsonl", f"model={tiny_model_dir}", "sft_steps=0", "group_size=2",
            "max_new_tokens=2", "threads=1"]
    for number in (1, 3, 6):
        assert main([*args, "--row", str(number), "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["prompt"] == rows[number - 1]["question"] and data["row"] == number
    assert main([*args, "--row", "3"]) == 0
    assert "Prompt (row 3 of mine.jsonl; " in capsys.readouterr().out
    for number in (0, 7):
        assert main([*args, "--row", str(number)]) == 2
        assert ("rows are numbered from 1, as in the file; mine.jsonl has rows 1..6"
                in capsys.readouterr().err)


def test_the_overview_prints_each_rewards_first_sentence_whole():
    from grpo.commands.explain import overview
    from grpo.rewards import REWARDS
    text = overview()
    block = text.split("  2. score")[1].split("  3. normalize")[0].splitlines()[1:]
    entries = {}
    for line in block:                        # a name in its column, or a wrapped continuation
        name = line[6:27].strip()
        if name:
            entries[name] = line[27:].strip()
        else:
            entries[list(entries)[-1]] += " " + line.strip()
    assert list(entries) == list(REWARDS)
    for name, sentence in entries.items():
        assert sentence.endswith("."), (name, sentence)
        assert sentence.count("(") == sentence.count(")") and sentence.count("`") % 2 == 0, (name, sentence)
    # before: "1.0 when the answer (inside <answer> tags if present"
    assert entries["exact_answer"] == ("1.0 when the answer (inside <answer> tags if present, else the "
                                       "whole completion, stripped) is exactly the string `answer`; a "
                                       "strict, fast check for tasks with canonical answers.")
    assert all(len(line) <= 100 for line in block)


def test_explain_runs_trainings_own_step_with_the_off_policy_correction(tiny_model_dir, monkeypatch):
    # explain re-implemented the step from its helpers and left out the off-policy correction;
    # it now runs step.grpo_step, watched: the updates it shows are training's updates, with the
    # correction's weights in them.
    import grpo.step as step
    seen = {}
    real_update, real_weights = step.update_policy, step.off_policy_weights

    def update_policy(c, learner, rollout, is_weights, selected=None, observer=None):
        seen["is_weights"] = is_weights
        seen["updates"] = real_update(c, learner, rollout, is_weights, selected, observer)
        return seen["updates"]

    def off_policy_weights(rollout, name, cap, low=0.0):
        weights, stats = real_weights(rollout, name, cap, low)
        seen["correction"] = (name, cap)
        return weights, stats

    monkeypatch.setattr(step, "update_policy", update_policy)
    monkeypatch.setattr(step, "off_policy_weights", off_policy_weights)
    c = build_config({"model": str(tiny_model_dir), "sft_steps": 0, "group_size": 4, "max_new_tokens": 5,
                      "num_iterations": 2, "lr": 0.05, "tis_cap": 2.0, "threads": 1})
    result = explain_group(c, row=2)
    assert seen["correction"] == ("tis", 2.0) and seen["is_weights"] is not None
    assert [it["loss"] for it in result["iterations"]] == [u["loss"] for u in seen["updates"]]
    assert [it["grad_norm"] for it in result["iterations"]] == [u["grad_norm"] for u in seen["updates"]]


def test_explain_shows_every_update_even_when_none_is_finite(tiny_model_dir, monkeypatch):
    # training stops after max_skipped_updates non-finite updates in a row; explain, which runs
    # training's step, shows each of them (stepped: False) instead of stopping with that error
    import grpo.step as step
    real = step.accumulate_gradients

    def poisoned(policy, rollout, **kw):
        stats = real(policy, rollout, **kw)
        for p in policy.parameters():
            if p.grad is not None:
                p.grad.fill_(float("nan"))
        return {**stats, "loss": float("nan")}

    monkeypatch.setattr(step, "accumulate_gradients", poisoned)
    c = build_config({"model": str(tiny_model_dir), "sft_steps": 0, "group_size": 4, "max_new_tokens": 5,
                      "num_iterations": 5, "max_skipped_updates": 2, "threads": 1})
    result = explain_group(c, row=1)
    assert [it["stepped"] for it in result["iterations"]] == [False] * 5


def test_explain_says_when_rows_override_the_system_prompt(tmp_path, tiny_model_dir, capsys):
    """`grpo explain system_prompt=...` on rows whose messages hold a system message of their
    own: the rows' own is kept, and that is said (it was dropped silently)."""
    import json
    f = tmp_path / "chat.jsonl"
    f.write_text("".join(json.dumps({"prompt": [{"role": "system", "content": "You add."},
                                                {"role": "user", "content": f"{i}+1="}],
                                     "answer": str(i + 1)}) + "\n" for i in range(3)))
    template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}assistant:{% endif %}")
    assert main(["explain", f"model={tiny_model_dir}", f"dataset={f}", "system_prompt=Think first.",
                 f"chat_template={template}", "group_size=2", "max_new_tokens=4"]) == 0
    captured = capsys.readouterr()
    assert f"system_prompt is not used for 3 of the 3 rows of {f} (the first: row 1)" in \
        captured.out + captured.err
