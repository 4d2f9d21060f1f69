"""Tools a policy can call in an episode: any Python function with type hints and a docstring.

A tool's JSON schema (the shape chat templates take in `apply_chat_template(..., tools=...)`) comes
from its signature and docstring; a parameter whose type cannot be said in JSON stops the run at
start, naming it. Calls are found in what the model wrote by a parser:

- `hermes` (Qwen2.5, Hermes, many instruct models): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
  results go back as `<tool_response>...</tool_response>` (or through the chat template's `tool` role);
- `plain` (the tiny models and the demo): `<call>NAME ARGUMENTS</call>`, ARGUMENTS a JSON object, or
  the text itself for a tool of one parameter; results go back as `<result>...</result>`.

Tools are user code: every call runs with a deadline; an exception, a bad call or an overrun
becomes the text the model sees as the result, and is counted. The deadline is kept by killing a
process, as `Tool.runs` says:

- `process`: a function at the top level of an importable module (the built-in calculator, a
  `module:function`) runs in a worker process of its own (sandbox/pool.py), killed and replaced
  at the deadline. A thread could not be stopped, and one that computes in C (`9**99**99`) holds
  the interpreter's lock: the trainer itself would stall;
- `itself`: a tool that runs its work in a process it kills at the deadline it is given (the
  built-in `python`, whose program runs in the code sandbox);
- `thread`: what a fresh process cannot import by name, as it shares state with the trainer (an
  environment's method, bound to its episode; a closure; a function of the script being run):
  a thread, which the episode leaves behind at the deadline, as it does an environment's `step`.
  Keep such tools short, or make them module-level functions.

Built-ins: `calculator` (arithmetic, no names, no calls, results of bounded size) and `python` (a
program in the code sandbox, its output capped).

Longer than about 400 lines: the tool contract (a schema from a signature), the built-in tools and
their deadline runner.
"""

from __future__ import annotations

import ast
import inspect
import json
import atexit
import math
import operator
import re
import sys
import threading
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

from grpo.rewards import faults
from grpo.rewards.answers import tagged
from grpo.sandbox.usercode import user_object


class ToolError(ValueError):
    """A tool that cannot be offered to the model; the message names it and the parameter."""


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable
    schema: dict                        # {"type": "function", "function": {name, description, parameters}}
    runs: str = "thread"                # how a call keeps its deadline: process | itself | thread

    @property
    def parameters(self) -> list[str]:
        return list(self.schema["function"]["parameters"]["properties"])


_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean"}


def _json_type(hint, where: str) -> dict:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    if origin in (list, tuple) or hint in (list, tuple):
        return {"type": "array", **({"items": _json_type(args[0], where)} if args else {})}
    if origin is dict or hint is dict:
        return {"type": "object"}
    if origin is typing.Literal:
        return {"type": _JSON_TYPES.get(type(args[0]), "string"), "enum": list(args)}
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        kinds = [a for a in args if a is not type(None)]
        if len(kinds) == 1:
            return {**_json_type(kinds[0], where), "nullable": True}
    raise ToolError(f"{where}: type {hint!r} has no JSON schema; use int, float, str, bool, list, "
                    "dict, Literal or Optional of these")


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """The description (first paragraph) and parameter descriptions from an `Args:` section."""
    doc = inspect.cleandoc(doc or "")
    description = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    params: dict[str, str] = {}
    match = re.search(r"^(?:Args|Arguments|Parameters):\s*\n(.*?)(?:\n\s*\n|\Z)", doc, re.S | re.M)
    if match:
        for line in match.group(1).splitlines():
            m = re.match(r"\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)", line)
            if m:
                params[m.group(1)] = m.group(2).strip()
    return description, params


def make_tool(fn: Callable, name: str | None = None) -> Tool:
    """A Tool from a function (or bound method) with type hints and a docstring."""
    name = name or getattr(fn, "__name__", None) or type(fn).__name__
    where = f"tool '{name}'"
    if not (fn.__doc__ or "").strip():
        raise ToolError(f"{where}: it has no docstring; the model is told what a tool does from "
                        "its docstring's first paragraph")
    description, param_docs = _docstring_parts(fn.__doc__)
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:  # noqa: BLE001 - an unresolvable annotation
        raise ToolError(f"{where}: its type hints cannot be read ({e})") from None
    properties, required = {}, []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ToolError(f"{where}: parameter '{p.name}' is *args or **kwargs, which a JSON "
                            "schema cannot describe; name each parameter")
        if p.name not in hints:
            raise ToolError(f"{where}: parameter '{p.name}' has no type hint")
        properties[p.name] = {**_json_type(hints[p.name], f"{where}, parameter '{p.name}'"),
                              **({"description": param_docs[p.name]} if p.name in param_docs else {})}
        if p.default is p.empty:
            required.append(p.name)
    schema = {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required}}}
    return Tool(name, fn, schema, how_it_runs(fn))


