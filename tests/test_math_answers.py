"""Math answers that can be trusted: formats, reward-hacking attempts, deadlines, bad golds."""

import json
import time

import pytest

from grpo.rewards import math_accuracy
from grpo.rewards import answers
from grpo.rewards.workers import DeadlinePool


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
    ("\\boxed{23} or maybe \\boxed{24}", "several different boxed answers"),
    ("\\boxed{24} no wait \\boxed{23}", "several different boxed answers, the right one last"),
    ("the result is 1234", "the answer hidden in a longer number"),
    ("the answer is 23. Actually, the answer is 24.", "a correct answer followed by another"),
    ("What is 20 + 3?", "a completion that only repeats the question"),
])
def test_reward_hacking_attempts_score_zero(completion, why):
    assert one(completion, "23") == 0.0, why


def test_the_same_boxed_answer_twice_still_counts():
    assert one("\\boxed{23}, so \\boxed{23}", "23") == 1.0


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


def test_a_verification_past_its_deadline_is_unscorable(monkeypatch):
    # The real verifier with a deadline no call can meet: the sample is None, never 0 or 1.
    monkeypatch.setattr(answers, "_POOL", None)
    monkeypatch.setattr(answers, "MATH_DEADLINE_S", 1e-6)
    try:
        assert math_accuracy(["q"] * 2, ["\\boxed{42}", "41"], answer=["42", "42"]) == [None, None]
    finally:
        answers._POOL.close()


def test_a_huge_expression_ends_within_the_deadline():
    start = time.monotonic()
    result = one("\\boxed{9^{9^{9^{9^{9}}}}}", "1")
    assert result in (0.0, None)
    assert time.monotonic() - start < answers.MATH_DEADLINE_S + 5


def test_a_gold_that_cannot_be_parsed_stops_the_load_naming_the_row(tmp_path):
    from grpo.build import load_data
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
