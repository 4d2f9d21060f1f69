"""Math answers that can be trusted: formats, reward-hacking attempts, verifier bombs, deadlines,
bad golds."""

import json
import time

import pytest

from grpo.rewards import answers, bounds, faults, math_accuracy
from grpo.sandbox.pool import DeadlinePool


def one(completion, gold):
    return math_accuracy(["q"], [completion], answer=[gold])[0]


@pytest.mark.parametrize("completion, gold", [
    ("so \\boxed{42}", "42"),
    ("<answer>42</answer>", "42"),
    ("work...\n#### 42", "42"),
    ("Adding them up, the answer is 42.", "42"),
    ("Q: what is 40+2?\nA: 42", "42"),
    ("I think it is 41, no, 42", "42"),                 # the last number
    ("\\boxed{\\frac{1}{2}}", "0.5"),
])
def test_each_answer_format_is_read(completion, gold):
    assert one(completion, gold) == 1.0


@pytest.mark.parametrize("completion, why", [
    ("\\boxed{23} or maybe \\boxed{24}", "the last boxed answer is the one that counts"),
    ("the result is 1234", "the answer hidden in a longer number"),
    ("the answer is 23. Actually, the answer is 24.", "a correct answer followed by another"),
    ("What is 20 + 3?", "a completion that only repeats the question"),
])
def test_reward_hacking_attempts_score_zero(completion, why):
    assert one(completion, "23") == 0.0, why


def test_the_same_boxed_answer_twice_still_counts():
    assert one("\\boxed{23}, so \\boxed{23}", "23") == 1.0


# One rule for which answer counts: the first kind present of \boxed{}, <answer>, `####`, a closing
# "the answer is"/"Answer:", a bare number; of that kind, the LAST one (as math-verify and the
# benchmarks' graders read it). A hedge gains nothing: only one answer is ever compared.
@pytest.mark.parametrize("completion, gold, expected", [
    ("\\boxed{18} no, \\boxed{19}", "19", 1.0),
    ("\\boxed{18} no, \\boxed{19}", "18", 0.0),
    ("\\boxed{41} or \\boxed{\\boxed{42}}", "42", 1.0),       # the last box, opened last
    ("<answer>18</answer> <answer>19</answer>", "19", 1.0),
    ("#### 18\n#### 19", "19", 1.0),
    ("#### 18\n#### 19", "18", 0.0),
    ("The answer is 18.\nNo: the answer is 19.", "19", 1.0),
    ("The answer is 18. Then 20 more.", "18", 1.0),          # the sentence ends at its period
    ("Answer: 18. Check: 18 + 2 = 20", "18", 1.0),
    ("Answer: let us work it out step by step.\n40 + 2 = 42", "42", 1.0),   # prose: read on
    ("I got 18, then 19", "19", 1.0),
    ("\\boxed{18}, so the answer is 19", "18", 1.0),          # a box beats a later phrase
])
def test_the_last_answer_of_each_kind_counts(completion, gold, expected):
    assert one(completion, gold) == expected


# A number is read whole, wherever it stands (a bare last number, after "the answer is", in a
# box) and whichever way it is written; each was read as another number before.
@pytest.mark.parametrize("completion, read, gold", [
    ("so x is .5", "0.5", "1/2"),                                  # was 5
    ("the change is -.5", "-0.5", "-\\frac{1}{2}"),                # was 5
    ("we get \\frac{1}{2}", "\\frac{1}{2}", "0.5"),               # was 2
    ("we get -\\dfrac{3}{4}", "-\\frac{3}{4}", "-0.75"),          # was 4
    ("so \\frac12 of it", "\\frac{1}{2}", "0.5"),
    ("a rise of 50%", "50\\%", "0.5"),                             # was 50
    ("it weighs 1.5e3 grams", "1.5 \\times 10^{3}", "1500"),       # was 3
    ("about 6.02 \\times 10^{23} atoms", "6.02 \\times 10^{23}", "6.02 \\times 10^{23}"),   # was 23
    ("it is 1{,}000", "1000", "1000"),                             # LaTeX's thousands separator
    ("it is 1\\,000", "1000", "1000"),
    ("es sind 1.000.000", "1000000", "1000000"),                  # dots between thousands
    ("c'est 1\u202f000\u202f000", "1000000", "1000000"),           # narrow spaces between thousands
    ("the temperature is \u22125", "-5", "-5"),                    # a Unicode minus
    ("The answer is 18 dollars.", "18", "18"),                     # units after the number
    ("The answer is: **42**", "42", "42"),                         # Markdown bold
    ("The answer is $18.", "18", "18"),
    ("The answer is \\(\\frac{1}{2}\\).", "\\frac{1}{2}", "0.5"),
    ("The answer is 2\\sqrt{3}.", "2\\sqrt{3}", "\\sqrt{12}"),     # not just its first number
    ("\\boxed{1\\,000}", "1000", "1000"),                          # math-verify alone reads 0
    ("\\boxed{1.5e3}", "1.5 \\times 10^{3}", "1500"),
])
def test_numbers_are_read_whole(completion, read, gold):
    assert answers.extract_answer(completion) == read
    assert one(completion, gold) == 1.0


