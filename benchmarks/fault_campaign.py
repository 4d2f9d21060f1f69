"""A fault campaign on the demo's loop: kill, corrupt, misbehave, and check what the user gets.

Each case runs real `grpo train` processes on a tiny model and holds the outcome to one rule:
either the run's files equal an unbroken run's (weights bit for bit, metrics but wall-clock
times, samples), or the command ends with exit status 2 and ONE line on stderr that names what
is at fault, leaving what was there as it was. A case prints `ok` or `FAILED` with what it saw;
the last line is the figure, `K of N cases hold`, and the exit status is 1 if any failed.

    python benchmarks/fault_campaign.py            # every case (several minutes on 2 cores)
    python benchmarks/fault_campaign.py --fast     # one of each kind (what CI runs)
    python benchmarks/fault_campaign.py --kills 8  # more SIGKILLs at random moments

Cases: SIGKILL at named points (a checkpoint write, a step, after the step-0 evaluation) and at
seeded random moments, each followed by `resume=auto` until the run ends; checkpoints corrupted
(a file truncated, a byte flipped, the manifest or a weight file removed, every checkpoint
corrupt); a reward server on loopback that fails (HTTP 500, not JSON, `null`, a dropped
connection, a trickle slower than the deadline) under reward_on_error=raise and skip; a second
run on a directory in use; the dataset changed under a resume; an output_dir that is a file.
On a real vLLM server (where vLLM is installed: run it with .venv-vllm's python; `--engine only`
for these alone): a server failing its weight loads under two trainer processes (the run equals
the same processes on the other server alone, and no request reaches the failed one), SIGINT
and SIGTERM to `grpo launch` (a checkpoint, then `grpo launch ... resume=auto` ends as the
unbroken run), a weights folder too small (a real 1 MiB tmpfs), another server on launch's port.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ARGS = ["sft_steps=3", "prompts_per_step=4", "group_size=4", "max_new_tokens=6", "steps=6",
        "eval_every=3", "eval_size=8", "save_every=2", "keep_last=3", "beta=0.04", "lr=1e-3",
        "threads=1", "seed=3"]
TIMEOUT_S = 300
CLOCKS = ("time/", "tokens/s", "pipeline/trainer_wait_s", "pipeline/worker_wait_s",
          "pipeline/publish_s")   # wall-clock figures: no two runs repeat them


def grpo(args: list[str], run: Path, *, fault: str = "", resume: bool = False,
         timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GRPO_FAULT_KILL_AT": fault}
    cmd = [sys.executable, "-m", "grpo", "train", *args, f"output_dir={run}"]
    return subprocess.run(cmd + (["resume=auto"] if resume else []), env=env, capture_output=True,
                          text=True, timeout=timeout)


def files_of(run: Path) -> dict:
    """What a resumed run must repeat: weights, metrics without wall-clock figures, samples."""
    from safetensors.torch import load_file
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    metrics = [{k: v for k, v in r.items() if not k.startswith(CLOCKS)} for r in rows]
    weights = load_file(run / "final" / "model.safetensors")
    return {"metrics": metrics, "samples": (run / "samples.jsonl").read_text(),
            "weights": {k: v.tolist() for k, v in weights.items()}}


def differences(run: Path, reference: dict) -> str:
    """'' when the run's files equal the unbroken run's, else which differ."""
    if not (run / "final" / "model.safetensors").is_file():
        return "the run has no final/ model"
    got = files_of(run)
    named = []
    for k in reference:
        if got[k] == reference[k]:
            continue
        if k == "metrics":    # which keys, at which steps
            keys = sorted({key for a, b in zip(got[k], reference[k]) for key in a.keys() | b.keys()
                           if a.get(key) != b.get(key)})
            k += f" ({', '.join(keys[:6]) or 'rows'})"
        named.append(k)
    return ", ".join(named)


def one_line_error(done: subprocess.CompletedProcess, *words: str) -> str:
    """'' when the command ended with status 2 and one stderr line holding every word."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    if done.returncode != 2:
        return f"exit status {done.returncode}: {(lines or [''])[-1][:200]}"
    if len(lines) != 1:
        return f"{len(lines)} lines on stderr, the last: {(lines or [''])[-1][:200]}"
    missing = [w for w in words if w not in lines[0]]
    return f"the line does not name {missing}: {lines[0][:200]}" if missing else ""


