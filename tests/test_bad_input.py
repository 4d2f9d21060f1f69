"""Every bad input gets an error that names it, and leaves an existing run's files as they were.

Each test points a resumed run (resume=auto) at the finished run of `done_run` with one bad input
and checks the message and that metrics.jsonl, samples.jsonl and every checkpoint file are
byte for byte unchanged. docs/faults.md lists these faults with the tests that show them.
"""

import hashlib
import json
import re
import shutil

import pytest

from grpo.assembly import ConfigError
from grpo.config import build_config
from grpo.data import DataError
from grpo.models import load_tokenizer
from grpo.rewards import RewardError
from grpo.train import train

BASE = {"sft_steps": 0, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4, "eval_every": 0,
        "save_every": 1, "keep_last": 0, "threads": 1}


@pytest.fixture(scope="module")
def done_run(tiny_model_dir, tmp_path_factory):
    run = tmp_path_factory.mktemp("done")
    train(build_config({**BASE, "model": str(tiny_model_dir), "steps": 2, "output_dir": str(run)}),
          log=lambda line: None)
    return run


def snapshot(run) -> dict:
    files = [run / "metrics.jsonl", run / "samples.jsonl", *sorted((run / "checkpoints").rglob("*"))]
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files if p.is_file()}


def resume_with(done_run, tiny_model_dir, error, match, **bad):
    """Resume the finished run with one bad input; the error and the untouched files."""
    before = snapshot(done_run)
    values = {**BASE, "model": str(tiny_model_dir), "steps": 3, "output_dir": str(done_run),
              "resume": "auto", **bad}
    with pytest.raises(error, match=match):
        train(build_config(values), log=lambda line: None)
    assert snapshot(done_run) == before


def test_a_model_path_that_does_not_exist(done_run, tiny_model_dir, tmp_path):
    resume_with(done_run, tiny_model_dir, ConfigError,
                f"config key 'model': cannot load '{tmp_path / 'nowhere'}'", model=str(tmp_path / "nowhere"))


def tokenizer_variant(tiny_model_dir, tmp_path, **tokens):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.update(tokens)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    return model


def test_a_tokenizer_without_eos_is_named(done_run, tiny_model_dir, tmp_path):
    model = tokenizer_variant(tiny_model_dir, tmp_path, eos_token=None)
    resume_with(done_run, tiny_model_dir, ConfigError, f"the tokenizer of {model} has no EOS token",
                model=str(model))


def test_a_tokenizer_without_pad_pads_with_eos(tiny_model_dir, tmp_path):
    tok = load_tokenizer(str(tokenizer_variant(tiny_model_dir, tmp_path, pad_token=None)))
    assert tok.pad_token == tok.eos_token   # masks come from lengths, so this is safe (test_rewards)


def test_a_chat_template_required_but_missing(done_run, tiny_model_dir):
    resume_with(done_run, tiny_model_dir, ConfigError,
                "config key 'chat_template' is required, but the tokenizer of .* has no chat template",
                chat_template="required")


@pytest.mark.parametrize("content, message", [
    ("", "the file is empty"),
    ('{"question": "1+1", "answer": "2"}\n{"question": "2+2", "answer": "4"}\n{"question": 3+3}\n',
     "line 3: not valid JSON"),
    ('{"question": "1+1", "answer": "2"}\n[1, 2]\n', "line 2: expected a JSON object, got list"),
    ('{"query": "1+1", "answer": "2"}\n', "no prompt column; none of"),
    ('{"question": "1+1", "gold": "2"}\n', "row 1: no value in the answer column 'answer'"),
])
def test_a_bad_dataset_file_is_named_with_its_line(done_run, tiny_model_dir, tmp_path, content, message):
    path = tmp_path / "data.jsonl"
    path.write_text(content)
    resume_with(done_run, tiny_model_dir, DataError, f"{path}.*{message}", dataset=str(path))


