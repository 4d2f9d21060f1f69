"""The program that runs inside the sandbox, as the sandbox user, and runs a completion's code
against its tests. It uses the standard library only: the trainer sends its source to a fresh
`python -I -S -c` (see sandbox.py) with one JSON line on standard input (the job).

Three modes, chosen by the trainer from the row's test format (code.py):

- `stdio`: every case in a forked child of this process, its input on fd 0 and its output to a
  file; this process never runs the completion's code, collects each case's output and exit status
  and sends them back; the trainer compares them with the expected outputs, which never come here.
- `calls`: the completion's code once, then its function on each argument list; the results go
  back as plain values and are compared in the trainer.
- `tests`: the completion's code in its own namespace, then the dataset's test program (a
  HumanEval `check(candidate)` or MBPP asserts) in a fresh namespace with a private copy of the
  builtins, the completion's functions wrapped. The trainer has rewritten every `assert` into a
  call that records it: an `assert X == LITERAL` sends only X (the literal stays in the trainer);
  other asserts record whether they held. Checks made here on what the program could have tampered
  with set flags; any flag scores 0.

Results leave on a duplicate of the original stdout, once, as one line that starts with a nonce
the trainer chose; the program's own stdout goes to /dev/null (tests, calls) or to a file (stdio).
"""

import builtins
import io
import json
import os
import sys

_BUILTIN_TYPES = (bool, int, float, complex, str, bytes, type(None), list, tuple, set, frozenset, dict)


class NotPlain(Exception):
    """A value whose type is not one of the plain built-in types (so its `==` cannot be trusted)."""


def encode(value, depth=0, _type=type, _dict_items=dict.items):
    """A plain value as JSON-able data, tagged so a tuple, a set and a dict survive the trip:
    lists stay lists; {"t": [..]} tuple, {"s": [..]} set, {"d": [[k, v], ..]} dict,
    {"c": [re, im]} complex, {"b": hex} bytes, {"f": "inf"|"-inf"|"nan"} non-finite float,
    {"q": [..]} collections.deque. Any other type (a subclass of int with its own `__eq__`, a
    generator, an instance of the program's own class) raises NotPlain."""
    if depth > 100:
        raise NotPlain("nested more than 100 deep")
    t = _type(value)
    if t is bool or t is int or t is str or value is None:
        return value
    if t is float:
        if value != value or value in (float("inf"), float("-inf")):
            return {"f": repr(value)}
        return value
    if t is list:
        return [encode(v, depth + 1) for v in value]
    if t is tuple:
        return {"t": [encode(v, depth + 1) for v in value]}
    if t is set or t is frozenset:
        items = [encode(v, depth + 1) for v in value]
        return {"s": sorted(items, key=lambda e: json.dumps(e, sort_keys=True))}
    if t is dict or t.__module__ == "collections" and t.__name__ in ("OrderedDict", "defaultdict",
                                                                     "Counter"):
        pairs = [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in _dict_items(value)]
        return {"d": sorted(pairs, key=lambda e: json.dumps(e[0], sort_keys=True))}
    if t is complex:
        return {"c": [value.real, value.imag]}
    if t is bytes:
        return {"b": value.hex()}
    if t.__module__ == "collections" and t.__name__ == "deque":
        return {"q": [encode(v, depth + 1) for v in value]}
    raise NotPlain(f"a value of type {t.__module__}.{t.__qualname__}")


