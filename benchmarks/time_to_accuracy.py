"""Wall time to a held-out accuracy: grpo against TRL's GRPOTrainer from the same cold start.

    python benchmarks/time_to_accuracy.py --trl-python /path/to/trl-venv/bin/python

1. `grpo sft` with the demo's settings (tiny model, `largest` task, 10 steps, seed 0): the
   cold-start checkpoint both libraries start from.
2. TRL trains it for 100 steps with the demo's hyperparameters (16 prompts x 8 completions,
   8 new tokens, lr 5e-4, beta 0.04, mu 1, temperature 1, exact-answer reward); `grpo eval` then
   measures the held-out accuracy A of TRL's model (greedy, the task's 200 held-out prompts).
3. grpo trains the same checkpoint with the same settings, evaluating every `--eval-every` steps.

Wall time counts training steps only (no start-up, no evaluation) on both sides: TRL's is the
sum of its 100 step times, grpo's the sum of `time/step_s` up to the first evaluation at or above
A. The result is printed as JSON and written to --out/time_to_accuracy.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
DEMO = ["task=largest", "prompts_per_step=16", "group_size=8", "max_new_tokens=8", "lr=5e-4",
        "beta=0.04", "num_iterations=1", "seed=0"]


def grpo(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "grpo.cli", *args], check=True, text=True,
                          stdout=subprocess.PIPE).stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trl-python", required=True)
    ap.add_argument("--trl-steps", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/time_to_accuracy")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    cold = out / "cold_start" / "final"
    if not (cold / "config.json").exists():
        grpo("sft", "model=tiny", "sft_steps=10", f"output_dir={out / 'cold_start'}", *DEMO)
    start_accuracy = json.loads(grpo("eval", f"model={cold}", *DEMO))["eval/accuracy"]

    from grpo import build
    from grpo.config import load_config
    from grpo.models import load_tokenizer
    config = load_config(None, [f"model={cold}", *DEMO])
    rows = build.load_data(config, None).train_rows
    prompts = out / "largest_prompts.jsonl"
    with open(prompts, "w") as f:
        for row, text in zip(rows, build.prompt_texts(config, load_tokenizer(str(cold)), rows)):
            f.write(json.dumps({"prompt": text, "answer": row["answer"]}) + "\n")

    trl_model = out / "trl_final"
    trl = subprocess.run(
        [args.trl_python, str(HERE / "trl_driver.py"), "--model", str(cold), "--prompts", str(prompts),
         "--steps", str(args.trl_steps), "--max-new-tokens", "8", "--prompts-per-step", "16",
         "--group-size", "8", "--beta", "0.04", "--lr", "5e-4", "--save", str(trl_model)],
        check=True, text=True, stdout=subprocess.PIPE).stdout
    trl = json.loads(trl.strip().splitlines()[-1])
    trl_accuracy = json.loads(grpo("eval", f"model={trl_model}", *DEMO))["eval/accuracy"]

    run = out / "grpo_run"
    shutil.rmtree(run, ignore_errors=True)   # a fresh run each time (train refuses a used directory)
    grpo("train", f"model={cold}", "sft_steps=0", f"steps={args.trl_steps}",
         f"eval_every={args.eval_every}", f"output_dir={run}", *DEMO)
    elapsed, reached = 0.0, None
    curve = []
    for line in open(run / "metrics.jsonl"):
        m = json.loads(line)
        elapsed += m.get("time/step_s", 0.0)
        if "eval/accuracy" in m:
            curve.append((m["step"], m["eval/accuracy"], round(elapsed, 2)))
            if reached is None and m["eval/accuracy"] >= trl_accuracy:
                reached = {"step": m["step"], "seconds": round(elapsed, 2), "accuracy": m["eval/accuracy"]}
    result = {"start_accuracy": start_accuracy,
              "trl": {"steps": args.trl_steps, "seconds": trl["train_s"], "accuracy": trl_accuracy,
                      "sec_per_step": trl["sec_per_step"]},
              "grpo": {"reached": reached, "curve": curve},
              "time_ratio": round(reached["seconds"] / trl["train_s"], 3) if reached else None}
    (out / "time_to_accuracy.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