def how_it_runs(fn: Callable) -> str:
    """`itself` for a tool with a `call_with_deadline(deadline_s, **arguments)`; `process` for a
    function a fresh interpreter finds by its module and name; else `thread` (module docstring)."""
    if callable(getattr(fn, "call_with_deadline", None)):
        return "itself"
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not inspect.isfunction(fn) or module in (None, "__main__") or "<" in qualname:
        return "thread"
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return "process" if found is fn else "thread"


# ---------------------------------------------------------------------------------------------
# Calls in what the model wrote

@dataclass
class Call:
    name: str
    arguments: dict = field(default_factory=dict)
    error: str | None = None            # a malformed call: what was wrong, told to the model


def parse_hermes(text: str, tools: dict[str, Tool]) -> list[Call]:
    calls = []
    for body in tagged(text, "<tool_call>", "</tool_call>"):
        try:
            data = json.loads(body.strip())
            name, arguments = data["name"], data.get("arguments", {})
            if isinstance(arguments, str):
                arguments = json.loads(arguments)
            if not isinstance(arguments, dict):
                raise ValueError("arguments must be a JSON object")
            calls.append(Call(str(name), arguments))
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            calls.append(Call("", error=f"malformed tool call ({type(e).__name__}: {e}); write "
                                         '<tool_call>{"name": ..., "arguments": {...}}</tool_call>'))
    return calls


def parse_plain(text: str, tools: dict[str, Tool]) -> list[Call]:
    calls = []
    for body in tagged(text, "<call>", "</call>"):
        name, _, rest = body.strip().partition(" ")
        rest = rest.strip()
        tool = tools.get(name)
        if rest.startswith("{"):
            try:
                arguments = json.loads(rest)
                if not isinstance(arguments, dict):
                    raise ValueError("not an object")
                calls.append(Call(name, arguments))
                continue
            except (ValueError, RecursionError):
                pass
        if tool is not None and len(tool.parameters) == 1:
            calls.append(Call(name, {tool.parameters[0]: rest}))
        elif tool is not None and not tool.parameters and not rest:
            calls.append(Call(name, {}))
        elif tool is None:
            calls.append(Call(name))          # unknown: said so when it runs
        else:
            calls.append(Call(name, error=f"malformed call of {name}: give its arguments as a JSON "
                                          f"object with {tool.parameters}"))
    return calls


@dataclass(frozen=True)
class CallFormat:
    parse: Callable[[str, dict], list[Call]]
    stop: str                             # a turn that ends with this string ends in a call
    result: Callable[[str], str]          # how a result is shown to the model
    answer: Callable[[list[str]], str] | None = None   # all of a turn's results at once

    def answer_of(self, results: list[str]) -> str:
        """The text that answers a turn with these results."""
        if self.answer is not None:
            return self.answer(results)
        return "".join(self.result(r) for r in results)


_MARK = "\u2063{}\u2063"    # invisible separators around placeholders: found, never confused


def templated(fmt: CallFormat, tokenizer) -> CallFormat:
    """`fmt` with results rendered by the tokenizer's chat template as `tool` messages: what
    follows the assistant's turn in a conversation [user, assistant, tool...] with the generation
    prompt (for Qwen2.5: `<|im_end|>` then a user turn of `<tool_response>` blocks, then the
    assistant's header). `fmt` unchanged when the template has no tool role."""
    def render(results: list[str]) -> str | None:
        messages = [{"role": "user", "content": _MARK.format("u")},
                    {"role": "assistant", "content": _MARK.format("a")}]
        messages += [{"role": "tool", "content": r} for r in results]
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception:    # noqa: BLE001 - a template without a tool role: the inline format
            return None
        mark = _MARK.format("a")
        if mark not in text or not all(r in text for r in results):
            return None
        return text[text.index(mark) + len(mark):]

    if not getattr(tokenizer, "chat_template", None) or render(["x"]) is None:
        return fmt
    return CallFormat(fmt.parse, fmt.stop, fmt.result,
                      lambda results: render(results) or "".join(fmt.result(r) for r in results))


FORMATS = {
    "hermes": CallFormat(parse_hermes, "</tool_call>",
                         lambda r: f"\n<tool_response>\n{r}\n</tool_response>\n"),
    "plain": CallFormat(parse_plain, "</call>", lambda r: f"<result>{r}</result>"),
}


# ---------------------------------------------------------------------------------------------
# Running a call

@dataclass
class Outcome:
    text: str                # what the model sees
    failed: bool             # raised, timed out, unknown tool, malformed call
    kind: str = "ok"         # ok | error | timeout | unknown | malformed
    images: tuple = ()       # PIL images the result holds, each at an IMAGE_MARK in `text`


