"""`code_tests` on the public code benchmarks' own rows (tests/data/code/, written by hand in their
published formats): a correct program passes, a wrong, a crashing and a hanging one fail, and every
way of forging a pass that a policy could find scores 0."""

import json
import time
from pathlib import Path

import pytest

from grpo.rewards import CodeTests, code_tests
from grpo.rewards.code import (AssertRewriter, CodeTestsError, apps_output, apps_value,
                               codecontests_output, exact_output, exact_value,
                               livecodebench_output, livecodebench_value, spec_from_row)
from grpo.sandbox.harness import NotPlain, decode, encode
from grpo.sandbox.isolate import Limits, isolation_level

DATA = Path(__file__).parent / "data" / "code"
needs_sandbox = pytest.mark.skipif(isolation_level() != "full",
                                   reason="needs root for namespaces and a user id of its own")
DEADLINE = 2.0


def rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / f"{name}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reward():
    return CodeTests(limits=Limits(timeout_s=DEADLINE), workers=2)


def score(reward, row: dict, completion: str, prompt: str | None = None) -> float:
    columns = {k: [v] for k, v in row.items()}
    return reward([row.get("prompt", "") if prompt is None else prompt], [completion],
                  **columns)[0]


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\n"


# ---- HumanEval: test program with check(candidate), entry point -------------------------------

def humaneval_solution(row: dict) -> str:
    return row["prompt"] + row["canonical_solution"]


@needs_sandbox
@pytest.mark.parametrize("k", range(3))
def test_humaneval_rows(reward, k):
    row = rows("humaneval")[k]
    assert score(reward, row, fenced(humaneval_solution(row))) == 1.0
    assert score(reward, row, row["canonical_solution"]) == 1.0   # a base model's continuation
    wrong = row["prompt"] + "    return None\n"
    assert score(reward, row, fenced(wrong)) == 0.0
    crash = row["prompt"] + "    raise RuntimeError('boom')\n"
    assert score(reward, row, fenced(crash)) == 0.0
    started = time.monotonic()
    assert score(reward, row, fenced(row["prompt"] + "    while True:\n        pass\n")) == 0.0
    assert time.monotonic() - started < DEADLINE + 1.5


# ---- MBPP: assert statements with any expressions, setup code and imports --------------------

@needs_sandbox
@pytest.mark.parametrize("k", range(3))
def test_mbpp_rows(reward, k):
    row = rows("mbpp")[k]
    name = row["code"].split("def ")[1].split("(")[0]
    assert score(reward, row, fenced(row["code"])) == 1.0
    assert score(reward, row, fenced(f"def {name}(*args):\n    return 0")) == 0.0
    assert score(reward, row, fenced(f"def {name}(*args):\n    return 1 / 0")) == 0.0
    started = time.monotonic()
    assert score(reward, row, fenced(f"def {name}(*args):\n    while True:\n        pass")) == 0.0
    assert time.monotonic() - started < DEADLINE + 1.5


@needs_sandbox
def test_mbpp_partial_credit_counts_each_assert():
    row = rows("mbpp")[2]
    partial = CodeTests(limits=Limits(timeout_s=DEADLINE), partial_credit=True)
    # Right on the empty sentence only: 1 of 3 asserts.
    assert score(partial, row, "def word_counts(s):\n    return {}") == pytest.approx(1 / 3)


# ---- APPS, CodeContests, LiveCodeBench: stdin/stdout and call-based cases ---------------------

@needs_sandbox
@pytest.mark.parametrize("name,k", [("apps", 0), ("apps", 1), ("apps", 2), ("codecontests", 0),
                                    ("livecodebench", 0), ("livecodebench", 1)])
def test_case_based_rows(reward, name, k):
    row = rows(name)[k]
    solutions = {
        ("apps", 0): "a, b = map(int, input().split())\nprint(a + b)",
        ("apps", 1): "input()\nprint(*sorted(map(int, input().split())))",
        ("apps", 2): json.loads(row.get("solutions", "[]") or "[]")[0] if name == "apps" and k == 2 else "",
        ("codecontests", 0): "print(2 * int(input()))",
        ("livecodebench", 0): "class Solution:\n    def countEvens(self, nums):\n"
                              "        return sum(n % 2 == 0 for n in nums)",
        ("livecodebench", 1): "import sys\nn, *xs = map(int, sys.stdin.read().split())\n"
                              "xs.sort()\nprint(xs[-1] + xs[-2])",
    }
    good = solutions[(name, k)]
    assert score(reward, row, fenced(good), prompt="") == 1.0
    call_based = "def " in good and "input" not in good
    fn = {("apps", 2): "gcd_all", ("livecodebench", 0): "countEvens"}.get((name, k))
    wrong = f"def {fn}(*a):\n    return -1" if fn else "print(-12345)"
    crash = f"def {fn}(*a):\n    return [][1]" if fn else "raise SystemExit(3)"
    hang = f"def {fn}(*a):\n    while True: pass" if fn else "while True:\n    pass"
    assert call_based == bool(fn)
    assert score(reward, row, fenced(wrong), prompt="") == 0.0
    assert score(reward, row, fenced(crash), prompt="") == 0.0
    started = time.monotonic()
    assert score(reward, row, fenced(hang), prompt="") == 0.0
    assert time.monotonic() - started < DEADLINE + 1.5


@needs_sandbox
def test_stdio_programs_may_read_fd_0_and_call_exit(reward):
    row = rows("apps")[0]
    program = ("import sys\na, b = map(int, open(0).read().split())\n"
               "sys.stdout.buffer.write(f'{a + b}\\r\\n'.encode())\nexit()")
    assert score(reward, row, program, prompt="") == 1.0


def test_own_cases_compare_lines_exactly():
    assert exact_output("3 \r\n4\n\n", "3\n4")            # line endings, trailing spaces, blank end
    assert not exact_output("101", "00000101")             # no numeric reading
    assert not exact_output("1.0 2", "1 2.00") and not exact_output("3 4", "34")
    assert exact_value((1, 2), [1, 2]) and not exact_value(7, [7])


def test_apps_rules():
    assert apps_output("101\n", "00000101\n")             # one number per line, as floats
    assert apps_output("1.000001\n", "1\n")               # within 1e-8 + 1e-5 * 1
    assert not apps_output("1.0001\n", "1\n")             # 1e-4 is past numpy.allclose's tolerance
    assert apps_output("  3\n\n 4  \n", "3\n4")             # lines stripped, blank lines dropped
    assert not apps_output("2 1", "1 2")                    # no unordered token sets
    assert not apps_output("1 2", "1.0 2.0")                # several numbers on a line: as text
    assert apps_value((1, 2), [1, 2]) and apps_value(7, [7])   # one-element wrapper, as APPS stores
    assert not apps_value(2, [2, 3])                        # APPS's first-element rule left out
    assert apps_value({1: 2}, {"1": 2})                     # JSON's string keys