@pytest.mark.parametrize("completion, gold", [
    ("so 18.", "18"), ("it costs $18", "18"), ("it costs 1,000 dollars", "1000"), ("that is 3/4", "0.75"),
    ("16 - 3 - 4 = 9", "9"),                            # a minus between numbers is not a sign
])
def test_numbers_read_right_before_still_are(completion, gold):
    assert one(completion, gold) == 1.0


@pytest.mark.parametrize("completion, read, gold", [
    ("the result is 2^10", "2^{10}", "1024"),           # read as 10 before: a power, not its exponent
    ("so we get 10^{3}", "10^{3}", "1000"),            # read as 3
    ("x = 10^3 meters", "10^{3}", "1000"),
    ("answer 2^{-1}", "2^{-1}", "\\frac{1}{2}"),
    ("x^2 + 1 = 5", "5", "5"),                           # a symbol's power is no number
])
def test_a_bare_power_is_read_whole(completion, read, gold):
    assert answers.extract_answer(completion) == read
    assert one(completion, gold) == 1.0
    if "^" in read:
        assert one(completion, read.split("^")[-1].strip("{}")) == 0.0      # not its exponent


def test_a_bare_power_too_large_is_refused_before_any_verifier(monkeypatch):
    def no_verifier():
        raise AssertionError("the verifier was reached")
    monkeypatch.setattr(answers, "verifier_pool", no_verifier)
    with faults.counting() as counts:
        assert math_accuracy(["q"], ["so it is 9^999999999"], answer=["42"]) == [0.0]
    assert counts.metrics() == {"reward/math_accuracy/zero/answer_too_large": 1}


@pytest.mark.parametrize("gold, read", [
    ("She sold 48/2 = 24 clips in May.\n#### 72", "72"),          # GSM8K
    ("#### 1,000", "1000"),
    ("first\n#### 18\nthen\n#### 19", "19"),                       # the same rule as completions
    ("At first $\\boxed{6}$, then $\\boxed{3}$.", "3"),           # MATH's solution: the last box
    (".5", "0.5"), ("-.5", "-0.5"), ("$18", "18"), ("1.5e3", "1.5 \\times 10^{3}"),
    ("\\frac{1}{2}", "\\frac{1}{2}"), ("50\\%", "50\\%"),
])
def test_golds_are_read_by_the_same_rule(gold, read):
    assert answers.extract_gold(gold) == read


def hangs_on_three(x):
    """Module level, so a spawned worker can import it."""
    if x == 3:
        while True:
            pass
    return x * 2


def test_pool_kills_a_call_that_never_returns_and_keeps_going():
    pool = DeadlinePool(hangs_on_three, workers=2, deadline_s=0.5)
    try:
        start = time.monotonic()
        assert pool.map([(i,) for i in range(6)]) == [0, 2, 4, None, 8, 10]
        assert pool.timeouts == 1
        assert pool.map([(5,), (3,)]) == [10, None]   # a replaced worker serves again
        assert pool.timeouts == 2
        assert time.monotonic() - start < 10
    finally:
        pool.close()


def test_a_workers_start_does_not_count_against_the_deadline():
    from slow_to_import import double    # 1.5 s to import, in each worker too; deadline 0.5 s
    pool = DeadlinePool(double, workers=2, deadline_s=0.5)
    try:
        assert pool.map([(i,) for i in range(4)]) == [0, 2, 4, 6]
        assert (pool.timeouts, pool.deaths) == (0, 0)
    finally:
        pool.close()


