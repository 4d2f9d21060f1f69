"""Model-written code in the sandbox: correct programs score, and every attack scores 0 while the
trainer keeps running and the machine is unharmed."""

import os
import socket
import uuid
from pathlib import Path

import pytest

from grpo.rewards.code import CodeTests, extract_code
from grpo.sandbox.isolate import Limits, isolation_level

pytestmark = pytest.mark.skipif(isolation_level() != "full",
                                reason="needs root for namespaces and a user id of its own")

TESTS = ["assert f(2) == 4", "assert f(0) == 0"]
FAST = Limits(timeout_s=2.0)


@pytest.fixture(scope="module")
def code_tests():
    return CodeTests(limits=FAST, workers=2)


def sandbox_processes() -> list[int]:
    """Pids of processes owned by a sandbox user id (there must be none between runs)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                uid = int((entry / "status").read_text().split("Uid:")[1].split()[0])
            except (OSError, IndexError):
                continue
            if uid >= 200_000:
                pids.append(int(entry.name))
    return pids


def test_correct_partly_correct_and_broken_programs(code_tests):
    completions = ["```python\ndef f(x):\n    return 2 * x\n```", "def f(x):\n    return 4", "def f(:"]
    assert code_tests(["p"] * 3, completions, tests=[TESTS] * 3) == [1.0, 0.0, 0.0]
    partial = CodeTests(limits=FAST, partial_credit=True)
    assert partial(["p"], ["def f(x):\n    return 4"], tests=[TESTS]) == [0.5]   # f(2) right, f(0) wrong


def test_stdin_stdout_cases(code_tests):
    cases = [{"input": "21", "output": "42"}, {"input": "5", "output": "10"}]
    assert code_tests(["p"] * 2, ["print(int(input()) * 2)", "print(42)"], tests=[cases] * 2) == [1.0, 0.0]


def test_extract_code_takes_the_last_fenced_block():
    assert extract_code("text\n```python\nx = 1\n```\nmore") == "x = 1\n"
    assert extract_code("```\na\n```\n```py\nb\n```") == "b\n"
    assert extract_code("def f(): pass") == "def f(): pass"


ATTACKS = {
    "infinite loop": "while True:\n    pass",
    "fork bomb": "import os\nwhile True:\n    os.fork()",
    "memory bomb": "x = bytearray(8 * 1024 ** 3)\ndef f(x): return 2 * x",
    "1 GB write": "open('big', 'wb').write(b'0' * 2 ** 30)\ndef f(x): return 2 * x",
    "killing the parent": "import os\nos.kill(os.getppid(), 9)\ndef f(x): return 2 * x",
    "reading the parent's environ": "import os\nopen(f'/proc/{os.getppid()}/environ').read()\n"
                                     "def f(x): return 2 * x",
    "reading the trainer's variable": "import os\nos.environ['GRPO_TEST_SECRET']\ndef f(x): return 2 * x",
    "sys.exit(0) before the asserts": "import sys\nsys.exit(0)",
    "forging the harness's result": "import sys, os\nline = b'{\"done\": true, \"flags\": [], "
                                    "\"lit\": {\"0\": [4], \"1\": [0]}}\\n'\n"
                                    "for fd in range(1, 64):\n    try:\n        os.write(fd, line)\n"
                                    "    except OSError:\n        pass\nos._exit(0)",
    "replacing assert and eval": "import builtins\nbuiltins.eval = lambda *a, **k: True\n"
                                 "builtins.AssertionError = Exception",
    "a flood of output": "while True:\n    print('x' * 10000)",
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_scores_zero_and_leaves_nothing_behind(name, code_tests, monkeypatch):
    monkeypatch.setenv("GRPO_TEST_SECRET", "trainer-only")
    assert code_tests(["p"], [ATTACKS[name]], tests=[TESTS]) == [0.0]
    assert sandbox_processes() == []        # the whole tree is gone, the trainer still here


def test_a_write_outside_its_directory_never_reaches_the_host(code_tests, tmp_path):
    host_tmp = Path("/tmp") / f"grpo-escape-{uuid.uuid4().hex}"
    private = tmp_path / "owned-by-the-trainer"
    program = (f"open({str(host_tmp)!r}, 'w').write('x')\n"     # lands in the sandbox's own /tmp
               f"open({str(private)!r}, 'w').write('x')\n"      # not writable: raises
               "def f(x): return 2 * x")
    assert code_tests(["p"], [program], tests=[TESTS]) == [0.0]
    assert not host_tmp.exists() and not private.exists()


def test_no_connection_to_a_port_the_test_opened(code_tests):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    port = server.getsockname()[1]
    program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\ndef f(x): return 2 * x"
    try:
        assert code_tests(["p"], [program], tests=[TESTS]) == [0.0]
        with pytest.raises(socket.timeout):
            server.accept()                  # nobody ever connected
    finally:
        server.close()


def test_output_is_capped_in_the_parent():
    from grpo.sandbox.isolate import run_program
    job = {"nonce": "n", "mode": "calls", "code": "import os\nwhile True:\n    os.write(3, b'x' * 10000)",
           "fn_name": "f", "calls": [[]]}
    out = run_program(job, limits=Limits(timeout_s=1, output_kb=64))
    assert out.timed_out and len(out.stdout) <= 64 * 1024


def test_refuses_without_isolation_unless_told(monkeypatch):
    import grpo.rewards.code as code
    monkeypatch.setattr(code, "isolation_level", lambda: "none")
    with pytest.raises(RuntimeError, match="unsafe_code_execution=true"):
        code.CodeTests()
    assert code.CodeTests(unsafe_code_execution=True).isolate is False
    assert os.getpid() > 0


def test_code_tests_from_config(tmp_path):
    import json
    from grpo.config import build_config
    from grpo.train import train
    f = tmp_path / "code.jsonl"
    rows = [{"prompt": f"Write f(x) returning {k} * x.", "answer": "", "tests": [f"assert f(3) == {3 * k}"]}
            for k in range(1, 5)]
    f.write_text("\n".join(json.dumps(r) for r in rows))
    c = build_config({"dataset": str(f), "rewards": ["code_tests"], "code_timeout_s": 2.0,
                      "sft_steps": 0, "steps": 1, "eval_every": 0, "prompts_per_step": 2,
                      "group_size": 2, "output_dir": str(tmp_path / "run")})
    m = train(c, log=lambda s: None, write_files=False).history[0]
    assert m["reward/code_tests/mean"] == 0.0     # a random tiny model writes no working f
    assert sandbox_processes() == []


def test_the_project_and_its_data_are_out_of_sight(code_tests):
    here = Path(__file__).resolve()          # world-readable on the host
    program = f"open({str(here)!r}).read()\ndef f(x): return 2 * x"
    assert code_tests(["p"], [program], tests=[TESTS]) == [0.0]
    assert code_tests(["p"], ["import json, math\ndef f(x): return 2 * x"], tests=[TESTS]) == [1.0]


def _sysv_keys(kind: str) -> dict[int, int]:
    """The host's SysV objects of one kind ("shm" or "msg"): key -> id."""
    lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
    return {int(line.split()[0]): int(line.split()[1]) for line in lines}


