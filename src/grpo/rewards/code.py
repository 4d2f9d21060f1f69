"""`code_tests`: run a completion's program against its row's tests, in the sandbox.

The tests come from the dataset's own columns, in the formats the public benchmarks publish:

| format | column(s) | mode |
|---|---|---|
| HumanEval | `test` (a program defining `check(candidate)`) and `entry_point` | tests |
| MBPP | `test_list` (assert statements, any expressions), `test_setup_code`, `test_imports` | tests |
| APPS | `input_output` (JSON: `inputs`, `outputs`, and `fn_name` when call-based) | stdio or calls |
| CodeContests | `public_tests` / `private_tests` / `generated_tests` (`input`, `output` lists) | stdio |
| LiveCodeBench | `public_test_cases` / `private_test_cases` (cases with `testtype`), `metadata` | stdio or calls |
| this project | `tests`: assert strings, or `{"input", "output"}` cases | tests or stdio |

`tests_column=NAME` (and `entry_point_column`, ...) in a config renames a dataset's column to `tests`
(or `entry_point`, ...); `tests` is read first, then the benchmark columns above in that order.

How a pass is told from a forged one is in docs/sandbox.md; in short, expected values stay in this
process wherever the format allows (stdin/stdout and call cases, `assert X == LITERAL`), and the
rest runs under checks for tampering that score 0 when they fire.

Longer than about 400 lines: the benchmarks' test formats and the rewrite of asserts that keeps
expected values in the trainer: one threat model, read in one file.
"""

from __future__ import annotations

import ast
import base64
import builtins
import io
import json
import pickle
import re
import secrets
import symtable
import sys
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from functools import lru_cache

from grpo.rewards import faults
from grpo.sandbox.harness import NotPlain, Unhashed, decode_unhashed, encode, same
from grpo.sandbox.isolate import Limits, isolation_level, run_program


class CodeTestsError(ValueError):
    """A row's tests cannot be understood; the message names the row and what was expected."""


@dataclass(frozen=True)
class TestSpec:
    """One row's tests, ready to run."""
    mode: str                                  # "tests" | "calls" | "stdio"
    test: str = ""                             # tests: the rewritten test program
    check: str | None = None                   # tests: the function called with the entry point
    entry_point: str | None = None
    expected: dict = field(default_factory=dict)   # tests: assert index -> the literal it compares with
    required: tuple = ()                       # tests: asserts that must have run (straight-line ones)
    asserts: int = 0                           # tests: how many asserts the program has
    fn_name: str = ""                          # calls: the function's name
    inputs: list = field(default_factory=list)     # stdio: input texts; calls: argument lists
    outputs: list = field(default_factory=list)    # stdio: expected texts; calls: expected values
    grader: str = "exact"                      # stdio, calls: whose comparison (OUTPUT_RULES)


# ---------------------------------------------------------------------------------------------
# Reading a row's tests

_BENCHMARK_COLUMNS = ("tests", "test", "test_list", "input_output", "public_tests", "private_tests",
                      "generated_tests", "public_test_cases", "private_test_cases")
_CASE_COLUMNS = _BENCHMARK_COLUMNS[4:]


_GRADERS = {"input_output": "apps", "public_tests": "codecontests", "private_tests": "codecontests",
            "generated_tests": "codecontests", "public_test_cases": "livecodebench",
            "private_test_cases": "livecodebench"}


def spec_from_row(row: dict, where: str = "row") -> TestSpec:
    """The TestSpec for a row's columns (see the module's table); CodeTestsError names `where`.
    Case outputs are compared as the benchmark the columns come from compares them."""
    spec = _spec_from_row(row, where)
    present = next(c for c in _BENCHMARK_COLUMNS if _given(row.get(c)))
    return replace(spec, grader=_GRADERS.get(present, "exact"))


