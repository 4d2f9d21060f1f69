"""Any Python function as a reward: `module:function` from config, and errors inside it."""

import json
import subprocess
import sys

import pytest

from grpo.rewards import RewardError, get_reward, score


def test_module_function_by_name():
    fn = get_reward("grpo.rewards.format:think_format")
    assert fn([""], ["<think>a</think><answer>1</answer>"]) == [1.0]


@pytest.mark.parametrize("name, message", [
    ("no_such_module_here:fn", "cannot import module 'no_such_module_here'"),
    ("grpo.rewards.format:nope", "module 'grpo.rewards.format' has no function 'nope'"),
    ("nosuch", "unknown reward function 'nosuch'.*module:function"),
])
def test_bad_reward_names_are_named(name, message):
    with pytest.raises(RewardError, match=message):
        get_reward(name)


def picky(prompts, completions, **columns):
    """Scores by length, and raises on a completion that says 'bad'."""
    out = []
    for c in completions:
        if c == "bad":
            raise ValueError("cannot read this one")
        out.append(float(len(c)))
    return out


def test_raising_function_stops_with_its_name_and_the_sample():
    with pytest.raises(RewardError, match=r"reward function 'picky' raised ValueError: cannot read "
                                          r"this one on sample 1 \(completion 'bad'\)"):
        score([picky], [1.0], ["p"] * 3, ["ok", "bad", "fine"], {})


def test_skip_marks_only_the_failing_sample_unscorable():
    totals, per_fn = score([picky], [1.0], ["p"] * 3, ["ok", "bad", "fine"], {}, on_error="skip")
    assert totals == [2.0, None, 4.0] and per_fn == {"picky": [2.0, None, 4.0]}


def test_reward_module_from_the_working_directory(tmp_path):
    (tmp_path / "my_rewards.py").write_text(
        "def brevity(prompts, completions, **columns):\n"
        "    return [-float(len(c)) for c in completions]\n")
    out = subprocess.run([sys.executable, "-m", "grpo.commands.cli", "train", "rewards=[my_rewards:brevity]",
                          "steps=1", "sft_steps=0", "eval_every=0", "prompts_per_step=2",
                          "group_size=2", "output_dir=run"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    # the user's function, applied to the logged completions, gives the logged mean
    expected = sum(-len(s["completion"]) for s in samples) / len(samples)
    assert len(samples) == 4 and metrics["reward/brevity/mean"] == pytest.approx(expected, abs=1e-9)


def test_raising_reward_on_the_command_line_is_one_line(tmp_path):
    (tmp_path / "broken.py").write_text(
        "def always(prompts, completions, **columns):\n    raise KeyError('answer_text')\n")
    out = subprocess.run([sys.executable, "-m", "grpo.commands.cli", "train", "rewards=[broken:always]",
                          "steps=1", "sft_steps=0", "eval_every=0", "prompts_per_step=1",
                          "group_size=2", "output_dir=run"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "reward function 'always' raised KeyError" in lines[0]
    assert "reward_on_error=skip" in lines[0]


def test_reward_functions_of_a_step_run_concurrently():
    # Each function waits at a two-party barrier: the step scores only if both run at once.
    import threading
    barrier = threading.Barrier(2, timeout=10)

    def first(prompts, completions, **columns):
        barrier.wait()
        return [1.0] * len(completions)

    def second(prompts, completions, **columns):
        barrier.wait()
        return [2.0] * len(completions)

    totals, _ = score([first, second], [1.0, 0.5], ["p"], ["c"], {})
    assert totals == [2.0]   # 1 * 1.0 + 0.5 * 2.0
