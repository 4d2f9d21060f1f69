"""Completions built to make each built-in reward and each built-in tool raise or stall: every one
gets a number (a reward) or an observation (a tool) in bounded time. The bounds are generous (ten
times the deadline, or seconds where there is none) so they cannot be flaky, but a stall fails."""

import json
import time

import pytest

from grpo.rewards import (countdown_equation, exact_answer, faults, final_answer, math_accuracy,
                          think_format)
from grpo.rewards import answers
from grpo.agents.tools import Call, resolve_tools, run_call

MB = 1_000_000

# Shapes that made extraction quadratic or the verifier overrun, at a megabyte, and small bombs.
COMPLETIONS = {
    "boxed flood": "\\boxed{" * (MB // 7),
    "closed boxes in boxes": "\\boxed{" * 2000 + "1" + "}" * 2000,
    "newlines": "\n" * MB,
    "nested braces": "{" * (MB // 2) + "}" * (MB // 2),
    "digits": "9" * MB,
    "answer tags": "<answer>" * (MB // 8),
    "think tags": "<think>" + "</think><answer>" * (MB // 16),
    "results": "</result>" * (MB // 9),
    "hashes": "#" * (MB // 2) + " " * (MB // 2),
    "closing phrases": "The answer is   \n  A:" * (MB // 20),
    "tower": "\\boxed{9^{9^{9^{9}}}}",
    "python tower": "<answer>9**9**9**9</answer>",
    "factorial": "\\boxed{(10^{10})!}",
    "mixed": ("\\boxed{" + "{" * 50 + "9^{9^{" + "\n" * 100 + "<answer>(((") * 2000,
    "null bytes and surrogates": "\x00\ud800\\boxed{\x00\ud800}" * 1000,
    "unbalanced closers": "}" * MB + "\\boxed{1}",
}

# The arguments each reward takes besides prompts and completions.
REWARDS = {
    "math_accuracy": (math_accuracy, {"answer": "42"}),
    "exact_answer": (exact_answer, {"answer": "42"}),
    "final_answer": (final_answer, {"answer": "42"}),
    "think_format": (think_format, {}),
    "countdown_equation": (countdown_equation, {"numbers": [3, 5, 2], "target": 16}),
}


@pytest.mark.parametrize("shape", COMPLETIONS)
@pytest.mark.parametrize("reward", REWARDS)
def test_every_built_in_reward_gives_a_number_in_bounded_time(reward, shape):
    fn, columns = REWARDS[reward]
    start = time.monotonic()
    out = fn(["q"], [COMPLETIONS[shape]], **{k: [v] for k, v in columns.items()})
    assert time.monotonic() - start < 10 * answers.MATH_DEADLINE_S
    assert out == [0.0]       # none of them is right; all are numbers, none is None


def test_countdown_counts_why_it_could_not_read_an_equation():
    completions = ["<answer>" + "1+" * 150 + "1</answer>", "<answer>3**5</answer>",
                   "<answer>3/(5-5)</answer>", "<answer>(3+5</answer>", "<answer>3+5+2</answer>",
                   "<answer>(3+5)*2</answer>"]
    with faults.counting() as counts:
        scores = countdown_equation(["q"] * 6, completions, numbers=[[3, 5, 2]] * 6, target=[16] * 6)
    assert scores == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert counts.metrics() == {"reward/countdown_equation/zero/divides_by_zero": 1,
                             "reward/countdown_equation/zero/equation_too_long": 1,
                             "reward/countdown_equation/zero/not_arithmetic": 2}


# Inputs built to make each built-in tool raise, stall or overflow what it sends back.
TOOL_CALLS = {
    "calculator": ["(((9**99)**99)**99)**99", "9**9**9**9", "2**(10**400)", "-" * 5000 + "1",
                   "(" * 300 + "1" + ")" * 300, "+".join(["9" * 300] * 3), "1/0", "1e308*1e308",
                   "10.0**400", "(" * 100 + "9**99" + ")" * 100, "\x00", "lambda: 1"],
    "python": ["while True: pass", "print('x' * 10_000_000)", "import os\nos.kill(os.getpid(), 9)",
               "import sys\nsys.stdout.write('\\ud800' * 50000)", "raise SystemExit(3)",
               "x = 9 ** 9 ** 9", "print(1)\nimport os\nos._exit(0)", "\x00"],
}
DEADLINE_S = 2.0


@pytest.mark.parametrize("tool, argument", [(t, a) for t, args in TOOL_CALLS.items() for a in args])
def test_every_built_in_tool_answers_in_bounded_time(tool, argument):
    tools = resolve_tools([tool])
    parameter = tools[tool].parameters[0]
    start = time.monotonic()
    outcome = run_call(Call(tool, {parameter: argument}), tools, DEADLINE_S)
    assert time.monotonic() - start < 10 * DEADLINE_S
    assert isinstance(outcome.text, str) and len(outcome.text) <= 2100


@pytest.mark.parametrize("parse,opening", [("parse_hermes", "<tool_call>"), ("parse_plain", "<call>")])
def test_reading_tool_calls_is_linear_in_the_completion(parse, opening):
    import grpo.agents.tools as tools
    fn = getattr(tools, parse)
    closing = opening.replace("<", "</")
    # the same calls as a regex finds them
    text = f"a{opening}x{closing}b{opening}{opening}y{closing}{opening}"
    assert tools.tagged(text, opening, closing) == ["x", f"{opening}y"]
    # 400 KB of openings that never close: re.findall took 77 s here; one pass takes milliseconds
    started = time.perf_counter()
    assert fn(opening * 40_000, {}) == []
    deep = opening + "[" * 100_000 + closing       # json.loads' RecursionError is a malformed call
    calls = fn(deep, {})
    assert time.perf_counter() - started < 2.0
    assert len(calls) == 1
    if parse == "parse_hermes":
        assert calls[0].error is not None and "RecursionError" in calls[0].error


# ---- Values and output a program sends back: judged in time linear in their size --------------
# 40,000 integers k * (2**61 - 1) all hash to 0: a set or a dict of them takes quadratic time to
# build (about 20 s here, and 20 to 30 minutes at the 8 MiB a result line may hold).

COLLIDING = [k * (2 ** 61 - 1) for k in range(40_000)]
COLLIDING_SHAPES = {
    "set": {"s": COLLIDING},
    "dict": {"d": [[k, 1] for k in COLLIDING]},
    "Counter": {"ctr": [[k, 1] for k in COLLIDING]},
    "frozenset in a tuple in a list": [{"t": [{"fs": COLLIDING}]}],
}


@pytest.mark.parametrize("shape", COLLIDING_SHAPES)
def test_values_whose_keys_share_one_hash_are_refused_where_they_are_rebuilt(shape):
    # the tests' process rebuilds what the program returns, as real sets and dicts
    from grpo.sandbox.harness import decode
    with pytest.raises(ValueError, match="share one hash"):
        decode(COLLIDING_SHAPES[shape])


@pytest.mark.parametrize("shape", COLLIDING_SHAPES)
def test_the_trainer_judges_returned_values_without_rebuilding_them(shape):
    from grpo.rewards.code import judge_cases, judge_tests, spec_from_row
    value = COLLIDING_SHAPES[shape]
    started = time.monotonic()
    # an assert against a literal: the literal stays in the trainer, compared there
    for literal in ("{0, 1, 2}", "{0: 1, 2: 1}", "[{0, 1}]"):
        spec = spec_from_row({"test_list": [f"assert f() == {literal}"]})
        assert judge_tests(spec, {"done": True, "ran": {}, "lit": {"0": [value]}}) == (0, 1)
    # a call-based case (APPS), its expected value from JSON
    spec = spec_from_row({"input_output": {"inputs": [[1]], "outputs": [[0, 1]], "fn_name": "f"}})
    assert judge_cases(spec, {"results": [{"value": value}]}) == (0, 1)
    assert time.monotonic() - started < 1.0


def test_judging_a_returned_value_keeps_pythons_equality():
    from grpo.rewards.code import judge_cases, judge_tests, spec_from_row
    from grpo.sandbox.harness import encode

    def lit(value, literal):
        spec = spec_from_row({"test_list": [f"assert f() == {literal}"]})
        record = json.loads(json.dumps(encode(value)))
        return judge_tests(spec, {"done": True, "ran": {}, "lit": {"0": [record]}}) == (1, 1)

    from collections import Counter, OrderedDict, deque
    from decimal import Decimal
    from fractions import Fraction
    assert lit({1, 2.0, True}, "{1, 2}")                       # {1, 2.0, True} is {1, 2.0}
    assert lit({1, 2.0}, "{2, 1}") and lit(frozenset({(1, "a")}), "{(1, 'a')}")
    assert lit(OrderedDict([(2, "b"), (1, "a")]), "{1: 'a', 2: 'b'}")
    assert lit(Counter("aab"), "{'a': 2, 'b': 1}") and not lit(Counter("aab"), "{'a': 2}")
    assert lit({(1, 2): [Fraction(1, 2)]}, "{(1, 2): [0.5]}") and lit(Decimal("1.50"), "1.5")
    assert not lit({1: 2}, "{1: 3}") and not lit({1: 2}, "{2: 2}") and not lit({1}, "[1]")
    assert not lit(deque([1]), "[1]") and not lit((1,), "[1]") and lit(1 + 0j, "1")
    assert not lit([float("nan")], "[1]") and not lit(float("inf"), "1e308")
    assert not lit(2 ** 70000, "2") and lit({frozenset({1}): 1}, "{1: 1}") is False
    # a set with two copies of one element (no real set has one) matches nothing
    spec = spec_from_row({"test_list": ["assert f() == {1, 2}"]})
    assert judge_tests(spec, {"done": True, "ran": {}, "lit": {"0": [{"s": [1, 1]}]}}) == (0, 1)
    spec = spec_from_row({"input_output": {"inputs": [[1]], "outputs": [{"1": [2]}], "fn_name": "f"}})
    assert judge_cases(spec, {"results": [{"value": encode({1: (2,)})}]}) == (1, 1)


def test_judging_standard_output_is_linear_in_its_size():
    from grpo.rewards.code import codecontests_output, exact_output
    started = time.monotonic()
    # 300,000 blank lines before the answer (the cap allows that against a 200 KB expected output)
    expected = "1\n" * 100_000
    assert exact_output("\n" * 300_000 + "1\n" * 50_000, expected) is False
    assert exact_output("\n" * 300_000 + expected, expected) is True
    # one long token that is almost a number: read as text
    assert codecontests_output("7" * 20_000 + "x", "7" * 20_001) is False
    assert time.monotonic() - started < 1.0
