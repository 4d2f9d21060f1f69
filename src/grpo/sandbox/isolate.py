"""Run model-written Python in a sandbox: the process isolation under `code_tests` (code.py).

Each program runs in a fresh interpreter (started with exec, never a fork of the trainer that goes on
running trainer code), through a small launcher that, as root, before it drops privileges:

- unshares a network namespace (no interface is up: not even 127.0.0.1 is reachable) and a mount
  namespace with fresh, size-capped tmpfs mounts on /tmp, /var/tmp and /dev/shm (its working
  directory), so nothing it writes outlives it or reaches the host's temporary directories;
- unshares an IPC namespace (SysV shared memory, semaphores and message queues, POSIX message
  queues: all gone with the run, capped at the scratch space's size), a UTS namespace (host name
  "sandbox") and a PID namespace, whose init is the launcher's child: it mounts a fresh /proc that
  lists only the run's own processes, and when it ends the kernel kills whatever is left;
- sets hard limits on CPU time, address space, file size, open files and processes;
- switches to a user id of its own (no supplementary groups), so it can signal no other process,
  read no other process's /proc entries, and write nowhere else the host does not leave open;
  then sets no-new-privileges and a seccomp filter that fails the kernel keyring calls (a user
  id's keyring outlives its processes, so a later run of that id would read it);
- execs the interpreter with an empty environment, in isolated mode.

The whole process tree is killed at the deadline (and after every run) by the namespace's init,
which signals every process in it and reaps until it has no child left (every orphan of the
namespace is its child, so none is left at all). Without isolation, a subreaper launcher kills the
program's process group. Output is read in the parent and
capped. What runs inside is harness.py, with the job on its standard input.

`isolation_level()` probes what this machine really allows: "full" (namespaces and a user id of
its own, which needs root), else "none", where code rewards refuse to run unless
`unsafe_code_execution=true` is set.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import secrets
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

HARNESS = (Path(__file__).parent / "harness.py").read_text()
_UIDS = itertools.count()
_UID_BASE = 200_000

# The backstop killer below counts the live (not zombie) processes of a user id from /proc.
_ALIVE = r"""
def alive(uid):
    found = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                with open(f"/proc/{pid}/status") as f:
                    fields = dict(l.split(":", 1) for l in f if ":" in l)
            except OSError:
                continue
            # a zombie is dead already; it stays listed until its parent reaps it
            found += int(fields["Uid"].split()[0]) == uid and not fields["State"].strip().startswith("Z")
    return found
"""

# Runs as root inside the new session; argv[1] is JSON settings. Isolated, it unshares its
# namespaces and forks their init (pid 1 of the new PID namespace), which mounts a fresh /proc,
# forks the program (it drops to the sandbox user and execs the harness), waits for it until the
# deadline, then kills and reaps everything in the namespace; the launcher waits for init and passes
# on its status. Exit status: 0 the harness exited cleanly, 1 it did not, 124 the deadline, 97 a
# namespace or mount could not be made (the run is refused, never run with less).
_LAUNCHER = r"""import ctypes, json, os, resource, sys, time
s = json.loads(sys.argv[1])