IMAGE_MARK = "\u2063image\u2063"     # where a result's image goes (invisible separators around it)


def is_image(value) -> bool:
    return hasattr(value, "convert") and hasattr(value, "size") and not isinstance(value, (str, bytes))


def run_call(call: Call, tools: dict[str, Tool], deadline_s: float, max_chars: int = 2000) -> Outcome:
    """Run one call with a deadline; every failure becomes an Outcome the model reads."""
    if call.error:
        return Outcome(f"error: {call.error}", True, "malformed")
    tool = tools.get(call.name)
    if tool is None:
        return Outcome(f"error: unknown tool '{call.name}'; the tools are {sorted(tools)}", True,
                       "unknown")
    try:
        inspect.signature(tool.fn).bind(**call.arguments)
    except TypeError as e:
        return Outcome(f"error: TypeError: {e}"[:max_chars], True, "error")
    kind, value = _RUNNERS[tool.runs](tool, call.arguments, deadline_s)
    if kind == "timeout":
        return Outcome(f"error: {value or f'{call.name} did not answer within {deadline_s:g} s'}",
                       True, "timeout")
    if kind != "ok":
        return Outcome(f"error: {value}"[:max_chars], True, "error")
    parts = list(value) if isinstance(value, (list, tuple)) and any(map(is_image, value)) else [value]
    images = tuple(p for p in parts if is_image(p))
    if images:      # a picture (a chart, a rendered board) reaches a vision model as image tokens
        text = "".join(IMAGE_MARK if is_image(p) else p if isinstance(p, str) else json.dumps(p, default=str)
                       for p in parts)
        return Outcome(text, False, images=images)
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n[cut at {max_chars:,} characters]"
    return Outcome(text, False)


_POOLS: dict[str, tuple[Any, threading.Lock]] = {}    # tool target -> its worker, one at a time
_POOLS_LOCK = threading.Lock()


def _close_pools() -> None:
    for pool, _ in _POOLS.values():
        pool.close()


def _in_process(tool: Tool, arguments: dict, deadline_s: float) -> tuple[str, Any]:
    from grpo.sandbox.pool import DeadlinePool
    target = f"{tool.fn.__module__}:{tool.fn.__qualname__}"
    with _POOLS_LOCK:
        if target not in _POOLS:
            if not _POOLS:
                atexit.register(_close_pools)
            _POOLS[target] = (DeadlinePool(tool.fn, workers=1, deadline_s=deadline_s),
                              threading.Lock())
        pool, lock = _POOLS[target]
    with lock:
        try:
            kind, value = pool.run([((), arguments)], deadline_s=deadline_s)[0]
        except RuntimeError as e:             # its worker cannot import it
            return "error", f"{tool.name} could not be started ({e})"
    if kind in ("cpu", "died"):
        return "error", f"{tool.name} stopped without an answer (its process died)"
    return kind, value


class ToolFailed(Exception):
    """Raised by a tool that keeps its own deadline (Tool.runs = "itself") when its call failed: the
    message is what the model reads after "error: ", and the call counts as failed, of `kind`."""
    kind = "error"


class ToolTimedOut(ToolFailed):
    kind = "timeout"


def _by_itself(tool: Tool, arguments: dict, deadline_s: float) -> tuple[str, Any]:
    try:
        return "ok", tool.fn.call_with_deadline(deadline_s, **arguments)
    except ToolFailed as e:
        return e.kind, str(e)
    except Exception as e:  # noqa: BLE001 - a tool may raise anything
        return "error", f"{type(e).__name__}: {e}"


def _in_thread(tool: Tool, arguments: dict, deadline_s: float) -> tuple[str, Any]:
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = tool.fn(**arguments)
        except BaseException as e:  # noqa: BLE001 - user code may raise anything
            box["error"] = f"{type(e).__name__}: {e}"

    worker = threading.Thread(target=faults.carried(target), daemon=True,
                              name=f"tool-{tool.name}")   # in the caller's context (faults.py)
    worker.start()
    worker.join(deadline_s)
    if worker.is_alive():     # it keeps its (daemon) thread; the episode moves on without it
        return "timeout", None
    return ("error", box["error"]) if "error" in box else ("ok", box.get("value"))


_RUNNERS = {"process": _in_process, "itself": _by_itself, "thread": _in_thread}


# ---------------------------------------------------------------------------------------------
# Built-in tools

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
        ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


MAX_EXPRESSION_CHARS = 1000
MAX_RESULT_DIGITS = 1000


