"""Synchronous GRPO against async_steps=1 (one rollout worker, one trainer) on the same cores.

    python benchmarks/async_pipeline.py                       # every task, as below
    python benchmarks/async_pipeline.py --tasks d --seeds 0   # one task, one seed

Four tasks, each run synchronously and with async_steps=1, one after the other (the order
alternates by seed), with nothing else on the machine:

    a  the README demo (`grpo train`: tiny model, `largest`, 300 steps, held-out accuracy every 20)
    b  the agent demo (examples/agent-calculator.yaml), both runs from one shared cold start
    c  a code task scored by `code_tests` in the sandbox: "largest of 3 8 5 1:" answered by a
       program `def f(): return 8`, with a held-out file of the same kind (40 steps)
    d  the demo scored by a reward server that answers after 0.5 s (a remote judge; 60 steps)

For every run: the median step time (steps 4 on), the total step time, the wall time of the whole
command, the final held-out accuracy, the step time spent until the first evaluation at or above
the synchronous run's final accuracy, and with async_steps how long the trainer waited for its
groups and the worker for its weights. Written to --out/async_pipeline.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parent


def grpo(*args: str, log: Path | None = None) -> float:
    """Run `grpo ARGS`; returns its wall time in seconds."""
    started = time.perf_counter()
    with open(log, "w") if log else open(os.devnull, "w") as out:
        subprocess.run([sys.executable, "-m", "grpo", *args], check=True, stdout=out,
                       stderr=subprocess.STDOUT, cwd=ROOT)
    return time.perf_counter() - started


def judge(delay: float) -> ThreadingHTTPServer:
    """A reward server on a free local port: exact answers, each request answered after `delay`."""
    from grpo.rewards import exact_answer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the http.server API
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(delay)
            rewards = exact_answer(body["prompts"], body["completions"], **body["columns"])
            data = json.dumps({"rewards": rewards}).encode()
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


def code_files(out: Path) -> tuple[Path, Path]:
    """The code task: `largest of ...:` -> a program whose f() returns the largest digit."""
    def rows(held_out: bool, n: int, seed: int) -> list[dict]:
        from grpo.data.tasks.largest import LargestTask
        task = LargestTask()
        picked = task.eval_rows() if held_out else task.train_rows(seed)
        return [{"prompt": r["prompt"], "completion": f"def f():\n    return {r['answer']}",
                 "tests": [f"assert f() == {r['answer']}"]} for r in picked[:n]]
    train, held = out / "code_train.jsonl", out / "code_eval.jsonl"
    for path, data in ((train, rows(False, 2000, 0)), (held, rows(True, 100, 0))):
        path.write_text("".join(json.dumps(r) + "\n" for r in data))
    return train, held


def summary(run_dir: Path, wall: float) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time/step_s" in r]
    evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    step_s = [r["time/step_s"] for r in steps]
    out = {"steps": len(steps), "median_step_s": statistics.median(step_s[3:] or step_s),
           "total_step_s": sum(step_s), "wall_s": wall, "final_accuracy": evals[-1][1] if evals else None,
           "evals": evals, "cumulative_step_s": {r["step"]: v for r, v in
                                                   zip(steps, _cumsum(step_s))}}
    if "pipeline/trainer_wait_s" in steps[-1]:
        out["trainer_wait_s"] = sum(r["pipeline/trainer_wait_s"] for r in steps)
        out["worker_wait_s"] = sum(r["pipeline/worker_wait_s"] for r in steps)
        out["sample_s"] = sum(r["time/sample_s"] for r in steps)
        out["reward_s"] = sum(r["time/reward_s"] for r in steps)
    else:
        out["sample_s"] = sum(r["time/sample_s"] for r in steps)
        out["reward_s"] = sum(r["time/reward_s"] for r in steps)
    return out


def _cumsum(values):
    total = 0.0
    for v in values:
        total += v
        yield total


def time_to(result: dict, target: float | None) -> float | None:
    """Step time spent until the first evaluation at or above `target` (None: never reached)."""
    if target is None:
        return None
    for step, accuracy in result["evals"]:
        if accuracy >= target - 1e-9:
            return result["cumulative_step_s"].get(step, 0.0)
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", default="a,b,c,d")
    ap.add_argument("--seeds", default="0,1,2", help="seeds for tasks a and b (c and d use the first)")
    ap.add_argument("--out", default="benchmarks/results/async_pipeline")
    ap.add_argument("--again", action="store_true", help="measure pairs already in the results again")
    ap.add_argument("--sim", action="store_true",
                    help="no runs: feed the runs in --out to benchmarks/pipeline_sim.py (each role's "
                         "measured phase costs) and compare its predicted step times with the measured")
    args = ap.parse_args()
    out = (ROOT / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.sim:
        check_simulator(out)
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    results_file = out / "async_pipeline.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}

    server = judge(0.5)
    tasks = {
        "a": (seeds, []),
        "b": (seeds, ["examples/agent-calculator.yaml"]),
        "c": (seeds[:1], []),
        "d": (seeds[:1], ["steps=60", f"rewards=[http://127.0.0.1:{server.server_port}/score]"]),
    }
    for name in args.tasks.split(","):
        task_seeds, extra = tasks[name]
        if name == "b":
            cold = out / "agent_cold_start"
            if not (cold / "final" / "config.json").exists():
                grpo("sft", "examples/agent-calculator.yaml", f"output_dir={cold}", log=out / "agent_sft.log")
            extra = [*extra, f"model={cold / 'final'}", "sft_steps=0"]
        if name == "c":
            train, held = code_files(out)
            extra = [f"dataset={train}", f"eval_dataset={held}", "prompt_column=prompt",
                     "rewards=[code_tests]", "sft_steps=60", "max_new_tokens=24", "steps=40",
                     "eval_every=20", "eval_size=100", "code_workers=2"]
        for seed in task_seeds:
            if f"{name}-seed{seed}" in results and not args.again:
                continue   # measured already (--again measures it anew)
            pair = {}
            modes = ["sync", "async"] if seed % 2 == 0 else ["async", "sync"]
            for mode in modes:
                run_dir = out / f"{name}-{mode}-seed{seed}"
                if run_dir.exists():
                    import shutil
                    shutil.rmtree(run_dir)
                keys = ["async_steps=1"] if mode == "async" else []
                cmd = ["train", *extra[:1]] if extra and extra[0].endswith(".yaml") else ["train"]
                rest = extra[1:] if extra and extra[0].endswith(".yaml") else extra
                wall = grpo(*cmd, *rest, *keys, f"seed={seed}", f"output_dir={run_dir}", "report_to=[]",
                            log=out / f"{name}-{mode}-seed{seed}.log")
                pair[mode] = summary(run_dir, wall)
                print(name, seed, mode, {k: v for k, v in pair[mode].items()
                                         if k not in ("evals", "cumulative_step_s")}, flush=True)
            target = pair["sync"]["final_accuracy"]
            for mode in pair:
                pair[mode]["time_to_sync_final_s"] = time_to(pair[mode], target)
            pair["step_ratio"] = pair["async"]["median_step_s"] / pair["sync"]["median_step_s"]
            results[f"{name}-seed{seed}"] = pair
            results_file.write_text(json.dumps(results, indent=1))
    write_table(results, out / "async_pipeline.md")


def phase_medians(run_dir: Path) -> dict:
    """Median seconds of each phase over steps 4 on, as the run's own processes measured them."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/step_s" in r][3:]
    keys = {"step": "time/step_s", "sample": "time/sample_s", "reward": "time/reward_s",
            "reference": "time/reference_s", "update": "time/update_s",
            "wait": "pipeline/trainer_wait_s"}
    medians = {name: statistics.median(r.get(key, 0.0) for r in rows) for name, key in keys.items()}
    # rewards to advantages: counted in time/reward_s until it had a timer of its own
    medians["reward"] += statistics.median(r.get("time/advantage_s", 0.0) for r in rows)
    return medians