def resume_to_end(args: list[str], run: Path, attempts: int = 6) -> str:
    for _ in range(attempts):
        done = grpo(args, run, resume=True)
        if done.returncode == 0:
            return ""
        if done.returncode != -signal.SIGKILL:
            return f"resume ended with status {done.returncode}: {done.stderr.strip()[-300:]}"
    return f"no end after {attempts} resumes"


# ---------------------------------------------------------------- the cases

def kill_at(point: str):
    def case(ctx) -> str:
        run = ctx.fresh("kill-" + point.replace(":", "-"))
        done = grpo(ctx.args, run, fault=point)
        if done.returncode != -signal.SIGKILL:
            return f"the fault point {point} was not reached (status {done.returncode})"
        return resume_to_end(ctx.args, run) or differences(run, ctx.reference)
    case.__name__ = f"SIGKILL at {point}, then resume=auto"
    return case


def kill_at_random(seed: int):
    def case(ctx) -> str:
        run = ctx.fresh(f"kill-random-{seed}")
        delay = random.Random(seed).uniform(0.3, 0.9) * ctx.whole_s
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "grpo", "train", *ctx.args, f"output_dir={run}"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.returncode == 0:          # it finished first: a resume must say so and change nothing
            return differences(run, ctx.reference)
        return resume_to_end(ctx.args, run) or differences(run, ctx.reference)
    case.__name__ = f"SIGKILL at a random moment (seed {seed}), then resume=auto"
    return case


def corrupt(how: str):
    def case(ctx) -> str:
        run = ctx.fresh("corrupt-" + how.replace(" ", "-"))
        done = grpo(ctx.args, run, fault="step:5")           # killed in step 5: checkpoints 2, 4
        if done.returncode != -signal.SIGKILL:
            return f"status {done.returncode} where a SIGKILL was set"
        steps = sorted((run / "checkpoints").glob("step-*"), key=lambda p: int(p.name[5:]))
        targets = steps if how == "every checkpoint" else steps[-1:]
        for step in targets:
            weights = next(step.rglob("*.safetensors"))
            if how == "truncated":
                weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
            elif how == "byte flipped":
                data = bytearray(weights.read_bytes())
                data[len(data) // 2] ^= 0xFF
                weights.write_bytes(bytes(data))
            elif how == "manifest removed":
                (step / "manifest.json").unlink()
            else:                                                 # a weight file removed
                weights.unlink()
        done = grpo(ctx.args, run, resume=True)
        if done.returncode != 0:
            return f"resume ended with status {done.returncode}: {done.stderr.strip()[-300:]}"
        if "step-4" not in done.stdout + done.stderr:
            return "the corrupt checkpoint was not named"
        return differences(run, ctx.reference)
    case.__name__ = f"checkpoint corrupted ({how}), then resume=auto"
    return case


class Misbehaving(http.server.BaseHTTPRequestHandler):
    mode = "500"

    def do_POST(self):  # noqa: N802 - the http.server API
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        mode = type(self).mode
        if mode == "drop":
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        status, body = {"500": (500, b"internal error"), "not json": (200, b"<html>"),
                        "null": (200, b"null")}.get(mode, (200, b""))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body) if mode != "trickle" else 10_000))
        self.end_headers()
        try:
            for _ in range(10_000 if mode == "trickle" else 0):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.5)
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):   # the client gave up at its deadline
            pass

    def log_message(self, *args):
        pass


def server_case(mode: str, on_error: str):
    def case(ctx) -> str:
        handler = type("Handler", (Misbehaving,), {"mode": mode})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/score"
        run = ctx.fresh(f"server-{mode.replace(' ', '-')}-{on_error}")
        args = [*ctx.args, f"rewards=[{url}]", f"reward_on_error={on_error}", "eval_every=0",
                "steps=2", "reward_server_timeout_s=3"]
        started = time.monotonic()
        try:
            done = grpo(args, run, timeout=120)
        finally:
            server.shutdown()
        took = time.monotonic() - started
        if on_error == "raise":
            return one_line_error(done, url) or ("" if took < 90 else f"took {took:.0f} s")
        if done.returncode != 0:
            return f"skip: status {done.returncode}: {done.stderr.strip()[-300:]}"
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        counted = any(k.startswith("reward/") and "/error/" in k and v for r in rows for k, v in r.items()
                      if isinstance(v, (int, float)))
        return "" if counted else "skip: no reward/<fn>/error/<cause> counted"
    case.__name__ = f"reward server: {mode}, reward_on_error={on_error}"
    return case