def decode(data):
    """The inverse of `encode`, building fresh built-in objects."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    (tag, body), = data.items()
    if tag == "t":
        return tuple(decode(v) for v in body)
    if tag == "s":
        return frozenset(decode(v) for v in body)
    if tag == "d":
        return {decode(k): decode(v) for k, v in body}
    if tag == "c":
        return complex(*body)
    if tag == "b":
        return bytes.fromhex(body)
    if tag == "f":
        return float(body)
    if tag == "q":
        import collections
        return collections.deque(decode(v) for v in body)
    raise ValueError(f"unknown tag {tag!r}")


def _threads():
    """Threads of this process; a joined thread may take a moment to leave /proc, so wait up to
    0.1 s for the count to fall to 1 (a thread that lingers on is still there after it)."""
    import time
    for _ in range(50):
        try:
            count = len(os.listdir("/proc/self/task"))
        except OSError:
            import threading
            count = threading.active_count()
        if count == 1:
            return 1
        time.sleep(0.002)
    return count


class Guard:
    """What the program must not change: the builtins, the modules the tests use, the tests' own
    namespace; no trace or profile function; no second thread."""

    SKIP = {"sys": {"stdout", "stderr", "stdin", "last_type", "last_value", "last_traceback",
                    "last_exc"}}

    def __init__(self, module_names):
        self.flags = []
        self.modules = [sys.modules[n] for n in module_names if n in sys.modules]
        self.snapshots = [(m, {k: v for k, v in vars(m).items()
                               if k not in self.SKIP.get(m.__name__, ())}) for m in self.modules]
        self.namespaces = []

    def watch(self, namespace):
        """Also guard `namespace` (the tests') and its private builtins during the program's calls:
        the tests may rebind their own names, the program may not."""
        self.namespaces = [namespace]
        if isinstance(namespace.get("__builtins__"), dict):
            self.namespaces.append(namespace["__builtins__"])

    def before_call(self):
        return [dict(n) for n in self.namespaces]

    def check(self, when, before=()):
        if self.flags:
            return
        for module, snapshot in self.snapshots:
            if sys.modules.get(module.__name__) is not module:
                self.flags.append(f"sys.modules[{module.__name__!r}] was replaced {when}")
                return
            now = vars(module)
            for key, value in snapshot.items():
                if now.get(key, self) is not value:
                    self.flags.append(f"{module.__name__}.{key} was replaced {when}")
                    return
        for namespace, snapshot in zip(self.namespaces, before):
            if namespace.keys() != snapshot.keys() or any(
                    namespace[k] is not v for k, v in snapshot.items()):
                self.flags.append(f"the tests' names were changed {when}")
                return
        if sys.gettrace() is not None or sys.getprofile() is not None:
            self.flags.append(f"a trace or profile function was set {when}")
        elif getattr(sys, "monitoring", None) is not None and any(
                sys.monitoring.get_tool(i) is not None for i in range(6)):
            self.flags.append(f"a monitoring tool was registered {when}")
        elif _threads() > 1:
            self.flags.append(f"a thread was started {when}")


def _wrap(fn, guard, name):
    """The program's callable as the tests see it: every result must be a plain value, and the
    guard looks for tampering after every call."""
    def candidate(*args, **kwargs):
        before = guard.before_call()
        result = fn(*args, **kwargs)
        guard.check(f"during a call of {name}", before)
        try:
            encode(result)
        except NotPlain as e:
            guard.flags.append(f"{name} returned {e}")
            raise
        except RecursionError:
            guard.flags.append(f"{name} returned a self-referencing value")
            raise
        return result
    candidate.__name__ = candidate.__qualname__ = name
    candidate.__doc__ = getattr(fn, "__doc__", None)
    return candidate


def _add_exit_names():
    """`exit` and `quit` as a normal interpreter has them (`-S` skips site, which defines them)."""
    for name in ("exit", "quit"):
        if not hasattr(builtins, name):
            setattr(builtins, name, sys.exit)


def run_tests(job, send):
    """The `tests` mode: the program, then the dataset's rewritten test program."""
    for name in job.get("imports", []):
        try:
            __import__(name)
        except BaseException:
            pass
    guard = Guard(["builtins", "sys", "os", "json", "io"] + list(job.get("imports", [])))
    records = {"lit": {}, "ran": {}}
    pristine = dict(vars(builtins))
    program = {"__name__": "__solution__", "__builtins__": builtins}
    try:
        exec(compile(job["code"], "<completion>", "exec"), program)
    except BaseException as e:  # noqa: BLE001 - anything the program raises, SystemExit included
        guard.flags.append(f"the program raised {type(e).__name__} before the tests")
        return send({"flags": guard.flags, **records})
    guard.check("by the program")
    tests = {"__name__": "__main__", "__builtins__": dict(pristine)}
    for name, value in program.items():
        if name.startswith("__"):
            continue
        if type(value) is type(os):
            tests[name] = value
        elif callable(value):
            tests[name] = _wrap(value, guard, name)
        else:
            try:
                encode(value)
                tests[name] = value
            except (NotPlain, RecursionError):
                pass
    entry = job.get("entry_point")
    if entry and not callable(program.get(entry)):
        guard.flags.append(f"the program defines no function {entry!r}")
        return send({"flags": guard.flags, **records})

    def lit(index, value):
        try:
            records["lit"].setdefault(str(index), []).append(encode(value))
        except (NotPlain, RecursionError) as e:
            guard.flags.append(f"assert {index} compared {e}")
            raise AssertionError(index) from None

    def ran(index, ok):
        count = records["ran"].setdefault(str(index), [0, 0])
        count[0] += 1
        if not ok:
            count[1] += 1
            raise AssertionError(index)

    def eq(index, left, right):
        try:
            same = decode(encode(left)) == decode(encode(right))
        except (NotPlain, RecursionError) as e:
            guard.flags.append(f"assert {index} compared {e}")
            raise AssertionError(index) from None
        ran(index, same)

    def truth(index, value):
        ran(index, bool(value))

    tests.update({"__grpo_lit__": lit, "__grpo_eq__": eq, "__grpo_truth__": truth})
    try:
        if job.get("helpers"):
            exec(compile(job["helpers"], "<prompt>", "exec"), tests)
        if entry:
            tests[entry] = _wrap(program[entry], guard, entry)
        guard.watch(tests)
        exec(compile(job["test"], "<tests>", "exec"), tests)
        if job.get("check"):
            guard.watch(tests)
            tests[job["check"]](tests[entry])
        guard.check("by the end of the tests")
        records["done"] = True
    except BaseException as e:  # noqa: BLE001 - a failed assert, or anything the program raised
        records["raised"] = type(e).__name__
        guard.check("by the end of the tests")
    send({"flags": guard.flags, **records})


def run_calls(job, send):
    """The `calls` mode: the program once, then fn(*args) per case; results go back encoded."""
    program = {"__name__": "__solution__", "__builtins__": builtins}
    try:
        exec(compile(job["code"], "<completion>", "exec"), program)
    except BaseException as e:  # noqa: BLE001
        return send({"error": f"the program raised {type(e).__name__}"})
    fn = program.get(job["fn_name"])
    if fn is None:
        # LeetCode style: the function is a method of a class named Solution.
        holder = program.get("Solution")
        fn = getattr(holder(), job["fn_name"], None) if isinstance(holder, type) else None
    if not callable(fn):
        return send({"error": f"the program defines no function {job['fn_name']!r}"})
    results = []
    for args in job["calls"]:
        try:
            results.append({"value": encode(fn(*args))})
        except (NotPlain, RecursionError) as e:
            results.append({"error": f"returned {e}"})
        except BaseException as e:  # noqa: BLE001
            results.append({"error": type(e).__name__})
            if not job.get("all_cases"):
                break
        if "error" in results[-1] and not job.get("all_cases"):
            break
    send({"results": results})


def run_stdio(job, send):
    """The `stdio` mode: each case in a forked child; this process never runs the program."""
    import signal
    import time
    try:  # the cases' processes, of the same user id, cannot open our descriptors or memory
        import ctypes
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)       # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError, ImportError):
        pass
    code = compile(job["code"], "<completion>", "exec") if _compiles(job["code"]) else None
    results = []
    for index, given in enumerate(job["inputs"]):
        if code is None:
            results.append({"error": "SyntaxError"})
            break
        in_path, out_path = f"/tmp/.case-{index}-in", f"/tmp/.case-{index}-out"
        with open(in_path, "w") as f:
            f.write(given)
        pid = os.fork()
        if pid == 0:  # the child: the case's input on fd 0, its output to a file, nothing else open
            status = 1
            try:
                os.setpgid(0, 0)
                os.dup2(os.open(in_path, os.O_RDONLY), 0)
                os.dup2(os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 1)
                os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
                os.closerange(3, 1 << 16)
                sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
                sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False))
                sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False))
                try:
                    exec(code, {"__name__": "__main__", "__builtins__": builtins})
                    status = 0
                except SystemExit as e:
                    status = 0 if e.code in (0, None) else 1
                except BaseException:  # noqa: BLE001
                    pass
                sys.stdout.flush()
            finally:
                os._exit(status)
        deadline = time.monotonic() + job["timeout_s"]
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                status = None
                break
            time.sleep(0.002)
        if job.get("isolated"):  # anything the case left running under this user id goes too
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
        try:
            with open(out_path, "rb") as f:
                out = f.read(job["output_cap"]).decode("utf-8", "replace")
        except OSError:
            out = ""
        for path in (in_path, out_path):
            try:
                os.remove(path)
            except OSError:
                pass
        if status is None:
            results.append({"error": "timeout"})
        elif os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            results.append({"out": out})
        else:
            results.append({"error": f"exit status {status}"})
        if "error" in results[-1] and not job.get("all_cases"):
            break
    send({"results": results})


def _compiles(code):
    try:
        compile(code, "<completion>", "exec")
        return True
    except (SyntaxError, ValueError):
        return False


def main():
    job = json.loads(sys.stdin.readline())
    nonce = job.pop("nonce").encode()
    result_fd = os.dup(1)
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    sys.stdin = io.StringIO("")
    _add_exit_names()
    write, dumps, exit_now = os.write, json.dumps, os._exit

    def send(payload):
        write(result_fd, nonce + dumps(payload).encode() + b"\n")
        exit_now(0)

    {"tests": run_tests, "calls": run_calls, "stdio": run_stdio}[job["mode"]](job, send)


if __name__ == "__main__":
    main()
