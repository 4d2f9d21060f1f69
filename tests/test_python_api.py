"""train() from Python: rows as a list of dicts or a `datasets.Dataset`, and a model and tokenizer
already loaded, beside the file paths and names the command line takes."""

import pytest
import torch
import yaml

from grpo.config import ConfigError, build_config
from grpo.data import DataError
from grpo.train import train


def _rows(n: int, start: int = 0) -> list[dict]:
    return [{"prompt": f"{i}+0=", "answer": str(i)} for i in range(start, start + n)]


def _ends_with_answer(prompts, completions, answer, **columns):
    return [1.0 if c.strip().endswith(a) else 0.0 for c, a in zip(completions, answer)]


def test_rows_and_a_dataset_object_are_taken_as_they_are(tmp_path, tiny_model_dir):
    import datasets
    seen = []

    def reward(prompts, completions, answer, level, **columns):
        seen.extend(zip(prompts, answer, level))
        return [0.0] * len(completions)

    train_rows = [dict(r, level=i % 3) for i, r in enumerate(_rows(6))]
    held_out = datasets.Dataset.from_list([dict(r, level=9) for r in _rows(3, start=50)])
    c = build_config({"model": str(tiny_model_dir), "sft_steps": 0, "steps": 1, "eval_every": 1,
                      "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4,
                      "output_dir": str(tmp_path / "run")})
    result = train(c, dataset=train_rows, eval_dataset=held_out, reward_fns=[reward],
                   log=lambda line: None)
    # step 1 drew 2 of the 6 given prompts, each twice, with their own columns
    assert len(seen) >= 4
    given = {(f"{i}+0=", str(i), i % 3) for i in range(6)}
    assert set(seen[:4]) <= given
    # every held-out row was evaluated: 3 rows, at step 0 and step 1
    evals = [m for m in result.history if "eval/n" in m]
    assert [m["eval/n"] for m in evals] == [3.0, 3.0]
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["dataset"] == "(6 rows given in Python)"
    assert saved["eval_dataset"] == "(3 rows given in Python)"


def test_a_bad_given_row_is_named_by_its_position():
    rows = _rows(4)
    rows[2] = {"prompt": "2+0=", "answer": ""}
    rows[3] = {"prompt": "3+0=", "answer": None}
    c = build_config({"sft_steps": 0, "steps": 1})
    with pytest.raises(DataError, match=r"\(4 rows given in Python\) row 3: answer '' holds no value"
                                        r".*2 of the 4 rows"):
        train(c, dataset=rows, log=lambda line: None, write_files=False)


def test_rows_that_are_not_dicts_are_refused_in_one_line():
    c = build_config({"sft_steps": 0, "steps": 1})
    with pytest.raises(DataError, match=r"train\(dataset=\.\.\.\): row 2 is a str, not a dict"):
        train(c, dataset=[{"prompt": "a", "answer": "1"}, "b"], log=lambda line: None,
              write_files=False)
    with pytest.raises(DataError, match=r"train\(dataset=\.\.\.\): the list has no rows"):
        train(c, dataset=[], log=lambda line: None, write_files=False)