def second_run_on_a_directory_in_use(ctx) -> str:
    run = ctx.fresh("in-use")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen([sys.executable, "-m", "grpo", "train", *ctx.args, "steps=400",
                              f"output_dir={run}"], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (run / "metrics.jsonl").exists():
            time.sleep(0.1)
        before = (run / "metrics.jsonl").read_text()
        second = grpo(ctx.args, run, resume=True, timeout=120)
        said = one_line_error(second, "in use")
        after = (run / "metrics.jsonl").read_text()
        if first.poll() is not None:
            return f"the first run ended: {first.stderr.read()[-300:]}"
        if not after.startswith(before):
            return "the second run changed the first one's metrics"
        return said
    finally:
        first.kill()
        first.wait()


def dataset_changed_under_a_resume(ctx) -> str:
    run = ctx.fresh("data-changed")
    data = run.parent / "data-changed.jsonl"
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(8) for b in range(5)]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    args = [*ctx.args, f"dataset={data}", "sft_steps=0", "eval_every=0"]
    done = grpo(args, run, fault="step:4")
    if done.returncode != -signal.SIGKILL:
        return f"status {done.returncode} where a SIGKILL was set"
    data.write_text("\n".join(json.dumps(r) for r in rows[:20]) + "\n")
    before = contents(run)
    said = one_line_error(grpo(args, run, resume=True), str(data))
    after = contents(run)
    changed = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    return said or (f"files changed: {changed}" if changed else "")


def contents(run: Path) -> dict:
    """Every file of a run directory and its bytes, but the lock file: a killed run leaves it, and
    the next run takes it and removes it when it ends (docs/faults.md)."""
    return {str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*")
            if p.is_file() and p.name != ".grpo-run.lock"}


def output_dir_that_is_a_file(ctx) -> str:
    path = ctx.fresh("a-file")
    path.write_text("not a directory\n")
    said = one_line_error(grpo(ctx.args, path, timeout=120), str(path))
    return said or ("" if path.read_text() == "not a directory\n" else "the file was changed")


# ---------------------------------------------------------------- on a real vLLM server

ENGINE_ARGS = ["sft_steps=0", "prompts_per_step=4", "group_size=4", "max_new_tokens=8", "steps=5",
               "eval_every=0", "save_every=0", "threads=1", "lr=1e-3", "seed=3", "report_to=[]",
               "rewards=[slowreward:varied]"]
SLOW_REWARD = """import time
def varied(prompts, completions, **columns):
    time.sleep(0.5)      # steps long enough for a signal to land mid-run
    return [len(set(c)) / 6 for c in completions]
"""


def engine_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}


def start_server(model: str, log: Path):
    """A real `vllm serve` as grpo launch starts it, on a free port; (process, url)."""
    from grpo.commands.launch import free_port, server_command, wait_healthy
    from grpo.config import build_config
    port = free_port()
    config = build_config({"model": model, "dtype": "float32", "vllm_gpu_memory_utilization": 0.1})
    with open(log, "w") as out:
        process = subprocess.Popen(server_command(config, model, port) + ["--max-model-len", "512"],
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**engine_env(), "VLLM_SERVER_DEV_MODE": "1"})
    url = f"http://127.0.0.1:{port}"
    wait_healthy(process, url, log, 600, lambda line: None)
    return process, url