def _result_bits(op: type, left, right) -> float:
    """An upper bound on the bits of `left op right` for integers (0 for the other operations and
    types, whose cost does not grow with their values: a float overflows instead)."""
    if type(left) is not int or type(right) is not int:
        return 0.0
    if op is ast.Pow and right > 0 and abs(left) > 1:
        return math.inf if right.bit_length() > 64 else right * math.log2(abs(left)) + 1
    if op is ast.Mult:
        return left.bit_length() + right.bit_length()
    return 0.0


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / // % ** and parentheses.

    Args:
        expression: the expression, such as 3847 * 29 or (2 + 3) ** 2
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression has {len(expression):,} characters; the calculator "
                         f"takes at most {MAX_EXPRESSION_CHARS:,}")
    max_bits = MAX_RESULT_DIGITS * math.log2(10)

    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = value(node.left), value(node.right)
            bits = _result_bits(type(node.op), left, right)
            if bits > max_bits:      # refused before it is computed: a big power holds the CPU
                about = f" (about {bits / math.log2(10):,.0f})" if math.isfinite(bits) else ""
                raise ValueError(f"the result of {ast.unparse(node)[:60]} would have more than "
                                 f"{MAX_RESULT_DIGITS:,} digits{about}; the calculator refuses "
                                 "to compute it")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError(f"not arithmetic: {ast.unparse(node)[:60]}")
    result = value(ast.parse(expression.strip(), mode="eval").body)
    if isinstance(result, float) and result.is_integer() and abs(result) < 2 ** 53:
        result = int(result)
    return str(result)


def python_tool(limits=None, isolate: bool | None = None) -> Callable:
    """The `python` tool: run a program in the code sandbox (sandbox/isolate.py), with the same
    isolation and limits; what it prints comes back, cut at `limits.output_kb`. It keeps its own
    deadline: the sandbox kills the program's process tree (Tool.runs = "itself")."""
    from grpo.sandbox.isolate import Limits, isolation_level, run_program
    limits = limits or Limits(timeout_s=5.0, output_kb=8)
    isolated = isolation_level() == "full" if isolate is None else isolate
    cap = limits.output_kb << 10

    def run(code: str, deadline_s: float) -> str:
        timeout_s = min(limits.timeout_s, deadline_s)
        job = {"nonce": "\x00", "mode": "stdio", "code": code, "inputs": [""],
               "timeout_s": timeout_s, "output_cap": cap, "isolated": isolated}
        # The program's output is cut at `cap` bytes inside the sandbox; what comes back is the
        # result line that holds it, JSON-escaped (up to 6 bytes a byte: \u0000, \ufffd), so the
        # read cap leaves room for that and never cuts the line itself.
        out = run_program(job, limits=limits, isolate=isolated, deadline_s=timeout_s + 2,
                          read_cap=6 * cap + 4096)
        # A program that ran out of time, crashed or could not be run is a failed call, counted by
        # its kind (episode/tool_failure_rate), as a Python tool that raises is.
        if out.timed_out:
            raise ToolTimedOut(f"the program did not finish within {timeout_s:g} s")
        lines = [line for line in out.stdout.split("\n") if line.startswith("\x00")]
        try:
            result = json.loads(lines[-1][1:])["results"][0]
        except (IndexError, KeyError, ValueError):
            raise ToolFailed("the program could not be run") from None
        if result.get("error") == "timeout":
            raise ToolTimedOut(f"the program did not finish within {timeout_s:g} s")
        if "out" not in result:
            raise ToolFailed(result.get("error", "failed"))
        return result["out"] + (f"\n[output cut at {limits.output_kb} KiB]" if result.get("cut") else "")

    def python(code: str) -> str:
        """Run a Python program and return what it prints (standard library only, no network).

        Args:
            code: the program
        """
        try:
            return run(code, limits.timeout_s)
        except ToolFailed as e:        # called directly: the text a call would read
            return f"error: {e}"

    python.call_with_deadline = lambda deadline_s, code: run(code, deadline_s)
    return python


BUILTIN_TOOLS: dict[str, Callable[[], Callable]] = {
    "calculator": lambda: calculator,
    "python": python_tool,
}


def resolve_tools(specs: list) -> dict[str, Tool]:
    """Tools by name: built-ins, `module:function` (the module found in the working directory
    first, as a reward's is) or `file.py:function` (sandbox/usercode.py), or callables (from
    Python)."""
    tools: dict[str, Tool] = {}
    for spec in specs:
        if callable(spec):
            tool = make_tool(spec)
        elif spec in BUILTIN_TOOLS:        # a built-in is made by its factory, and keeps its name
            tool = make_tool(BUILTIN_TOOLS[spec](), spec)
        else:
            tool = make_tool(user_object(spec, BUILTIN_TOOLS, what="tool", error=ToolError))
        if tool.name in tools:
            raise ToolError(f"two tools are named '{tool.name}'")
        tools[tool.name] = tool
    return tools