def _spec_from_row(row: dict, where: str) -> TestSpec:
    present = [c for c in _BENCHMARK_COLUMNS if _given(row.get(c))]
    if not present:
        raise CodeTestsError(f"{where}: no tests; expected a column 'tests' (or one of "
                             f"{list(_BENCHMARK_COLUMNS[1:])}), or set tests_column=NAME")
    column = present[0]
    entry = row.get("entry_point") or None
    if column in _CASE_COLUMNS:   # CodeContests / LiveCodeBench: every case column is a test set
        fn_name = _fn_name_from_metadata(row.get("metadata"), where) or entry
        loaded = [(c, _load_json(row[c], f"{where}, column '{c}'")) for c in present
                  if c in _CASE_COLUMNS]
        loaded = [(c, v) for c, v in loaded if _given(v) and not (
            isinstance(v, dict) and not _given(v.get("input", v.get("inputs"))))]
        if not loaded:
            raise CodeTestsError(f"{where}: every test column is empty")
        return _merge([_from_value(v, f"{where}, column '{c}'", fn_name, "", "")
                       for c, v in loaded], where)
    setup = _text(row.get("test_setup_code"))
    imports = row.get("test_imports") or []
    imports = "\n".join(imports) if isinstance(imports, (list, tuple)) else _text(imports)
    return _from_value(row[column], f"{where}, column '{column}'", entry, setup, imports,
                       fn_name=row.get("fn_name") or None)


def _given(value) -> bool:
    return value is not None and value != "" and value != [] and value != {}


def _text(value) -> str:
    return "" if value is None else str(value)


def _load_json(value, where: str):
    if isinstance(value, str) and value[:1] not in ("[", "{", ""):
        value = _uncompressed(value)
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise CodeTestsError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    return value


