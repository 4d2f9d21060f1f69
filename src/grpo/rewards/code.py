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
"""

from __future__ import annotations

import ast
import json
import re
import secrets
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

from grpo.rewards.harness import decode
from grpo.rewards.sandbox import Limits, isolation_level, run_program


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
    imports: tuple = ()                        # tests: modules the tests use (guarded from patching)
    fn_name: str = ""                          # calls: the function's name
    inputs: list = field(default_factory=list)     # stdio: input texts; calls: argument lists
    outputs: list = field(default_factory=list)    # stdio: expected texts; calls: expected values


# ---------------------------------------------------------------------------------------------
# Reading a row's tests

_BENCHMARK_COLUMNS = ("tests", "test", "test_list", "input_output", "public_tests", "private_tests",
                      "generated_tests", "public_test_cases", "private_test_cases")
_CASE_COLUMNS = _BENCHMARK_COLUMNS[4:]


def spec_from_row(row: dict, where: str = "row") -> TestSpec:
    """The TestSpec for a row's columns (see the module's table); CodeTestsError names `where`."""
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
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise CodeTestsError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    return value


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
    used = _modules_used(test)
    return TestSpec("tests", test=test, check="check" if defines_check else None, entry_point=entry,
                    expected=rewritten.expected, required=tuple(rewritten.required),
                    asserts=rewritten.count, imports=tuple(sorted(used)))


def _modules_used(source: str) -> set[str]:
    """Standard-library modules a program imports or names (as `math.isclose`)."""
    tree, names = ast.parse(source), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Name):
            names.add(node.id)
    return {n for n in names if n in sys.stdlib_module_names}


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

def same_output(got: str, expected: str) -> bool:
    """Standard output against the expected text, as APPS, CodeContests and LiveCodeBench judge it:
    line endings are normalized, trailing spaces on each line and blank lines at either end are
    ignored; failing that, the two are compared token by token (split on any whitespace), where
    two numeric tokens match when they are the same decimal number (`1.0` and `1`; no tolerance)."""
    if _lines(got) == _lines(expected):
        return True
    a, b = got.split(), expected.split()
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x != y:
            try:
                if Decimal(x) != Decimal(y):
                    return False
            except (InvalidOperation, ValueError):
                return False
    return True


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return lines


def same_value(got, expected) -> bool:
    """A call's result against the expected JSON value (APPS, LiveCodeBench): tuples read as lists,
    and an expected value wrapped in a one-element list also matches, as APPS stores them."""
    got = _as_json(got)
    return got == expected or [got] == expected


def _as_json(value):
    if isinstance(value, (tuple, list)):
        return [_as_json(v) for v in value]
    if isinstance(value, dict):
        return {k if isinstance(k, str) else json.dumps(k): _as_json(v) for k, v in value.items()}
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
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError):
        return 0, total
    if every is None:
        return 0, total
    if one_test:
        passed = (done and not any(v is False for v in every)
                  and all(every[i] is True for i in spec.required) and any(v for v in every))
        return int(bool(passed)), 1
    if not done:
        return 0, total
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
            values = [decode(v) for v in lit[key]]
            every.append(bool(values) and all(_equal(v, spec.expected[index]) for v in values))
        elif key in ran:
            count, failed = ran[key]
            every.append(int(count) > 0 and int(failed) == 0)
        else:
            every.append(None)
    return every, payload.get("done") is True


def _equal(got, expected) -> bool:
    try:
        return bool(got == expected)
    except Exception:  # noqa: BLE001 - comparing odd literals
        return False


# ---------------------------------------------------------------------------------------------
# The reward

def extract_code(completion: str) -> str:
    """The last fenced code block (```python or ```), else the whole completion."""
    blocks = [b.split("\n", 1)[1] if "\n" in b else "" for b in completion.split("```")[1::2]]
    return blocks[-1] if blocks else completion


def prompt_code(prompt: str) -> str:
    """The Python in a prompt, for HumanEval's signature and helpers: the whole prompt when it
    parses as a program with a definition or an import, else its last fenced block that does."""
    for candidate in [prompt] + extract_all_blocks(prompt)[::-1]:
        try:
            tree = ast.parse(candidate)
        except (SyntaxError, ValueError):
            continue
        if any(isinstance(n, (ast.FunctionDef, ast.Import, ast.ImportFrom, ast.ClassDef))
               for n in tree.body):
            return candidate
    return ""


def extract_all_blocks(text: str) -> list[str]:
    return [b.split("\n", 1)[1] if "\n" in b else "" for b in text.split("```")[1::2]]


def _defines(code: str, name: str) -> bool:
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return bool(re.search(rf"^\s*def\s+{re.escape(name)}\s*\(", code, re.MULTILINE))
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name
               for n in tree.body) or any(isinstance(n, ast.Assign) and any(
                   isinstance(t, ast.Name) and t.id == name for t in n.targets) for n in tree.body)


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
        with ThreadPoolExecutor(self.workers) as pool:
            return list(pool.map(self.score_one, prompts, completions, specs))

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
            helpers = prompt_code(prompt) if spec.entry_point else ""
            if spec.entry_point and helpers and not _defines(code, spec.entry_point):
                code = helpers + "\n" + completion          # a base model continuing the signature
            job.update(code=code, test=spec.test, check=spec.check, entry_point=spec.entry_point,
                       helpers=helpers, imports=list(spec.imports))
            read_cap = max(read_cap, 8 << 20)
        elif spec.mode == "calls":
            job.update(fn_name=spec.fn_name, calls=spec.inputs)
            read_cap = max(read_cap, 8 << 20)
        else:
            cap = [2 * len(o.encode()) + 4096 for o in spec.outputs]
            job.update(inputs=spec.inputs, timeout_s=self.limits.timeout_s, output_cap=max(cap))
            deadline = self.limits.timeout_s * len(spec.inputs) + 2.0
            read_cap = max(read_cap, sum(cap) + 65536)
        out = run_program(job, limits=self.limits, isolate=self.isolate, deadline_s=deadline,
                          read_cap=read_cap)
        payload = None if out.timed_out else result_payload(out.stdout, nonce)
        if spec.mode == "tests":
            return judge_tests(spec, payload)
        results = (payload or {}).get("results", [])
        if not isinstance(results, list):
            return 0, len(spec.outputs)
        passed = 0
        for k, expected in enumerate(spec.outputs):
            got = results[k] if k < len(results) else {}
            try:
                if spec.mode == "stdio":
                    passed += isinstance(got["out"], str) and same_output(got["out"], expected)
                else:
                    passed += same_value(decode(got["value"]), expected)
            except (ValueError, TypeError, KeyError, RecursionError):
                pass
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
