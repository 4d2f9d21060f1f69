"""Benchmark files as they are published, by path; conversational prompts; hub-style datasets with
a configuration and a split; pass@k and maj@k; `grpo eval` with n samples."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from grpo.assembly import load_data
from grpo.config import build_config
from grpo.data import DataError, format_prompt, load_rows
from grpo.models import build_tiny_tokenizer
from grpo.algorithm.passk import majority_vote, pass_at_k, summarize

DATA = Path(__file__).parent / "data"


# ---- pass@k and maj@k, by hand ------------------------------------------------------------------

def test_pass_at_k_against_the_closed_form():
    # n = 10 samples, c = 3 correct. pass@1 = c / n. pass@5 = 1 - C(7,5)/C(10,5) = 1 - 21/252 = 11/12.
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3, abs=1e-15)
    assert pass_at_k(10, 3, 5) == pytest.approx(11 / 12, abs=1e-15)
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 6, 5) == 1.0          # fewer than k wrong: every draw of 5 has a right one
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)


def test_majority_vote_by_hand():
    # Votes 7, 7, 8, None: 7 wins (2 votes); it was right -> maj right although one sample was wrong.
    assert majority_vote(["7", "7", "8", None], [True, True, False, False]) is True
    # A tie 7 / 8 goes to the first seen (8), which was wrong.
    assert majority_vote(["8", "7", "7", "8"], [False, True, True, False]) is False
    assert majority_vote([None, None], [False, False]) is False


def test_summarize_by_hand():
    rows = [{"scores": [1.0, 0.0, 1.0, 1.0], "answers": ["4", "5", "4", "4"]},
            {"scores": [0.0, 0.0, 1.0, None], "answers": ["1", "1", "2", "1"]}]
    m = summarize(rows, [1, 2, 4], with_votes=True)
    # pass@1: row means 3/4 and 1/3 (the None is left out) -> (0.75 + 1/3) / 2
    assert m["eval/pass@1"] == pytest.approx((0.75 + 1 / 3) / 2, abs=1e-12)
    # pass@2: row 1 n=4, c=3 -> 1 - C(1,2)/C(4,2) = 1; row 2 n=3, c=1 -> 1 - C(2,2)/C(3,2) = 2/3
    assert m["eval/pass@2"] == pytest.approx((1 + 2 / 3) / 2, abs=1e-12)
    # pass@4 only for rows with 4 scored samples: row 1 -> 1
    assert m["eval/pass@4"] == 1.0
    # maj@2: row 1 votes 4,5 -> 4 (right); row 2 votes 1,1 -> 1 (wrong) -> 1/2. maj@4: row 2 has a
    # None among its first 4, so only row 1 (4 wins, right) -> 1.
    assert (m["eval/maj@2"], m["eval/maj@4"]) == (0.5, 1.0)
    # spread over positions: position means 0.5, 0, 1, 1 -> mean 0.625, population std
    positions = [0.5, 0.0, 1.0, 1.0]
    std = (sum((p - 0.625) ** 2 for p in positions) / 4) ** 0.5
    assert m["eval/pass@1_std"] == pytest.approx(std, abs=1e-12)
    assert (m["eval/n"], m["eval/unscorable"]) == (2.0, 1.0)


# ---- Files as published ----------------------------------------------------------------------------

def test_gsm8k_and_math_files_load_by_path_and_score():
    from grpo.rewards import math_accuracy
    gsm = load_rows(str(DATA / "gsm8k.jsonl"))
    assert gsm[0]["prompt"].startswith("Ali has") and gsm[0]["answer"].endswith("#### 7")
    assert math_accuracy(["q"] * 3, ["so 7", "\\boxed{150}", "99"], answer=[r["answer"] for r in gsm]) \
        == [1.0, 1.0, 0.0]
    rows = load_rows(str(DATA / "math.jsonl"))        # `problem` and a worked `solution`
    assert rows[0]["prompt"].startswith("What is") and "\\boxed" in rows[0]["answer"]
    got = math_accuracy(["q"] * 4, ["\\boxed{\\frac{10}{12}}", "so \\boxed{(2,3)}", "The answer is Monday.",
                                    "\\boxed{\\begin{pmatrix}2&0\\\\0&2\\end{pmatrix}}"],
                        answer=[r["answer"] for r in rows])
    assert got == [1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("name,prompt_start", [("humaneval", "from typing"), ("mbpp", "Write a function"),
                                               ("apps", "Read two"), ("codecontests", "Print twice"),
                                               ("livecodebench", "Return how many")])
def test_code_benchmark_files_load_by_path_with_their_tests(name, prompt_start):
    from grpo.rewards.code import spec_from_row
    rows = load_rows(str(DATA / "code" / f"{name}.jsonl"))
    assert rows[0]["prompt"].startswith(prompt_start)
    for row in rows:
        spec_from_row(row)                         # every row's tests are readable as they are


def test_columns_are_mapped_by_config(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text(json.dumps({"task": "add", "checks": ["assert add(1, 2) == 3"], "fn": "add",
                             "gold": "3"}) + "\n")
    c = build_config({"dataset": str(f), "prompt_column": "task", "answer_column": "gold",
                      "tests_column": "checks", "entry_point_column": "fn", "rewards": ["code_tests"],
                      "sft_steps": 0})
    row = load_data(c).train_rows[0]
    assert (row["prompt"], row["answer"], row["tests"], row["entry_point"]) == \
        ("add", "3", ["assert add(1, 2) == 3"], "add")
    bad = build_config({"dataset": str(f), "prompt_column": "task", "tests_column": "nope",
                        "rewards": ["code_tests"], "sft_steps": 0})
    with pytest.raises(DataError, match="no column 'nope' for tests_column"):
        load_data(bad)


def test_unreadable_tests_stop_the_load_naming_the_row(tmp_path):
    f = tmp_path / "code.jsonl"
    f.write_text(json.dumps({"prompt": "p", "tests": ["assert f(1) == 1"]}) + "\n"
                 + json.dumps({"prompt": "p", "test_list": ["assert f(1) =="]}) + "\n")
    c = build_config({"dataset": str(f), "rewards": ["code_tests"], "sft_steps": 0})
    with pytest.raises(DataError, match=r"code.jsonl row 2, column 'test_list', item 0: not valid Python"):
        load_data(c)


# ---- Conversational prompts ------------------------------------------------------------------------

def chat_tokenizer():
    tok = build_tiny_tokenizer()
    tok.chat_template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    return tok


def test_conversational_prompts_go_through_the_chat_template():
    rows = load_rows(str(DATA / "chat.jsonl"))
    assert isinstance(rows[0]["prompt"], list) and rows[0]["prompt"][0]["role"] == "system"
    text = format_prompt(chat_tokenizer(), rows[0]["prompt"], "auto", system_prompt="ignored")
    assert text == ("<system>Answer with a number.<user>2+2?<assistant>4<user>and 3+3?<assistant>")
    # a system prompt from the config goes first when the conversation has none
    assert format_prompt(chat_tokenizer(), rows[1]["prompt"], "auto", "Be brief.") == \
        "<system>Be brief.<user>5+5?<assistant>"


def test_conversational_prompts_without_a_template_are_refused_never_stringified(tmp_path):
    rows = load_rows(str(DATA / "chat.jsonl"))
    with pytest.raises(DataError, match="list of chat messages, but the tokenizer has no chat template"):
        format_prompt(build_tiny_tokenizer(), rows[0]["prompt"], "auto")
    with pytest.raises(DataError, match="chat_template=none"):
        format_prompt(chat_tokenizer(), rows[0]["prompt"], "none")
    # through the command, the error names the file and the row
    done = subprocess.run([sys.executable, "-m", "grpo.commands.cli", "train", f"dataset={DATA / 'chat.jsonl'}",
                           "sft_steps=0", "steps=1", f"output_dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "chat.jsonl row 1: the prompt is a list of chat messages" in done.stderr, done.stderr
    assert "[{'role'" not in done.stderr + done.stdout


def test_a_malformed_message_names_the_row(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps({"prompt": [{"role": "user"}], "answer": "1"}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl row 1, column 'prompt': message 0 of the prompt has no 'role' and 'content'"):
        load_rows(str(f))


# ---- A dataset with configurations and splits (a hub dataset, as a local directory) ----------------

def test_a_configuration_and_split_can_be_named():
    from grpo.data import Columns
    main_train = load_rows(str(DATA / "gsm8k_dir"), Columns(), "main", "train")
    main_test = load_rows(str(DATA / "gsm8k_dir"), Columns(), "main", "test")
    socratic = load_rows(str(DATA / "gsm8k_dir"), Columns(), "socratic", "test")
    assert (len(main_train), len(main_test), len(socratic)) == (2, 1, 2)
    assert "How?" in socratic[0]["answer"] and "How?" not in main_test[0]["answer"]
    c = build_config({"dataset": str(DATA / "gsm8k_dir"), "dataset_config": "main",
                      "eval_dataset": str(DATA / "gsm8k_dir"), "eval_split": "test", "sft_steps": 0})
    data = load_data(c)
    assert (len(data.train_rows), len(data.eval_rows)) == (2, 1)


def test_an_unknown_configuration_or_split_is_named():
    from grpo.data import Columns
    with pytest.raises(DataError, match="configuration 'nope'.*dataset_config=NAME"):
        load_rows(str(DATA / "gsm8k_dir"), Columns(), "nope", "train")
    with pytest.raises(DataError, match="split 'validation'"):
        load_rows(str(DATA / "gsm8k_dir"), Columns(), "main", "validation")


# ---- grpo eval with n samples ----------------------------------------------------------------------

def test_grpo_eval_reports_pass_at_k_and_writes_every_row(tmp_path):
    out = tmp_path / "rows.jsonl"
    done = subprocess.run([sys.executable, "-m", "grpo.commands.cli", "eval", "eval_size=6", "eval_samples=4",
                           "eval_k=[1,2,4]", "eval_temperature=0.8", f"eval_output={out}",
                           f"output_dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    metrics = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ["eval/pass@1", "eval/pass@1_std", "eval/pass@2", "eval/pass@4", "eval/maj@2",
                "eval/maj@4", "eval/n"]:
        assert key in metrics
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6 and all(len(r["completions"]) == len(r["scores"]) == 4 for r in rows)
    # the reported pass@1 is the mean of the rows' scores as written
    mean = sum(sum(r["scores"]) / 4 for r in rows) / 6
    assert metrics["eval/pass@1"] == pytest.approx(mean, abs=1e-12)


def test_eval_help_shows_the_column_and_sampling_keys():
    done = subprocess.run([sys.executable, "-m", "grpo.commands.cli", "eval", "--help"], capture_output=True,
                          text=True, timeout=120)
    for key in ["prompt_column=", "answer_column=", "tests_column=", "entry_point_column=",
                "dataset_config=", "eval_samples=", "eval_k=", "eval_temperature="]:
        assert key in done.stdout


def test_eval_k_above_the_samples_is_refused():
    from grpo.config import ConfigError
    with pytest.raises(ConfigError, match="eval_k.*raise eval_samples"):
        build_config({"eval_k": [4], "eval_samples": 2})


def test_periodic_evaluation_during_training_reports_the_same_metrics(tmp_path):
    from grpo.train import train
    c = build_config({"steps": 2, "eval_every": 2, "eval_size": 8, "eval_samples": 3,
                      "eval_k": [1, 3], "sft_steps": 0, "prompts_per_step": 2, "group_size": 2,
                      "output_dir": str(tmp_path / "run")})
    history = train(c, log=lambda s: None).history
    evals = [h for h in history if "eval/pass@3" in h]
    assert [h["step"] for h in evals] == [0, 2]
    assert "eval/maj@3" in evals[0] and "eval/pass@1_std" in evals[0]
    rows = (tmp_path / "run" / "eval" / "step-2.jsonl").read_text().splitlines()
    assert len(rows) == 8