class _TextOnly(pickle.Unpickler):
    """Unpickles text and plain containers only: a pickle that names any class or function (the
    way a pickle runs code) is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refused: the pickle names {module}.{name}")


def _uncompressed(value: str):
    """LiveCodeBench's "lite" release stores `private_test_cases` as base64(zlib(pickle(json
    text))); anything else is returned as it was (and then read as JSON)."""
    try:
        data = zlib.decompress(base64.b64decode(value, validate=True))
        text = _TextOnly(io.BytesIO(data)).load()
    except (ValueError, zlib.error, pickle.UnpicklingError, EOFError, TypeError):
        return value
    return text if isinstance(text, (str, list, dict)) else value


def _fn_name_from_metadata(metadata, where: str) -> str | None:
    if not metadata:
        return None
    data = _load_json(metadata, f"{where}, column 'metadata'")
    return data.get("func_name") if isinstance(data, dict) else None


def _merge(specs: list[TestSpec], where: str) -> TestSpec:
    modes = {s.mode for s in specs}
    if len(modes) != 1:
        raise CodeTestsError(f"{where}: the test columns mix {sorted(modes)} cases")
    first = specs[0]
    return TestSpec(first.mode, fn_name=first.fn_name,
                    inputs=[i for s in specs for i in s.inputs],
                    outputs=[o for s in specs for o in s.outputs])


def _from_value(value, where: str, entry: str | None, setup: str, imports: str,
                fn_name: str | None = None) -> TestSpec:
    if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass  # Python that starts with a bracket: read as a program below
    if isinstance(value, str):
        return _program_spec(value, where, entry, setup, imports)
    if isinstance(value, dict):
        return _dict_spec(value, where, fn_name or entry)
    if isinstance(value, (list, tuple)) and value:
        if all(isinstance(v, str) for v in value):
            for k, line in enumerate(value):
                _parse_python(line, f"{where}, item {k}")
            return _program_spec("\n".join(value), where, entry, setup, imports)
        if all(isinstance(v, dict) for v in value):
            return _cases_spec(value, where, fn_name or entry)
    raise CodeTestsError(f"{where}: expected a test program (a HumanEval check function or assert "
                         "statements), a list of asserts, {'inputs': [...], 'outputs': [...]} or a "
                         f"list of {{'input', 'output'}} cases; got {type(value).__name__} "
                         f"{str(value)[:60]!r}")


def _dict_spec(value: dict, where: str, fn_name: str | None) -> TestSpec:
    inputs = value.get("inputs", value.get("input"))
    outputs = value.get("outputs", value.get("output"))
    if inputs is None or outputs is None:
        raise CodeTestsError(f"{where}: expected keys 'inputs' and 'outputs' (or 'input' and "
                             f"'output'); found {sorted(value)}")
    if isinstance(inputs, str):
        return TestSpec("stdio", inputs=[inputs], outputs=[_out_text(outputs)])
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise CodeTestsError(f"{where}: 'inputs' and 'outputs' must be lists of the same length")
    name = value.get("fn_name") or None
    if name:   # APPS call-based: inputs are argument lists
        return TestSpec("calls", fn_name=name,
                        inputs=[i if isinstance(i, list) else [i] for i in inputs], outputs=outputs)
    return TestSpec("stdio", inputs=[_out_text(i) for i in inputs],
                    outputs=[_out_text(o) for o in outputs])


def _cases_spec(cases: list[dict], where: str, fn_name: str | None) -> TestSpec:
    for k, case in enumerate(cases):
        if "input" not in case or "output" not in case:
            raise CodeTestsError(f"{where}, case {k}: expected keys 'input' and 'output'; found "
                                 f"{sorted(case)}")
    if any(c.get("testtype") == "functional" for c in cases):
        if not fn_name:
            raise CodeTestsError(f"{where}: functional cases need the function's name (a "
                                 "'metadata' column with func_name, or entry_point_column=NAME)")
        inputs, outputs = [], []
        for k, case in enumerate(cases):   # LiveCodeBench: one JSON value per line is one argument
            try:
                inputs.append([json.loads(line) for line in str(case["input"]).splitlines()
                               if line.strip()])
                outputs.append(json.loads(case["output"]))
            except json.JSONDecodeError:
                raise CodeTestsError(f"{where}, case {k}: a functional case's input lines and "
                                     "output must each be JSON") from None
        return TestSpec("calls", fn_name=fn_name, inputs=inputs, outputs=outputs)
    return TestSpec("stdio", inputs=[_out_text(c["input"]) for c in cases],
                    outputs=[_out_text(c["output"]) for c in cases])


def _out_text(value) -> str:
    """An input or output as text: APPS sometimes stores one as a list of lines."""
    if isinstance(value, list):
        return "\n".join(str(v) for v in value)
    return str(value)


def _parse_python(source: str, where: str) -> ast.Module:
    try:
        return ast.parse(source)
    except SyntaxError as e:
        raise CodeTestsError(f"{where}: not valid Python (line {e.lineno}: {e.msg})") from None


def _program_spec(source: str, where: str, entry: str | None, setup: str, imports: str) -> TestSpec:
    tree = _parse_python(source, where)
    defines_check = any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in tree.body)
    if defines_check and not entry:
        raise CodeTestsError(f"{where}: the tests define check(candidate) but the row names no "
                             "entry point; give an 'entry_point' column or set "
                             "entry_point_column=NAME")
    prelude = "\n".join(p for p in (imports, setup) if p.strip())
    if prelude:
        _parse_python(prelude, f"{where} (setup code and imports)")
    rewritten = AssertRewriter(check_fn="check" if defines_check else None)
    body = rewritten.visit(tree)
    if not rewritten.count:
        raise CodeTestsError(f"{where}: the tests hold no assert statement, so nothing would be "
                             "checked")
    test = (prelude + "\n" if prelude else "") + ast.unparse(ast.fix_missing_locations(body))
    return TestSpec("tests", test=test, check="check" if defines_check else None, entry_point=entry,
                    expected=rewritten.expected, required=tuple(rewritten.required),
                    asserts=rewritten.count)


class AssertRewriter(ast.NodeTransformer):
    """Every `assert` becomes a call that records it in the harness (harness.run_tests):

    - `assert X == LITERAL` (either side a literal) -> `__grpo_lit__(i, X)`: only X's value goes
      back; LITERAL stays here, in `expected[i]`;
    - `assert X == Y` -> `__grpo_eq__(i, X, Y)`: both sides must be plain values, compared there;
    - any other `assert E` -> `__grpo_truth__(i, E)`.

    Asserts at the top level of the module, or of the check function's body, are `required`: the
    harness must report each of them. A top-level assert that fails does not stop the next one, so
    partial credit counts each; inside `check` the first failure ends it, as in HumanEval.
    """

    def __init__(self, check_fn: str | None):
        self.check_fn, self.count = check_fn, 0
        self.expected: dict[int, object] = {}
        self.required: list[int] = []
        self._straight = True

    def visit_Module(self, node: ast.Module) -> ast.Module:
        body = []
        for stmt in node.body:
            if isinstance(stmt, ast.Assert):
                call = self._record(stmt, required=True)
                body.append(ast.Try(body=[call], handlers=[ast.ExceptHandler(
                    type=ast.Name("Exception", ast.Load()), name=None, body=[ast.Pass()])],
                    orelse=[], finalbody=[]))
            elif isinstance(stmt, ast.FunctionDef) and stmt.name == self.check_fn:
                stmt.body = [self._record(s, required=True) if isinstance(s, ast.Assert)
                             else self._nested(s) for s in stmt.body]
                body.append(stmt)
            else:
                body.append(self._nested(stmt))
        node.body = body
        return node

    def _nested(self, stmt):
        return self.generic_visit(stmt)

    def visit_Assert(self, node: ast.Assert):
        return self._record(node, required=False)

    def _record(self, node: ast.Assert, required: bool) -> ast.stmt:
        self.generic_visit(node)
        index = self.count
        self.count += 1
        if required:
            self.required.append(index)
        test = node.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
            left, right = test.left, test.comparators[0]
            for value_side, literal_side in ((left, right), (right, left)):
                try:
                    self.expected[index] = ast.literal_eval(literal_side)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    continue
                return self._call("__grpo_lit__", index, value_side, node)
            return self._call("__grpo_eq__", index, left, node, right)
        return self._call("__grpo_truth__", index, test, node)

    @staticmethod
    def _call(name: str, index: int, value, node, *more) -> ast.stmt:
        call = ast.Call(ast.Name(name, ast.Load()), [ast.Constant(index), value, *more], [])
        return ast.copy_location(ast.Expr(call), node)


# ---------------------------------------------------------------------------------------------
# Judging what came back

# Each benchmark's outputs compared as its own grader compares them (docs/sandbox.md has the table);
# where a grader accepts more than the task asks (APPS's unordered token sets, its first-element
# rule for call results), the rule here is stricter and says so.

def exact_output(got: str, expected: str) -> bool:
    """This project's own `tests` cases: the same lines, with line endings normalized, trailing
    spaces on each line and blank lines at either end ignored; nothing else (`101` is not
    `00000101`, `1.0` is not `1`)."""
    return _lines(got) == _lines(expected)


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    first = next((k for k, line in enumerate(lines) if line), len(lines))
    last = next((k for k in range(len(lines) - 1, first - 1, -1) if lines[k]), first - 1)
    return lines[first:last + 1]            # one slice: popping from the front is quadratic


def apps_output(got: str, expected: str) -> bool:
    """APPS (`input_output`), as its testing_util judges standard output: the whole text, or each
    line, with surrounding whitespace stripped; or the non-empty lines stripped; or one number per
    line, every one within numpy.allclose's tolerance (|a - b| <= 1e-8 + 1e-5 |b|). APPS's last
    fallbacks, which compare each line's tokens, and the lines, as unordered sets, are left out:
    they accept the right numbers in the wrong order."""
    lines = got.splitlines()
    want = expected.strip()
    if "\n".join(lines).strip() == want or "\n".join(x.strip() for x in lines).strip() == want:
        return True
    wanted = [x.strip() for x in expected.split("\n") if x]
    if [x.strip() for x in lines if x] == wanted:
        return True
    try:
        a = [float(x) for x in lines if x]
        b = [float(x) for x in wanted]
    except ValueError:
        return False
    return len(a) == len(b) and all(x == y or abs(x - y) <= 1e-8 + 1e-5 * abs(y)
                                    for x, y in zip(a, b))


_CC_INT = re.compile(r"[+-]?[0-9]+")
_CC_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)(e[+-]?[0-9]+)?|[+-]?(inf|infinity|nan)")


def codecontests_output(got: str, expected: str) -> bool:
    """CodeContests (`public_tests`, ...), as its tester compares outputs (OutputsMatch): the
    whitespace-separated tokens, lower-cased, must be equal; failing that, token by token, two
    32-bit integers must be equal, two numbers of which one is not such an integer must differ by
    less than 1e-5, and anything else must be the same text."""
    a, b = got.lower().split(), expected.lower().split()
    if a == b:
        return True
    return len(a) == len(b) and all(_cc_values_match(x, y) for x, y in zip(a, b))


def _cc_number(token: str):
    """(int or None, float or None) as the tester's SimpleAtoi and SimpleAtod read a token."""
    # the length first: the float pattern backtracks quadratically on a long run of digits
    whole = int(token) if len(token) < 12 and _CC_INT.fullmatch(token) else None
    if whole is not None and not -2**31 <= whole < 2**31:
        whole = None
    number = float(token) if len(token) < 400 and _CC_FLOAT.fullmatch(token) else None
    return whole, number


