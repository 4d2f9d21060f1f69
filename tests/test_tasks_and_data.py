import json

import pytest

from grpo.data import Columns, DataError, PromptStream, columns_of, format_prompt, load_rows
from grpo.models import build_tiny_tokenizer
from grpo.rewards import countdown_equation, exact_answer
from grpo.data.tasks import TASKS, get_task


@pytest.mark.parametrize("name", sorted(TASKS))
def test_task_splits_are_disjoint_and_fixed(name):
    task = get_task(name)
    train, held = task.train_rows(seed=0), task.eval_rows()

    def what(r):     # a row's content: its prompt, and for a task of pictures, the picture's
        return r["prompt"] + r.get("picture", "")
    assert {what(r) for r in train}.isdisjoint({what(r) for r in held})
    assert [what(r) for r in task.eval_rows()] == [what(r) for r in held]
    # another seed reorders the same training split
    assert sorted(what(r) for r in task.train_rows(seed=1)) == sorted(what(r) for r in train)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_demonstrations_earn_full_reward(name):
    task = get_task(name)
    rows = task.eval_rows()[:50]
    demos = [task.demonstration(r) for r in rows]
    # an agent task's demonstration is its turns; the last turn's context holds the ones before
    demos = [d if isinstance(d, str) else d[-1][0] + d[-1][1] for d in demos]
    from grpo.rewards import final_answer
    fn = {"exact_answer": exact_answer, "countdown_equation": countdown_equation,
          "final_answer": final_answer}[task.rewards[0]]
    assert fn([r["prompt"] for r in rows], demos, **columns_of(rows, 1)) == [1.0] * len(rows)


def test_largest_rows():
    row = get_task("largest").eval_rows()[0]
    digits = [int(d) for d in row["prompt"].removeprefix("largest of ").removesuffix(":").split()]
    assert len(set(digits)) == 4 and row["answer"] == str(max(digits))


def test_gsm8k_jsonl_loads_as_is(tmp_path):
    f = tmp_path / "gsm8k.jsonl"
    rows = [{"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=7\n#### 7"}]
    f.write_text("\n".join(json.dumps(r) for r in rows))
    out = load_rows(str(f), Columns("question", "answer"))
    assert out == [{"prompt": rows[0]["question"], "answer": "3+4=7\n#### 7", "_row": 0}]


def test_csv_and_parquet_with_custom_columns(tmp_path):
    import pandas  # datasets depends on pandas
    table = pandas.DataFrame({"q": ["1+1=", "2+2="], "gold": ["2", "4"], "level": [1, 2]})
    table.to_csv(tmp_path / "d.csv", index=False)
    table.to_parquet(tmp_path / "d.parquet")
    for name in ("d.csv", "d.parquet"):
        out = load_rows(str(tmp_path / name), Columns("q", "gold"))
        assert [r["prompt"] for r in out] == ["1+1=", "2+2="]
        assert [str(r["answer"]) for r in out] == ["2", "4"]
        assert [r["level"] for r in out] == [1, 2]


def test_missing_prompt_column_is_named(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"query": "hi", "answer": "1"}))
    with pytest.raises(DataError, match="no prompt column 'question'.*prompt_column=NAME"):
        load_rows(str(f), Columns("question", "answer"))


def test_missing_file_is_named(tmp_path):
    with pytest.raises(DataError, match="dataset file not found: .*nope.jsonl"):
        load_rows(str(tmp_path / "nope.jsonl"), "question", "answer")


def test_chat_template_used_only_when_asked():
    tok = build_tiny_tokenizer()
    assert format_prompt(tok, "2+2=", "auto") == "2+2="  # no template: the prompt as it is
    tok.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
    assert format_prompt(tok, "2+2=", "auto", "Be brief.") == "<system>Be brief.<user>2+2=<assistant>"
    assert format_prompt(tok, "2+2=", "none") == "2+2="


