"""Run model-written Python in a sandbox, and the `code_tests` reward built on it.

Each program runs in a fresh interpreter (started with exec, never a fork of the trainer that goes on
running trainer code), through a small launcher that, as root, before it drops privileges:

- unshares a network namespace (no interface is up: not even 127.0.0.1 is reachable) and a mount
  namespace with fresh, size-capped tmpfs mounts on /tmp, /var/tmp and /dev/shm (its working
  directory), so nothing it writes outlives it or reaches the host's temporary directories;
- sets hard limits on CPU time, address space, file size, open files and processes;
- switches to a user id of its own (no supplementary groups), so it can signal no other process,
  read no other process's /proc entries, and write nowhere else the host does not leave open;
- execs the interpreter with an empty environment, in isolated mode.

The whole process tree is killed at the deadline (and after every run) by a helper that takes the
program's user id and sends SIGKILL to every process of that id. Output is read in the parent and
capped. Expected values never reach the child: an assert test `assert EXPR == LITERAL` sends only
EXPR, whose value comes back as JSON and is compared in the parent.

`isolation_level()` probes what this machine really allows: "full" (namespaces and a user id of
its own, which needs root), else "none", where code rewards refuse to run unless
`unsafe_code_execution=true` is set.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache

MARKER = "\x00GRPO-RESULT\x00"
_UIDS = itertools.count()
_UID_BASE = 200_000

# Runs as root inside the new session; argv[1] is JSON settings. Drops to the sandbox user, execs.
_LAUNCHER = r"""
import ctypes, json, os, resource, sys
s = json.loads(sys.argv[1])
if s["isolate"]:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x40000000 | 0x00020000) != 0:          # CLONE_NEWNET | CLONE_NEWNS
        sys.exit(97)
    if libc.mount(b"none", b"/", None, 16384 | 262144, None) != 0:   # MS_REC | MS_PRIVATE
        sys.exit(97)
    for where in (b"/tmp", b"/var/tmp", b"/dev/shm"):
        if os.path.isdir(where) and libc.mount(b"tmpfs", where, b"tmpfs", 2 | 4,
                                               b"size=%dk,mode=1777" % s["tmp_kb"]) != 0:
            sys.exit(97)
    # Hide every other top-level directory (data sets, the project, home directories) behind an
    # empty read-only tmpfs, but what the interpreter needs to start.
    keep = {"usr", "lib", "lib64", "lib32", "bin", "sbin", "etc", "proc", "dev", "sys", "tmp", "var"}
    keep.add(s["python"].split("/")[1])
    for name in os.listdir("/"):
        where = "/" + name
        if name not in keep and os.path.isdir(where) and not os.path.islink(where):
            if libc.mount(b"tmpfs", where.encode(), b"tmpfs", 1 | 2 | 4, b"size=4k,mode=755") != 0:
                sys.exit(97)
limits = {resource.RLIMIT_CPU: s["cpu_s"], resource.RLIMIT_AS: s["memory_bytes"],
          resource.RLIMIT_FSIZE: s["file_bytes"], resource.RLIMIT_NOFILE: 64,
          resource.RLIMIT_NPROC: s["processes"], resource.RLIMIT_CORE: 0}
for kind, value in limits.items():
    resource.setrlimit(kind, (value, value))
if s["uid"] is not None:
    os.setgroups([])
    os.setgid(s["uid"])
    os.setuid(s["uid"])
os.chdir("/tmp")
os.execve(s["python"], [s["python"], "-I", "-S", "-c", s["harness"]], {})
"""

# Runs as the sandbox user. First stdin line: {"code", "exprs", "stdin"}.
_HARNESS = r"""
import io, json, sys
job = json.loads(sys.stdin.readline())
out = sys.stdout
sys.stdin = io.StringIO(job["stdin"])
ns = {"__name__": "__main__"}
try:
    exec(compile(job["code"], "<completion>", "exec"), ns)
except BaseException as e:
    out.write("%s%s\n" % (MARKER, json.dumps({"error": type(e).__name__})))
    out.flush()
    raise SystemExit(1)
