"""What users coming from other trainers hand over, in the shapes they have it: reward functions
that change their inputs or return arrays, and dataset rows as public files hold them."""

import time

import numpy as np
import torch

from grpo.rewards import score


def test_a_reward_that_changes_its_inputs_changes_no_other_reward_and_no_logged_sample():
    def rewrites(prompts, completions, answer, **columns):
        for i in range(len(completions)):
            completions[i] = "X"        # "normalizing" in place
        answer.reverse()
        return [0.0] * len(completions)

    def exact(prompts, completions, answer, **columns):
        time.sleep(0.05)                # runs beside `rewrites`, after it has changed its lists
        return [float(c == a) for c, a in zip(completions, answer)]

    completions, columns = ["1", "2"], {"answer": ["1", "3"]}
    totals, per_fn = score([rewrites, exact], [1.0, 1.0], ["p", "p"], completions, columns)
    assert per_fn["exact"] == [1.0, 0.0]
    assert totals == [1.0, 0.0]
    assert completions == ["1", "2"]                # what samples.jsonl logs, as sampled
    assert columns == {"answer": ["1", "3"]}        # the next step's rows, as read


def test_a_reward_may_return_a_numpy_array_or_a_tensor_as_trl_accepts():
    def as_array(prompts, completions, **columns):
        return np.array([1.0, 0.0], dtype=np.float32)

    def as_tensor(prompts, completions, **columns):
        return torch.tensor([0.5, 0.25])

    def of_scalars(prompts, completions, **columns):
        return [torch.tensor(2.0), np.int64(3)]

    totals, per_fn = score([as_array, as_tensor, of_scalars], [1.0, 2.0, 1.0], ["p"] * 2,
                           ["a", "b"], {})
    assert per_fn == {"as_array": [1.0, 0.0], "as_tensor": [0.5, 0.25], "of_scalars": [2.0, 3.0]}
    assert totals == [1.0 + 1.0 + 2.0, 0.0 + 0.5 + 3.0]
    assert all(type(v) is float for values in per_fn.values() for v in values)


# ---- The cold start's demonstrations, from a `completion` column ----------------------------------

def _demonstrations(tmp_path, rows):
    import json

    from grpo.assembly import load_data
    from grpo.config import build_config
    f = tmp_path / "demos.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_data(build_config({"dataset": str(f), "sft_steps": 2, "seed": 0})).demonstrations


def test_a_conversational_completion_is_imitated_as_its_text_never_as_python(tmp_path):
    # TRL's conversational prompt-completion rows: both columns are lists of messages.
    demos = _demonstrations(tmp_path, [
        {"prompt": [{"role": "user", "content": "2+2?"}], "answer": "4",
         "completion": [{"role": "assistant", "content": "It is 4."}]}])
    assert [target for _, _, target in demos] == ["It is 4."]


def test_rows_without_a_completion_are_not_demonstrations_of_none(tmp_path):
    demos = _demonstrations(tmp_path, [
        {"prompt": "2+2?", "answer": "4", "completion": "It is 4."},
        {"prompt": "3+3?", "answer": "6", "completion": None},
        {"prompt": "4+4?", "answer": "8", "completion": ""}])
    assert [(row["prompt"], target) for row, _, target in demos] == [("2+2?", "It is 4.")]


def test_a_completion_of_several_messages_is_refused_naming_the_row(tmp_path):
    import pytest

    from grpo.data import DataError
    with pytest.raises(DataError, match=r"demos.jsonl row 2, column 'completion': .*assistant"):
        _demonstrations(tmp_path, [
            {"prompt": "2+2?", "answer": "4", "completion": "It is 4."},
            {"prompt": "3+3?", "answer": "6",
             "completion": [{"role": "assistant", "content": "call"}, {"role": "tool", "content": "6"}]}])


def test_grpo_score_still_reads_a_completion_column_of_several_texts(tmp_path):
    import json

    from grpo.commands.score import score_file
    f = tmp_path / "outputs.jsonl"
    f.write_text(json.dumps({"prompt": "2+2?", "answer": "4", "completion": ["4", "5"]}) + "\n")
    metrics = score_file([f"dataset={f}", "rewards=[exact_answer]"], out=str(tmp_path / "s.jsonl"))
    assert (metrics["completions"], metrics["pass@1"]) == (2, 0.5)


def test_an_empty_prompt_is_refused_naming_the_row(tmp_path):
    import json

    import pytest

    from grpo.data import DataError, load_rows
    f = tmp_path / "gaps.jsonl"
    f.write_text("".join(json.dumps({"question": q, "answer": "1"}) + "\n"
                         for q in ["1 + 0?", "  \n", "0 + 1?"]))
    with pytest.raises(DataError, match=r"gaps.jsonl row 2, column 'question': the prompt is empty"):
        load_rows(str(f))