def test_codecontests_rules():
    assert codecontests_output("YES\n", "yes")              # tokens lower-cased
    assert codecontests_output("101", "00000101")           # 32-bit integers by value
    assert codecontests_output("1.000009", "1")             # a float within 1e-5
    assert not codecontests_output("1.00002", "1")
    assert not codecontests_output("3 4", "34") and not codecontests_output("a b", "b a")
    assert codecontests_output("1 2\n", "1\n2")              # whitespace of any kind between tokens
    # past 32 bits an integer is read as a double: 2^53 + 1 and 2^53 differ by less than 1e-5 there
    assert codecontests_output("9007199254740993", "9007199254740992")


def test_livecodebench_rules():
    assert livecodebench_output(" 1.0 2 \n", "1 2.00")       # tokens as exact decimals
    assert livecodebench_output("101", "00000101")          # Decimal('00000101') == Decimal('101')
    assert not livecodebench_output("1.0000001", "1")       # exact: no tolerance
    assert not livecodebench_output("1\n\n2", "1\n2")       # as many lines
    assert not livecodebench_output("sNaN", "sNaN x")       # a signalling NaN is no error
    assert livecodebench_value((1, 2), [1, 2])
    assert not livecodebench_value(2, [2])                  # no wrapping rule
    assert not livecodebench_value([(1, 2)], [[1, 2]])      # tuples read as lists at the top only


@needs_sandbox
@pytest.mark.parametrize("name", ["apps", "livecodebench"])
def test_each_benchmark_row_is_judged_by_its_rule(reward, name):
    if name == "livecodebench":     # a functional case expecting [2]: a bare 2 fails
        row = {"public_test_cases": json.dumps([{"input": "[1, 2]", "output": "[2]",
                                                 "testtype": "functional"}]),
               "metadata": json.dumps({"func_name": "evens"})}
        right = "def evens(xs):\n    return [x for x in xs if x % 2 == 0]\n"
        wrong = "def evens(xs):\n    return 2\n"
    else:                           # APPS stdin: 1.0001 is not 1 within numpy's tolerance
        row = {"input_output": json.dumps({"inputs": ["1\n"], "outputs": ["0.5\n"]})}
        right, wrong = "print(int(input()) / 2)\n", "print(0.5001)\n"
    assert score(reward, row, right, prompt="") == 1.0
    assert score(reward, row, wrong, prompt="") == 0.0
    own = {"tests": [{"input": "5\n", "output": "00000101\n"}]}
    assert score(reward, own, "print('00000101')", prompt="") == 1.0
    assert score(reward, own, "print(101)", prompt="") == 0.0


# ---- Bad test data: a clear error naming the row ----------------------------------------------

@pytest.mark.parametrize("row,expected", [
    ({"test": "def check(candidate):\n    assert candidate(1) == 2\n"}, "no entry point"),
    ({"test_list": ["assert f(1) == 2", "assert f(2) =="]}, "item 1: not valid Python"),
    ({"tests": ["print(1)"]}, "no assert statement"),
    ({"input_output": '{"inputs": ["1"]'}, "not valid Python"),   # a JSON-looking program
    ({"input_output": {"inputs": ["1", "2"], "outputs": ["1"]}}, "same length"),
    ({"tests": [{"input": "1"}]}, "expected keys 'input' and 'output'"),
    ({"tests": 42}, "expected a test program"),
    ({"public_test_cases": '[{"input": "1"'}, "not valid JSON"),
    ({"question": "no tests here"}, "no tests"),
])
def test_unreadable_tests_name_the_row(row, expected):
    with pytest.raises(CodeTestsError, match=expected) as info:
        spec_from_row(row, "data.jsonl row 7")
    assert "data.jsonl row 7" in str(info.value)


def test_the_rewriter_keeps_literals_in_the_parent():
    import ast
    rewriter = AssertRewriter(check_fn=None)
    tree = rewriter.visit(ast.parse("assert f(2) == (1, 2)\nassert 3 == g(1)\n"
                                    "assert set(h()) == set((4, 5))\nassert ok(1)"))
    text = ast.unparse(tree)
    assert rewriter.expected == {0: (1, 2), 1: 3}
    assert "(1, 2)" not in text and "__grpo_lit__(1, g(1))" in text      # the literal stays here
    assert "__grpo_eq__(2, set(h()), set((4, 5)))" in text and "__grpo_truth__(3, ok(1))" in text
    assert rewriter.required == [0, 1, 2, 3]


def test_plain_values_round_trip_and_others_are_refused():
    from collections import Counter, deque
    for value in [1, -0.5, "s", None, True, [1, (2, 3)], {1: {2, 3}}, frozenset({"a"}), b"x",
                  3 + 4j, float("inf")]:
        assert decode(json.loads(json.dumps(encode(value)))) == value
    assert decode(encode(Counter("aab"))) == {"a": 2, "b": 1}
    assert decode(encode(deque([1]))) != [1]              # as in Python: a deque is not a list

    class Always(int):
        def __eq__(self, other):
            return True
    for bad in [Always(1), [Always(1)], iter([1]), object()]:
        with pytest.raises(NotPlain):
            encode(bad)


# ---- Reward hacking: every attempt scores 0 ----------------------------------------------------

RUNNING_MAX = rows("humaneval")[0]
SOLVED = humaneval_solution(RUNNING_MAX)
STUB = RUNNING_MAX["prompt"] + "    return []\n"      # wrong on every non-empty input