results = []
for expr in job["exprs"]:
    try:
        results.append(json.dumps(eval(expr, ns)))
    except BaseException:
        results.append(None)
out.write("%s%s\n" % (MARKER, json.dumps({"values": results})))
out.flush()
""".replace("MARKER", repr(MARKER))


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 5.0          # wall clock; the CPU limit is this, rounded up
    memory_mb: int = 512
    file_mb: int = 16
    tmp_mb: int = 64
    processes: int = 32
    output_kb: int = 256


@dataclass
class RunResult:
    stdout: str
    returncode: int | None          # None: killed at the deadline
    timed_out: bool


def _python_for(uid_can_run: bool) -> str:
    """An interpreter the sandbox user can execute (every directory on its path world-searchable)."""
    candidates = [sys.executable, os.path.realpath(sys.executable), "/usr/bin/python3"]
    for path in candidates:
        real = os.path.realpath(path)
        parts = real.split("/")
        dirs = ["/".join(parts[:i]) or "/" for i in range(1, len(parts))]
        if os.path.isfile(real) and all(os.stat(d).st_mode & 0o001 for d in dirs) \
                and os.stat(real).st_mode & 0o001:
            return real
    if not uid_can_run:
        return sys.executable
    raise RuntimeError("no Python interpreter that an unprivileged user can run was found")


def _read_capped(stream, cap: int, sink: list) -> None:
    kept = 0
    while True:
        chunk = stream.read(65536)
        if not chunk:
            return
        if kept < cap:
            sink.append(chunk[: cap - kept])
            kept += len(sink[-1])


_KILLER = r"""
import os, sys, time
uid = int(sys.argv[1])
os.setgroups([]); os.setgid(uid); os.setuid(uid)
def others():
    found = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                with open(f"/proc/{pid}/status") as f:
                    found += any(l.startswith("Uid:") and int(l.split()[1]) == uid for l in f)
            except OSError:
                pass
    return found
for _ in range(300):                 # a fork bomb forks while we kill: repeat until none is left
    try:
        os.kill(-1, 9)
    except ProcessLookupError:
        pass
    if not others():
        break
    time.sleep(0.01)
"""


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid` until none is left (run as that uid: it can signal nothing
    else)."""
    subprocess.run([sys.executable, "-I", "-S", "-c", _KILLER, str(uid)], timeout=30, check=False)


