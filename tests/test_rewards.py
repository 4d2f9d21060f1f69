"""Reward functions, how they combine, and the completion masks the rewards' tokens are counted by."""

import math

import pytest
import torch

from grpo.rewards import (REWARDS, RewardError, countdown_equation, exact_answer, get_reward,
                          math_accuracy, score, think_format)
from grpo.sampling import completion_lengths, mask_from_lengths


def one(fn, completion, **columns):
    """Score a single completion; columns are given as scalars."""
    return fn(["prompt"], [completion], **{k: [v] for k, v in columns.items()})[0]


# --------------------------------------------------------------------------------- math_accuracy

@pytest.mark.parametrize("completion, gold", [
    ("so the result is \\boxed{19}", "19"),
    ("reasoning... so the answer is 72", "some reasoning\n#### 72"),   # GSM8K gold, last number
    ("the answer is 72.", "72"),                                      # sentence full stop
    ("1/2", "0.5"),
    ("\\boxed{1/2}", "\\boxed{\\frac{1}{2}}"),
    ("\\boxed{0.5}", "\\boxed{\\frac{1}{2}}"),
    ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("<answer>19</answer>", "19"),
    ("it costs 1000 dollars", "#### 1,000"),                          # GSM8K thousands separator
    ("it costs 1,000 dollars", "1000"),
    ("\\boxed{19}", 19),                                              # a non-string gold column
])
def test_math_accuracy_correct(completion, gold):
    assert one(math_accuracy, completion, answer=gold) == 1.0


@pytest.mark.parametrize("completion, gold", [
    ("\\boxed{18}", "19"),
    ("so the answer is 73", "some reasoning #### 72"),
    ("\\boxed{0.4}", "\\boxed{\\frac{1}{2}}"),
    ("I have no idea", "19"),                                         # nothing to extract
    ("\\boxed{19} ... \\boxed{20}", "19"),                            # the last boxed counts
])
def test_math_accuracy_wrong(completion, gold):
    assert one(math_accuracy, completion, answer=gold) == 0.0


def test_math_accuracy_unscorable_gold_is_none_row_by_row():
    # Gold None, a gold with no answer in it, and an empty gold cannot be scored -> None;
    # the row with a real gold next to them is still scored.
    out = math_accuracy(["p"] * 4, ["\\boxed{3}"] * 4, answer=[None, "there is no answer here at all", "", "3"])
    assert out == [None, None, None, 1.0]


def test_math_accuracy_bare_latex_gold():
    # The module docstring: "\frac{1}{2}, 0.5 and 1/2 agree" and golds "may be bare values".
    assert one(math_accuracy, "1/2", answer="\\frac{1}{2}") == 1.0
    assert one(math_accuracy, "\\boxed{2}", answer="\\frac{1}{2}") == 0.0  # 2 is not 1/2


# ---------------------------------------------------------------------------------- exact_answer

@pytest.mark.parametrize("completion, expected", [
    ("<answer>19</answer>", 1.0),
    (" 19 ", 1.0),                                 # whole completion, stripped
    ("<think>maybe 18</think><answer> 19 </answer>", 1.0),
    ("<answer>18</answer> then <answer>19</answer>", 1.0),  # the last tag counts
    ("190", 0.0),
    ("<answer>190</answer>", 0.0),
    ("the answer is 19", 0.0),                     # strict: no extraction without tags
])
def test_exact_answer(completion, expected):
    assert one(exact_answer, completion, answer="19") == expected


def test_exact_answer_non_string_gold():
    assert one(exact_answer, "<answer>19</answer>", answer=19) == 1.0


# ---------------------------------------------------------------------------------- think_format