def _cc_values_match(x: str, y: str) -> bool:
    xi, xf = _cc_number(x)
    yi, yf = _cc_number(y)
    if (xi is None and xf is None) or (yi is None and yf is None):
        return x == y
    if xi is None or yi is None:
        return xf is not None and yf is not None and abs(xf - yf) < 1e-5
    return xi == yi


def livecodebench_output(got: str, expected: str) -> bool:
    """LiveCodeBench (`public_test_cases` stdin cases), as its grade_stdio compares: both texts
    stripped and split into lines, each line stripped; as many lines; each line equal, or its
    whitespace-separated tokens all decimal numbers with exactly the same values (Decimal)."""
    a = [x.strip() for x in got.strip().split("\n")]
    b = [x.strip() for x in expected.strip().split("\n")]
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        try:
            if [Decimal(t) for t in x.split()] != [Decimal(t) for t in y.split()]:
                return False
        except (InvalidOperation, ValueError):
            return False
    return True


def apps_value(got, expected) -> bool:
    """APPS call-based cases: tuples read as lists, dict keys as JSON's strings; an expected value
    stored wrapped in a one-element list also matches (APPS stores most of them so). APPS's own
    rule compares with the first element of any list, which a longer expected list would turn
    into a pass for a partial answer; here the list must hold exactly one element."""
    got = _as_json(got)
    return same(got, expected) or (isinstance(expected, list) and len(expected) == 1
                                   and same(got, expected[0]))


