"""What can be found before any training is found there: a missing engine, and a user's reward
function that raises, has a signature the call does not fit, or returns the wrong number of
values or a value that is not finite. One dry call on the first row, before the cold start."""

import json

import pytest

from grpo.commands.cli import main
from grpo.config import ConfigError, build_config
from grpo.rewards import RewardError
from grpo.train import train

REWARDS = '''
def raises(prompts, completions, **columns):
    raise KeyError("score")

def too_few(prompts, completions, **columns):
    return [1.0] * (len(completions) - 1)

def not_finite(prompts, completions, **columns):
    return [float("nan")] * len(completions)

def no_columns(prompts, completions):
    return [1.0] * len(completions)

CALLS = []

def fine(prompts, completions, **columns):
    CALLS.append(list(completions))
    return [float(len(c) % 2) for c in completions]
'''


@pytest.fixture
def demo(tmp_path, monkeypatch):
    """A dataset whose rows have an answer and a completion to imitate, and a module of rewards."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dry_call_rewards.py").write_text(REWARDS)
    path = tmp_path / "sums.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=?", "answer": str(i + 1),
                                        "completion": f"It is {i + 1}."}) + "\n" for i in range(4)))
    return path


def settings(model, dataset, out, **more):
    return {"model": str(model), "dataset": str(dataset), "sft_steps": 5, "steps": 1,
            "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4, "eval_every": 0,
            "save_every": 0, "threads": 1, "seed": 0, "output_dir": str(out), **more}


@pytest.mark.parametrize("name, says", [
    ("raises", "reward function 'raises' raised KeyError: 'score' on sample 0"),
    ("too_few", "reward function 'too_few' returned 0 values for 1 completions"),
    ("not_finite", "reward function 'not_finite' returned nan for completion 0"),
    ("no_columns", "reward function 'no_columns' raised TypeError"),
])
def test_a_broken_reward_stops_the_run_before_the_cold_start(tiny_model_dir, demo, tmp_path, name,
                                                              says):
    lines = []
    with pytest.raises(RewardError) as e:
        train(build_config(settings(tiny_model_dir, demo, tmp_path / "run",
                                    rewards=[f"dry_call_rewards:{name}"])), log=lines.append)
    message = str(e.value)
    assert "\n" not in message
    # the dataset is shuffled with the seed; the dry call names the row it used
    assert message.startswith(f"before training, a dry call on {demo} row ")
    assert says in message
    assert not any(line.startswith("cold start") for line in lines)   # no cold-start step ran
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_command_line_says_it_in_one_line_and_exits_2(tiny_model_dir, demo, tmp_path, capsys):
    status = main(["train", f"model={tiny_model_dir}", f"dataset={demo}", "sft_steps=5", "steps=1",
                   "rewards=[dry_call_rewards:raises]", "threads=1", f"output_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert err[-1].startswith("grpo train: error: before training, a dry call on ")
    assert "reward function 'raises' raised KeyError" in err[-1]


def test_the_dry_call_uses_the_rows_completion_and_is_in_no_metric(tiny_model_dir, demo, tmp_path):
    from grpo.sandbox.pool import find
    calls = find("dry_call_rewards:CALLS", "list")
    calls.clear()
    result = train(build_config(settings(tiny_model_dir, demo, tmp_path / "run",
                                         rewards=["dry_call_rewards:fine"])), log=lambda line: None)
    first = calls[0]
    assert len(first) == 1 and first[0].startswith("It is ")      # the row's own completion
    assert [len(c) for c in calls[1:]] == [4]           # step 1: 2 prompts x 2
    assert len(result.history) == 1


def test_a_missing_engine_stops_the_run_before_anything_is_loaded(tiny_model_dir, demo, tmp_path,
                                                                  monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "vllm", None)      # as where vLLM is not installed
    lines = []
    with pytest.raises(ConfigError, match=r"^config key 'sampler': sampler=vllm needs vLLM 0\.32: in a "
                                          r"clone of grpo, pip install .*; or set sampler=hf$"):
        train(build_config(settings(tiny_model_dir, demo, tmp_path / "run", sampler="vllm",
                                    rewards=["dry_call_rewards:fine"])), log=lines.append)
    assert lines == []      # before the dataset is read or the model loaded