@pytest.mark.parametrize("completion, expected", [
    ("<think>2+2 is 4</think><answer>4</answer>", 1.0),         # the R1 template exactly
    ("<think>\nstep 1\nstep 2\n</think>\n<answer>4</answer>\n", 1.0),  # whitespace between tags
    ("<think>2+2 is 4</think><answer>4", 0.0),                 # missing </answer>
    ("<think>2+2 is 4<answer>4</answer>", 0.0),                # missing </think>
    ("Sure! <think>x</think><answer>4</answer>", 0.0),         # text before
    ("<think>x</think><answer>4</answer> Done.", 0.0),         # text after
    ("<think>x</think>so<answer>4</answer>", 0.0),             # text between
    ("<answer>4</answer>", 0.0),                               # no reasoning block
    ("<think>x</think><answer>4</answer><answer>5</answer>", 0.0),  # two answers
    ("<think>a</think><think>b</think><answer>4</answer>", 0.0),    # two think blocks
])
def test_think_format(completion, expected):
    assert one(think_format, completion) == expected


# ---------------------------------------------------------------------------- countdown_equation

@pytest.mark.parametrize("completion, numbers, target, expected", [
    ("(3+5)*2", [3, 5, 2], 16, 1.0),                       # 8*2 = 16, each number once
    ("<think>try</think><answer>(3 + 5) * 2</answer>", [3, 5, 2], 16, 1.0),
    ("2*(5+3)", [3, 5, 2], 16, 1.0),                       # any order
    ("(3+5)*2*2", [3, 5, 2], 32, 0.0),                     # 2 used twice (value 32 is right)
    ("(3+5)+8", [3, 5, 8], 16, 1.0),                       # a repeated value given twice is fine
    ("(3+5)*2", [3, 5, 2, 7], 16, 0.0),                    # 7 not used
    ("3+5+2", [3, 5, 2], 16, 0.0),                         # 10, wrong value
    ("8/3*6", [8, 3, 6], 16, 1.0),                         # exact fractions: 8/3*6 = 16
    ("__import__('os')", [3, 5, 2], 16, 0.0),              # not arithmetic
    ("3**2+5+2", [3, 5, 2], 16, 0.0),                      # ** is not allowed (value 16 anyway)
    ("3/(5-5)", [3, 5, 5], 16, 0.0),                       # division by zero, no exception
    ("(3+5", [3, 5], 8, 0.0),                              # syntax error
])
def test_countdown_equation(completion, numbers, target, expected):
    assert one(countdown_equation, completion, numbers=numbers, target=target) == expected


# ------------------------------------------------------------------------------ score, registry

def length_reward(prompts, completions, **columns):
    return [float(len(c)) for c in completions]


def is_yes(prompts, completions, **columns):
    return [None if c == "?" else float(c == "yes") for c in completions]


def test_score_is_the_weighted_sum():
    # completions "yes", "no", "maybe": length [3, 2, 5], is_yes [1, 0, 0]
    # totals with weights [0.5, 2.0]: [1.5 + 2, 1.0 + 0, 2.5 + 0] = [3.5, 1.0, 2.5]
    totals, per_fn = score([length_reward, is_yes], [0.5, 2.0], ["p"] * 3, ["yes", "no", "maybe"], {})
    assert totals == [3.5, 1.0, 2.5]
    assert per_fn == {"length_reward": [3.0, 2.0, 5.0], "is_yes": [1.0, 0.0, 0.0]}


def test_none_from_one_function_makes_the_total_none():
    # "?" is unscorable for is_yes -> total None even though length_reward scored it (1.0)
    totals, per_fn = score([length_reward, is_yes], [1.0, 1.0], ["p"] * 2, ["?", "yes"], {})
    assert totals == [None, 4.0]  # "yes": 3 + 1
    assert per_fn["length_reward"] == [1.0, 3.0]
    assert per_fn["is_yes"] == [None, 1.0]


def math_only(prompts, completions, task, **columns):
    """Scores the math rows (1 when the completion is "4"); None for the others."""
    return [float(c == "4") if t == "math" else None for c, t in zip(completions, task)]


def code_only(prompts, completions, task, **columns):
    """Scores the code rows (1 when the completion is "ok"); None for the others."""
    return [float(c == "ok") if t == "code" else None for c, t in zip(completions, task)]


MIXED = {"task": ["math", "math", "code", "code", "poem"]}
MIXED_COMPLETIONS = ["4", "5", "ok", "no", "roses"]