def test_sysv_shared_memory_and_message_queues_end_with_the_run(code_tests):
    import ctypes
    key = int(uuid.uuid4().hex[:7], 16) + 1
    libc = "import ctypes, struct\nlibc = ctypes.CDLL(None)\nlibc.shmat.restype = ctypes.c_void_p\n"
    first = (libc +
             f"shm = libc.shmget({key}, 1 << 24, 0o1600)\n"            # IPC_CREAT | 0600, 16 MiB
             "at = libc.shmat(shm, None, 0)\n"
             "ctypes.memset(at, 1, 1 << 24)\n"                          # touched: pinned memory
             "libc.shmdt(ctypes.c_void_p(at))\n"
             f"queue = libc.msgget({key}, 0o1600)\n"
             "message = ctypes.create_string_buffer(struct.pack('l', 1) + b'for the next run')\n"
             "sent = libc.msgsnd(queue, message, 16, 0)\n"
             "def f(x): return 2 * x if shm >= 0 and queue >= 0 and sent == 0 else -1")
    second = (libc + f"queue = libc.msgget({key}, 0o600)\n"              # no IPC_CREAT: find it
              "def f(x): return 2 * x if queue == -1 else -1")
    try:
        assert code_tests(["p"], [first], tests=[TESTS]) == [1.0]      # it made both
        assert key not in _sysv_keys("shm") and key not in _sysv_keys("msg")
        assert code_tests(["p"], [second], tests=[TESTS]) == [1.0]     # and found no queue
    finally:    # remove what a sandbox without its own IPC namespace left on the host
        host = ctypes.CDLL(None)
        if key in _sysv_keys("shm"):
            host.shmctl(_sysv_keys("shm")[key], 0, None)               # IPC_RMID
        if key in _sysv_keys("msg"):
            host.msgctl(_sysv_keys("msg")[key], 0, None)


