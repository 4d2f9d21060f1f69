"""Two checkouts, the same runs: do they give the same outputs?

A change that should not change what grpo computes (a refactor, a move into packages) is held to
this: for each run below, both checkouts' `metrics.jsonl` are equal but for the wall-clock columns
(`time/*`, `tokens/s`, the pipeline's waits), and their `final/` weights are byte-equal. A checkpoint written by
the first checkout is resumed by the second, and must end as the first's unbroken run ends.

    python benchmarks/same_outputs.py BEFORE_DIR AFTER_DIR            # the runs, shortened
    python benchmarks/same_outputs.py BEFORE_DIR AFTER_DIR --full     # the demos as the README runs them
    python benchmarks/same_outputs.py BEFORE_DIR AFTER_DIR --full --side-by-side   # both at once
    .venv-vllm/bin/python benchmarks/same_outputs.py BEFORE AFTER --full --only vllm   # on vLLM

BEFORE_DIR and AFTER_DIR are checkouts (git worktree add /tmp/before <commit>); each is run with
its own `src/` first on PYTHONPATH, in this environment. Runs: the demo, the agent demo
(examples/agent-calculator.yaml), the vision demo (task=shapes), async_steps=1, and two processes
under torchrun; then the resume of an async_steps=1 checkpoint; and where vLLM is installed, the
README's `grpo train model=tiny sampler=vllm steps=20` (its engine in the training process). One line per run, `same` or what
differs; the exit status is 1 if any differs.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SHORT = ["steps=4", "eval_every=2", "eval_size=16", "sft_steps=20", "save_every=2"]
RUNS = {   # name -> (launcher, arguments), the shortened ones' extra keys after them
    "demo": ([], []),
    "agent demo": ([], ["examples/agent-calculator.yaml"]),
    "vision demo": ([], ["task=shapes"]),
    "async_steps=1": ([], ["async_steps=1"]),
    "two processes": (["-m", "torch.distributed.run", "--nproc-per-node", "2"], ["prompts_per_step=16"]),
}
VLLM_RUN = ("sampler=vllm", ["model=tiny", "sampler=vllm", "steps=20"])   # the README's command
CLOCKS = ("tokens/s", "pipeline/publish_s", "pipeline/trainer_wait_s", "pipeline/worker_wait_s")
RESUME = "an async_steps=1 checkpoint of the first, killed in step 3, resumed by the second"


def grpo(checkout: Path, launcher: list[str], args: list[str], out: Path, timeout: float = 1800,
         env: dict | None = None) -> None:
    env = {**os.environ, "PYTHONPATH": str(checkout / "src"), "OMP_NUM_THREADS": "1", **(env or {})}
    if "torch.distributed.run" in launcher:   # a port of its own: two checkouts may run at once
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            launcher = [*launcher, f"--master-port={s.getsockname()[1]}"]
    command = [sys.executable, *launcher, "-m", "grpo", "train", *args, f"output_dir={out}"]
    done = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} in {checkout} ended with {done.returncode}: "
                           f"{done.stderr.strip()[-1500:]}")


def outputs(run: Path) -> tuple[list[dict], dict[str, str]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    metrics = [{k: v for k, v in r.items() if not k.startswith("time/") and k not in CLOCKS} for r in rows]
    weights = {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
               for p in sorted((run / "final").rglob("*.safetensors"))}
    return metrics, weights


def differences(a: Path, b: Path) -> str:
    (ma, wa), (mb, wb) = outputs(a), outputs(b)
    said = []
    if len(ma) != len(mb):
        said.append(f"{len(ma)} metric rows against {len(mb)}")
    for i, (x, y) in enumerate(zip(ma, mb)):
        if x != y:
            keys = sorted(k for k in x.keys() | y.keys() if x.get(k) != y.get(k))
            said.append(f"row {i} (step {x.get('step')}) differs in {keys[:6]}")
            break
    if wa != wb:
        said.append("final/ weights differ" if wa.keys() == wb.keys() else f"final/ files differ: {sorted(wa)} vs {sorted(wb)}")
    return "; ".join(said)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--full", action="store_true", help="the demos as the README runs them")
    parser.add_argument("--only", default="", help="the runs whose name holds this text")
    parser.add_argument("--side-by-side", action="store_true",
                        help="run each pair's two checkouts at once (each with one thread: on two "
                             "cores, about half the time; only the outputs are compared, not times)")
    options = parser.parse_args(argv)
    before, after = options.before.resolve(), options.after.resolve()
    failed = 0
    with tempfile.TemporaryDirectory(prefix="grpo-same-") as tmp:
        root = Path(tmp)
        runs = dict(RUNS)
        if importlib.util.find_spec("vllm") is not None:
            runs[VLLM_RUN[0]] = ([], VLLM_RUN[1])
        for name, (launcher, args) in runs.items():
            if options.only not in name:
                continue
            args = args + ([] if options.full else SHORT)
            key = name.replace(" ", "-").replace("=", "")
            try:
                env = {"VLLM_CPU_KVCACHE_SPACE": "1"} if name == VLLM_RUN[0] else None
                pair = [(before, root / f"{key}-before"), (after, root / f"{key}-after")]
                if options.side_by_side:
                    with ThreadPoolExecutor(2) as pool:
                        list(pool.map(lambda side: grpo(side[0], launcher, args, side[1], env=env), pair))
                else:
                    for checkout, out in pair:
                        grpo(checkout, launcher, args, out, env=env)
                problem = differences(root / f"{key}-before", root / f"{key}-after")
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                problem = str(e)
            failed += bool(problem)
            print(f"{name}: {problem or 'same'}", flush=True)
        if options.only in RESUME:
            # an async checkpoint of the first checkout (its queued groups in pipeline.pt), written
            # by a run killed in step 3, resumed by the second; the first's unbroken run is the reference
            args = ["async_steps=1", *SHORT]
            whole, cut = root / "resume-whole", root / "resume-cut"
            try:
                grpo(before, [], args, whole)
                try:
                    grpo(before, [], args, cut, env={"GRPO_FAULT_KILL_AT": "step:3"})
                    problem = "the first checkout's run was not killed at step 3"
                except RuntimeError:
                    grpo(after, [], args + ["resume=auto"], cut)
                    problem = differences(whole, cut)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                problem = str(e)
            failed += bool(problem)
            print(f"{RESUME}: {problem or 'same'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