def test_unscorable_all_sums_the_functions_that_scored_each_row():
    # weights [1.0, 0.5]; math_only scores rows 0, 1 ([1, 0]); code_only scores rows 2, 3 ([1, 0]);
    # nobody scores row 4 (a poem). all: rows 0..3 are 1.0*1 = 1.0, 1.0*0 = 0.0, 0.5*1 = 0.5,
    # 0.5*0 = 0.0; row 4 None. any (the default): every row has a None, so every total is None.
    fns, weights = [math_only, code_only], [1.0, 0.5]
    totals, per_fn = score(fns, weights, ["p"] * 5, MIXED_COMPLETIONS, MIXED, unscorable="all")
    assert totals == [1.0, 0.0, 0.5, 0.0, None]
    assert per_fn == {"math_only": [1.0, 0.0, None, None, None],
                      "code_only": [None, None, 1.0, 0.0, None]}
    assert score(fns, weights, ["p"] * 5, MIXED_COMPLETIONS, MIXED)[0] == [None] * 5
    # when every function scores a row, all and any agree: 2 * 1 + 3 * 0.5 = 3.5
    both = [lambda p, c, **k: [1.0], lambda p, c, **k: [0.5]]
    assert score(both, [2.0, 3.0], ["p"], ["x"], {}, unscorable="all")[0] == [3.5]
    assert score(both, [2.0, 3.0], ["p"], ["x"], {}, unscorable="any")[0] == [3.5]


def test_unscorable_must_be_any_or_all():
    with pytest.raises(ValueError, match=r"unscorable must be one of \('any', 'all'\), got 'some'"):
        score([length_reward], [1.0], ["p"], ["x"], {}, unscorable="some")
    from grpo.config import ConfigError, load_config
    with pytest.raises(ConfigError, match="config key 'unscorable' must be any or all, got 'some'"):
        load_config(None, ["unscorable=some"])


def test_unscorable_reaches_the_rollouts_rewards_from_the_config():
    from grpo.assembly import Data
    from grpo.config import build_config
    from grpo.rollout import Rollout
    from grpo.pipeline.inline import score_rollout

    def rollout():
        n = len(MIXED_COMPLETIONS)
        return Rollout(prompts=["p"] * n, completions=MIXED_COMPLETIONS,
                       group_ids=torch.zeros(n, dtype=torch.long),
                       prompt_ids=torch.zeros(n, 1, dtype=torch.long),
                       prompt_mask=torch.ones(n, 1, dtype=torch.long),
                       completion_ids=torch.zeros(n, 1, dtype=torch.long),
                       completion_mask=torch.ones(n, 1, dtype=torch.long),
                       sampler_logprobs=torch.zeros(n, 1), truncated=torch.zeros(n, dtype=torch.bool),
                       columns=dict(MIXED))
    data = Data(train_rows=[], eval_rows=[], reward_fns=[math_only, code_only],
                reward_weights=[1.0, 0.5], accuracy_fn=math_only)
    r = rollout()
    score_rollout(build_config({"unscorable": "all"}), r, data)
    # as above: [1.0, 0.0, 0.5, 0.0, None]; None becomes NaN (left out of its group)
    assert r.rewards[:4].tolist() == [1.0, 0.0, 0.5, 0.0] and math.isnan(r.rewards[4])
    r = rollout()
    score_rollout(build_config({}), r, data)
    assert torch.isnan(r.rewards).all()


def test_columns_reach_the_functions():
    totals, _ = score([get_reward("exact_answer")], [1.0], ["p"] * 2, ["7", "8"], {"answer": ["7", "7"]})
    assert totals == [1.0, 0.0]


def test_wrong_number_of_values_names_the_function():
    def short_reward(prompts, completions, **columns):
        return [1.0]

    with pytest.raises(RewardError, match=r"'short_reward' returned 1 values for 2 completions"):
        score([short_reward], [1.0], ["p"] * 2, ["a", "b"], {})