def test_a_function_no_worker_can_import_is_a_clear_error():
    pool = DeadlinePool(double_of, workers=1, deadline_s=5)
    pool.target = "no_such_module_anywhere:double_of"
    pool._replace(pool._workers[0])
    try:
        with pytest.raises(RuntimeError, match="no_such_module_anywhere:double_of.*did not start"):
            pool.map([(1,)])
    finally:
        pool.close()


def double_of(x):
    return 2 * x


def sleeps(seconds):
    time.sleep(seconds)
    return seconds


def test_a_worker_killed_mid_call_is_replaced_and_its_input_unscorable():
    import threading
    pool = DeadlinePool(sleeps, workers=2, deadline_s=30)
    try:
        def kill_the_slow_one():
            until = time.monotonic() + 20
            while not any(w.job == 0 for w in pool._workers) and time.monotonic() < until:
                time.sleep(0.05)                      # the call is sent once its worker is up
            time.sleep(0.3)
            slow = next(w for w in pool._workers if w.job == 0)
            slow.process.kill()                       # from outside, mid-call
        killer = threading.Thread(target=kill_the_slow_one)
        killer.start()
        start = time.monotonic()
        assert pool.map([(20.0,), (0.01,), (0.02,)]) == [None, 0.01, 0.02]
        killer.join()
        assert time.monotonic() - start < 15           # not the 20 s call, not the 30 s deadline
        assert (pool.deaths, pool.timeouts) == (1, 0)
        assert pool.map([(0.03,)]) == [0.03]           # the replacement serves
    finally:
        pool.close()


SCRIPT = """
from grpo.rewards import math_accuracy
print("scored", math_accuracy(["q", "q"], ["so \\boxed{2}", "3"], answer=["2", "2"]))
"""