def livecodebench_value(got, expected) -> bool:
    """LiveCodeBench functional cases, as its grade_call_based compares: a tuple result reads as a
    list (at the top level only), then Python's == against the JSON value; no wrapping rule."""
    if type(got) is tuple:
        got = list(got)
    return same(got, expected)


def exact_value(got, expected) -> bool:
    """This project's own call cases: tuples read as lists, then Python's ==; no wrapping rule."""
    return same(_as_json(got), expected)


OUTPUT_RULES = {"apps": apps_output, "codecontests": codecontests_output,
                "livecodebench": livecodebench_output, "exact": exact_output}
VALUE_RULES = {"apps": apps_value, "livecodebench": livecodebench_value, "exact": exact_value,
               "codecontests": exact_value}


def _as_json(value):
    """Tuples as lists and mapping keys as JSON's strings, as a value would read back from JSON;
    values from the sandbox (harness.decode_unhashed) stay unbuilt."""
    if isinstance(value, (tuple, list)):
        return [_as_json(v) for v in value]
    if isinstance(value, dict):
        value = Unhashed("dict", list(value.items()))
    if type(value) is Unhashed and value.kind == "dict":
        return Unhashed("dict", [(k if isinstance(k, str) else json.dumps(k), _as_json(v))
                                 for k, v in value.items])
    return value


def result_payload(stdout: str, nonce: str) -> dict | None:
    """The harness's one result line, or None: missing, unreadable, or more than one (forged)."""
    lines = [line for line in stdout.split("\n") if line.startswith(nonce)]
    if len(lines) != 1:
        return None
    try:
        payload = json.loads(lines[0][len(nonce):])
    except (ValueError, RecursionError):
        return None
    return payload if isinstance(payload, dict) else None


def judge_tests(spec: TestSpec, payload: dict | None) -> tuple[int, int]:
    """(asserts passed, asserts counted) for a `tests` run; (0, n) on any sign of tampering or a
    payload of the wrong shape. A HumanEval `check`, or a test program whose asserts all sit in
    loops, branches or functions, counts as one test."""
    one_test = spec.check is not None or not spec.required
    total = 1 if one_test else len(spec.required)
    try:
        every, done = _outcomes(spec, payload)
    except Exception:  # noqa: BLE001 - a forged or malformed payload is the program's doing: 0
        return 0, total
    if every is None:
        return 0, total
    if one_test:
        passed = (done and not any(v is False for v in every)
                  and all(every[i] is True for i in spec.required) and any(v for v in every))
        return int(bool(passed)), 1
    if not done:
        return 0, total
    required = set(spec.required)
    if any(v is False for i, v in enumerate(every) if i not in required):
        return 0, total          # a nested assert failed: in Python the tests would have stopped
    return sum(every[i] is True for i in spec.required), total