def test_non_list_return_names_the_function():
    def scalar_reward(prompts, completions, **columns):
        return 1.0

    with pytest.raises(RewardError, match="scalar_reward"):
        score([scalar_reward], [1.0], ["p"], ["a"], {})


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "1.0", [1.0]])
def test_non_finite_or_non_number_names_the_function(bad):
    def broken_reward(prompts, completions, **columns):
        return [0.0, bad]

    with pytest.raises(RewardError, match=r"'broken_reward' returned .* for completion 1"):
        score([broken_reward], [1.0], ["p"] * 2, ["a", "b"], {})


def test_a_reward_of_bools_counts_true_as_one_and_false_as_zero():
    import numpy as np

    def is_right(prompts, completions, **columns):
        return [c == "4" for c in completions]          # Python bools

    def numpy_checks(prompts, completions, **columns):
        return [np.bool_(True), np.float32(0.5)]

    totals, per_fn = score([is_right, numpy_checks], [2.0, 1.0], ["p"] * 2, ["4", "5"], {})
    assert per_fn == {"is_right": [1.0, 0.0], "numpy_checks": [1.0, 0.5]}
    assert totals == [3.0, 0.5]                         # 2 * 1 + 1, 2 * 0 + 0.5
    assert all(type(v) is float for values in per_fn.values() for v in values)


def test_reward_error_is_a_value_error():
    assert issubclass(RewardError, ValueError)


def test_get_reward_unknown_name_lists_built_ins():
    with pytest.raises(RewardError) as info:
        get_reward("nosuch")
    message = str(info.value)
    assert "nosuch" in message
    for name in ["countdown_equation", "exact_answer", "math_accuracy", "think_format"]:
        assert name in message


def test_get_reward_known_names():
    assert get_reward("math_accuracy") is math_accuracy
    assert set(REWARDS) == {"math_accuracy", "exact_answer", "think_format", "countdown_equation",
                            "code_tests", "final_answer", "reasoning_gym"}


def test_final_answer_reads_what_the_model_wrote_after_the_last_tool_result():
    from grpo.rewards import final_answer
    completions = ["<call>calculator 12*3</call><result>36</result>36",   # copied the result
                   "<call>calculator 12*3</call><result>36</result>",     # stopped at the result
                   "36",                                                   # no tool: the whole text
                   "<tool_call>{}</tool_call>\n<tool_response>\n36\n</tool_response>\n 36 "]
    assert final_answer(["q"] * 4, completions, answer=["36"] * 4) == [1.0, 0.0, 1.0, 1.0]


def test_two_functions_with_the_same_name_are_both_counted():
    one_fn = lambda prompts, completions, **c: [1.0] * len(completions)   # noqa: E731
    two_fn = lambda prompts, completions, **c: [2.0] * len(completions)   # noqa: E731
    totals, per_fn = score([one_fn, two_fn], [1.0, 1.0], ["p"], ["a"], {})
    assert totals == [3.0]  # 1 + 2, each function counted once
    assert per_fn == {"<lambda>": [1.0], "<lambda>_2": [2.0]}


def test_gsm8k_gold_with_text_after_the_marker():
    assert one(math_accuracy, "72", answer="reasoning\n#### 72\n\nThe end.") == 1.0


@pytest.mark.parametrize("completion", ["<think>a</think></think><answer>4</answer>",
                                        "<think>a</think><answer>4</answer></answer>"])
def test_think_format_rejects_repeated_closing_tags(completion):
    assert one(think_format, completion) == 0.0


# ------------------------------------------------------------------ completion lengths and masks

EOS, PAD = 1, 0


def test_lengths_include_the_eos():
    ids = torch.tensor([
        [5, 6, EOS, PAD, PAD],   # EOS at index 2 -> length 3
        [EOS, PAD, PAD, PAD, PAD],  # EOS first -> length 1 (just the EOS)
        [5, 6, 7, 8, 9],         # no EOS -> full length 5
        [5, 6, 7, 8, EOS],       # EOS last -> 5
    ])
    lengths = completion_lengths(ids, EOS)
    assert lengths.tolist() == [3, 1, 5, 5]
    assert lengths.dtype == torch.long
    assert mask_from_lengths(lengths, 5).tolist() == [
        [1, 1, 1, 0, 0],
        [1, 0, 0, 0, 0],
        [1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1],
    ]