def test_other_processes_are_out_of_sight_in_proc(code_tests):
    import subprocess
    import sys
    token = f"grpo-token-{uuid.uuid4().hex}"
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", token])
    program = ("import os\n"
               "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
               "seen = []\n"
               "for pid in pids:\n"
               "    try:\n"
               "        seen += [pid] if b'grpo-token-' in open(f'/proc/{pid}/cmdline', 'rb').read() else []\n"
               "    except OSError:\n"
               "        pass\n"
               # its own namespace: the launcher as pid 1, the tests' process, the program's process
               "def f(x): return 2 * x if seen == [] and pids == [1, 2, 3] else -1")
    try:
        assert code_tests(["p"], [program], tests=[TESTS]) == [1.0]
    finally:
        host.kill()
        host.wait()


def test_the_host_name_is_not_the_hosts(code_tests):
    import socket as host_socket
    program = ("import socket\nname = socket.gethostname()\n"
               f"def f(x): return 2 * x if name == 'sandbox' and name != {host_socket.gethostname()!r} else -1")
    assert code_tests(["p"], [program], tests=[TESTS]) == [1.0]


def test_the_hosts_sys_is_out_of_sight(code_tests):
    # the host's /sys lists its network interfaces, disks and devices
    program = "import os\nseen = os.listdir('/sys')\ndef f(x): return 2 * x if seen == [] else -1"
    assert code_tests(["p"], [program], tests=[TESTS]) == [1.0]


def test_a_kernel_keyring_carries_nothing_to_a_later_run(code_tests, monkeypatch):
    # a user id's keyring outlives its processes; runs 256 apart in one trainer share a user id
    import itertools
    import subprocess
    import sys
    import grpo.sandbox.isolate as sandbox
    monkeypatch.setattr(sandbox, "_UIDS", itertools.repeat(7))          # both runs: one user id
    name = f"grpo-carry-{uuid.uuid4().hex}".encode()
    numbers = {"x86_64": (248, 250), "aarch64": (217, 219)}[os.uname().machine]
    libc = "import ctypes\nlibc = ctypes.CDLL(None)\n"
    first = (libc + f"libc.syscall({numbers[0]}, b'user', {name!r}, b'the answer', 10, -4)\n"
             "def f(x): return 2 * x")                                  # add_key to @u
    second = (libc + f"found = libc.syscall({numbers[1]}, 10, -4, b'user', {name!r}, 0)\n"
              "def f(x): return 2 * x if found == -1 else -1")          # KEYCTL_SEARCH in @u
    uid = sandbox._UID_BASE + (os.getpid() % (1 << 22)) * 256 + 7
    try:
        assert code_tests(["p"], [first], tests=[TESTS]) == [1.0]
        assert code_tests(["p"], [second], tests=[TESTS]) == [1.0]
    finally:    # clear that user id's keyring on the host (KEYCTL_CLEAR of @u, as that user)
        subprocess.run([sys.executable, "-c", f"import ctypes, os\nos.setgid({uid}); os.setuid({uid})\n"
                        f"ctypes.CDLL(None).syscall({numbers[1]}, 7, -4)"], check=False)


def test_dev_shm_and_abstract_sockets_carry_nothing_between_runs(code_tests):
    name = f"grpo-carry-{uuid.uuid4().hex}"
    first = f"open('/dev/shm/{name}', 'w').write('the answer')\ndef f(x): return 2 * x"
    second = f"import os\nfound = os.path.exists('/dev/shm/{name}')\ndef f(x): return 2 * x if not found else -1"
    assert code_tests(["p"], [first], tests=[TESTS]) == [1.0]
    assert code_tests(["p"], [second], tests=[TESTS]) == [1.0]
    assert not Path(f"/dev/shm/{name}").exists()
    host = socket.socket(socket.AF_UNIX)           # an abstract socket on the host: no file
    host.bind(b"\0" + name.encode())
    host.listen()
    program = ("import socket\ns = socket.socket(socket.AF_UNIX)\n"
               f"try:\n    s.connect(b'\\0{name}'); reached = True\nexcept OSError:\n    reached = False\n"
               "def f(x): return 2 * x if not reached else -1")
    try:
        assert code_tests(["p"], [program], tests=[TESTS]) == [1.0]
    finally:
        host.close()


def test_a_namespace_that_cannot_be_made_leaves_no_isolation(monkeypatch):
    # the launcher refuses the run (status 97) rather than run it with fewer namespaces, so the
    # probe sees nothing and code rewards refuse to start without unsafe_code_execution=true
    import grpo.sandbox.isolate as sandbox
    flags = "0x20000000 | 0x04000000) != 0"
    assert flags in sandbox._LAUNCHER
    monkeypatch.setattr(sandbox, "_LAUNCHER", sandbox._LAUNCHER.replace(flags, "0x20000000 | 0x1) != 0"))
    assert sandbox.isolation_level.__wrapped__() == "none"
    job = {"nonce": "n", "mode": "calls", "code": "def f(): return 1", "fn_name": "f", "calls": [[]]}
    assert sandbox.run_program(job, limits=FAST).returncode == 97