class FailingLoads:
    """A loopback HTTP server in front of a real vLLM server: every request passed on, but the
    `fail_from`-th weight load and every later one answered 500; counts completion requests
    reaching it after the first it failed."""

    def __init__(self, target: str, fail_from: int):
        import urllib.error
        import urllib.request
        self.loads, self.after, lock, proxy = 0, 0, threading.Lock(), self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, status: int, body: bytes):
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _pass(self, body):
                with lock:
                    if self.path == "/collective_rpc":
                        proxy.loads += 1
                        if proxy.loads >= fail_from:
                            return self._answer(500, b'{"error": "a load that fails"}')
                    elif self.path == "/v1/completions" and proxy.loads >= fail_from:
                        proxy.after += 1
                request = urllib.request.Request(target + self.path, data=body, method=self.command,
                                                 headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(request, timeout=300) as r:
                        return self._answer(r.status, r.read())
                except urllib.error.HTTPError as e:
                    return self._answer(e.code, e.read())

            def do_GET(self):  # noqa: N802 - the http.server API
                self._pass(None)

            def do_POST(self):  # noqa: N802
                self._pass(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def train_on(urls: list[str], run: Path, cwd: Path, *more: str, nproc: int = 1):
    from grpo.commands.launch import free_port
    head = ([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
             f"--master-port={free_port()}", "-m", "grpo", "train"] if nproc > 1
            else [sys.executable, "-m", "grpo", "train"])
    url = urls[0] if len(urls) == 1 else "[" + ",".join(urls) + "]"
    return subprocess.run([*head, f"model={cwd / 'engine-model'}", "sampler=vllm_server",
                           f"vllm_url={url}", *ENGINE_ARGS, *more, f"output_dir={run}"],
                          cwd=cwd, env=engine_env(), capture_output=True, text=True, timeout=900)


def a_server_failing_a_load_under_two_processes(ctx) -> str:
    alone, two = ctx.fresh("load-alone"), ctx.fresh("load-two")
    done = train_on([ctx.server_url], alone, ctx.root, "async_steps=1", nproc=2)
    if done.returncode:
        return f"the run on one server failed: {done.stderr.strip()[-300:]}"
    proxy = FailingLoads(ctx.server_url, fail_from=2)
    try:
        done = train_on([ctx.server_url, proxy.url], two, ctx.root, "async_steps=1", nproc=2)
    finally:
        proxy.close()
    if done.returncode:
        return f"status {done.returncode}: {done.stderr.strip()[-300:]}"
    if proxy.after:
        return f"{proxy.after} completion requests reached the server after its failed load"
    return differences(two, files_of(alone))


def launch(args: list[str], run: Path, cwd: Path, *more: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "grpo", "launch", f"model={cwd / 'engine-model'}",
                             *args, *more, f"output_dir={run}"], cwd=cwd, env=engine_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def launch_reference(ctx) -> dict:
    if "launch" not in ctx.engine_reference:
        run = ctx.fresh("launch-whole")
        done = launch(ENGINE_ARGS, run, ctx.root)
        err = done.communicate(timeout=900)[1]
        if done.returncode:
            raise RuntimeError(f"the unbroken grpo launch run failed: {err.strip()[-300:]}")
        ctx.engine_reference["launch"] = files_of(run)
    return ctx.engine_reference["launch"]


def signal_to_launch(signum: int):
    def case(ctx) -> str:
        reference = launch_reference(ctx)
        run = ctx.fresh(f"launch-{signal.Signals(signum).name}")
        proc = launch(ENGINE_ARGS, run, ctx.root)
        metrics = run / "metrics.jsonl"
        deadline = time.time() + 900
        while not metrics.is_file() or len(metrics.read_text().splitlines()) < 2:
            if proc.poll() is not None or time.time() > deadline:
                return f"the run ended before its second step: {proc.stderr.read()[-300:]}"
            time.sleep(0.1)
        proc.send_signal(signum)
        err = proc.communicate(timeout=600)[1]
        if proc.returncode != 128 + signum:
            return f"status {proc.returncode}, not {128 + signum}: {err.strip()[-300:]}"
        if not list((run / "checkpoints").glob("step-*")):
            return "no checkpoint was written"
        for kept in re.findall(r"kept in (\S+); remove it", err):
            shutil.rmtree(kept, ignore_errors=True)
        resumed = launch(ENGINE_ARGS, run, ctx.root, "resume=auto")
        err = resumed.communicate(timeout=900)[1]
        if resumed.returncode:
            return f"the resume ended with status {resumed.returncode}: {err.strip()[-300:]}"
        return differences(run, reference)
    case.__name__ = f"{signal.Signals(signum).name} to grpo launch, then grpo launch resume=auto"
    return case


def a_full_weights_dir(ctx) -> str:
    shm = ctx.fresh("small-shm")
    shm.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(shm)],
                             capture_output=True, text=True)
    if mounted.returncode:
        return f"cannot mount a tmpfs here to fill: {mounted.stderr.strip()}"
    try:
        done = train_on([ctx.server_url], ctx.fresh("full-shm"), ctx.root, f"vllm_weights_dir={shm}")
        said = one_line_error(done, "vllm_weights_dir", "MiB free")
        left = [str(p) for p in shm.rglob("*") if p.is_file()]
        return said or (f"files left: {left}" if left else "")
    finally:
        subprocess.run(["umount", str(shm)])


def a_foreign_server_on_the_port(ctx) -> str:
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    port = other.server_address[1]
    try:
        done = subprocess.run([sys.executable, "-m", "grpo", "launch", f"model={ctx.root / 'engine-model'}",
                               *ENGINE_ARGS, f"output_dir={ctx.fresh('foreign')}", "--port", str(port)],
                              cwd=ctx.root, env=engine_env(), capture_output=True, text=True, timeout=300)
        return one_line_error(done, f"--port {port}", "taken")
    finally:
        other.shutdown()
        other.server_close()