def test_pad_equal_to_eos_still_ends_at_the_first_eos():
    # pad id == eos id: finished rows are padded with more EOS tokens; the mask must cover up to and
    # including the first one only, not every token equal to the pad id.
    ids = torch.tensor([
        [5, 6, EOS, EOS, EOS],   # -> 3
        [EOS, EOS, EOS, EOS, EOS],  # -> 1
        [5, 6, 7, 8, 9],         # -> 5
    ])
    lengths = completion_lengths(ids, EOS)
    assert lengths.tolist() == [3, 1, 5]
    assert mask_from_lengths(lengths, 5).tolist() == [
        [1, 1, 1, 0, 0],
        [1, 0, 0, 0, 0],
        [1, 1, 1, 1, 1],
    ]


def test_several_eos_ids_first_of_any():
    # eos ids [1, 2]: row 0 hits 2 at index 1 -> 2; row 1 hits 1 at index 3 -> 4; row 2 none -> 4
    ids = torch.tensor([[5, 2, 1, 0], [5, 6, 7, 1], [5, 6, 7, 8]])
    assert completion_lengths(ids, [1, 2]).tolist() == [2, 4, 4]


def test_mask_from_lengths_zero_length():
    assert mask_from_lengths(torch.tensor([0, 2]), 3).tolist() == [[0, 0, 0], [1, 1, 0]]


@pytest.mark.parametrize("gold, expected", [
    ("\\frac{1}{2}", "\\frac{1}{2}"),        # a bare value: taken whole
    ("x=3", "x=3"),
    ("The total is 42 apples", "42"),      # prose: its last number
    ("there is no answer here at all", None),   # prose without a number: nothing to compare with
    ("\\text{Monday}", "\\text{Monday}"),    # a text answer is its own gold
])
def test_extract_gold(gold, expected):
    from grpo.rewards.answers import extract_gold
    assert extract_gold(gold) == expected


# ------------------------------------------------------------- fault counts, scoped to their call

def test_a_count_made_in_a_pool_thread_is_counted_in_the_callers_scope():
    import threading
    from grpo.rewards import faults
    threads = set()

    def strict(prompts, completions, **columns):
        threads.add(threading.get_ident())
        faults.count("strict", "too_long", len(completions))
        return [0.0] * len(completions)

    with faults.counting() as counts:
        score([strict, think_format], [1.0, 1.0], ["p"] * 3, ["a", "b", "c"], {})
    assert threading.get_ident() not in threads      # score ran it in its pool's thread
    assert counts.metrics() == {"reward/strict/zero/too_long": 3}


def test_code_tests_counts_in_its_own_pool_threads_into_the_callers_scope():
    from grpo.rewards import CodeTests, faults

    def timed_out(prompt, completion, spec):
        faults.count("code_tests", "timeout")
        return 0, 1
    reward = CodeTests(workers=2, unsafe_code_execution=True)
    reward.run = timed_out          # its own pool calls score_one, which calls run
    rows = {"tests": [[{"input": "", "output": "1\n"}]] * 3}
    with faults.counting() as counts:
        assert reward(["p"] * 3, ["x", "y", "z"], **rows) == [0.0, 0.0, 0.0]
    assert counts.metrics() == {"reward/code_tests/zero/timeout": 3}


def test_two_scopes_do_not_see_each_others_counts_and_none_open_counts_nowhere():
    from concurrent.futures import ThreadPoolExecutor
    from grpo.rewards import faults
    faults.count("before", "any_scope")                  # none open: counted nowhere
    with faults.counting() as evaluation:
        math_accuracy(["q"], ["no answer here"], answer=["42"])
    with faults.counting() as step:
        with ThreadPoolExecutor(2) as pool:              # a pool's threads, carried into the scope
            list(pool.map(faults.carried(lambda _: faults.count("mine", "x")), range(4)))
        with faults.counting() as inner:                 # the innermost scope takes its own
            faults.count("inner", "y")
    assert evaluation.metrics() == {"reward/math_accuracy/zero/no_answer": 1}
    assert step.metrics() == {"reward/mine/zero/x": 4}
    assert inner.metrics() == {"reward/inner/zero/y": 1}