def test_a_missing_dataset_file_and_a_missing_named_answer_column(done_run, tiny_model_dir, tmp_path):
    resume_with(done_run, tiny_model_dir, DataError, f"dataset file not found: {tmp_path / 'no.jsonl'}",
                dataset=str(tmp_path / "no.jsonl"))
    path = tmp_path / "data.jsonl"
    path.write_text('{"question": "1+1", "answer": "2"}\n')
    resume_with(done_run, tiny_model_dir, DataError, "no answer column 'gold'", dataset=str(path),
                answer_column="gold")


def long_dataset(tmp_path):
    path = tmp_path / "long.jsonl"
    rows = [{"question": "1+1", "answer": "2"}, {"question": "9" * 600, "answer": "1"},
            {"question": "2+2", "answer": "4"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_prompt_longer_than_the_context_is_an_error_naming_the_row(done_run, tiny_model_dir, tmp_path):
    # a new run: resuming the finished run on this dataset is refused earlier, as other data
    # than its checkpoint's (test_resume.py::test_a_resume_on_changed_data_is_refused_...)
    path = long_dataset(tmp_path)
    run = tmp_path / "run"
    with pytest.raises(DataError, match=f"{path} row 2: the prompt has 60[0-9] tokens; with "
                       "max_new_tokens=4 it exceeds the model's context of 512.*long_prompts=skip"):
        train(build_config({**BASE, "model": str(tiny_model_dir), "steps": 2, "dataset": str(path),
                            "output_dir": str(run)}), log=lambda line: None)
    assert not (run / "metrics.jsonl").exists() and not (run / "checkpoints").exists()


def test_long_prompts_skip_leaves_them_out_and_counts_them(tiny_model_dir, tmp_path):
    path = long_dataset(tmp_path)
    lines = []
    result = train(build_config({**BASE, "model": str(tiny_model_dir), "steps": 2, "dataset": str(path),
                                 "long_prompts": "skip", "output_dir": str(tmp_path / "run")}),
                   log=lines.append)
    assert any("left out 1 of 3 train prompts longer than 508 tokens" in line for line in lines)
    assert all(m["data/skipped_long_prompts"] == 1 for m in result.history if "loss" in m)
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert samples and all("9" * 600 not in s["prompt"] for s in samples)


REWARDS = '''
def raises(prompts, completions, **columns):
    raise KeyError("no such field")

def short(prompts, completions, **columns):
    return [1.0] * (len(completions) - 1)

def nan(prompts, completions, **columns):
    return [float("nan")] * len(completions)

def inf(prompts, completions, **columns):
    return [float("inf")] * len(completions)
'''


@pytest.mark.parametrize("name, message", [
    ("raises", "reward function 'raises' raised KeyError"),
    # found by the dry call on the first row, before training (one completion)
    ("short", "reward function 'short' returned 0 values for 1 completions; it must return one"),
    ("nan", "reward function 'nan' returned nan"),
    ("inf", "reward function 'inf' returned inf"),
])
def test_a_failing_reward_function_is_named(done_run, tiny_model_dir, tmp_path, monkeypatch, name, message):
    (tmp_path / "bad_rewards.py").write_text(REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    resume_with(done_run, tiny_model_dir, RewardError, message, rewards=[f"bad_rewards:{name}"])


@pytest.mark.parametrize("file_text, args, message", [
    ("steps: 3\nlr: [1e-3\n", [], r"bad\.yaml:3: not valid YAML"),
    ("steps: 3\n", ["grup_size=4"], "unknown config key 'grup_size'; the nearest valid key is 'group_size'"),
    ("steps: 3\n", ["group_size=1"], "config key 'group_size' must be at least 2, got 1"),
    ("steps: 3\n", ["lr=-1e-5"], "config key 'lr' must be 0 or more"),
    ("steps: 3\n", ["group_size=four"], "config key 'group_size' expects an integer, got 'four'"),
])
def test_a_bad_config_is_one_line_and_touches_nothing(done_run, tiny_model_dir, tmp_path, capsys,
                                                      file_text, args, message):
    from grpo.commands.cli import main
    (tmp_path / "bad.yaml").write_text(file_text)
    before = snapshot(done_run)
    status = main(["train", str(tmp_path / "bad.yaml"), f"model={tiny_model_dir}",
                   f"output_dir={done_run}", "resume=auto", *args])
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert re.search(message, err), err
    assert snapshot(done_run) == before