def test_prompt_stream_visits_every_row_each_pass():
    stream = PromptStream([{"prompt": str(i)} for i in range(5)], seed=0)
    first = [r["prompt"] for r in stream.next_batch(5)]
    second = [r["prompt"] for r in stream.next_batch(5)]
    assert sorted(first) == sorted(second) == ["0", "1", "2", "3", "4"]


def test_columns_repeat_per_group_member():
    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}]
    # the prompts as the rows hold them ride along under RAW_PROMPTS, for rewards.as_messages only
    from grpo.data import RAW_PROMPTS
    assert columns_of(rows, 3) == {"answer": ["1", "1", "1", "2", "2", "2"],
                                   RAW_PROMPTS: ["a", "a", "a", "b", "b", "b"]}


def test_characters_the_tokenizer_cannot_represent_are_reported_at_start(tiny_model_dir, tmp_path,
                                                                         monkeypatch, capsys):
    from grpo.commands.cli import main
    rows = [{"question": "Tom’s cat has 3 kittens and 2 more. How many?", "answer": "#### 5"},
            {"question": "What is 2 + 2?", "answer": "#### 4"},
            {"question": "Ana’s dog ate 5 of 7 bones. How many are left?", "answer": "#### 2"},
            {"question": "Is 1 + 1 = 2 ✓?", "answer": "#### 2"}]
    (tmp_path / "gsm8k_like.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.chdir(tmp_path)
    assert main(["train", "dataset=gsm8k_like.jsonl", f"model={tiny_model_dir}", "sft_steps=0",
                 "steps=1", "prompts_per_step=2", "group_size=2", "max_new_tokens=4", "eval_every=0",
                 "threads=1", "output_dir=run"]) == 0
    first = next(line for line in capsys.readouterr().out.splitlines()
                 if line.startswith("warning: the tokenizer"))      # among the start lines
    assert first == (f"warning: the tokenizer of model {tiny_model_dir} has no token for 2 characters "
                     "of the data: '’' (U+2019), '✓' (U+2713); each reaches the model as <pad>. Rows "
                     "holding one: 3 of 4 train rows (75.0%). Replace them in the data, or use a "
                     "model whose tokenizer covers them")


def test_a_tokenizer_that_covers_the_data_says_nothing(tiny):
    from grpo.data import coverage_note, uncovered_characters
    _, tokenizer = tiny
    rows = [{"prompt": "largest of 3 8 5 1:", "completion": "8"}, {"prompt": [{"role": "user", "content": "hi"}]}]
    assert uncovered_characters(tokenizer, rows) == ([], 0)
    assert coverage_note(tokenizer, {"train": rows}, "model tiny") is None
    assert uncovered_characters(tokenizer, [{"prompt": "a", "completion": "b\tc"}]) == (["\t"], 1)


def test_a_file_with_two_usual_prompt_columns_asks_which(tmp_path):
    # A TRL-prepared GSM8K keeps the source's `question` beside its `prompt` of chat messages (with
    # the system prompt): the default prompt_column=question trained on `question` and silently
    # dropped `prompt`. Now neither is taken without being named.
    f = tmp_path / "d.jsonl"
    row = {"question": "What is 2+2?", "answer": "4",
           "prompt": [{"role": "system", "content": "Think first."},
                      {"role": "user", "content": "What is 2+2?"}]}
    f.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataError, match=r"the columns \['prompt', 'question'\] could each hold the "
                                        r"prompts; set prompt_column=prompt"):
        load_rows(str(f), Columns())
    assert load_rows(str(f), Columns("prompt"))[0]["prompt"] == row["prompt"]
    assert load_rows(str(f), Columns("question"))[0]["prompt"] == "What is 2+2?"
    g = tmp_path / "gsm8k.jsonl"                  # one usual column: taken, as before
    g.write_text(json.dumps({"question": "1+1?", "answer": "#### 2", "text": "other"}) + "\n")
    assert load_rows(str(g), Columns())[0]["prompt"] == "1+1?"