def _outcomes(spec: TestSpec, payload) -> tuple[list | None, bool]:
    """Each assert: True (held), False (failed) or None (never ran); None for the whole run when
    it shows tampering. An assert against a literal counts only through the value it reported:
    a record of it as run-and-held is a forgery."""
    if not isinstance(payload, dict) or payload.get("flags"):
        return None, False
    lit, ran = payload.get("lit", {}), payload.get("ran", {})
    if not isinstance(lit, dict) or not isinstance(ran, dict):
        return None, False
    if any(int(key) in spec.expected for key in ran):
        return None, False
    every: list[bool | None] = []
    for index in range(spec.asserts):
        key = str(index)
        if index in spec.expected:
            if key not in lit:
                every.append(None)
                continue
            # compared as they came, never rebuilt as sets or dicts here (harness.same)
            values = [decode_unhashed(v) for v in lit[key]]
            every.append(bool(values) and all(same(v, spec.expected[index]) for v in values))
        elif key in ran:
            count, failed = ran[key]
            every.append(int(count) > 0 and int(failed) == 0)
        else:
            every.append(None)
    return every, payload.get("done") is True


# ---------------------------------------------------------------------------------------------
# The reward

def extract_code(completion: str) -> str:
    """The last fenced code block (```python or ```), else the whole completion."""
    blocks = extract_all_blocks(completion)
    return blocks[-1] if blocks else completion


@lru_cache(maxsize=4096)
def prompt_code(prompt: str) -> str:
    """The Python in a prompt, for HumanEval's signature and helpers, in the prompt's order:

    - the whole prompt, when it parses as a program with a definition or an import;
    - else every fenced block that does (a helper in one block, the signature in the next);
    - else every run of code in the text: from a line that starts a definition or an import (an
      import line only if it parses: "from the list below ..." is prose) up to the first line at the
      left margin that is not code, or a Markdown code block indented by four spaces, each cut back
      to its longest start that parses.

    The tests define these helpers themselves, so a program's own `encode_cyclic` never stands in
    for the prompt's; `undefined_helpers` names what the tests call that is not recovered."""
    if _defines_something(prompt):
        return prompt
    blocks = [b for b in extract_all_blocks(prompt) if _defines_something(b)]
    pieces = blocks or _code_runs(prompt.split("\n"))
    return "\n\n\n".join(piece.rstrip("\n") for piece in pieces) + "\n" if pieces else ""


_CODE_START = re.compile(r"(def|class|import|from|async def|@)[ \t(]")
# a line at the left margin that goes on with a run of code (prose such as "Rule 3: ..." ends it)
_CODE_LINE = re.compile(r"(def|class|import|from|async|if|elif|else|for|while|with|try|except|"
                        r"finally|return|raise|assert|pass|print)\b|[@#)\]}]|\"\"\"|'''|"
                        r"[A-Za-z_][\w.]*(\[[^\]]*\])?\s*(,\s*[A-Za-z_]\w*\s*)*(:[^=]*)?"
                        r"[-+*/%|&^]?=[^=]")
_INDENT = re.compile(r"    |\t")


def _starts_code(line: str) -> bool:
    if not _CODE_START.match(line):
        return False
    if line.startswith(("import", "from")) and not line.rstrip().endswith(("(", "\\")):
        return _parses(line)
    return True


def _code_runs(lines: list[str]) -> list[str]:
    """The runs of code in unfenced text, in order (see prompt_code); each run is one top-level
    definition or import (with its decorators and the code at the margin that follows it), so
    the parses it costs grow with the prompt's length, not its square."""
    pieces, i = [], 0
    while i < len(lines):
        indent = _INDENT.match(lines[i])
        if _starts_code(lines[i]):
            margin = ""
        elif indent and (i == 0 or not lines[i - 1].strip()) and _starts_code(lines[i][indent.end():]):
            margin = indent.group()      # a Markdown code block: indented, after a blank line
        else:
            i += 1
            continue
        run = [lines[i][len(margin):]]
        for line in lines[i + 1:]:
            if line.strip() and not line.startswith(margin):
                break
            line = line[len(margin):] if line.strip() else ""
            if line and line[0] not in " \t" and (not _CODE_LINE.match(line) or (
                    _starts_code(line) and not run[-1].startswith("@"))):
                break                    # prose at the margin, or the next definition
            run.append(line)
        cut = _longest_start_that_parses(run)
        if cut and _defines_something("\n".join(run[:cut])):
            pieces.append("\n".join(run[:cut]))
            i += cut
        else:
            i += 1
    return pieces