def test_a_dataset_in_the_config_and_in_the_call_is_refused(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": "1+0=", "answer": "1"}\n')
    c = build_config({"dataset": str(f), "sft_steps": 0, "steps": 1})
    with pytest.raises(ConfigError, match=r"config key 'dataset' .* and train\(dataset=\.\.\.\)"):
        train(c, dataset=_rows(2), log=lambda line: None, write_files=False)


def test_a_loaded_model_and_tokenizer_are_trained_in_place(tmp_path, tiny_model_dir):
    from grpo.models import load_policy
    from transformers import AutoTokenizer
    policy = load_policy(str(tiny_model_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))   # as a user loads it
    tokenizer.padding_side = "right"
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    c = build_config({"sft_steps": 0, "steps": 1, "eval_every": 0, "prompts_per_step": 2,
                      "group_size": 4, "max_new_tokens": 6, "beta": 0.0, "lr": 1e-2,
                      "output_dir": str(tmp_path / "run")})
    result = train(c, model=policy, tokenizer=tokenizer, dataset=_rows(4),
                   reward_fns=[lambda prompts, completions, **k: [float(len(x)) for x in completions]],
                   log=lambda line: None)
    assert result.policy is policy and result.tokenizer is tokenizer
    assert result.history[0]["grad_norm"] > 0            # rewards differed within the groups
    assert tokenizer.padding_side == "left"            # generation pads on the left
    changed = [n for n, p in policy.named_parameters() if not torch.equal(p, before[n])]
    assert changed, "the given model was not the one trained"
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["model"] == str(tiny_model_dir)        # the model's own name_or_path
    assert not (tmp_path / "run" / "base_model").exists()   # no tiny model built beside it
    assert (tmp_path / "run" / "final" / "config.json").is_file()


def test_a_model_without_its_tokenizer_is_refused(tiny_model_dir):
    from grpo.models import load_policy
    c = build_config({"sft_steps": 0, "steps": 1})
    with pytest.raises(ConfigError, match=r"train\(model=\.\.\.\) needs its tokenizer too"):
        train(c, model=load_policy(str(tiny_model_dir)), log=lambda line: None, write_files=False)


# ---- push_to_hub, against a stand-in of the hub API on loopback ------------------------------------

def test_push_to_hub_uploads_final_to_the_repo(tmp_path, tiny_model_dir, monkeypatch):
    import huggingface_hub.constants
    from hub_standin import Hub
    hub = Hub()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_TOKEN", "hf_standin")
    lines = []
    c = build_config({"model": str(tiny_model_dir), "sft_steps": 0, "steps": 1, "eval_every": 0,
                      "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4,
                      "push_to_hub": "someone/tiny-grpo", "output_dir": str(tmp_path / "run")})
    train(c, dataset=_rows(4), reward_fns=[_ends_with_answer], log=lines.append)
    final = tmp_path / "run" / "final"
    sent = {p.relative_to(final).as_posix(): p.read_bytes() for p in final.rglob("*") if p.is_file()}
    assert "config.json" in sent and "model.safetensors" in sent
    assert hub.repos == {"someone/tiny-grpo"}
    assert hub.files == sent                          # every file of final/, byte for byte
    assert [path for method, path in hub.calls if method == "POST"][-1] == \
        "/api/models/someone/tiny-grpo/commit/main"
    assert any("someone/tiny-grpo" in line and "final" in line for line in lines)


def test_push_to_hub_without_a_token_or_offline_stops_before_training(tmp_path, monkeypatch):
    import huggingface_hub.constants
    c = build_config({"sft_steps": 0, "steps": 1, "push_to_hub": "someone/x",
                      "output_dir": str(tmp_path / "run")})
    # conftest sets HF_HUB_OFFLINE=1
    with pytest.raises(ConfigError, match=r"config key 'push_to_hub'.*HF_HUB_OFFLINE"):
        train(c, log=lambda line: None)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))          # no saved login either
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))
    with pytest.raises(ConfigError, match=r"config key 'push_to_hub'.*token.*HF_TOKEN"):
        train(c, log=lambda line: None)
    assert not (tmp_path / "run" / "final").exists()
    with pytest.raises(ConfigError, match=r"config key 'push_to_hub' .*user/name"):
        build_config({"push_to_hub": "not a repo"})


# ---- a newcomer's first hour: the cold start, the records, evaluate(), quiet libraries --------------

def _small(tmp_path, **keys) -> dict:
    return {"steps": 1, "eval_every": 1, "prompts_per_step": 2, "group_size": 2,
            "max_new_tokens": 4, "output_dir": str(tmp_path / "run"), **keys}


def _lengths(prompts, completions, **columns):
    return [float(len(c)) for c in completions]


def test_rows_given_turn_the_demos_cold_start_off_unless_it_is_set(tmp_path, tiny_model_dir):
    """Rows given to train() are a dataset= as a file is: sft_steps is 0 unless set (it stopped
    with a cold-start error telling the user to leave out the sft_steps they had left out)."""
    lines = []
    result = train(build_config(_small(tmp_path, model=str(tiny_model_dir))), dataset=_rows(4),
                   eval_dataset=_rows(2, start=9), reward_fns=[_lengths], log=lines.append)
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["sft_steps"] == 0
    assert any("cold start: off (sft_steps=0, the default with dataset=)" in line for line in lines)
    c = build_config(_small(tmp_path, model=str(tiny_model_dir), sft_steps=10,
                            output_dir=str(tmp_path / "again")))
    with pytest.raises(ConfigError, match=r"config key 'sft_steps' asks for a cold start"):
        train(c, dataset=_rows(4), reward_fns=[_lengths], log=lambda line: None)
    # the records: steps and evaluations apart (history[-1] is the final evaluation)
    assert "eval/accuracy" in result.history[-1] and "reward/mean" not in result.history[-1]
    assert [m["step"] for m in result.steps] == [1] and "reward/mean" in result.steps[-1]
    assert [m["step"] for m in result.evaluations] == [0, 1]


def test_the_reward_line_says_rows_given_in_python(tmp_path, tiny_model_dir):
    lines = []
    train(build_config(_small(tmp_path, model=str(tiny_model_dir))), dataset=_rows(4),
          eval_dataset=_rows(2, start=9), log=lines.append)
    said = next(line for line in lines if line.startswith("rewards:"))
    assert said.endswith("eval/accuracy: math_accuracy, for rows given in Python"), said