def run_program(code: str, exprs: list[str], stdin: str = "", limits: Limits = Limits(),
                isolate: bool = True) -> RunResult:
    """Run `code` (then evaluate `exprs`) in the sandbox; return its capped stdout."""
    uid = _UID_BASE + next(_UIDS) % 100_000 if isolate else None
    settings = {"isolate": isolate, "uid": uid, "python": _python_for(isolate),
                "harness": _HARNESS, "cpu_s": int(limits.timeout_s) + 1,
                "memory_bytes": limits.memory_mb << 20, "file_bytes": limits.file_mb << 20,
                "processes": limits.processes, "tmp_kb": limits.tmp_mb << 10}
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _LAUNCHER, json.dumps(settings)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env={}, start_new_session=True)
    chunks: list[bytes] = []
    reader = threading.Thread(target=_read_capped, args=(proc.stdout, limits.output_kb << 10, chunks),
                              daemon=True)
    reader.start()
    try:
        proc.stdin.write((json.dumps({"code": code, "exprs": exprs, "stdin": stdin}) + "\n").encode())
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass
    timed_out = False
    try:
        proc.wait(timeout=limits.timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    if uid is not None:
        _kill_uid(uid)              # the program and anything it started, wherever it went
    try:
        os.killpg(proc.pid, 9)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    reader.join(timeout=5)
    return RunResult(b"".join(chunks).decode("utf-8", "replace"),
                     None if timed_out else proc.returncode, timed_out)


@lru_cache(maxsize=1)
def isolation_level() -> str:
    """'full' when a probe program ran with its own user id, no network and a private /tmp."""
    probe = ("import os, socket\n"
             "s = socket.socket()\n"
             "try:\n    s.connect(('127.0.0.1', 9)); net = True\n"
             "except OSError:\n    net = False\n"
             "r = (os.getuid(), net, os.listdir('/tmp'))\n")
    try:
        result = run_program(probe, ["r"], limits=Limits(timeout_s=10))
    except (OSError, RuntimeError, subprocess.SubprocessError):
        return "none"
    values = _result_values(result.stdout)
    if not values or values[0] is None:
        return "none"
    uid, network, tmp = json.loads(values[0])
    return "full" if uid >= _UID_BASE and not network and tmp == [] else "none"


def _result_values(stdout: str) -> list | None:
    """The harness's last result line, or None when the program never got there."""
    lines = [line for line in stdout.split("\n") if line.startswith(MARKER)]
    if not lines:
        return None
    try:
        payload = json.loads(lines[-1][len(MARKER):])
    except json.JSONDecodeError:
        return None
    return payload.get("values") if isinstance(payload, dict) else None


def parse_assert(test: str) -> tuple[str, object]:
    """`assert EXPR == LITERAL` -> (EXPR, LITERAL as JSON would carry it); `assert EXPR` -> (EXPR, True)."""
    node = ast.parse(test.strip()).body
    if len(node) != 1 or not isinstance(node[0], ast.Assert):
        raise ValueError(f"not a single assert statement: {test!r}")
    check = node[0].test
    if (isinstance(check, ast.Compare) and len(check.ops) == 1 and isinstance(check.ops[0], ast.Eq)):
        expected = ast.literal_eval(check.comparators[0])
        return ast.unparse(check.left), json.loads(json.dumps(expected))
    return f"bool({ast.unparse(check)})", True


def extract_code(completion: str) -> str:
    """The last fenced code block (```python or ```), else the whole completion."""
    blocks = [b.split("\n", 1)[1] if "\n" in b else "" for b in completion.split("```")[1::2]]
    return blocks[-1] if blocks else completion


class CodeTests:
    """Reward: run the completion's code against the row's `tests` (assert strings, or
    {"input", "output"} cases). 1 when all pass, or the fraction passed with `partial_credit`."""

    def __init__(self, limits: Limits = Limits(), workers: int = 2, partial_credit: bool = False,
                 unsafe_code_execution: bool = False):
        self.limits, self.workers, self.partial_credit = limits, workers, partial_credit
        self.isolate = isolation_level() == "full"
        if not self.isolate and not unsafe_code_execution:
            raise RuntimeError("code_tests: this machine cannot isolate programs (it needs root for "
                               "namespaces and a user id of their own); set "
                               "unsafe_code_execution=true to run them anyway, unisolated")
        self.__name__ = "code_tests"

    def score_one(self, completion: str, tests) -> float:
        code = extract_code(completion)
        tests = [tests] if isinstance(tests, (str, dict)) else list(tests or [])
        if not tests:
            raise ValueError("code_tests: the row has no tests")
        if isinstance(tests[0], dict):  # stdin/stdout cases, one run each
            passed = 0
            for case in tests:
                out = run_program(code, [], stdin=str(case["input"]), limits=self.limits,
                                  isolate=self.isolate)
                printed = out.stdout.split(MARKER)[0]
                passed += (not out.timed_out and out.returncode == 0
                           and printed.strip().replace("\r\n", "\n") == str(case["output"]).strip())
        else:
            checks = [parse_assert(line) for t in tests for line in str(t).splitlines()
                      if line.strip()]
            out = run_program(code, [e for e, _ in checks], limits=self.limits, isolate=self.isolate)
            values = _result_values(out.stdout) if not out.timed_out else None
            values = values if values is not None and len(values) == len(checks) else [None] * len(checks)
            passed = sum(v is not None and json.loads(v) == expected
                         for v, (_, expected) in zip(values, checks))
            tests = checks
        if self.partial_credit:
            return passed / len(tests)
        return 1.0 if passed == len(tests) else 0.0

    def __call__(self, prompts: list[str], completions: list[str], tests: list, **columns) -> list[float]:
        with ThreadPoolExecutor(self.workers) as pool:
            return list(pool.map(self.score_one, completions, tests))