@pytest.mark.parametrize("how", ["a script without a main guard", "a program on standard input"])
def test_workers_do_not_depend_on_the_callers_main_module(tmp_path, how):
    import subprocess
    import sys
    script = tmp_path / "train_me.py"
    script.write_text(SCRIPT)
    if how == "a script without a main guard":
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)
    else:
        done = subprocess.run([sys.executable, "-"], input=SCRIPT, capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["scored [1.0, 0.0]"]    # once: no worker re-ran it


def test_a_function_a_worker_cannot_import_is_refused_at_once():
    with pytest.raises(ValueError, match="top level of an importable module"):
        DeadlinePool(lambda x: x)


def spins_in_c():
    return 9 ** 9 ** 9           # hundreds of millions of digits: seconds in C, no bytecode


def test_a_call_that_spends_its_cpu_budget_ends_even_inside_c_and_is_told_apart():
    pool = DeadlinePool(spins_in_c, workers=1, deadline_s=30, cpu_s=0.3)
    try:
        start = time.monotonic()
        assert pool.run([((), {})]) == [("cpu", None)]
        assert time.monotonic() - start < 10           # the CPU timer, not the 30 s deadline
        assert (pool.cpu_overruns, pool.timeouts, pool.deaths) == (1, 0, 0)
    finally:
        pool.close()
    pool = DeadlinePool(sleeps, workers=1, deadline_s=0.3, cpu_s=0.3)
    try:                                               # no CPU spent: the wall clock ends it
        assert pool.run([((5.0,), {}), ((0.01,), {})]) == [("timeout", None), ("ok", 0.01)]
        assert pool.run([(("x",), {})])[0][0] == "error"
        assert (pool.cpu_overruns, pool.timeouts, pool.errors) == (0, 1, 1)
    finally:
        pool.close()


@pytest.fixture
def fresh_verifier(monkeypatch):
    """A verifier pool of its own, so its settings can be changed."""
    monkeypatch.setattr(answers, "_POOL", None)
    yield monkeypatch
    if answers._POOL is not None:
        answers._POOL.close()


COSTLY = "\\boxed{" + "{" * 8 + "42" + "}" * 8 + "}"   # within the bounds; ~0.4 s of math-verify's CPU


def test_a_verifier_starved_past_its_deadline_leaves_the_sample_unscorable(fresh_verifier):
    # A stopped worker spends no CPU, as one on a machine too loaded to run it: the machine's
    # doing, not the completion's. None, and no fault of the completion counted.
    import signal
    import threading
    fresh_verifier.setattr(answers, "MATH_DEADLINE_S", 1.0)
    pool = answers.verifier_pool()
    assert math_accuracy(["q"] * 2, ["\\boxed{42}", "\\boxed{41}"], answer=["42"] * 2) == [1.0, 0.0]

    def stop_the_busy_one():
        until = time.monotonic() + 10
        while time.monotonic() < until:
            for w in pool._workers:
                if w.job is not None:
                    w.process.send_signal(signal.SIGSTOP)
                    return
            time.sleep(0.0005)
    stopper = threading.Thread(target=stop_the_busy_one)
    stopper.start()
    start = time.monotonic()
    with faults.counting() as counts:
        assert math_accuracy(["q"], [COSTLY], answer=["42"]) == [None]
    stopper.join()
    assert time.monotonic() - start < 10
    assert pool.timeouts == 1 and counts.metrics() == {}


def test_an_answer_within_bounds_that_spends_the_cpu_budget_scores_zero(fresh_verifier):
    # With a budget of 0.05 s the costly answer is ended by its own CPU timer: its cost, so 0,
    # counted. The same row with the right answer still gets 1.
    fresh_verifier.setattr(answers, "MATH_CPU_S", 0.05)
    start = time.monotonic()
    with faults.counting() as counts:
        assert math_accuracy(["q"] * 2, [COSTLY, "\\boxed{42}"], answer=["42"] * 2) == [0.0, 1.0]
    assert time.monotonic() - start < 10 * answers.MATH_DEADLINE_S
    assert counts.metrics() == {"reward/math_accuracy/zero/verifier_overran": 1}


def raises_on_x(gold, predicted):
    """A stand-in verifier (module level, for its worker) that raises on the answer `x`."""
    if predicted == "x":
        raise ValueError("cannot read x")
    return True


def test_a_verifier_that_raises_on_an_answer_scores_it_zero(monkeypatch):
    pool = DeadlinePool(raises_on_x, workers=1, deadline_s=5)
    monkeypatch.setattr(answers, "_POOL", pool)
    try:
        with faults.counting() as counts:
            assert math_accuracy(["q"] * 2, ["\\boxed{x}", "\\boxed{42}"], answer=["42"] * 2) == [0.0, 1.0]
        assert counts.metrics() == {"reward/math_accuracy/zero/verifier_raised": 1}
    finally:
        pool.close()


BOMBS = [
    ("\\boxed{9^{9^{9^{9}}}}", "answer_too_large"),          # overran the deadline: was None
    ("\\boxed{x^{9^{9^{9}}}}", "answer_too_large"),          # a tower over a symbol
    ("\\boxed{9**9**9}", "answer_too_large"),
    ("\\boxed{(10^{9})!}", "answer_too_large"),
    ("\\boxed{0.5^{10^{9}}}", "answer_too_large"),
    ("\\boxed{" + "{" * 300 + "42" + "}" * 300 + "}", "answer_too_deep"),   # was None
    ("\\boxed{" + "(" * 20 + "42" + ")" * 20 + "}", "answer_too_deep"),
    ("\\boxed{" + "+".join(["42"] * 400) + "}", "answer_too_long"),
    ("The answer is " + "4" * 5000, "answer_too_long"),
    ("\\boxed{" * 3500, "no_answer"),                        # 24k characters: took seconds
    ("\n" * 32000, "no_answer"),                              # 32k newlines: took seconds
    # a second round: commands whose arguments are numbers (each spent the 2 s CPU budget)
    ("\\boxed{\\frac{9}{1}^{9^{9}}}", "answer_too_large"),      # the power is the fraction's
    ("\\boxed{\\tfrac{9}{1}^{9^{9}}}", "answer_too_large"),
    ("\\boxed{\\binom{10^{9}}{10^{8}}}", "answer_too_large"),   # C(n, k) <= n^k
    ("\\boxed{\\Gamma(10^{9})}", "answer_too_large"),           # (10^9 - 1)!
    # a third round: each spent the verifier's whole 2 s CPU budget
    ("\\boxed{{10^{9} \\choose 10^{8}}}", "answer_too_large"),   # C(n, k) written with \choose
    ("\\boxed{" + "^".join(["x"] * 400) + "}", "answer_too_deep"),   # a tower of 400 powers
    ("\\boxed{" + "^".join(["1"] * 50) + "}", "answer_too_deep"),    # of 50, worth 1
    ("\\boxed{" + "**".join(["2"] * 300) + "}", "answer_too_deep"),
    ("\\boxed{x^{x^{x^{x^{x^{x}}}}}}", "answer_too_deep"),           # 5 powers, 5 braces deep
    ("\\boxed{1) 9^{9^{9^{9}}}}", "answer_too_large"),              # a stray closer hid the rest
]


@pytest.mark.parametrize("completion, cause", BOMBS)
def test_a_bomb_scores_zero_in_bounded_time_with_its_cause_counted(completion, cause):
    start = time.monotonic()
    with faults.counting() as counts:
        assert math_accuracy(["q"] * 2, [completion, "so \\boxed{42}"], answer=["42"] * 2) == [0.0, 1.0]
    assert time.monotonic() - start < 10 * answers.MATH_DEADLINE_S
    assert counts.metrics() == {f"reward/math_accuracy/zero/{cause}": 1}


TOWERS_AND_CHOOSE = ["{10^{9} \\choose 10^{8}}", "10^{9} \\choose 10^{8}",
                     "^".join(["2"] * 400), "2^{" * 400 + "2" + "}" * 400, "**".join(["2"] * 400),
                     "2^2^2^2^2^2^2^2"]


@pytest.mark.parametrize("completion", TOWERS_AND_CHOOSE)
def test_towers_and_choose_are_refused_before_any_verifier(monkeypatch, completion):
    # Refused in the trainer's process, from the text alone: the verifier is never reached.
    def no_verifier():
        raise AssertionError("the verifier was reached")
    monkeypatch.setattr(answers, "verifier_pool", no_verifier)
    with faults.counting() as counts:
        assert math_accuracy(["q"], ["\\boxed{" + completion + "}"], answer=["42"]) == [0.0]
    assert list(counts.metrics().values()) == [1]


@pytest.mark.parametrize("completion, gold", [
    ("\\boxed{2^{2017}}", "2^{2017}"), ("\\boxed{1000!}", "1000!"), ("\\boxed{e^{x^{2}}}", "e^{x^2}"),
    ("\\boxed{\\frac{\\sqrt{\\left(\\frac{1}{4}\\right)}}{2}}", "\\frac14"),
    ("\\boxed{\\binom{100}{50}}", "\\binom{100}{50}"), ("\\boxed{\\Gamma(5)}", "24"),
    ("\\boxed{\\frac{3}{4}^{2}}", "\\frac{9}{16}"),
    ("\\boxed{{5 \\choose 2}}", "10"), ("\\boxed{\\binom{10000}{9999}}", "10000"),   # C(n, k) <= 2^n
    ("\\boxed{2^{2^{2^{2}}}}", "65536"), ("\\boxed{2^2^2}", "16"),
])
def test_answers_within_the_bounds_are_verified(completion, gold):
    # Powers and factorials of a few thousand digits, symbolic towers, four brackets deep.
    assert bounds.answer_fault(answers.extract_answer(completion)) is None
    assert one(completion, gold) == 1.0


SHAPES = {
    "boxed flood": lambda n: "\\boxed{" * (n // 7),
    "newlines": lambda n: "\n" * n,
    "nested braces": lambda n: "\\boxed{" + "{" * n,
    "digits": lambda n: "7" * n,
    "answer tags": lambda n: "<answer>" * (n // 8),
    "hashes then spaces": lambda n: "#" * (n // 2) + " \n" * (n // 4),
    "closing phrases": lambda n: "the answer is   \n A:" * (n // 20),
    "answer colons": lambda n: "Answer**" * (n // 8),
    "a phrase then spaces": lambda n: "the answer is" + " " * n,
    "thousands": lambda n: "1,000." * (n // 6),
    "half-written fractions": lambda n: "\\frac{1}{" * (n // 9),
    "exponents": lambda n: "1e" * (n // 2) + " \\times 10^" * (n // 24),
    "narrow spaces": lambda n: "1\u202f" * (n // 2),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_reading_the_answer_of_a_megabyte_completion_is_linear(shape):
    # Quadratic extraction took seconds at 24k characters; at a megabyte it would take hours.
    completion = SHAPES[shape](1_000_000)
    start = time.monotonic()
    score = math_accuracy(["q"], [completion], answer=["42"])
    assert time.monotonic() - start < 5 and score == [0.0]


def test_boxes_tags_and_hashes_are_read_as_before():
    assert answers.boxed_answers("a \\boxed{1} b \\boxed{\\frac{1}{2}} \\boxed{ {x} }") == \
        ["1", "\\frac{1}{2}", "{x}"]
    assert answers.boxed_answers("\\boxed{\\boxed{3}}") == ["\\boxed{3}", "3"]
    assert answers.boxed_answers("}} \\boxed{2} \\boxed{unclosed") == ["2"]
    assert answers.last_tagged("<answer>1</answer><answer>2</answer><answer>3") == "2"
    assert answers.extract_answer("work\n#### \n 42\nmore") == "42"


def test_a_gold_that_cannot_be_parsed_stops_the_load_naming_the_row(tmp_path):
    from grpo.assembly import load_data
    from grpo.config import build_config
    from grpo.data import DataError

    f = tmp_path / "d.jsonl"
    rows = [{"question": "1+1?", "answer": "#### 2"}, {"question": "?", "answer": "this row has no answer at all"}]
    f.write_text("\n".join(json.dumps(r) for r in rows))
    c = build_config({"dataset": str(f), "rewards": ["math_accuracy"], "sft_steps": 0})
    with pytest.raises(DataError, match=r"d.jsonl row 2: answer 'this row has no answer at all' holds no value"):
        load_data(c)


# Competition answers (MATH style): fractions, roots, intervals, sets, units, text, matrices.
CASES = [
 ("\\boxed{\\dfrac{3}{4}}", "\\frac34", 1.0), ("\\boxed{0.75}", "\\frac{3}{4}", 1.0),
 ("\\boxed{2\\sqrt{3}}", "\\sqrt{12}", 1.0), ("\\boxed{\\sqrt{3}}", "\\sqrt{12}", 0.0),
 ("\\boxed{(1, 3]}", "(1,3]", 1.0), ("\\boxed{(1, 3)}", "(1,3]", 0.0),
 ("\\boxed{[2, \\infty)}", "[2,\\infty)", 1.0),
 ("\\boxed{\\{2, 1\\}}", "\\{1,2\\}", 1.0), ("\\boxed{\\{1, 3\\}}", "\\{1,2\\}", 0.0),
 ("\\boxed{10\\text{ cm}}", "10", 1.0), ("\\boxed{10}", "10\\text{ cm}", 1.0),
 ("\\boxed{12 \\text{ cm}}", "10\\text{ cm}", 0.0),
 ("\\boxed{\\text{Monday}}", "\\text{Monday}", 1.0), ("The answer is monday.", "\\text{Monday}", 1.0),
 ("\\boxed{\\text{Tuesday}}", "\\text{Monday}", 0.0),
 ("\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", 1.0),
 ("\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 5 \\end{pmatrix}}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", 0.0),
 ("\\boxed{30^\\circ}", "30", 1.0), ("\\boxed{50\\%}", "50", 1.0), ("\\boxed{x = 3}", "3", 1.0),
 ("\\boxed{(1, 2)}", "(1,2)", 1.0), ("\\boxed{(2, 1)}", "(1,2)", 0.0),
 ("\\boxed{\\frac{\\pi}{2}}", "\\frac{\\pi}{2}", 1.0), ("\\boxed{1.5708}", "\\frac{\\pi}{2}", 0.0),
 ("\\boxed{-\\frac{1}{2}}", "-0.5", 1.0), ("\\boxed{\\frac{-1}{2}}", "-\\frac12", 1.0),
 ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0), ("\\boxed{1000}", "1,000", 1.0),
 ("\\boxed{\\text{(B)}}", "\\text{(B)}", 1.0), ("\\boxed{B}", "\\text{(B)}", 1.0),
 ("\\boxed{C}", "\\text{(B)}", 0.0),
]
SOLUTION = ("Adding gives $1+2=3$. A first guess of $\\boxed{6}$ doubles it by mistake; "
            "the total is $\\boxed{3}$.")


@pytest.mark.parametrize("completion, gold, expected", CASES)
def test_competition_answers(completion, gold, expected):
    assert one(completion, gold) == expected


def test_the_gold_is_the_last_boxed_answer_of_a_worked_solution():
    assert math_accuracy(["q"] * 2, ["\\boxed{3}", "\\boxed{6}"], answer=[SOLUTION] * 2) == [1.0, 0.0]


def test_text_answers_are_compared_as_normalized_text():
    assert answers.is_text_answer("\\text{Monday}") and not answers.is_text_answer("10\\text{ cm}")
    assert answers.normalize_text("$\\text{(B)}$.") == "b"
    assert answers.extract_gold("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}").startswith("\\begin")
