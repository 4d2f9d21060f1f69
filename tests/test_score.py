"""`grpo score`: a user's file of completions scored with the reward functions, no model."""

import json
from pathlib import Path

import pytest

from grpo.commands.cli import main

HUMANEVAL = Path(__file__).parent / "data" / "code" / "humaneval.jsonl"


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_file_of_model_outputs_gets_per_row_results_and_pass_at_k(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "outputs.jsonl", [
        {"question": "What is 2 + 3?", "answer": "#### 5",
         "completions": ["So \\boxed{5}", "\\boxed{6}", "\\boxed{5}", "no idea"]},
        {"question": "What is 10 - 4?", "answer": "#### 6",
         "completions": ["\\boxed{6}", "\\boxed{6}", "\\boxed{7}", "\\boxed{6}"]}])
    assert main(["score", "dataset=outputs.jsonl", "eval_k=[1,2,4]", "output_dir=out"]) == 0
    result = json.loads(capsys.readouterr().out)
    # row 1: 2 of 4 right, row 2: 3 of 4. pass@1 = (1/2 + 3/4) / 2; pass@2 = 1 - C(n-c, 2) / C(4, 2):
    # row 1 1 - 1/6, row 2 1 (only one wrong); maj@2 votes over the first two answers: row 1 ties
    # 5 and 6, the first seen (5) wins and is right; row 2 votes 6, right
    assert result["pass@1"] == pytest.approx(0.625, abs=1e-12)
    assert result["pass@2"] == pytest.approx((5 / 6 + 1) / 2, abs=1e-12)
    assert result["pass@4"] == 1.0 and result["maj@2"] == 1.0
    assert result["rows"] == 2 and result["completions"] == 8
    assert result["reward/math_accuracy/mean"] == pytest.approx(5 / 8, abs=1e-12)
    rows = [json.loads(line) for line in open(result["rows_file"])]
    assert result["rows_file"] == str(Path("out") / "score.jsonl")
    assert [r["row"] for r in rows] == [1, 2]             # numbered as in the file
    assert rows[0]["scores"] == [1.0, 0.0, 1.0, 0.0] and rows[0]["answers"] == ["5", "6", "5", None]


def test_a_benchmarks_canonical_solutions_pass_their_own_tests(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["score", f"dataset={HUMANEVAL}", "rewards=[code_tests]", "--completions",
                 "canonical_solution", "eval_output=humaneval_scores.jsonl"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["pass@1"] == 1.0 and result["rows"] == sum(1 for _ in open(HUMANEVAL))
    rows = [json.loads(line) for line in open(tmp_path / "humaneval_scores.jsonl")]
    assert all(r["rewards"]["code_tests"] == [1.0] for r in rows)


def test_one_completion_per_row_and_the_errors_that_name_the_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "one.jsonl", [{"question": "1 + 1?", "answer": "2", "completion": "2"},
                                         {"question": "2 + 2?", "answer": "4", "completion": "5"}])
    assert main(["score", "dataset=one.jsonl", "rewards=[exact_answer]"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["pass@1"] == 0.5 and result["completions"] == 2
    write_jsonl(tmp_path / "bad.jsonl", [{"question": "1 + 1?", "answer": "#### 2", "completion": "2"},
                                         {"question": "2 + 2?", "answer": "#### 4", "completion": None}])
    for args, named in [(["dataset=one.jsonl", "rewards=[exact_answer]", "eval_k=[2]"], "'eval_k': [2] above the fewest completions"),
                        (["dataset=one.jsonl", "rewards=[exact_answer]", "--completions", "output"], "no completion column 'output'"),
                        (["dataset=bad.jsonl"], "bad.jsonl row 2: column 'completion' holds NoneType"),
                        (["rewards=[exact_answer]"], "grpo score needs the file of completions")]:
        assert main(["score", *args]) == 2, args
        err = capsys.readouterr().err
        assert named in err and len(err.strip().splitlines()) == 1, (args, err)