def _longest_start_that_parses(run: list[str], tries: int = 64) -> int:
    """How many of the run's first lines parse; each failure cuts at the line the parser names,
    so prose after the code costs a parse or two, not one per line."""
    cut = len(run)
    while cut and tries:
        tries -= 1
        try:
            ast.parse("\n".join(run[:cut]))
            return cut
        except SyntaxError as e:
            cut = min(cut - 1, (e.lineno or cut) - 1)
        except (ValueError, RecursionError, MemoryError):
            return 0
    return 0


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


@lru_cache(maxsize=4096)
def undefined_helpers(test: str, helpers: str, entry: str) -> tuple[str, ...]:
    """The names a HumanEval-style test program reads that neither it nor the prompt's code
    (`helpers`) defines, the entry point, builtins and standard-library modules aside: in the
    tests' process those would be the program's own, so the row cannot be scored honestly."""
    if re.search(r"import\s+\*", test + "\n" + helpers):
        return ()                          # a star import defines names no one can list
    try:
        read, bound = _names(test)
        bound |= _names(helpers)[1] if helpers else set()
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()                          # a test that does not parse is refused elsewhere
    known = bound | set(dir(builtins)) | {"exit", "quit", entry} | set(sys.stdlib_module_names)
    return tuple(sorted(n for n in read - known if not (n.startswith("__") and n.endswith("__"))))


def _names(source: str) -> tuple[set[str], set[str]]:
    """(names read from the module's globals, names the module binds), by `symtable`."""
    top = symtable.symtable(source, "<tests>", "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    read = {s.get_name() for s in top.get_symbols() if s.is_referenced()}
    tables = list(top.get_children())
    while tables:
        table = tables.pop()
        tables.extend(table.get_children())
        for symbol in table.get_symbols():
            if symbol.is_global():
                if symbol.is_referenced():
                    read.add(symbol.get_name())
                if symbol.is_declared_global() and symbol.is_assigned():
                    bound.add(symbol.get_name())
    return read, bound


def _defines_something(source: str) -> bool:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Import, ast.ImportFrom,
                              ast.ClassDef)) for n in tree.body)


def extract_all_blocks(text: str) -> list[str]:
    return [b.split("\n", 1)[1] if "\n" in b else "" for b in text.split("```")[1::2]]