def test_evaluate_a_run_a_loaded_model_and_a_file_with_ones_own_reward(tmp_path, tiny_model_dir):
    from grpo.train import evaluate
    result = train(build_config(_small(tmp_path, model=str(tiny_model_dir))), dataset=_rows(4),
                   eval_dataset=_rows(3, start=20), reward_fns=[_lengths], log=lambda line: None)
    seen = []

    def counted(prompts, completions, answer, **columns):
        seen.extend(answer)
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    lines = []
    scores = evaluate(result.run_dir, dataset=_rows(5, start=40), reward_fns=[counted, _lengths],
                      log=lines.append)
    assert scores.metrics["eval/n"] == 5.0 and len(scores.rows) == 5
    assert sorted(seen) == sorted(str(i) for i in range(40, 45))          # greedy: one each
    assert scores.metrics["eval/accuracy"] == scores.metrics["eval/reward/counted/mean"]
    lengths = [float(len(r["completions"][0])) for r in scores.rows]
    assert scores.metrics["eval/reward/_lengths/mean"] == pytest.approx(sum(lengths) / 5)
    assert scores.model == str(result.run_dir / "final")
    assert any("eval/accuracy: counted (given to evaluate())" in line for line in lines)
    # the same weights loaded, and a file of rows: the same greedy completions
    f = tmp_path / "held.jsonl"
    f.write_text("".join(f'{{"prompt": "{i}+0=", "answer": "{i}"}}\n' for i in range(40, 45)))
    again = evaluate(result.policy, tokenizer=result.tokenizer, dataset=str(f),
                     reward_fns=[counted], config={"max_new_tokens": 4}, log=lambda line: None)
    assert [r["completions"] for r in again.rows] == [r["completions"] for r in scores.rows]
    # a run whose held-out rows were given in Python: they are asked for, in evaluate's terms
    with pytest.raises(DataError, match=r"given in Python and are not saved with the run.*"
                                        r"grpo\.train\.evaluate\(run_dir, dataset=rows\)"):
        evaluate(result.run_dir, log=lambda line: None)
    with pytest.raises(DataError, match=r"evaluate\(dataset=\.\.\.\): row 2 is a str"):
        evaluate(result.run_dir, dataset=[{"prompt": "a", "answer": "1"}, "b"],
                 log=lambda line: None)


def test_train_keeps_hugging_faces_progress_bars_off_and_restores_them(tmp_path, tiny_model_dir,
                                                                       capfd):
    """A Python caller saw transformers' "Loading weights" and "Writing model shards" bars
    between grpo's own lines; the caller's own setting is put back afterwards."""
    from transformers.utils import logging as hf_logging
    hf_logging.enable_progress_bar()
    try:
        train(build_config(_small(tmp_path, model=str(tiny_model_dir), eval_every=0, save_every=1)),
              dataset=_rows(4), reward_fns=[_lengths], log=lambda line: None)
        out, err = capfd.readouterr()
        assert "Loading weights" not in err + out and "Writing model shards" not in err + out
        assert hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.disable_progress_bar()


def test_evaluate_rows_for_a_run_that_had_a_held_out_file_and_columns_of_its_own(tmp_path,
                                                                                 tiny_model_dir):
    """A run trained with eval_dataset=FILE and eval_size=2 is evaluated on rows given in Python:
    the rows stand for its file, whole (its eval_size cut its own file), read with its
    prompt_column."""
    from grpo.train import evaluate
    held = tmp_path / "held.jsonl"
    held.write_text("".join(f'{{"task": "{i}+0=", "answer": "{i}"}}\n' for i in range(30, 34)))
    rows = [{"task": f"{i}+0=", "answer": str(i)} for i in range(8)]
    run = train(build_config(_small(tmp_path, model=str(tiny_model_dir), eval_dataset=str(held),
                                    eval_size=2, prompt_column="task")),
                dataset=rows, reward_fns=[_lengths], log=lambda line: None)
    assert [m["eval/n"] for m in run.evaluations] == [2.0, 2.0]
    scores = evaluate(run.run_dir, dataset=[{"task": f"{i}+0=", "answer": str(i)} for i in range(50, 55)],
                      log=lambda line: None)
    assert scores.metrics["eval/n"] == 5.0
    assert [r["prompt"] for r in scores.rows] == [f"{i}+0=" for i in range(50, 55)]


def test_a_config_made_without_build_config_keeps_its_own_cold_start(tmp_path, tiny_model_dir):
    """set_keys is build_config's record; a TrainConfig made by hand with sft_steps=5 asked for
    five, and rows given to train() do not turn them off (the cold start then asks for
    demonstrations these rows do not have)."""
    from grpo.config import RunConfig, TrainConfig, ModelConfig
    c = TrainConfig(model=ModelConfig(model=str(tiny_model_dir)),
                    run=RunConfig(sft_steps=5, steps=1, output_dir=str(tmp_path / "run")))
    with pytest.raises(ConfigError, match=r"config key 'sft_steps' asks for a cold start"):
        train(c, dataset=_rows(4), reward_fns=[_lengths], log=lambda line: None)
