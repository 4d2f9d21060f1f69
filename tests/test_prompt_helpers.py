"""A HumanEval row's helpers (`poly`, `encode_cyclic`) are the prompt's, whatever shape the prompt
has: the program's own helper never stands in for them in `check`, and a row whose tests call a
helper that neither they nor the prompt define is refused, naming the row and the helper."""

import textwrap

import pytest

from grpo.rewards import CodeTests
from grpo.rewards.code import CodeTestsError, prompt_code
from grpo.sandbox.isolate import Limits, isolation_level

needs_sandbox = pytest.mark.skipif(isolation_level() != "full",
                                   reason="needs root for namespaces and a user id of its own")

# HumanEval/32's shape: the test checks poly(coeffs, find_zero(coeffs)) is near 0 with the prompt's
# poly; a program whose own poly returns 0 passes when its poly is the one called.
POLY_HELPER = ("import math\n\n\ndef poly(xs: list, x: float):\n    \"\"\"xs[0] + xs[1] x + ...\"\"\"\n"
               "    return sum(coeff * math.pow(x, i) for i, coeff in enumerate(xs))\n")
POLY_SIGNATURE = "def find_zero(xs: list):\n    \"\"\"A zero of the polynomial with coefficients xs.\"\"\"\n"
POLY_ROW = {"entry_point": "find_zero", "test": (
    "def check(candidate):\n    import math\n    import random\n    rng = random.Random(42)\n"
    "    for _ in range(20):\n        coeffs = [rng.choice([-3, -2, -1, 1, 2, 3]) for _ in range(4)]\n"
    "        solution = candidate(coeffs)\n        assert math.fabs(poly(coeffs, solution)) < 1e-4\n")}
POLY_BODY = ("    lo, hi = -1.0, 1.0\n    while poly(xs, lo) * poly(xs, hi) > 0:\n"
             "        lo, hi = 2 * lo, 2 * hi\n    for _ in range(200):\n        mid = (lo + hi) / 2\n"
             "        if poly(xs, lo) * poly(xs, mid) <= 0:\n            hi = mid\n        else:\n"
             "            lo = mid\n    return lo\n")
POLY_HACK = "def poly(xs, x):\n    return 0\n\n\ndef find_zero(xs):\n    return 0.0\n"

# HumanEval/38's shape: check decodes the prompt's encode_cyclic; a program whose own encode_cyclic
# is the identity passes with an identity decode_cyclic when its encoder is the one called.
CYCLIC_HELPER = ("def encode_cyclic(s: str):\n    \"\"\"Each group of three characters rotated left.\"\"\"\n"
                 "    groups = [s[3 * i:min(3 * i + 3, len(s))] for i in range((len(s) + 2) // 3)]\n"
                 "    return ''.join(g[1:] + g[0] if len(g) == 3 else g for g in groups)\n")
CYCLIC_SIGNATURE = "def decode_cyclic(s: str):\n    \"\"\"The inverse of encode_cyclic.\"\"\"\n"
CYCLIC_ROW = {"entry_point": "decode_cyclic", "test": (
    "def check(candidate):\n    for s in ['abcdefg', 'hello world', 'xy']:\n"
    "        assert candidate(encode_cyclic(s)) == s\n")}
CYCLIC_BODY = ("    groups = [s[3 * i:min(3 * i + 3, len(s))] for i in range((len(s) + 2) // 3)]\n"
               "    return ''.join(g[-1] + g[:-1] if len(g) == 3 else g for g in groups)\n")
CYCLIC_HACK = "def encode_cyclic(s):\n    return s\n\n\ndef decode_cyclic(s):\n    return s\n"

PROBLEMS = {"HumanEval/32": (POLY_HELPER, POLY_SIGNATURE, POLY_ROW, POLY_BODY, POLY_HACK),
            "HumanEval/38": (CYCLIC_HELPER, CYCLIC_SIGNATURE, CYCLIC_ROW, CYCLIC_BODY, CYCLIC_HACK)}


def shaped(shape: str, helper: str, signature: str) -> str:
    code = helper + "\n\n" + signature
    if shape == "two fenced blocks":
        return (f"Here is a helper you may use:\n```python\n{helper}```\n"
                f"Complete this function:\n```python\n{signature}```\n")
    if shape == "indented as a Markdown code block":
        return "Complete the following code.\n\n" + textwrap.indent(code, "    ") + "\nAnswer in Python.\n"
    if shape == "60 lines of instructions after the code":
        rules = "".join(f"Rule {i}: keep the solution short and clear.\n" for i in range(60))
        return "Complete this:\n\n" + code + "\n" + rules
    if shape == "25 prose lines starting with from/import before it":
        prose = "".join(f"from step {i} on, think before you write.\n" if i % 2 else
                        f"import nothing beyond the standard library, point {i}.\n" for i in range(25))
        return prose + "\n" + code
    raise ValueError(shape)


SHAPES = ["two fenced blocks", "indented as a Markdown code block",
          "60 lines of instructions after the code", "25 prose lines starting with from/import before it"]


@pytest.fixture(scope="module")
def reward():
    return CodeTests(limits=Limits(timeout_s=3.0), workers=2)


def score(reward, row: dict, completion: str, prompt: str) -> float:
    return reward([prompt], [completion], **{k: [v] for k, v in row.items()})[0]


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}```\n"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("problem", sorted(PROBLEMS))
def test_the_prompts_code_is_recovered_whole(problem, shape):
    helper, signature = PROBLEMS[problem][:2]
    recovered = prompt_code(shaped(shape, helper, signature))
    namespace: dict = {}
    exec(compile(recovered, "<prompt>", "exec"), namespace)
    helper_name, entry = ("poly", "find_zero") if problem == "HumanEval/32" else ("encode_cyclic",
                                                                                "decode_cyclic")
    assert callable(namespace[helper_name]) and callable(namespace[entry])
    assert "Rule" not in recovered and "think before" not in recovered
    # the signature comes last, so a base model's continuation of its body completes it
    assert recovered.rstrip().endswith(signature.rstrip())


@needs_sandbox
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("problem", sorted(PROBLEMS))
def test_a_programs_own_helper_does_not_fool_check(reward, problem, shape):
    helper, signature, row, body, hack = PROBLEMS[problem]
    prompt = shaped(shape, helper, signature)
    assert score(reward, row, fenced(hack), prompt) == 0.0
    assert score(reward, row, fenced(helper + "\n\n" + signature + body), prompt) == 1.0
    assert score(reward, row, body, prompt) == 1.0          # a base model continuing the signature


@pytest.mark.parametrize("problem", sorted(PROBLEMS))
def test_tests_that_call_a_helper_no_one_defines_are_refused_naming_it(reward, problem):
    helper, signature, row, body, hack = PROBLEMS[problem]
    helper_name = "poly" if problem == "HumanEval/32" else "encode_cyclic"
    prompt = "Write " + signature.split("(")[0][4:] + " as the tests describe."    # no code at all
    with pytest.raises(CodeTestsError, match=f"sample 0.*'{helper_name}'.*neither the tests nor the prompt"):
        score(reward, row, fenced(hack), prompt)
    with pytest.raises(CodeTestsError, match=f"'{helper_name}'"):
        score(reward, row, fenced(hack), shaped("two fenced blocks", "import math\n", signature))
