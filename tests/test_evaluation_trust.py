"""Evaluation that says what it evaluated: the whole file unless told otherwise, a run's own
weights and settings, output beside what was evaluated, a reward of the user's choosing."""

import json
from pathlib import Path

import pytest
import torch

from grpo.commands.cli import main


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def rows_of(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


SUMS = [{"question": f"{a}+{a + 1}=", "answer": str(2 * a + 1)} for a in range(250)]


# ---------------------------------------------------------------- how many rows


def test_a_file_given_for_evaluation_is_evaluated_whole(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "test.jsonl", SUMS)      # 250 rows: more than the old cut of 200
    assert main(["eval", f"model={tiny_model_dir}", "eval_dataset=test.jsonl", "max_new_tokens=1",
                 "rewards=[exact_answer]", "eval_output=out.jsonl"]) == 0
    captured = capsys.readouterr()
    result = last_json(captured.out)
    assert (result["eval/n"], result["eval/rows"]) == (250, 250)
    assert len(rows_of(tmp_path / "out.jsonl")) == 250
    assert "evaluating the first" not in captured.err   # nothing was cut, so no cut is reported


def test_a_cut_is_stated_in_the_output_and_the_metrics(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "test.jsonl", SUMS[:5])
    assert main(["eval", f"model={tiny_model_dir}", "eval_dataset=test.jsonl", "max_new_tokens=1",
                 "rewards=[exact_answer]", "eval_size=3", "eval_output=out.jsonl"]) == 0
    captured = capsys.readouterr()
    result = last_json(captured.out)
    assert (result["eval/n"], result["eval/rows"]) == (3, 5)
    assert "evaluating the first 3 of 5 held-out rows" in captured.err


def test_a_built_in_task_keeps_its_held_out_size_and_says_the_cut_once_in_training(tiny_model_dir, tmp_path):
    from grpo.config import build_config
    from grpo.train import train
    lines: list[str] = []
    # the demo's task holds 511 held-out lists; unset, eval_size takes the first 200 as before
    c = build_config({"model": str(tiny_model_dir), "steps": 2, "sft_steps": 0, "eval_every": 1,
                      "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 2, "threads": 1,
                      "output_dir": str(tmp_path / "run")})
    result = train(c, log=lines.append)
    evals = [m for m in result.history if "eval/accuracy" in m]
    assert [(m["step"], m["eval/n"], m["eval/rows"]) for m in evals] == [(0, 200, 511), (1, 200, 511),
                                                                         (2, 200, 511)]
    stated = [line for line in lines if "200 of 511" in line]
    assert len(stated) == 1 and "eval_size" in stated[0]


def test_evaluation_in_training_shows_its_progress(tiny_model_dir, tmp_path):
    from grpo.config import build_config
    from grpo.train import train
    lines: list[str] = []
    c = build_config({"model": str(tiny_model_dir), "task": "addition", "steps": 1, "sft_steps": 0,
                      "eval_every": 1, "eval_size": 70, "prompts_per_step": 2, "group_size": 2,
                      "max_new_tokens": 2, "threads": 1, "output_dir": str(tmp_path / "run")})
    train(c, log=lines.append)
    # greedy evaluation samples 64 prompts per call: 64 of 70, then 70 of 70, at steps 0 and 1
    shown = [line.split("  ")[0] for line in lines if line.startswith("eval ")]
    assert shown == ["eval 64/70", "eval 70/70"] * 2


# ---------------------------------------------------------------- a run's weights and settings


@pytest.fixture(scope="module")
def trained_run(tiny_model_dir, tmp_path_factory):
    """A run on the addition task with its own settings (3 new tokens, a system prompt), a cold
    start that moves the weights, one GRPO step and a checkpoint."""
    from grpo.config import build_config
    from grpo.train import train
    run = tmp_path_factory.mktemp("trained") / "run"
    threads = torch.get_num_threads()
    train(build_config({"model": str(tiny_model_dir), "task": "addition", "sft_steps": 30,
                        "sft_lr": 1e-2, "steps": 1, "save_every": 1, "eval_every": 0,
                        "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 3,
                        "system_prompt": "Add.", "eval_size": 4, "threads": 1,
                        "output_dir": str(run)}),
          log=lambda line: None)
    torch.set_num_threads(threads)
    return run


def test_a_runs_config_evaluates_its_trained_weights_with_its_settings(trained_run, tmp_path,
                                                                      monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["eval", f"model={trained_run / 'final'}", "task=addition", "max_new_tokens=3",
                 "system_prompt=Add.", "eval_size=6", "eval_output=explicit.jsonl"]) == 0
    capsys.readouterr()
    assert main(["eval", str(trained_run / "config.yaml"), "eval_size=6"]) == 0
    captured = capsys.readouterr()
    result = last_json(captured.out)
    assert result["model"] == str(trained_run / "final")
    assert result["rows_file"] == str(trained_run / "eval.jsonl")
    explicit, of_run = rows_of(tmp_path / "explicit.jsonl"), rows_of(trained_run / "eval.jsonl")
    assert [r["prompt"] for r in of_run] == [r["prompt"] for r in explicit]     # addition's rows
    assert [r["completions"] for r in of_run] == [r["completions"] for r in explicit]
    assert not (tmp_path / "runs").exists()          # nothing went to a default run directory


def test_model_run_dir_takes_the_runs_settings_and_a_key_given_wins(trained_run, capsys):
    assert main(["eval", f"model={trained_run}", "max_new_tokens=1", "--print-config"]) == 0
    shown = capsys.readouterr().out
    assert "task: addition" in shown and "system_prompt: Add." in shown
    assert "max_new_tokens: 1" in shown
    assert f"model: {trained_run / 'final'}" in shown


def test_a_runs_final_or_checkpoint_comes_with_the_runs_settings(trained_run, capsys):
    checkpoint = trained_run / "checkpoints" / "step-1"
    for named, weights in [(f"model={trained_run / 'final'}", trained_run / "final"),
                           (str(checkpoint / "config.yaml"), checkpoint),
                           (f"model={checkpoint}", checkpoint)]:
        assert main(["eval", named, "--print-config"]) == 0
        shown = capsys.readouterr().out
        assert f"model: {weights}\n" in shown, named
        assert "task: addition" in shown and "max_new_tokens: 3" in shown, named


def test_a_file_given_with_a_run_is_not_cut_by_the_runs_eval_size(trained_run, tmp_path, capsys):
    write_jsonl(tmp_path / "test.jsonl", SUMS[:7])
    assert main(["eval", str(trained_run), "--print-config"]) == 0
    assert "eval_size: 4\n" in capsys.readouterr().out          # the run's cut of its own rows
    assert main(["eval", f"model={trained_run}", f"eval_dataset={tmp_path / 'test.jsonl'}",
                 "--print-config"]) == 0
    assert "eval_size: 0\n" in capsys.readouterr().out          # a file given here: all of it


def test_a_run_without_final_is_evaluated_at_its_newest_checkpoint(trained_run, tmp_path, capsys):
    import shutil
    stopped = tmp_path / "stopped"
    shutil.copytree(trained_run, stopped)
    shutil.rmtree(stopped / "final")
    assert main(["eval", f"model={stopped}", "eval_size=2"]) == 0
    captured = capsys.readouterr()
    result = last_json(captured.out)
    assert result["model"] == str(stopped / "checkpoints" / "step-1")
    assert "newest checkpoint" in captured.err
    assert Path(result["rows_file"]).parent == stopped
    shutil.rmtree(stopped / "checkpoints")       # stopped before its first checkpoint
    assert main(["eval", str(stopped / "config.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no trained weights yet" in err and "resume=auto" in err


def test_eval_writes_beside_the_model_and_says_when_it_replaces_a_file(tiny_model_dir, tmp_path,
                                                                      monkeypatch, capsys):
    import shutil
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "models" / "mine"
    shutil.copytree(tiny_model_dir, model)
    args = ["eval", f"model={model}", "task=addition", "eval_size=2", "max_new_tokens=1"]
    assert main(args) == 0
    first = capsys.readouterr()
    assert last_json(first.out)["rows_file"] == str(tmp_path / "models" / "mine-eval.jsonl")
    assert "replacing" not in first.err
    assert main(args) == 0
    second = capsys.readouterr()
    assert f"replacing {tmp_path / 'models' / 'mine-eval.jsonl'}" in second.err
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- the reward evaluation scores with


def test_eval_rewards_scores_with_a_users_own_reward(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "even_reward.py").write_text(
        "def even_length(prompts, completions, **columns):\n"
        "    return [1.0 if len(c) % 2 == 0 else 0.0 for c in completions]\n")
    assert main(["eval", f"model={tiny_model_dir}", "task=addition", "eval_size=9",
                 "max_new_tokens=3", "eval_rewards=[even_reward:even_length]",
                 "eval_output=out.jsonl"]) == 0
    captured = capsys.readouterr()
    result = last_json(captured.out)
    rows = rows_of(tmp_path / "out.jsonl")
    by_hand = sum(len(r["completions"][0]) % 2 == 0 for r in rows) / 9
    assert [r["scores"][0] for r in rows] == [float(len(r["completions"][0]) % 2 == 0) for r in rows]
    assert result["eval/accuracy"] == by_hand
    assert result["eval/reward/even_length/mean"] == by_hand
    assert "eval/accuracy: even_length (eval_rewards=)" in captured.err
    # checked as training checks rewards: a wrong length is one line naming the function
    (tmp_path / "short.py").write_text("def one_value(prompts, completions, **columns):\n"
                                       "    return [1.0]\n")
    assert main(["eval", f"model={tiny_model_dir}", "task=addition", "eval_size=3",
                 "max_new_tokens=1", "eval_rewards=[short:one_value]"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("grpo eval: error: reward function 'one_value' returned 1 values "
                              "for 3 completions")


# ---------------------------------------------------------------- score


def test_score_takes_any_column_as_the_file_names_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "outputs.jsonl", [
        {"prompt": "3", "answer": "3", "guess": "4"},
        {"prompt": "5", "answer": "7", "guess": "7"}])
    # the prompt column scored as if it were the completion: row 1 matches, row 2 does not
    assert main(["score", "dataset=outputs.jsonl", "rewards=[exact_answer]", "--completions",
                 "prompt"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["pass@1"] == 0.5
    assert result["rows_file"] == "outputs-score.jsonl"        # beside the file, as it was named
    assert not (tmp_path / "runs").exists()
    assert main(["score", "dataset=outputs.jsonl", "rewards=[exact_answer]", "--completions",
                 "answer"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["pass@1"] == 1.0
    assert "replacing outputs-score.jsonl" in captured.err
    assert main(["score", "dataset=outputs.jsonl", "rewards=[exact_answer]", "--completions",
                 "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "no completion column 'nope'" in err and "['answer', 'guess', 'prompt']" in err


def test_grpo_eval_ends_completions_at_the_stop_strings_as_training_does(tiny_model_dir, tmp_path,
                                                                        monkeypatch, capsys):
    # Evaluation inside training samples with the run's stop strings; grpo eval sampled without
    # them, so the same weights read a different answer there.
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "test.jsonl", SUMS[:4])
    common = [f"model={tiny_model_dir}", "eval_dataset=test.jsonl", "max_new_tokens=8",
              "rewards=[exact_answer]"]
    assert main(["eval", *common, "eval_output=free.jsonl"]) == 0
    free = [r["completions"][0] for r in rows_of(tmp_path / "free.jsonl")]
    stop = free[0][len(free[0]) // 2]                 # a character the greedy completion writes
    assert main(["eval", *common, f"stop=[{json.dumps(stop)}]", "eval_output=cut.jsonl"]) == 0
    cut = [r["completions"][0] for r in rows_of(tmp_path / "cut.jsonl")]
    assert cut == [c[:c.index(stop) + 1] if stop in c else c for c in free]
    assert cut[0] != free[0]


# ---------------------------------------------------------------- what evaluation needs, and says


def test_a_run_whose_training_file_is_gone_is_still_evaluated(tiny_model_dir, tmp_path, capsys):
    # grpo eval RUN read the run's training dataset too, which evaluation never uses: slow for a
    # large file, and an error once the file was moved or deleted.
    from grpo.config import build_config
    from grpo.train import train
    train_file = write_jsonl(tmp_path / "train.jsonl", SUMS[:20])
    write_jsonl(tmp_path / "test.jsonl", SUMS[200:205])
    run = tmp_path / "run"
    threads = torch.get_num_threads()
    train(build_config({"model": str(tiny_model_dir), "dataset": str(train_file),
                        "eval_dataset": str(tmp_path / "test.jsonl"), "rewards": ["exact_answer"],
                        "steps": 1, "sft_steps": 0, "eval_every": 0, "save_every": 0,
                        "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 2, "threads": 1,
                        "output_dir": str(run)}), log=lambda line: None)
    torch.set_num_threads(threads)
    train_file.unlink()
    assert main(["eval", str(run)]) == 0
    captured = capsys.readouterr()
    result = last_json(captured.out)
    assert (result["eval/n"], result["eval/rows"]) == (5, 5)
    assert [r["prompt"] for r in rows_of(run / "eval.jsonl")] == [r["question"] for r in SUMS[200:205]]
    assert "train.jsonl" not in captured.err          # not read, not named


def test_pass_at_k_and_maj_at_k_only_for_a_reward_of_0_or_1(tiny_model_dir, tmp_path, monkeypatch,
                                                            capsys):
    # pass@k and maj@k count a sample correct when its score is 1; with a reward of 0.5 or 2 they
    # were logged all the same, a number that measures nothing.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "graded.py").write_text(
        "def graded(prompts, completions, **columns):\n"
        "    return [(0.5, 2.0, 1.0, 0.0)[i % 4] for i in range(len(completions))]\n"
        "def strict(prompts, completions, **columns):\n"
        "    return [float(i % 2) for i in range(len(completions))]\n")
    common = ["eval", f"model={tiny_model_dir}", "task=addition", "eval_size=3", "max_new_tokens=1",
              "eval_samples=4", "eval_k=[1,2,4]"]
    assert main([*common, "eval_rewards=[graded:graded]", "eval_output=graded.jsonl"]) == 0
    captured = capsys.readouterr()
    result = last_json(captured.out)
    assert not any(k.startswith(("eval/pass@2", "eval/pass@4", "eval/maj@")) for k in result)
    # pass@1 is the mean score as it is, the same whatever eval_k asks: (0.5 + 2 + 1 + 0) / 4
    assert result["eval/pass@1"] == result["eval/accuracy"] == 0.875
    assert "pass@k and maj@k left out" in captured.err and "graded" in captured.err
    # a reward of 0 or 1 keeps them: half of each row's samples right -> pass@2 = 1 - C(2,2)/C(4,2)
    assert main([*common, "eval_rewards=[graded:strict]", "eval_output=strict.jsonl"]) == 0
    captured = capsys.readouterr()
    result = last_json(captured.out)
    assert (result["eval/pass@1"], result["eval/pass@4"]) == (0.5, 1.0)
    assert result["eval/pass@2"] == pytest.approx(5 / 6, abs=1e-12)
    assert "eval/maj@2" in result and "left out" not in captured.err


def test_summarize_leaves_out_pass_at_k_for_scores_other_than_0_and_1():
    from grpo.algorithm.passk import summarize
    rows = [{"scores": [1.0, 0.5], "answers": ["4", "4"]}, {"scores": [0.0, None], "answers": ["1", None]}]
    m = summarize(rows, [1, 2], with_votes=True)
    assert m["eval/pass@1"] == m["eval/accuracy"] == (0.75 + 0.0) / 2
    assert not any(k in m for k in ("eval/pass@2", "eval/maj@2"))
    rows[0]["scores"][1] = 0.0       # now 0 or 1 (None is unscorable, not a score): all logged
    m = summarize(rows, [1, 2], with_votes=True)
    # pass@1: row means 1/2 and 0 -> 1/4. Row 2 has one scored sample, so pass@2 and maj@2 are
    # row 1's alone: pass@2 = 1 - C(1,2)/C(2,2) = 1; votes 4, 4 -> 4, given by a right one
    assert (m["eval/pass@1"], m["eval/pass@2"], m["eval/maj@2"]) == (0.25, 1.0, 1.0)


def test_prompts_skipped_as_too_long_are_not_counted_as_evaluated(tiny_model_dir, tmp_path,
                                                                 monkeypatch, capsys):
    # eval/rows counted the held-out rows before long_prompts=skip left some out, so a file of 5
    # with 2 too long read as 3 of 5 evaluated, as if eval_size had cut it.
    monkeypatch.chdir(tmp_path)
    long = {"question": "1+1= " * 400, "answer": "2"}         # over the tiny model's 512 tokens
    write_jsonl(tmp_path / "test.jsonl", [SUMS[0], long, SUMS[1], long, SUMS[2]])
    assert main(["eval", f"model={tiny_model_dir}", "eval_dataset=test.jsonl", "max_new_tokens=1",
                 "rewards=[exact_answer]", "long_prompts=skip", "eval_output=out.jsonl"]) == 0
    captured = capsys.readouterr()
    result = last_json(captured.out)
    assert (result["eval/n"], result["eval/rows"], result["eval/skipped_long_prompts"]) == (3, 3, 2)
    assert [r["row"] for r in rows_of(tmp_path / "out.jsonl")] == [0, 2, 4]
    assert "left out 2 of 5 eval prompts" in captured.err


def test_evaluation_in_training_shows_progress_about_every_tenth_of_the_rows(tiny_model_dir, tmp_path):
    # every sampling call printed a line: with eval_samples=64 one prompt a call, 100 lines for
    # 100 rows at every evaluation
    from grpo.config import build_config
    from grpo.train import train
    lines: list[str] = []
    c = build_config({"model": str(tiny_model_dir), "task": "addition", "steps": 0, "sft_steps": 0,
                      "eval_every": 1, "eval_size": 100, "eval_samples": 64, "max_new_tokens": 1,
                      "threads": 1, "save_every": 0, "output_dir": str(tmp_path / "run")})
    train(c, log=lines.append)
    shown = [line.split("  ")[0] for line in lines if line.startswith("eval ")]
    assert shown == [f"eval {done}/100" for done in range(10, 101, 10)]