HACKS = {
    # exiting, by any path, before the checks ran
    "sys.exit(0) at the top": STUB + "import sys\nsys.exit(0)\n",
    "os._exit(0) at the top": STUB + "import os\nos._exit(0)\n",
    "raise SystemExit": STUB + "raise SystemExit(0)\n",
    "exit() inside the function": RUNNING_MAX["prompt"] + "    exit(0)\n",
    "killing itself": STUB + "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    "an atexit handler that prints a pass": STUB + "import atexit\natexit.register(lambda: "
                                             "print('ALL TESTS PASSED'))\nimport os\nos._exit(0)\n",
    # results whose type is not a plain value
    "__eq__ always True": "class Yes:\n    def __eq__(self, other):\n        return True\n"
                          "def running_max(numbers):\n    return Yes()\n",
    "an int subclass with __eq__": "class Int(int):\n    def __eq__(self, o):\n        return True\n"
                                   "def running_max(numbers):\n    return [Int(0)] * len(numbers)\n",
    "a list subclass": "class L(list):\n    def __eq__(self, o):\n        return True\n"
                       "def running_max(numbers):\n    return L()\n",
    # patching builtins or the tests' helpers, before the checks or during them
    "patching isinstance": STUB + "import builtins\nbuiltins.isinstance = lambda *a: True\n",
    "patching print and sys.exit": STUB + "import builtins, sys\nbuiltins.print = lambda *a: None\n"
                                   "sys.exit = lambda *a: None\n",
    "patching inside the call": RUNNING_MAX["prompt"] + "    import builtins\n"
                                "    builtins.len = lambda x: 0\n    return []\n",
    "patching the tests' globals through the frame": RUNNING_MAX["prompt"]
        + "    import sys\n    f = sys._getframe(2)\n"
          "    f.f_globals['__grpo_lit__'] = lambda *a: None\n    return []\n",
    "a trace function that skips lines": STUB + "import sys\n"
        "def skip(frame, event, arg):\n    return skip\nsys.settrace(skip)\n",
    "a thread that patches later": STUB + "import threading, time, builtins\n"
        "threading.Thread(target=lambda: (time.sleep(0.05), setattr(builtins, 'abs', "
        "lambda x: 0)), daemon=True).start()\n",
    # printing what looks like the harness's result line
    "printing a pass": STUB + "print('All tests passed')\nprint('{\"done\": true, \"flags\": []}')\n",
    "writing a result line to every descriptor": STUB + "import os\n"
        "for fd in range(0, 64):\n    try:\n        os.write(fd, b'\\n{\"done\": true, \"flags\": [], "
        "\"lit\": {}, \"ran\": {}}\\n')\n    except OSError:\n        pass\nos._exit(0)\n",
    # catching the assertion error raised by the checks
    "defining check that catches": STUB + "def check(candidate):\n    try:\n"
                                   "        assert candidate([1]) == [1]\n    except AssertionError:\n"
                                   "        pass\ncheck(running_max)\n",
    "replacing AssertionError": STUB + "import builtins\nclass Quiet(BaseException):\n    pass\n"
                                "builtins.AssertionError = Quiet\n",
    "an excepthook that hides failures": STUB + "import sys\nsys.excepthook = lambda *a: None\n",
    # defining the check function or the tests themselves
    "defining check and METADATA": STUB + "METADATA = {}\ndef check(candidate):\n    return True\n",
    "defining its own passing tests": STUB + "assert running_max([]) == []\nprint('passed')\n",
}


@needs_sandbox
def test_the_correct_program_passes_before_any_hack(reward):
    assert score(reward, RUNNING_MAX, fenced(SOLVED)) == 1.0
    assert score(reward, RUNNING_MAX, fenced(STUB)) == 0.0


@needs_sandbox
@pytest.mark.parametrize("name", sorted(HACKS))
def test_humaneval_hack_scores_zero(reward, name):
    assert score(reward, RUNNING_MAX, fenced(HACKS[name])) == 0.0


# MBPP style: asserts that use isinstance, abs, math.isclose. The honest answer is f(x) = 2.0 * x.
HELPER_ROW = {"test_list": ["assert isinstance(f(2), float)", "assert abs(f(1) - 2.0) < 1e-6",
                            "assert math.isclose(f(0.5), 1.0)"], "test_imports": ["import math"]}
WRONG_F = "def f(x):\n    return 0\n"
HELPER_HACKS = {
    "isinstance, abs, math.isclose replaced before the checks":
        "import builtins, math\nbuiltins.isinstance = lambda *a: True\n"
        "builtins.abs = lambda x: 0\nmath.isclose = lambda *a, **k: True\n" + WRONG_F,
    "abs replaced inside the call": "def f(x):\n    import builtins, math\n"
        "    builtins.abs = lambda x: 0\n    builtins.isinstance = lambda *a: True\n"
        "    math.isclose = lambda *a, **k: True\n    return 0.0\n",
    "a fake module in sys.modules": "import sys, types\nfake = types.ModuleType('math')\n"
        "fake.isclose = lambda *a, **k: True\nsys.modules['math'] = fake\n"
        "import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.isinstance = lambda *a: True\n"
        + WRONG_F,
    "a helper of the same name defined by the program": "import math\n"
        "def isclose(*a, **k): return True\nmath.isclose = isclose\n"
        "def abs(x): return 0\ndef isinstance(*a): return True\n" + WRONG_F,
    "print and sys.exit replaced, then exit": "import builtins, sys, os\n"
        "builtins.print = lambda *a, **k: None\nsys.exit = lambda *a: os._exit(0)\n"
        "def f(x):\n    sys.exit(0)\n",
}


def naive_pass(code: str, tests: str) -> bool:
    """What a harness that runs program + tests in one interpreter and trusts a clean exit says."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", f"{code}\n{tests}\n"], capture_output=True,
                          timeout=20)
    return done.returncode == 0


@needs_sandbox
def test_helper_row_passes_honestly(reward):
    assert score(reward, HELPER_ROW, "def f(x):\n    return 2.0 * x") == 1.0
    assert score(reward, HELPER_ROW, WRONG_F) == 0.0


@needs_sandbox
@pytest.mark.parametrize("name", sorted(HELPER_HACKS))
def test_helper_hack_fools_a_naive_harness_and_scores_zero_here(reward, name):
    tests = "import math\n" + "\n".join(HELPER_ROW["test_list"])
    assert naive_pass(HELPER_HACKS[name], tests)          # the attack is real
    assert score(reward, HELPER_ROW, HELPER_HACKS[name]) == 0.0


NAIVE_CALL = RUNNING_MAX["test"] + "\ncheck(running_max)\n"
FOOLS_NAIVE = {"sys.exit(0) at the top", "os._exit(0) at the top", "raise SystemExit",
               "exit() inside the function", "an atexit handler that prints a pass",
               "__eq__ always True", "an int subclass with __eq__", "a list subclass",
               "writing a result line to every descriptor"}


@needs_sandbox
@pytest.mark.parametrize("name", sorted(FOOLS_NAIVE))
def test_these_humaneval_hacks_fool_a_naive_harness(name):
    assert naive_pass(HACKS[name], NAIVE_CALL)


@needs_sandbox
def test_redefining_a_prompt_helper_does_not_fool_the_check(reward):
    row = rows("humaneval")[1]      # check() calls is_palindrome, defined in the prompt
    cheat = ("def is_palindrome(text):\n    return True\n"
             "def shortest_palindrome_prefix(text):\n    return text if text != 'cat' else 'catac'\n")
    assert score(reward, row, fenced(cheat)) == 0.0


@needs_sandbox
def test_stdio_forgeries_score_zero(reward):
    row = rows("apps")[0]
    # the expected outputs never reach the sandbox; writing to the harness's descriptors fails
    forged = ("import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'x')\n"
              "    except OSError:\n        pass\nprint(0)")
    assert score(reward, row, forged, prompt="") == 0.0


@needs_sandbox
def test_code_tests_is_a_plain_reward_function():
    row = rows("mbpp")[0]
    assert code_tests(["p", "p"], [row["code"], "def similar_elements(a, b): return ()"],
                      test_list=[row["test_list"]] * 2) == [1.0, 0.0]


@needs_sandbox
def test_a_fake_module_in_sys_modules_scores_zero(reward):
    row = {"test_list": ["assert math.isclose(f(0.5), 1.0)"], "test_imports": ["import math"]}
    fake = ("import sys, types\nfake = types.ModuleType('math')\nfake.isclose = lambda *a, **k: True\n"
            "sys.modules['math'] = fake\ndef f(x):\n    return 0\n")
    assert naive_pass(fake, "import math\nassert math.isclose(f(0.5), 1.0)")
    assert score(reward, row, fake) == 0.0
    assert score(reward, row, "def f(x):\n    return 2 * x\n") == 1.0


@needs_sandbox
def test_the_tests_may_rebind_a_name_the_program_defined(reward):
    # The setup code imports gcd over the program's own gcd, and the program uses threads,
    # sys.setrecursionlimit and a cache: nothing here is tampering, so the right program passes.
    row = {"test_setup_code": "from math import gcd", "test_list": ["assert lcm(4, 6) == 12",
                                                                    "assert gcd(4, 6) == 2"]}
    program = ("import sys, threading, functools\nsys.setrecursionlimit(10000)\n"
               "def gcd(a, b):\n    return a if b == 0 else gcd(b, a % b)\n"
               "@functools.lru_cache(maxsize=None)\ndef lcm(a, b):\n"
               "    t = threading.Thread(target=lambda: None)\n    t.start()\n    t.join()\n"
               "    return a * b // gcd(a, b)\n")
    assert score(reward, row, program) == 1.0


# ---- A second round: attacks and correct programs found by reviewing the harness ---------------

FAKE_DEQUE = ("class deque:\n    __module__ = 'collections'\n    def __iter__(self): return iter(())\n"
              "    def __sub__(self, o): return 0.0\n    def __rsub__(self, o): return 0.0\n"
              "    def __bool__(self): return True\n    def __lt__(self, o): return True\n"
              "    def __gt__(self, o): return True\ndef f(x):\n    return deque()\n")
FRAME_SEND = ("import sys\ndef running_max(numbers):\n    return []\nf = sys._getframe()\n"
              "while f is not None and 'send' not in f.f_locals:\n    f = f.f_back\n"
              "f.f_locals['send']({'done': True, 'flags': [], 'lit': {}, "
              "'ran': {str(i): [1, 0] for i in range(1000)}})\n")
CODE_SWAP = ("import sys\ndef _mk():\n    guard = records = None\n    def lit(index, value):\n"
             "        guard, records\n        records['ran'][str(index)] = [1, 0]\n    return lit\n"
             "def running_max(numbers):\n    lit = sys._getframe(2).f_globals['__grpo_lit__']\n"
             "    new = _mk().__code__\n    lit.__code__ = new.replace(co_freevars=lit.__code__.co_freevars)\n"
             "    return []\n")
CYCLIC_PROMPT = ("def shift(s: str) -> str:\n    \"\"\"Each letter one place on.\"\"\"\n"
                 "    return ''.join(chr((ord(c) - 97 + 1) % 26 + 97) for c in s)\n\n\n"
                 "def unshift(s: str) -> str:\n    \"\"\"Undo shift.\"\"\"\n")
CYCLIC = {"entry_point": "unshift", "test": (
    "def check(candidate):\n    from random import randint, choice\n    import string\n"
    "    for _ in range(50):\n        word = ''.join(choice(string.ascii_lowercase) for i in range(randint(5, 9)))\n"
    "        assert candidate(shift(word)) == word\n")}

SECOND_ROUND_HACKS = {
    # the program's own `abs`, `isinstance` or `set` standing in for the builtins in the tests
    "builtins shadowed by the program's functions": (
        {"test_list": ["assert isinstance(f(2), float)", "assert abs(f(1) - 2.0) < 1e-6",
                       "assert set(f(3)) == set((1, 2))"]},
        "def abs(x):\n    return 0\ndef isinstance(*a):\n    return True\n"
        "def set(*a):\n    return 0\ndef f(x):\n    return 0\n", ""),
    "a module object the program built under a module's name": (
        {"test_list": ["assert math.isclose(f(0.5), 1.0)"]},
        "import types\nmath = types.ModuleType('math')\nmath.isclose = lambda *a, **k: True\n"
        "def f(x):\n    return 0\n", ""),
    "a class that calls itself collections.deque": (
        {"test_list": ["assert abs(f(1) - 2.0) < 1e-6", "assert f(3) > 5", "assert f(0)"]},
        FAKE_DEQUE, ""),
    "a class that says it is fractions'": (
        {"test_list": ["assert abs(Sol().m() - 2) < 1e-6", "assert Sol().m()"]},
        "class Sol:\n    __module__ = 'fractions'\n    def m(self):\n        class X:\n"
        "            def __abs__(self): return self\n            def __sub__(self, o): return self\n"
        "            def __lt__(self, o): return True\n            def __bool__(self): return True\n"
        "        return X()\n", ""),
    "random's instance patched so the inputs are empty": (
        CYCLIC, "import random\nrandom._inst.randrange = lambda *a, **k: 0\n"
                "def unshift(s):\n    return s\n", CYCLIC_PROMPT),
    "random's class patched": (
        CYCLIC, "import random\nrandom.Random.randrange = lambda *a, **k: 0\n"
                "def unshift(s):\n    return s\n", CYCLIC_PROMPT),
    "the harness's send() found through the frames": (RUNNING_MAX, FRAME_SEND, RUNNING_MAX["prompt"]),
    "the harness's recorder's code swapped": (RUNNING_MAX, CODE_SWAP, RUNNING_MAX["prompt"]),
    "an OrderedDict in the wrong order": (
        {"test_list": ["from collections import OrderedDict",
                       "assert f() == OrderedDict([('b', 2), ('a', 1)])"]},
        "from collections import OrderedDict\ndef f():\n    return OrderedDict([('a', 1), ('b', 2)])\n",
        ""),
}

SECOND_ROUND_CORRECT = {
    "asserts only inside a loop": ({"tests": "for a, b in [(1, 2), (2, 4)]:\n    assert f(a) == b\n"},
                                   "def f(x):\n    return 2 * x\n"),
    "asserts only inside a function": ({"tests": "def test():\n    assert f(1) == 2\ntest()\n"},
                                       "def f(x):\n    return 2 * x\n"),
    "asserts under a main guard": ({"tests": "if __name__ == '__main__':\n    assert f(1) == 2\n"},
                                   "def f(x):\n    return 2 * x\n"),
    "a class of the program's (MBPP's Pair)": (
        {"test_list": ["assert max_chain_length([Pair(5, 24), Pair(15, 25), Pair(27, 40), "
                       "Pair(50, 60)], 4) == 3"]},
        "class Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n"
        "def max_chain_length(arr, n):\n    best = [1] * n\n    for i in range(1, n):\n"
        "        for j in range(i):\n            if arr[i].a > arr[j].b:\n"
        "                best[i] = max(best[i], best[j] + 1)\n    return max(best)\n"),
    "a LeetCode Solution class": ({"tests": ["assert Solution().add(1, 2) == 3"]},
                                  "class Solution:\n    def add(self, a, b):\n        return a + b\n"),
    "a Fraction result": ({"test_list": ["assert half(1) == 0.5"]},
                          "from fractions import Fraction\ndef half(x):\n    return Fraction(x, 2)\n"),
    "a namedtuple result": ({"test_list": ["assert p() == (1, 2)"]},
                            "from collections import namedtuple\nP = namedtuple('P', 'x y')\n"
                            "def p():\n    return P(1, 2)\n"),
    "a generator read by list()": ({"test_list": ["assert list(g(3)) == [0, 1, 2]"]},
                                   "def g(n):\n    yield from range(n)\n"),
    "a truth assert on a re.Match": ({"test_list": ["import re", "assert re.match('a', f())"]},
                                     "def f():\n    return 'abc'\n"),
    "stdout written at exit by a fast-IO template": (
        {"input_output": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})},
        "import atexit, io, sys\nbuf = io.StringIO()\nsys.stdout = buf\n@atexit.register\n"
        "def _w():\n    sys.__stdout__.write(buf.getvalue())\na, b = map(int, input().split())\n"
        "print(a + b)\n"),
    "stdout through sys.__stdout__": (
        {"input_output": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})},
        "import sys\na, b = map(int, input().split())\nsys.__stdout__.write(str(a + b) + '\\n')\n"),
}


@needs_sandbox
@pytest.mark.parametrize("name", sorted(SECOND_ROUND_HACKS))
def test_second_round_hack_scores_zero(reward, name):
    row, program, prompt = SECOND_ROUND_HACKS[name]
    assert score(reward, row, program, prompt=prompt) == 0.0


@needs_sandbox
def test_the_random_row_passes_honestly(reward):
    right = CYCLIC_PROMPT + "    return ''.join(chr((ord(c) - 97 - 1) % 26 + 97) for c in s)\n"
    assert score(reward, CYCLIC, fenced(right), prompt=CYCLIC_PROMPT) == 1.0


@needs_sandbox
@pytest.mark.parametrize("name", sorted(SECOND_ROUND_CORRECT))
def test_a_correct_program_of_this_shape_passes(reward, name):
    row, program = SECOND_ROUND_CORRECT[name]
    assert score(reward, row, program, prompt="") == 1.0


# ---- A third round: the program in a process of its own -------------------------------------
# Rows whose expected values are computed inside the sandbox (a check loop over a list of
# expected values, an expectation computed from the argument, a property test), and programs that
# are wrong unless they reach the tests' objects. The first eight fooled the harness in which the
# program and the tests shared one interpreter.

ADD = {"entry_point": "add", "test": (
    "def check(candidate):\n    inputs = [[1, 2], [5, 7], [10, -3]]\n    results = [3, 12, 7]\n"
    "    for inp, exp in zip(inputs, results):\n        assert candidate(*inp) == exp\n")}
ADD_RIGHT = "def add(a, b):\n    return a + b\n"
SORTED = {"tests": "xs = [3, 1, 2]\nassert sort_copy(xs) == sorted(xs)\n"}
SORTED_RIGHT = "def sort_copy(xs):\n    return sorted(xs)\n"
ISCLOSE = {"test_list": ["assert math.isclose(f(0.5), 1.0)"], "test_imports": ["import math"]}
ISCLOSE_RIGHT = "def f(x):\n    return 2 * x\n"
EQ = {"tests": "assert f(2) == int('4')\n"}
EQ_RIGHT = "def f(x):\n    return 2 * x\n"
POLY_PROMPT = ("import math\n\n\ndef poly(xs: list, x: float):\n    \"\"\"xs[0] + xs[1] x + ...\"\"\"\n"
               "    return sum(coeff * math.pow(x, i) for i, coeff in enumerate(xs))\n\n\n"
               "def find_zero(xs: list):\n    \"\"\"A zero of the polynomial with coefficients xs.\"\"\"\n")
POLY = {"entry_point": "find_zero", "test": (
    "def check(candidate):\n    import math\n    import random\n    rng = random.Random(42)\n"
    "    for _ in range(50):\n        ncoeff = 2 * rng.randint(1, 4)\n        coeffs = []\n"
    "        for _ in range(ncoeff):\n            coeff = rng.randint(-10, 10)\n"
    "            coeffs.append(coeff if coeff != 0 else 1)\n"
    "        solution = candidate(coeffs)\n        assert math.fabs(poly(coeffs, solution)) < 1e-4\n")}
POLY_RIGHT = POLY_PROMPT + (
    "    lo, hi = -1.0, 1.0\n    while poly(xs, lo) * poly(xs, hi) > 0:\n        lo, hi = 2 * lo, 2 * hi\n"
    "    for _ in range(200):\n        mid = (lo + hi) / 2\n"
    "        if poly(xs, lo) * poly(xs, mid) <= 0:\n            hi = mid\n        else:\n"
    "            lo = mid\n    return lo\n")
FORGED_LINE = json.dumps({"flags": [], "lit": {}, "ran": {"0": [3, 0]}, "done": True})

# name -> (row, prompt, wrong program that passes only by reaching the tests, right program)
CROSS_PROCESS_ATTACKS = {
    "reading the expected value from the caller's frame": (ADD, "", (
        "import sys\ndef add(a, b):\n    f = sys._getframe(1)\n    while f is not None:\n"
        "        if 'exp' in f.f_locals:\n            return f.f_locals['exp']\n        f = f.f_back\n"
        "    return 0\n"), ADD_RIGHT),
    "mutating the test's argument in place": (SORTED, "", (
        "def sort_copy(xs):\n    xs.clear()\n    return []\n"), SORTED_RIGHT),
    "mutating a property test's argument (HumanEval/32's shape)": (POLY, POLY_PROMPT, POLY_PROMPT + (
        "    xs[:] = [0, 1]\n    return 0.0\n"), POLY_RIGHT),
    "the guard switched off through sys.modules, then math.isclose patched": (ISCLOSE, "", (
        "import sys, math\nh = sys.modules['__main__']\nh.Guard.check = lambda *a, **k: None\n"
        "math.isclose = lambda *a, **k: True\ndef f(x):\n    return 0\n"), ISCLOSE_RIGHT),
    "the guard switched off, then builtins patched": (
        {"test_list": ["assert abs(f(1) - 2) < 1e-9"]}, "", (
        "import sys, builtins\nh = sys.modules['__main__']\nh.Guard.check = lambda *a, **k: None\n"
        "def f(x):\n    builtins.abs = lambda v: 0\n    return 0\n"), ISCLOSE_RIGHT),
    "the harness's encode and decode patched": (EQ, "", (
        "import sys\nh = sys.modules['__main__']\nh.Guard.check = lambda *a, **k: None\n"
        "h.encode = lambda *a, **k: 0\nh.decode = lambda *a, **k: 0\ndef f(x):\n    return 0\n"),
        EQ_RIGHT),
    "an audit hook that swaps the recorders when the tests are compiled": (ADD, "", (
        "import sys\ndef hook(event, args):\n    if event != 'exec':\n        return\n"
        "    f = sys._getframe(1)\n    while f is not None:\n        t = f.f_locals.get('tests')\n"
        "        if isinstance(t, dict) and '__grpo_eq__' in t and not t.get('_done'):\n"
        "            real = t['__grpo_eq__']\n            t['__grpo_eq__'] = lambda i, a, b: real(i, 0, 0)\n"
        "            t['_done'] = True\n            return\n        f = f.f_back\n"
        "sys.addaudithook(hook)\ndef add(a, b):\n    return 0\n"), ADD_RIGHT),
    "a result line forged with the nonce read from the frames": (ADD, "", (
        "import sys, os\nf = sys._getframe()\nwhile f is not None:\n"
        "    if 'nonce' in f.f_locals and 'result_fd' in f.f_locals:\n"
        f"        os.write(f.f_locals['result_fd'], f.f_locals['nonce'] + {FORGED_LINE!r}.encode() + b'\\n')\n"
        "        os._exit(0)\n    f = f.f_back\ndef add(a, b):\n    return 0\n"), ADD_RIGHT),
    # against the two processes themselves
    "a forged list of names that sets the tests' __name__": (
        {"tests": "assert f(0) == 0\nif __name__ == '__main__':\n    assert f(1) == int('2')\n"}, "", (
        "import sys\nh = sys.modules['__main__']\nreal = h._send_message\n"
        "def forged(fd, payload):\n    if isinstance(payload, dict) and 'names' in payload:\n"
        "        payload['names']['__name__'] = {'v': 'not main'}\n    real(fd, payload)\n"
        "h._send_message = forged\ndef f(x):\n    return 0\n"), EQ_RIGHT),
    "a class named like a module the row does not import": (
        {"test_list": ["assert math.isclose(area(1), 3.141592653589793, rel_tol=1e-9)"]}, "", (
        "class math:\n    isclose = staticmethod(lambda *a, **k: True)\ndef area(r):\n    return 0\n"),
        "import math\ndef area(r):\n    return math.pi * r * r\n"),
    "StopIteration raised to end the tests' all(map(...)) early": (
        {"entry_point": "is_prime", "test": "def check(candidate):\n"
         "    assert all(map(candidate, [2, 3, 5, 7, 11]))\n"
         "    assert not any(map(candidate, [1, 4, 6, 8, 9]))\n"}, "",
        "def is_prime(n):\n    raise StopIteration\n",
        "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, n))\n"),
    "killing the tests' process": (ADD, "", (
        "import os, signal\ndef add(a, b):\n    os.kill(os.getppid(), signal.SIGKILL)\n    return 0\n"),
        ADD_RIGHT),
    "stopping the tests' process": (ADD, "", (
        "import os, signal\ndef add(a, b):\n    os.kill(os.getppid(), signal.SIGSTOP)\n    return 0\n"),
        ADD_RIGHT),
    "interrupting the tests with SIGINT during a failing check": (ADD, "", (
        "import os, signal\ndef add(a, b):\n    os.kill(os.getppid(), signal.SIGINT)\n    return 0\n"),
        ADD_RIGHT),
    "the tests' memory and descriptors through /proc": (ADD, "", (
        "import os, re\ndef add(a, b):\n    p = os.getppid()\n    try:\n"
        "        with open(f'/proc/{p}/mem', 'rb') as m, open(f'/proc/{p}/maps') as maps:\n"
        "            for line in maps:\n                lo, hi = (int(x, 16) for x in line.split()[0].split('-'))\n"
        "                m.seek(lo)\n                data = m.read(hi - lo)\n"
        "                for nonce in re.findall(rb'[0-9a-f]{32}', data):\n"
        f"                    for fd in range(64):\n                        try:\n"
        f"                            with open(f'/proc/{{p}}/fd/{{fd}}', 'wb') as out:\n"
        f"                                out.write(nonce + {FORGED_LINE!r}.encode() + b'\\n')\n"
        "                        except OSError:\n                            pass\n"
        "    except OSError:\n        pass\n    return 0\n"), ADD_RIGHT),
    "a reply the program's server forges (a malformed Fraction)": (EQ, "", (
        "import sys\nh = sys.modules['__main__']\nh.encode = lambda *a, **k: {'fr': [1, 0]}\n"
        "def f(x):\n    return 0\n"), EQ_RIGHT),
    "a reply the program's server forges (a signalling NaN)": (EQ, "", (
        "from decimal import Decimal\ndef f(x):\n    return Decimal('sNaN')\n"), EQ_RIGHT),
    "a reply larger than the cap": (EQ, "", (
        "def f(x):\n    return 'x' * (40 << 20)\n"), EQ_RIGHT),
}


@needs_sandbox
@pytest.mark.parametrize("name", sorted(CROSS_PROCESS_ATTACKS))
def test_the_tests_are_out_of_the_programs_reach(reward, name):
    row, prompt, wrong, right = CROSS_PROCESS_ATTACKS[name]
    started = time.monotonic()
    assert score(reward, row, fenced(wrong), prompt=prompt) == 0.0
    assert time.monotonic() - started < DEADLINE + 1.5
    assert score(reward, row, fenced(right), prompt=prompt) == 1.0


CYCLIC_CODE = ("def encode_cyclic(s: str):\n    \"\"\"Each group of three characters rotated left.\"\"\"\n"
               "    groups = [s[3 * i:min(3 * i + 3, len(s))] for i in range((len(s) + 2) // 3)]\n"
               "    return ''.join(g[1:] + g[0] if len(g) == 3 else g for g in groups)\n\n\n"
               "def decode_cyclic(s: str):\n    \"\"\"The inverse of encode_cyclic.\"\"\"\n")
CYCLIC_ROW = {"entry_point": "decode_cyclic", "test": (
    "def check(candidate):\n    for s in ['abcdefg', 'hello world', 'xy']:\n"
    "        assert candidate(encode_cyclic(s)) == s\n")}


@needs_sandbox
@pytest.mark.parametrize("form", ["raw", "fenced chat", "unfenced chat", "chat with text after"])
def test_a_prompts_helpers_are_the_prompts_whatever_its_form(reward, form):
    prompt = {"raw": CYCLIC_CODE,
              "fenced chat": f"Complete the following code.\n```python\n{CYCLIC_CODE}```\n",
              "unfenced chat": "Complete the following Python code.\n\n" + CYCLIC_CODE,
              "chat with text after": "Complete this:\n\n" + CYCLIC_CODE + "\nAnswer in one block.\n",
              }[form]
    hack = "def encode_cyclic(s):\n    return s\n\ndef decode_cyclic(s):\n    return s\n"
    right = CYCLIC_CODE + ("    groups = [s[3 * i:min(3 * i + 3, len(s))] for i in range((len(s) + 2) // 3)]\n"
                           "    return ''.join(g[-1] + g[:-1] if len(g) == 3 else g for g in groups)\n")
    assert score(reward, CYCLIC_ROW, fenced(hack), prompt=prompt) == 0.0
    assert score(reward, CYCLIC_ROW, fenced(right), prompt=prompt) == 1.0


@needs_sandbox
def test_integers_of_any_size_cross_both_ways(reward):
    row = {"test_list": ["assert f(2000) == math.factorial(2000)", "assert f(5) == 120",
                         "assert g(10 ** 5000) == 10 ** 5000 + 1"], "test_imports": ["import math"]}
    right = "import math\ndef f(n):\n    return math.factorial(n)\ndef g(x):\n    return x + 1\n"
    assert score(reward, row, right, prompt="") == 1.0
    assert score(reward, row, right.replace("x + 1", "x"), prompt="") == 0.0
    calls = {"input_output": json.dumps({"inputs": [[3000]], "outputs": [[str(3 ** 3000)]],
                                         "fn_name": "p"})}
    assert score(reward, calls, "def p(n):\n    return str(3 ** n)\n", prompt="") == 1.0


def test_two_trainer_processes_never_share_a_sandbox_user(tmp_path):
    # two ranks on one machine: a slow right program in one must not be killed by the other's
    # clean-up, which kills every process of its sandbox user id
    if isolation_level() != "full":
        pytest.skip("needs root for namespaces and a user id of its own")
    import subprocess
    import sys
    script = tmp_path / "rank.py"
    script.write_text(
        "import sys, time\nfrom grpo.rewards import CodeTests\nfrom grpo.sandbox.isolate import Limits\n"
        "row = {'entry_point': 'add', 'test': 'def check(candidate):\\n    assert candidate(1, 2) == 3\\n'}\n"
        "slow = 'import time\\ndef add(a, b):\\n    time.sleep(1.2)\\n    return a + b\\n'\n"
        "fast = 'def add(a, b):\\n    return a + b\\n'\n"
        "r = CodeTests(limits=Limits(timeout_s=3.0), workers=1)\n"
        "if sys.argv[1] == 'fast':\n    time.sleep(0.4)\n"
        "code = slow if sys.argv[1] == 'slow' else fast\n"
        "print(r([''], [code], **{k: [v] for k, v in row.items()})[0])\n")
    ranks = [subprocess.Popen([sys.executable, str(script), which], stdout=subprocess.PIPE,
                              text=True) for which in ("slow", "fast")]
    assert [p.communicate(timeout=60)[0].strip() for p in ranks] == ["1.0", "1.0"]


@needs_sandbox
def test_the_tests_process_memory_and_descriptors_are_closed_to_the_program(reward):
    row = {"tests": "assert probe() == ['denied', 'denied', 'denied']\n"}
    program = ("import os\ndef probe():\n    out = []\n    p = os.getppid()\n"
               "    for path, mode in ((f'/proc/{p}/mem', 'rb'), (f'/proc/{p}/fd/1', 'wb'),\n"
               "                       (f'/proc/{p}/environ', 'rb')):\n        try:\n"
               "            open(path, mode).close()\n            out.append('opened')\n"
               "        except PermissionError:\n            out.append('denied')\n    return out\n")
    assert score(reward, row, program, prompt="") == 1.0


@needs_sandbox
def test_arguments_cross_as_the_same_types_in_the_same_order(reward):
    # HumanEval/95's canonical solution reads a dict's keys in insertion order; a set argument is
    # a set the program may add to; a Counter stays a Counter
    row = {"tests": ["assert first({'p': 1, 'A': 2, 'B': 3}) == 'p'", "assert grow({1}) == {1, 2}",
                     "from collections import Counter",
                     "assert top(Counter('aab')) == [('a', 2)]", "assert keys(frozenset({3})) == [3]"]}
    program = ("def first(d):\n    return next(iter(d))\ndef grow(s):\n    s.add(2)\n    return s\n"
               "def top(c):\n    return c.most_common(1)\ndef keys(f):\n    return sorted(f | {3})\n")
    assert score(reward, row, program, prompt="") == 1.0


@needs_sandbox
def test_program_objects_cross_as_handles(reward):
    # a generator, a class's instances passed back, a method, an attribute, len(), indexing and
    # a builtin exception raised across
    row = {"tests": ["assert list(g(3)) == [0, 1, 2]", "b = Box([4, 5])",
                     "assert b.size() == 2 and b.items == [4, 5] and len(b) == 2 and b[1] == 5",
                     "assert total([Box([1]), Box([2, 3])]) == 6",
                     "try:\n    pos(-1)\n    raised = False\nexcept ValueError:\n    raised = True",
                     "assert raised"]}
    program = ("def g(n):\n    yield from range(n)\ndef pos(n):\n    if n < 0:\n"
               "        raise ValueError(n)\n    return n\n"
               "class Box:\n    def __init__(self, items):\n        self.items = items\n"
               "    def size(self):\n        return len(self.items)\n    def __len__(self):\n"
               "        return len(self.items)\n    def __getitem__(self, k):\n        return self.items[k]\n"
               "def total(boxes):\n    return sum(sum(b.items) for b in boxes)\n")
    assert score(reward, row, program, prompt="") == 1.0
    # a handle compared, or tested for truth, is refused whatever the object would answer
    for test in ("assert Box([1]) == Box([1])", "assert Box([1])"):
        assert score(reward, {"tests": [test]}, program, prompt="") == 0.0


def test_a_result_line_of_the_wrong_shape_scores_zero_not_an_error():
    from grpo.rewards.code import judge_tests, result_payload
    spec = spec_from_row({"test_list": ["assert f(1) == 2", "assert g(1)"]})
    assert judge_tests(spec, {"done": True, "ran": {"1": 5}, "lit": {"0": [2]}}) == (0, 2)
    assert judge_tests(spec, {"done": True, "ran": "x"}) == (0, 2)
    assert judge_tests(spec, {"done": True, "ran": {"0": [1, 0], "1": [1, 0]}}) == (0, 2)  # a literal
    assert judge_tests(spec, {"done": True, "ran": {"1": [1, 0]}, "lit": {"0": [2]}}) == (2, 2)
    assert result_payload("N" + "[" * 200_000 + "]" * 200_000 + "\n", "N") is None
    # a forged or malformed value in the line is a 0, never an exception in the trainer
    for bad in ({"fr": [1, 0]}, {"dec": "sNaN"}, {"d": [[[1], 2]]}, {"c": ["a", 1]}, {"x": 1}, {}):
        assert judge_tests(spec, {"done": True, "ran": {"1": [1, 0]}, "lit": {"0": [bad]}}) == (0, 2)


def test_a_failed_assert_nested_under_a_top_level_one_fails_the_run():
    from grpo.rewards.code import judge_tests
    # a literal assert records its value and goes on; in Python it would have stopped the tests
    spec = spec_from_row({"tests": "assert f(0) == 0\nif True:\n    assert f(1) == 2\n"})
    assert spec.required == (0,)
    assert judge_tests(spec, {"done": True, "ran": {}, "lit": {"0": [0], "1": [2]}}) == (1, 1)
    assert judge_tests(spec, {"done": True, "ran": {}, "lit": {"0": [0], "1": [0]}}) == (0, 1)


# ---- Completions built to make the reward raise or stall ---------------------------------------

BUILT_TO_BREAK = {
    "an expression 3,000 levels deep": "x = " + "(" * 3000 + "1" + ")" * 3000 + "\n",
    "a def line after 200,000 blank lines": "\n" * 200_000 + "def f(:\n",
    "100,000 code fences": "```\n" * 100_000,
    "a lone surrogate and a NUL": "def running_max(numbers):\n    return '\udcff\x00'\n",
    "a megabyte of one line": "#" + "x" * (1 << 20),
}


@needs_sandbox
@pytest.mark.parametrize("name", sorted(BUILT_TO_BREAK))
@pytest.mark.parametrize("fmt", ["humaneval", "apps", "livecodebench"])
def test_a_completion_cannot_make_code_tests_raise_or_stall(reward, fmt, name):
    row = rows(fmt)[0]
    started = time.monotonic()
    assert score(reward, row, BUILT_TO_BREAK[name], prompt=row.get("prompt", "")) == 0.0
    assert time.monotonic() - started < DEADLINE + 1.5


@needs_sandbox
def test_each_zero_the_program_caused_is_counted_by_cause(reward):
    from grpo.rewards import faults
    row = rows("humaneval")[0]
    hang = row["prompt"] + "    while True:\n        pass\n"
    forged = CROSS_PROCESS_ATTACKS["a reply the program's server forges (a malformed Fraction)"]
    with faults.counting() as counts:   # counted in the reward's pool threads, into this scope
        assert score(reward, row, fenced(hang)) == 0.0
        killer = row["prompt"] + "    import os\n    os.kill(os.getppid(), 9)\n"    # no result line
        assert score(reward, row, fenced(killer)) == 0.0
        assert score(reward, forged[0], fenced(forged[2]), prompt="") == 0.0      # a malformed value
        with faults.counting() as inner:
            assert score(reward, row, fenced(humaneval_solution(row))) == 1.0
    assert counts.metrics() == {"reward/code_tests/zero/no_result": 1,
                                "reward/code_tests/zero/rejected": 1,
                                "reward/code_tests/zero/timeout": 1}
    assert inner.metrics() == {}


# ---- Output past the cap, and functions named like standard-library modules --------------------

@needs_sandbox
@pytest.mark.parametrize("name", ["apps", "codecontests", "livecodebench", "own"])
def test_output_that_hit_the_cap_fails(reward, name):
    # the right answer, then blank lines past the cap (twice the expected output plus 4 KiB), then
    # a wrong line: compared after the cut, the first part alone passed
    case = {"input": "2\n", "output": "4\n"}
    row = {"apps": {"input_output": json.dumps({"inputs": ["2\n"], "outputs": ["4\n"]})},
           "codecontests": {"public_tests": json.dumps({"input": ["2\n"], "output": ["4\n"]})},
           "livecodebench": {"public_test_cases": json.dumps([{**case, "testtype": "stdin"}])},
           "own": {"tests": [case]}}[name]
    right = "print(2 * int(input()))\n"
    assert score(reward, row, right, prompt="") == 1.0
    from grpo.rewards import faults
    with faults.counting() as counts:
        assert score(reward, row, right + "print('\\n' * 200_000)\nprint(5)\n", prompt="") == 0.0
        assert score(reward, row, right + "print(' ' * 200_000)\n", prompt="") == 0.0
    assert counts.metrics() == {"reward/code_tests/zero/output_too_long": 2}


# HumanEval's check(candidate) and MBPP's asserts calling a function whose name is also a module
# of the standard library: the program's function is the one called
STDLIB_NAMED = {
    "token": ("def token(s):\n    return s.split()[0]\n",
              "    assert candidate('a b') == 'a'\n    assert candidate('xy z') == 'xy'\n",
              ["assert token('a b') == 'a'", "assert token('xy z') == 'xy'"]),
    "array": ("def array(n):\n    return list(range(n))\n",
              "    assert candidate(3) == [0, 1, 2]\n",
              ["assert array(3) == [0, 1, 2]", "assert len(array(5)) == 5"]),
    "string": ("def string(n):\n    return 'ab' * n\n", "    assert candidate(2) == 'abab'\n",
               ["assert string(2) == 'abab'"]),
    "random": ("def random(xs):\n    return sorted(xs)[0]\n", "    assert candidate([3, 1]) == 1\n",
               ["assert random([3, 1]) == 1"]),
}


@needs_sandbox
@pytest.mark.parametrize("name", sorted(STDLIB_NAMED))
def test_a_function_named_like_a_stdlib_module_is_the_programs(reward, name):
    program, check_body, asserts = STDLIB_NAMED[name]
    humaneval = {"entry_point": name, "test": "def check(candidate):\n" + check_body}
    mbpp = {"test_list": asserts}
    wrong = f"def {name}(*args):\n    return None\n"
    for row in (humaneval, mbpp):
        assert score(reward, row, fenced(program), prompt="") == 1.0
        assert score(reward, row, fenced(wrong), prompt="") == 0.0


@needs_sandbox
def test_a_module_name_the_tests_read_attributes_of_is_never_the_programs(reward):
    # `math.isclose` in the tests: the program's function `math` is not the module, whatever it is
    row = {"test_list": ["assert math.isclose(area(1), 3.141592653589793)"]}
    fake = ("class math:\n    isclose = staticmethod(lambda *a, **k: True)\n"
            "def area(r):\n    return 0\n")
    assert score(reward, row, fake, prompt="") == 0.0
    assert score(reward, row, "import math\ndef area(r):\n    return math.pi * r * r\n",
                 prompt="") == 1.0


@needs_sandbox
def test_a_forged_colliding_set_costs_the_trainer_nothing(reward):
    # a call-based program runs in the harness's process, so it can replace the harness's encoder
    # and send 40,000 integers that share one hash as a set: rebuilt, that took 20 s of the trainer
    row = {"input_output": json.dumps({"inputs": [[1]], "outputs": [[1]], "fn_name": "f"})}
    forged = ("import sys\nh = sys.modules['__main__']\n"
              "h.encode = lambda *a, **k: {'s': [k * (2 ** 61 - 1) for k in range(40_000)]}\n"
              "def f(x):\n    return 1\n")
    started = time.monotonic()
    assert score(reward, row, forged, prompt="") == 0.0
    assert time.monotonic() - started < DEADLINE + 1.5


@needs_sandbox
def test_a_returned_value_far_larger_than_the_expected_one_never_reaches_the_trainer(
        reward, monkeypatch):
    # decoding is linear, but 8 MiB of small values still cost seconds: what comes back is sized
    # from the row's expected values (4 times their encoding, and 4 KiB, per case or literal)
    import grpo.rewards.code as code
    received = []

    def recording(*args, **kwargs):
        out = run_program(*args, **kwargs)
        received.append(len(out.stdout))
        return out
    run_program = code.run_program
    monkeypatch.setattr(code, "run_program", recording)
    calls = {"input_output": json.dumps({"inputs": [[1]], "outputs": [[1]], "fn_name": "f"})}
    flood = "def f(x):\n    return [0] * 2_000_000\n"
    assert score(reward, calls, flood, prompt="") == 0.0
    assert score(reward, calls, "def f(x):\n    return [1]\n", prompt="") == 1.0
    lit = {"test_list": ["assert f(1) == [1]", "assert f(2) == [2]"]}
    assert score(reward, lit, flood, prompt="") == 0.0
    assert score(reward, lit, "def f(x):\n    return [x]\n", prompt="") == 1.0
    assert max(received) < (4 << 10) + (64 << 10) + 100


@needs_sandbox
@pytest.mark.parametrize("char", ["\u4e2d", "\U0001F600", "\x01"])
def test_a_right_output_of_any_characters_reaches_the_trainer_whole(reward, char):
    # the result line escapes an emoji as 12 characters and a control character as 6: the read
    # cap must hold the escaped output, or a right program scores 0 (no result line)
    row = {"tests": [{"input": "", "output": char * 100_000}]}
    program = f"print({char!r} * 100_000)\n"
    assert score(reward, row, program, prompt="") == 1.0
    assert score(reward, row, f"print({char!r} * 99_999)\n", prompt="") == 0.0
