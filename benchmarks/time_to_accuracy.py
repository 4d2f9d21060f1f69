"""Wall time to a held-out accuracy: grpo against TRL's GRPOTrainer from the same cold start.

    python benchmarks/time_to_accuracy.py --trl-python /path/to/trl-venv/bin/python

1. `grpo sft` with the demo's settings (tiny model, `largest` task, 10 steps, seed 0): the
   cold-start checkpoint both libraries start from.
2. TRL trains it for 100 steps with the demo's hyperparameters (16 prompts x 8 completions,
   8 new tokens, lr 5e-4, beta 0.04, mu 1, temperature 1, exact-answer reward); `grpo eval` then
   measures the held-out accuracy A of TRL's model (greedy, the task's 200 held-out prompts).
3. grpo trains the same checkpoint with the same settings, evaluating every `--eval-every` steps,
   for up to `--grpo-steps` steps.

Steps 2 and 3 run once per seed in `--seeds` (default 0,1,2; both libraries get the seed), since
on one seed of this toy task the step at which a rule is learned moves with the draws. Wall time
counts training steps only (no start-up, no evaluation) on both sides: TRL's is the sum of its
100 step times, grpo's the sum of `time/step_s` up to the first evaluation at or above A. Each
seed's ratio and their median are printed as JSON and written to --out/time_to_accuracy.json.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
DEMO = ["task=largest", "prompts_per_step=16", "group_size=8", "max_new_tokens=8", "lr=5e-4",
        "beta=0.04", "num_iterations=1", "seed=0"]


def grpo(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "grpo.commands.cli", *args], check=True, text=True,
                          stdout=subprocess.PIPE).stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trl-python", required=True)
    ap.add_argument("--trl-steps", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--grpo-steps", type=int, default=200,
                    help="grpo's longest run; its time counts only up to TRL's accuracy")
    ap.add_argument("--seeds", type=lambda v: [int(x) for x in v.split(",")], default=[0, 1, 2])
    ap.add_argument("--out", default="benchmarks/results/time_to_accuracy")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    cold = out / "cold_start" / "final"
    if not (cold / "config.json").exists():
        grpo("sft", "model=tiny", "sft_steps=10", f"output_dir={out / 'cold_start'}", *DEMO)
    start_accuracy = json.loads(grpo("eval", f"model={cold}", *DEMO))["eval/accuracy"]

    from grpo import assembly
    from grpo.config import load_config
    from grpo.models import load_tokenizer
    config = load_config(None, [f"model={cold}", *DEMO])
    rows = assembly.load_data(config, None).train_rows
    prompts = out / "largest_prompts.jsonl"
    with open(prompts, "w") as f:
        for row, text in zip(rows, assembly.prompt_texts(config, load_tokenizer(str(cold)), rows,
                                                           assembly.agent_of(config))):
            f.write(json.dumps({"prompt": text, "answer": row["answer"]}) + "\n")

    runs = [one_seed(args, out, cold, prompts, seed) for seed in args.seeds]
    # a seed where grpo never reached TRL's accuracy counts as an infinite ratio
    median = statistics.median(r["time_ratio"] if r["time_ratio"] is not None else math.inf for r in runs)
    result = {"start_accuracy": start_accuracy, "seeds": runs,
              "median_time_ratio": None if math.isinf(median) else median}
    (out / "time_to_accuracy.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


def one_seed(args, out: Path, cold: Path, prompts: Path, seed: int) -> dict:
    """TRL's 100 steps and grpo's run to TRL's accuracy, both with this seed."""
    trl_model = out / f"trl_final_seed{seed}"
    trl = subprocess.run(
        [args.trl_python, str(HERE / "trl_driver.py"), "--model", str(cold), "--prompts", str(prompts),
         "--steps", str(args.trl_steps), "--max-new-tokens", "8", "--prompts-per-step", "16",
         "--group-size", "8", "--beta", "0.04", "--lr", "5e-4", "--seed", str(seed),
         "--save", str(trl_model)],
        check=True, text=True, stdout=subprocess.PIPE).stdout
    trl = json.loads(trl.strip().splitlines()[-1])
    settings = [s for s in DEMO if not s.startswith("seed=")] + [f"seed={seed}"]
    trl_accuracy = json.loads(grpo("eval", f"model={trl_model}", *settings))["eval/accuracy"]

    run = out / f"grpo_run_seed{seed}"
    shutil.rmtree(run, ignore_errors=True)   # a fresh run each time (train refuses a used directory)
    grpo("train", f"model={cold}", "sft_steps=0", f"steps={args.grpo_steps}",
         f"eval_every={args.eval_every}", f"output_dir={run}", *settings)
    elapsed, reached, steps = 0.0, None, 0
    curve = []
    for line in open(run / "metrics.jsonl"):
        m = json.loads(line)
        elapsed += m.get("time/step_s", 0.0)
        steps += "time/step_s" in m
        if "eval/accuracy" in m:
            curve.append((m["step"], m["eval/accuracy"], round(elapsed, 2)))
            if reached is None and m["eval/accuracy"] >= trl_accuracy:
                reached = {"step": m["step"], "seconds": round(elapsed, 2), "accuracy": m["eval/accuracy"]}
    result = {"seed": seed,
              "trl": {"steps": args.trl_steps, "seconds": trl["train_s"], "accuracy": trl_accuracy,
                      "sec_per_step": trl["sec_per_step"]},
              "grpo": {"reached": reached, "sec_per_step": round(elapsed / max(1, steps), 4),
                       "curve": curve},
              "time_ratio": round(reached["seconds"] / trl["train_s"], 3) if reached else None}
    print(f"seed {seed}: TRL {trl_accuracy:.3f} in {trl['train_s']:.1f} s; grpo "
          + (f"step {reached['step']}, {reached['seconds']:.1f} s" if reached else
             f"not reached in {args.grpo_steps} steps"), file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