# No new privileges (a set-user-id program runs as its caller), and a seccomp filter that fails
# add_key, request_key and keyctl with EPERM: a user id's kernel keyring outlives its processes,
# and a later run of the same user id would read what this one left there.
def no_keyrings():
    import struct
    arch, calls = {"x86_64": (0xC000003E, (248, 249, 250)),
                   "aarch64": (0xC00000B7, (217, 218, 219))}.get(os.uname().machine, (None, ()))
    if arch is None:
        return False                                 # numbers unknown here: refuse the run
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    program = [(0x20, 0, 0, 4),                      # A = the call's architecture
               (0x15, 1, 0, arch),                   # native: go on; else
               (0x06, 0, 0, enosys),                 # any other ABI fails
               (0x20, 0, 0, 0),                      # A = the call's number
               (0x35, 4, 0, 0x40000000),             # x32 numbers: EPERM
               (0x15, 3, 0, calls[0]), (0x15, 2, 0, calls[1]), (0x15, 1, 0, calls[2]),
               (0x06, 0, 0, allow),
               (0x06, 0, 0, eperm)]
    code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *op) for op in program))

    class Filter(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = Filter(len(program), ctypes.addressof(code))
    libc, zero = ctypes.CDLL(None), ctypes.c_ulong(0)
    return (libc.prctl(38, ctypes.c_ulong(1), zero, zero, zero) == 0             # NO_NEW_PRIVS
            and libc.prctl(22, ctypes.c_ulong(2), ctypes.byref(fprog), zero, zero) == 0)


if s["isolate"]:
    libc = ctypes.CDLL(None, use_errno=True)
    # network, mounts, SysV IPC and POSIX message queues, process ids, host name
    if libc.unshare(0x40000000 | 0x00020000 | 0x08000000 | 0x20000000 | 0x04000000) != 0:
        sys.exit(97)
    if libc.mount(b"none", b"/", None, 16384 | 262144, None) != 0:   # MS_REC | MS_PRIVATE
        sys.exit(97)
    for where in (b"/tmp", b"/var/tmp", b"/dev/shm"):
        if os.path.isdir(where) and libc.mount(b"tmpfs", where, b"tmpfs", 2 | 4,
                                               b"size=%dk,mode=1777" % s["tmp_kb"]) != 0:
            sys.exit(97)
    # Hide every other top-level directory (data sets, the project, home directories, the host's
    # /sys) behind an empty read-only tmpfs, but what the interpreter needs to start.
    keep = {"usr", "lib", "lib64", "lib32", "bin", "sbin", "etc", "proc", "dev", "tmp", "var"}
    keep.add(s["python"].split("/")[1])
    for name in os.listdir("/"):
        where = "/" + name
        if name not in keep and os.path.isdir(where) and not os.path.islink(where):
            if libc.mount(b"tmpfs", where.encode(), b"tmpfs", 1 | 2 | 4, b"size=4k,mode=755") != 0:
                sys.exit(97)
    # CLONE_NEWPID moves this process's next child, not this process, into the new namespace:
    # that child is its init. When init ends, the kernel kills whatever is left in the namespace.
    init = os.fork()
    if init:
        os.close(0)
        os.close(1)
        while True:
            try:
                status = os.waitpid(init, 0)[1]
                break
            except InterruptedError:
                continue
        sys.exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)
    # a /proc of the new namespace: the program sees its own processes, not the host's
    if libc.mount(b"proc", b"/proc", b"proc", 2 | 4 | 8, None) != 0:   # nosuid, nodev, noexec
        os._exit(97)
    # SysV shared memory of the run stays within its scratch space: shmall in pages, shmmax in
    # bytes; few message queues (each holds up to 16 KiB)
    try:
        for name, value in (("shmall", s["tmp_kb"] // 4), ("shmmax", s["tmp_kb"] << 10),
                            ("shmmni", 64), ("msgmni", 16)):
            with open("/proc/sys/kernel/" + name, "w") as f:
                f.write(str(value))
    except OSError:
        os._exit(97)
    if libc.sethostname(b"sandbox", 7) != 0:
        os._exit(97)
else:
    # Stay as the program's parent and a subreaper, so whatever it starts is ours to kill and reap.
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)                  # PR_SET_CHILD_SUBREAPER
pid = os.fork()
if pid == 0:
    limits = {resource.RLIMIT_CPU: s["cpu_s"], resource.RLIMIT_AS: s["memory_bytes"],
              resource.RLIMIT_FSIZE: s["file_bytes"], resource.RLIMIT_NOFILE: 64,
              resource.RLIMIT_NPROC: s["processes"], resource.RLIMIT_CORE: 0}
    for kind, value in limits.items():
        resource.setrlimit(kind, (value, value))
    if s["uid"] is not None:
        os.setgroups([])
        os.setgid(s["uid"])
        os.setuid(s["uid"])
        if not no_keyrings():
            os._exit(97)
    os.chdir("/tmp")
    os.execve(s["python"], [s["python"], "-I", "-S", "-c", s["harness"], s["mode"]], {})
os.close(0)
os.close(1)
deadline, status, pause = time.monotonic() + s["deadline_s"], None, 0.0005
while time.monotonic() < deadline:
    done, code = os.waitpid(pid, os.WNOHANG)
    if done:
        status = code
        break
    time.sleep(pause)
    pause = min(pause * 2, 0.002)
if s["isolate"]:
    # init of the namespace: every process left in it is ours to signal, and every orphan is
    # our child; none left to reap means none left at all
    while True:
        try:
            os.kill(-1, 9)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