def test_an_environment_or_tool_thread_counts_into_the_callers_scope():
    from grpo.agents.environments import with_deadline
    from grpo.rewards import faults
    with faults.counting() as counts:
        assert with_deadline(lambda: faults.count("env", "z") or 7, 5.0) == (7, None)
    assert counts.metrics() == {"reward/env/zero/z": 1}


# ---- what a reward is given for chat rows: text, or TRL's messages with as_messages ----------------

CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def test_a_reward_gets_text_and_as_messages_gets_trls_form(tmp_path, tiny_model_dir):
    """For a chat row a reward gets the prompt as the model saw it and the completion as text;
    one marked as_messages gets TRL's form (TRL-ported `c[0]["content"]` raised TypeError before),
    and for a text row the row's own prompt. Other rewards never see the raw prompts' column."""
    from grpo.config import build_config
    from grpo.rewards import as_messages
    from grpo.train import train
    seen = {}

    def plain(prompts, completions, answer, **columns):
        seen["plain"] = (prompts[0], completions[0], sorted(columns))
        return [0.0] * len(completions)

    @as_messages
    def ported(prompts, completions, answer, **columns):
        seen.setdefault("ported", []).append((prompts[0], completions[0], sorted(columns)))
        return [float(len(c[0]["content"]) if isinstance(c, list) else len(c)) for c in completions]

    chat = [{"prompt": [{"role": "system", "content": "You add."},
                        {"role": "user", "content": f"{i}+1="}], "answer": str(i + 1), "level": i}
            for i in range(4)]
    c = build_config({"model": str(tiny_model_dir), "chat_template": CHAT_TEMPLATE, "steps": 1,
                      "sft_steps": 0, "eval_every": 0, "prompts_per_step": 2, "group_size": 2,
                      "max_new_tokens": 4})
    train(c, dataset=chat, reward_fns=[plain, ported], log=lambda line: None, write_files=False)
    prompt, completion, columns = seen["plain"]
    assert prompt.startswith("system: You add.\nuser: ") and prompt.endswith("assistant:")
    assert isinstance(completion, str) and columns == ["level"]
    messages, completion, columns = seen["ported"][-1]
    assert messages[0] == {"role": "system", "content": "You add."}
    assert messages[1]["role"] == "user" and messages[1]["content"].endswith("+1=")
    assert completion[0]["role"] == "assistant" and isinstance(completion[0]["content"], str)
    assert columns == ["level"]
    # a text row: the row's prompt text, before the chat template
    seen.clear()
    train(c, dataset=[{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(4)],
          reward_fns=[ported], log=lambda line: None, write_files=False)
    prompt, completion, _ = seen["ported"][-1]
    assert prompt.endswith("+1=") and not prompt.startswith("user:") and isinstance(completion, str)


def test_a_system_prompt_that_rows_override_is_said(tmp_path, tiny_model_dir):
    from grpo.config import build_config
    from grpo.train import train
    rows = [{"prompt": [{"role": "user", "content": "1+1="}], "answer": "2"},
            {"prompt": [{"role": "system", "content": "Add."}, {"role": "user", "content": "2+1="}],
             "answer": "3"},
            {"prompt": [{"role": "system", "content": "Add."}, {"role": "user", "content": "3+1="}],
             "answer": "4"}]
    f = tmp_path / "chat.jsonl"
    import json
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = []
    c = build_config({"model": str(tiny_model_dir), "chat_template": CHAT_TEMPLATE, "steps": 1,
                      "dataset": str(f), "system_prompt": "Think first.", "eval_every": 0,
                      "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4})
    train(c, log=lines.append, write_files=False)
    assert any(line.startswith(f"system_prompt is not used for 2 of the 3 rows of {f} (the first: "
                               "row 2)") for line in lines), lines