def sim_inputs(sync: dict, asyn: dict, rows: int) -> dict:
    """The simulator's inputs: every phase a cost per step (lengths of 1 token, so a decode step
    costs the measured sampling time), the async run's costs as its worker (1 thread) and trainer
    (1 thread) measured them, the baseline's as the synchronous run (2 threads) measured them;
    whatever else a step spent (metrics, logging) is a per-step overhead of the trainer."""
    def costs(m: dict, trainer_other: float) -> dict:
        return {"decode_step_s": m["sample"], "reward_s_per_batch": m["reward"],
                "logprob_s_per_token": m["reference"] / rows, "train_s_per_token": m["update"] / rows,
                "step_overhead_s": max(0.0, trainer_other)}
    base = costs(sync, sync["step"] - sync["sample"] - sync["reward"] - sync["reference"] - sync["update"])
    run = costs(asyn, asyn["step"] - asyn["wait"] - asyn["reference"] - asyn["update"])
    return {"prompts_per_step": rows, "group_size": 1, "steps": 40, "async_steps": 1,
            "lengths": {"kind": "constant", "value": 1}, "rollout_workers": 1, "colocated": False,
            "score_beside_decode": True, **run, "baseline": {"colocated": True, **base}}


def check_simulator(out: Path) -> None:
    sys.path.insert(0, str(HERE))
    import pipeline_sim
    results = json.loads((out / "async_pipeline.json").read_text())
    lines = ["| task, seed | measured sync step | measured async step | predicted async step | error | "
             "measured ratio | predicted ratio |", "|---|---|---|---|---|---|---|"]
    checked = {}
    for key, pair in sorted(results.items()):
        task, seed = key.split("-seed")
        sync = phase_medians(out / f"{task}-sync-seed{seed}")
        asyn = phase_medians(out / f"{task}-async-seed{seed}")
        data = sim_inputs(sync, asyn, rows=128)
        (out / f"sim-{key}.json").write_text(json.dumps(data, indent=1))
        got = pipeline_sim.compare(pipeline_sim.load_inputs(data))
        predicted = got["run"].median_step_s
        measured = pair["async"]["median_step_s"]
        error = predicted / measured - 1
        checked[key] = {"predicted_async_step_s": predicted, "measured_async_step_s": measured,
                        "error": error, "predicted_ratio": 1 / got["speedup_step"],
                        "measured_ratio": pair["step_ratio"],
                        "predicted_sync_step_s": got["baseline"].median_step_s,
                        "measured_sync_step_s": pair["sync"]["median_step_s"]}
        lines.append(f"| {key} | {pair['sync']['median_step_s']:.3f} s | {measured:.3f} s | "
                     f"{predicted:.3f} s | {error:+.1%} | {pair['step_ratio']:.2f} | "
                     f"{1 / got['speedup_step']:.2f} |")
        print(lines[-1], flush=True)
    (out / "pipeline_sim_check.json").write_text(json.dumps(checked, indent=1))
    (out / "pipeline_sim_check.md").write_text("\n".join(lines) + "\n")


def write_table(results: dict, path: Path) -> None:
    lines = ["| task, seed | sync step (median) | async step | ratio | sync total | async total | "
             "final accuracy sync / async | time to sync's final accuracy, sync / async | trainer waited | worker waited |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for key, pair in sorted(results.items()):
        s, a = pair["sync"], pair["async"]
        ts, ta = s.get("time_to_sync_final_s"), a.get("time_to_sync_final_s")
        shown = lambda t: "not reached" if t is None else f"{t:.1f} s"  # noqa: E731
        lines.append(
            f"| {key} | {s['median_step_s']:.3f} s | {a['median_step_s']:.3f} s | {pair['step_ratio']:.2f} | "
            f"{s['total_step_s']:.1f} s | {a['total_step_s']:.1f} s | "
            f"{s['final_accuracy']} / {a['final_accuracy']} | "
            f"{shown(ts)} / {shown(ta)} | "
            f"{a.get('trainer_wait_s', 0):.1f} s | {a.get('worker_wait_s', 0):.1f} s |")
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    random.seed(0)
    main()