else:
    try:
        os.killpg(pid, 9)
    except OSError:
        pass
while True:                              # reap the program and every orphan it left to us
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        break
    except InterruptedError:
        continue
sys.exit(124 if status is None else 0 if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else 1)
"""

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


_KILLER = "import os, sys, time\n" + _ALIVE + r"""
uid = int(sys.argv[1])
os.setgroups([]); os.setgid(uid); os.setuid(uid)
for _ in range(300):                 # a fork bomb forks while we kill: repeat until none is left
    try:
        os.kill(-1, 9)
    except ProcessLookupError:
        pass
    if not alive(uid):
        break
    time.sleep(0.01)
"""


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid` until none is left (run as that uid: it can signal nothing
    else)."""
    subprocess.run([sys.executable, "-I", "-S", "-c", _KILLER, str(uid)], timeout=30, check=False)


def run_program(job: dict, limits: Limits = Limits(), isolate: bool = True,
                deadline_s: float | None = None, read_cap: int | None = None) -> RunResult:
    """Run harness.py on `job` in the sandbox, killed at `deadline_s` (default limits.timeout_s);
    return its stdout, capped at `read_cap` bytes (default limits.output_kb)."""
    # a user id no other run uses: this process's id picks a block of 256 (so two trainer
    # processes on one machine never share one, and never kill each other's programs), the
    # counter a slot in it (more than `code_workers` programs are never in flight at once)
    uid = _UID_BASE + (os.getpid() % (1 << 22)) * 256 + next(_UIDS) % 256 if isolate else None
    settings = {"isolate": isolate, "uid": uid, "python": _python_for(isolate),
                "harness": HARNESS, "mode": str(job.get("mode", "")),
                "cpu_s": int(limits.timeout_s) + 1,
                "memory_bytes": limits.memory_mb << 20, "file_bytes": limits.file_mb << 20,
                "processes": limits.processes, "tmp_kb": limits.tmp_mb << 10,
                "deadline_s": limits.timeout_s if deadline_s is None else deadline_s}
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _LAUNCHER, json.dumps(settings)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env={}, start_new_session=True)
    chunks: list[bytes] = []
    cap = read_cap if read_cap is not None else limits.output_kb << 10
    reader = threading.Thread(target=_read_capped, args=(proc.stdout, cap, chunks), daemon=True)
    reader.start()
    try:
        proc.stdin.write((json.dumps(job) + "\n").encode())
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass
    try:   # the launcher keeps the deadline and cleans up; this is the backstop if it cannot
        proc.wait(timeout=settings["deadline_s"] + 15)
    except subprocess.TimeoutExpired:
        if uid is not None:
            _kill_uid(uid)
        os.killpg(proc.pid, 9)
        proc.wait()
    timed_out = proc.returncode in (124, -9)
    reader.join(timeout=5)
    return RunResult(b"".join(chunks).decode("utf-8", "replace"),
                     None if timed_out else proc.returncode, timed_out)


@lru_cache(maxsize=1)
def isolation_level() -> str:
    """'full' when a probe program ran with its own user id, no network, a private /tmp, its own
    host name and a /proc that lists none of the host's processes (pid 1 is the run's init)."""
    probe = ("import os, socket\n"
             "def probe():\n"
             "    s = socket.socket()\n"
             "    try:\n        s.connect(('127.0.0.1', 9)); net = True\n"
             "    except OSError:\n        net = False\n"
             "    return [os.getuid(), net, os.listdir('/tmp'), socket.gethostname(),\n"
             "            str(os.getpid()) in os.listdir('/proc') and os.getpid() < 16]\n")
    nonce = secrets.token_hex(8)
    try:
        result = run_program({"nonce": nonce, "mode": "calls", "code": probe, "fn_name": "probe",
                              "calls": [[]]}, limits=Limits(timeout_s=10))
    except (OSError, RuntimeError, subprocess.SubprocessError):
        return "none"
    lines = [line for line in result.stdout.split("\n") if line.startswith(nonce)]
    try:
        uid, network, tmp, host, own_pids = json.loads(lines[0][len(nonce):])["results"][0]["value"]
    except (IndexError, KeyError, ValueError, TypeError):
        return "none"
    return "full" if (uid >= _UID_BASE and not network and tmp == [] and host == "sandbox"
                      and own_pids) else "none"