def engine_cases() -> list:
    return [a_server_failing_a_load_under_two_processes, signal_to_launch(signal.SIGINT),
            signal_to_launch(signal.SIGTERM), a_full_weights_dir, a_foreign_server_on_the_port]


# ---------------------------------------------------------------- running them

class Context:
    def __init__(self, root: Path, args: list[str]):
        self.root, self.args = root, args
        self.reference: dict = {}
        self.whole_s = 0.0
        self.server_url = ""              # the engine cases' shared vLLM server
        self.engine_reference: dict = {}

    def fresh(self, name: str) -> Path:
        path = self.root / name
        shutil.rmtree(path, ignore_errors=True)
        return path


def cases(fast: bool, kills: int) -> list:
    if fast:
        return [kill_at("checkpoint:2"), kill_at_random(0), corrupt("truncated"),
                server_case("500", "raise"), server_case("null", "skip"),
                second_run_on_a_directory_in_use, dataset_changed_under_a_resume,
                output_dir_that_is_a_file]
    return [kill_at("checkpoint:1"), kill_at("checkpoint:2"), kill_at("step:1"), kill_at("step:4"),
            kill_at("step:6"), *[kill_at_random(seed) for seed in range(kills)],
            *[corrupt(how) for how in ("truncated", "byte flipped", "manifest removed",
                                        "weight file removed", "every checkpoint")],
            *[server_case(mode, on_error) for mode in ("500", "not json", "null", "drop", "trickle")
              for on_error in ("raise", "skip")],
            second_run_on_a_directory_in_use, dataset_changed_under_a_resume,
            output_dir_that_is_a_file]


def has_vllm() -> bool:
    import importlib.util
    return importlib.util.find_spec("vllm") is not None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="one case of each kind")
    parser.add_argument("--engine", choices=["auto", "only", "no"], default="auto",
                        help="the cases on a real vLLM server: with the others where vLLM is "
                             "installed (auto), alone, or none")
    parser.add_argument("--kills", type=int, default=4, help="SIGKILLs at random moments")
    parser.add_argument("--model", default="", help="a model directory (default: a tiny one built here)")
    parser.add_argument("--only", default="", help="run the cases whose name holds this text")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="grpo-faults-") as tmp:
        root = Path(tmp)
        model = options.model
        if not model:
            from grpo.models import build_tiny
            model = str(build_tiny(root / "model", hidden_size=32, layers=2, heads=2))
        ctx = Context(root, [f"model={model}", *ARGS])
        engine = options.engine == "only" or (options.engine == "auto" and has_vllm())
        chosen = [] if options.engine == "only" else cases(options.fast, options.kills)
        chosen += engine_cases() if engine else []
        chosen = [c for c in chosen if options.only in c.__name__]
        if options.engine == "auto" and not engine:
            print("the cases on a real vLLM server are left out: vLLM is not installed here "
                  "(run with .venv-vllm's python)")
        engine_names = {c.__name__ for c in engine_cases()}
        if any(c.__name__ not in engine_names for c in chosen):
            started = time.monotonic()
            whole = grpo(ctx.args, root / "whole")
            ctx.whole_s = time.monotonic() - started
            if whole.returncode != 0:
                print(f"the unbroken run failed: {whole.stderr[-2000:]}", file=sys.stderr)
                return 1
            ctx.reference = files_of(root / "whole")
        server = None
        if engine and chosen:
            from grpo.commands.launch import stop
            from grpo.models import build_tiny
            build_tiny(root / "engine-model")
            (root / "slowreward.py").write_text(SLOW_REWARD)
            server, ctx.server_url = start_server(str(root / "engine-model"), root / "vllm-server.log")
        try:
            return run_cases(ctx, chosen)
        finally:
            if server is not None:
                stop(server)


def run_cases(ctx: Context, chosen: list) -> int:
    """Each case, a line each; the figure last; 1 if any failed."""
    held = 0
    for case in chosen:
        started = time.monotonic()
        try:
            problem = case(ctx)
        except Exception as e:  # noqa: BLE001 - a case that crashes is a failed case
            problem = f"{type(e).__name__}: {e}"
        held += not problem
        print(f"{'ok    ' if not problem else 'FAILED'}  {case.__name__}  "
              f"({time.monotonic() - started:.0f} s){'' if not problem else ': ' + problem}",
              flush=True)
    print(f"{held} of {len(chosen)} cases hold")
    return 0 if held == len(chosen) else 1

if __name__ == "__main__":
    sys.exit(main())