class CodeTests:
    """Reward: 1 when the completion's program passes all of its row's tests, else 0 (or the
    fraction of tests passed with `partial_credit`). Formats: see the module's docstring."""

    def __init__(self, limits: Limits = Limits(), workers: int = 2, partial_credit: bool = False,
                 unsafe_code_execution: bool = False):
        self.limits, self.workers, self.partial_credit = limits, workers, partial_credit
        self.isolate = isolation_level() == "full"
        if not self.isolate and not unsafe_code_execution:
            raise RuntimeError("code_tests: this machine cannot isolate programs (it needs root for "
                               "namespaces and a user id of their own); set "
                               "unsafe_code_execution=true to run them anyway, unisolated")
        self.__name__ = "code_tests"

    def __call__(self, prompts: list[str], completions: list[str], **columns) -> list[float]:
        specs = []
        for i in range(len(completions)):
            row = {k: v[i] for k, v in columns.items()}
            specs.append(spec_from_row(row, f"code_tests, sample {i}"))
            if specs[-1].mode == "tests" and specs[-1].entry_point:
                missing = undefined_helpers(specs[-1].test, prompt_code(prompts[i]),
                                            specs[-1].entry_point)
                if missing:
                    raise CodeTestsError(
                        f"code_tests, sample {i}: the tests call {missing[0]!r}, which neither the "
                        f"tests nor the prompt define, so the program's own {missing[0]!r} would "
                        "be the one checked; put its code in the prompt (plain or in a ``` block) "
                        "or in the tests")
        with ThreadPoolExecutor(self.workers) as pool:
            # in the caller's context: the causes counted are its scope's (faults.py)
            return list(pool.map(faults.carried(self.score_one), prompts, completions, specs))

    def score_one(self, prompt: str, completion: str, spec: TestSpec) -> float:
        passed, total = self.run(prompt, completion, spec)
        if self.partial_credit:
            return passed / total
        return 1.0 if passed == total else 0.0

    def run(self, prompt: str, completion: str, spec: TestSpec) -> tuple[int, int]:
        """(tests passed, tests) for one completion."""
        code = extract_code(completion)
        nonce = secrets.token_hex(16)
        job = {"nonce": nonce, "mode": spec.mode, "code": code, "isolated": self.isolate,
               "all_cases": self.partial_credit}
        deadline = self.limits.timeout_s
        read_cap = self.limits.output_kb << 10
        if spec.mode == "tests":
            # the program's process decides whether the code continues the prompt's signature
            helpers = prompt_code(prompt) if spec.entry_point else ""
            job.update(test=spec.test, check=spec.check, entry_point=spec.entry_point,
                       helpers=helpers, completion=completion,
                       lit_caps={str(i): _sized(v) for i, v in spec.expected.items()})
            read_cap = max(read_cap, 8 << 20)
        elif spec.mode == "calls":
            job.update(fn_name=spec.fn_name, calls=spec.inputs)
            read_cap = sum(_sized(o) for o in spec.outputs) + 65536
        else:
            cap = [2 * len(o.encode()) + 4096 for o in spec.outputs]
            job.update(inputs=spec.inputs, timeout_s=self.limits.timeout_s, output_cap=max(cap))
            deadline = self.limits.timeout_s * len(spec.inputs) + 2.0
            # the result line escapes each byte of output into at most 6 characters (a control
            # character as \u0001, an emoji's 4 bytes as two 6-character escapes)
            read_cap = max(read_cap, 6 * sum(cap) + 65536)
        out = run_program(job, limits=self.limits, isolate=self.isolate, deadline_s=deadline,
                          read_cap=read_cap)
        payload = None if out.timed_out else result_payload(out.stdout, nonce)
        if out.timed_out:
            faults.count("code_tests", "timeout")
        elif payload is None:
            faults.count("code_tests", "no_result")
        elif payload.get("flags"):
            faults.count("code_tests", "rejected")
        if spec.mode == "tests":
            return judge_tests(spec, payload)
        return judge_cases(spec, payload)


def _sized(expected) -> int:
    """How many bytes of a returned value's encoding to take for one compared with `expected`: a
    right one is about the size of `expected`'s own (a tuple is a tagged list, a key a pair), so
    four times that and 4 KiB; a flood far past it would cost the trainer time to read."""
    try:
        return 4 * len(json.dumps(encode(expected))) + 4096
    except (NotPlain, RecursionError, ValueError, TypeError):
        return 8 << 20


def judge_cases(spec: TestSpec, payload: dict | None) -> tuple[int, int]:
    """(cases passed, cases) for a `stdio` or `calls` run, each compared by the row's benchmark's
    rule; a returned value is compared as it came (harness.same), never rebuilt."""
    results = (payload or {}).get("results", [])
    if not isinstance(results, list):
        return 0, len(spec.outputs)
    if any(isinstance(r, dict) and r.get("cut") for r in results):
        faults.count("code_tests", "output_too_long")
    passed = 0
    compare = OUTPUT_RULES[spec.grader] if spec.mode == "stdio" else VALUE_RULES[spec.grader]
    for k, expected in enumerate(spec.outputs):
        got = results[k] if k < len(results) and isinstance(results[k], dict) else {}
        try:
            if spec.mode == "stdio":
                # output that hit the cap fails: what was cut off could be anything
                passed += (isinstance(got.get("out"), str) and "cut" not in got
                           and compare(got["out"], expected))
            elif "value" in got:
                passed += compare(decode_unhashed(got["value"]), expected)
        except Exception:  # noqa: BLE001 - a malformed value, or one that cannot be compared
            faults.count("code_tests", "malformed_result")
    return passed, len(spec.outputs)


_DEFAULT: CodeTests | None = None


def code_tests(prompts: list[str], completions: list[str], **columns) -> list[float]:
    """1.0 when the completion's program passes every test of its row, else 0.0, run in the
    sandbox with the default limits (docs/sandbox.md). The tests are read from the row's columns:
    `tests`, HumanEval's `test` + `entry_point`, MBPP's `test_list`, APPS's `input_output`, ...
    For other limits, workers or partial credit, build `CodeTests(...)` yourself."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = CodeTests()
    return _DEFAULT(prompts, completions, **columns)
