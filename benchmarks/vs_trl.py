"""grpo against TRL's GRPOTrainer on the same models, prompts and settings, side by side.

    python benchmarks/vs_trl.py --trl-python /path/to/trl-venv/bin/python [--steps 4] [--repeats 2]

Builds four Qwen2-style models with random weights as Hugging Face directories, writes the
`addition` prompts exactly as grpo formats them, then for each workload runs `grpo bench` and
`benchmarks/trl_driver.py` (TRL, in its own environment) one after the other, alternating which
goes first, `--repeats` times. Every run: 8 prompts x 8 completions, beta 0.04, mu 1, lr 5e-4,
temperature 1. TRL does one forward/backward over all 64 completions; grpo runs with its default
micro-batching (length-sorted rows, about 2^20 / hidden_size padded tokens per pass). TRL runs with gradient
checkpointing off (its fastest setting) and loss_type "grpo".

    W1 overhead     hidden 128, 4 layers, character vocabulary, 16 new tokens
    W2 compute      hidden 512, 8 layers, character vocabulary, 64 new tokens
    W3 vocabulary   hidden 256, 2 layers, 151,936-token vocabulary, 128 new tokens
    W4 ragged       W2 cold-started (40 supervised steps) on completions of 1 to 63 random digits,
                    so sampled completions end anywhere from 1 to 64 tokens

Step times are medians over every step but each run's first; memory is each process's peak
resident set (VmHWM, which unlike ru_maxrss does not inherit the launcher's), median over runs. The float32 matrix-multiply peak is measured here, between
runs, and model FLOP/s use grpo.bench's estimate over the tokens each library computes: TRL
computes every completion's prompt, grpo each group's prompt once.
Without --trl-python, only grpo's side runs. Results go to --out as JSON and Markdown.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from grpo.bench import flops_per_step, matmul_peak

HERE = Path(__file__).parent
WORKLOADS = {
    "W1": dict(hidden_size=128, layers=4, heads=2, vocab_size=None, max_new_tokens=16),
    "W2": dict(hidden_size=512, layers=8, heads=8, vocab_size=None, max_new_tokens=64),
    "W3": dict(hidden_size=256, layers=2, heads=4, vocab_size=151936, max_new_tokens=128),
    "W4": dict(hidden_size=512, layers=8, heads=8, vocab_size=None, max_new_tokens=64, ragged=True),
}
LR, BETA, PROMPTS, GROUP = 5e-4, 0.04, 8, 8


def build_workload(name: str, root: Path, prompts: Path) -> Path:
    from grpo.models import build_tiny
    spec = WORKLOADS[name]
    path = root / name
    if (path / "config.json").exists():
        return path
    build_tiny(path, hidden_size=spec["hidden_size"], layers=spec["layers"], heads=spec["heads"],
               architecture="qwen2", vocab_size=spec["vocab_size"])
    if spec.get("ragged"):
        make_ragged(path, spec["max_new_tokens"], prompts)
    return path


def make_ragged(path: Path, max_new: int, prompts: Path) -> None:
    """Cold-start the model to stop anywhere: supervised steps on completions of random digits
    whose lengths are uniform on 1..max_new-1 (then EOS), so sampled lengths spread from a few
    tokens to the maximum. The spread reached is printed."""
    import random
    from grpo.models import load_policy, load_tokenizer
    from grpo.sampling import HFSampler
    from grpo.sft import supervised_finetune
    model, tok = load_policy(str(path)), load_tokenizer(str(path))
    rows = [json.loads(line) for line in open(prompts)]
    rng = random.Random(0)
    pairs = [(r["prompt"], "".join(rng.choice("0123456789") for _ in range(rng.randint(1, max_new - 1))))
             for r in rows[:512]]
    supervised_finetune(model, tok, pairs, steps=40, lr=1e-3, batch_size=16, seed=0)
    torch.manual_seed(0)
    lengths = HFSampler(model, tok, max_new_tokens=max_new).sample(
        [r["prompt"] for r in rows[:8]], GROUP).completion_mask.sum(-1).float()
    print(f"W4: after the cold start, sampled lengths min {lengths.min():.0f} median "
          f"{lengths.median():.0f} mean {lengths.mean():.1f} max {lengths.max():.0f}", file=sys.stderr)
    model.save_pretrained(path)


def write_prompts(path: Path, model_dir: Path) -> Path:
    from grpo import build
    from grpo.config import load_config
    from grpo.models import load_tokenizer
    config = load_config(None, [f"model={model_dir}", "task=addition"])
    data = build.load_data(config, None)
    rows = data.train_rows[:2048]
    texts = build.prompt_texts(config, load_tokenizer(str(model_dir)), rows)
    with open(path, "w") as f:
        for row, text in zip(rows, texts):
            f.write(json.dumps({"prompt": text, "answer": row["answer"]}) + "\n")
    return path


def run_json(cmd: list[str], log: Path) -> dict:
    with open(log, "a") as err:
        err.write("\n$ " + " ".join(cmd) + "\n")
        err.flush()
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def ours(model: Path, max_new: int, steps: int, threads: int, log: Path) -> dict:
    return run_json([sys.executable, "-m", "grpo.cli", "bench", f"model={model}", "task=addition",
                     f"prompts_per_step={PROMPTS}", f"group_size={GROUP}", f"max_new_tokens={max_new}",
                     f"beta={BETA}", "num_iterations=1", f"lr={LR}", f"steps={steps}",
                     f"threads={threads}"], log)


def trl(python: str, model: Path, prompts: Path, max_new: int, steps: int, threads: int,
        log: Path) -> dict:
    return run_json([python, str(HERE / "trl_driver.py"), "--model", str(model), "--prompts",
                     str(prompts), "--steps", str(steps), "--max-new-tokens", str(max_new),
                     "--prompts-per-step", str(PROMPTS), "--group-size", str(GROUP),
                     "--beta", str(BETA), "--lr", str(LR), "--threads", str(threads)], log)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trl-python", default="", help="python of an environment with TRL installed")
    ap.add_argument("--workloads", default="W1,W2,W3,W4")
    ap.add_argument("--steps", type=int, default=4, help="steps per run; the first is not timed")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    (out / "models").mkdir(parents=True, exist_ok=True)
    log = out / "vs_trl.log"
    names = args.workloads.split(",")
    prompts = write_prompts(out / "addition_prompts.jsonl", build_workload("W1", out / "models", None))
    models = {n: build_workload(n, out / "models", prompts) for n in names}
    peaks = [matmul_peak()]
    runs: dict[str, dict[str, list[dict]]] = {n: {"grpo": [], "trl": []} for n in names}
    started = time.perf_counter()
    for r in range(args.repeats):
        for n in names:
            max_new = WORKLOADS[n]["max_new_tokens"]
            sides = ["grpo", "trl"] if r % 2 == 0 else ["trl", "grpo"]
            for side in sides:
                if side == "trl" and not args.trl_python:
                    continue
                print(f"[{time.perf_counter() - started:6.0f}s] repeat {r + 1}/{args.repeats} {n} {side}",
                      file=sys.stderr)
                result = (ours(models[n], max_new, args.steps, args.threads, log) if side == "grpo"
                          else trl(args.trl_python, models[n], prompts, max_new, args.steps,
                                   args.threads, log))
                runs[n][side].append(result)
            peaks.append(matmul_peak())
    peak = statistics.median(peaks)
    table = summarize(runs, peak, prompts)
    (out / "vs_trl.json").write_text(json.dumps({"matmul_peak_flops": peak, "peaks": peaks,
                                                 "threads": args.threads, "table": table,
                                                 "runs": runs}, indent=1))
    markdown = to_markdown(table, peak, args)
    (out / "vs_trl.md").write_text(markdown)
    print(markdown)


def summarize(runs: dict, peak: float, prompts: Path) -> list[dict]:
    rows = [json.loads(line) for line in open(prompts)]
    prompt_tokens = statistics.mean(len(r["prompt"]) for r in rows)  # a character tokenizer
    table = []
    for name, sides in runs.items():
        row = {"workload": name}
        for side, results in sides.items():
            if not results:
                continue
            times = [t for res in results for t in res["step_times"][1:]]
            sec = statistics.median(times)
            length = statistics.mean(res["completion_len_mean"] for res in results)
            params = sides["grpo"][0]["params"] if sides["grpo"] else None
            # the prompt tokens each side computes: TRL one per completion, grpo one per group
            tokens = PROMPTS * (GROUP if side == "trl" else 1) * prompt_tokens + PROMPTS * GROUP * length
            row[side] = {"sec_per_step": round(sec, 4), "steps_timed": len(times),
                         "peak_rss_mb": statistics.median(res["peak_rss_mb"] for res in results),
                         "completion_len_mean": round(length, 2)}
            if params:
                row[side]["peak_fraction"] = round(flops_per_step(params, tokens, 1, BETA) / sec / peak, 3)
            if side == "grpo":
                row[side]["split_s"] = {k: round(statistics.median(res["split_s"][k] for res in results), 3)
                                        for k in results[0]["split_s"]}
        if "grpo" in row and "trl" in row:
            row["time_ratio"] = round(row["grpo"]["sec_per_step"] / row["trl"]["sec_per_step"], 3)
            row["memory_ratio"] = round(row["grpo"]["peak_rss_mb"] / row["trl"]["peak_rss_mb"], 3)
        table.append(row)
    return table


def to_markdown(table: list[dict], peak: float, args) -> str:
    lines = [f"float32 matmul peak {peak / 1e9:.1f} GFLOP/s, {args.threads} threads, "
             f"{args.repeats} runs x {args.steps - 1} timed steps per side",
             "",
             "| workload | grpo s/step | TRL s/step | time ratio | grpo peak MB | TRL peak MB | memory ratio "
             "| grpo % of peak | TRL % of peak | mean completion grpo / TRL |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in table:
        g, t = row.get("grpo", {}), row.get("trl", {})

        def cell(d, key, fmt="{}"):
            return fmt.format(d[key]) if key in d else "-"
        lines.append(
            f"| {row['workload']} | {cell(g, 'sec_per_step')} | {cell(t, 'sec_per_step')} | "
            f"{row.get('time_ratio', '-')} | {cell(g, 'peak_rss_mb')} | {cell(t, 'peak_rss_mb')} | "
            f"{row.get('memory_ratio', '-')} | {cell(g, 'peak_fraction', '{:.0%}')} | "
            f"{cell(t, 'peak_fraction', '{:.0%}')} | {cell(g, 'completion_len_mean')} / "
            f"{cell(t, 'completion_len_mean')} |")
    lines += ["", "grpo's split (median s/step): " + "; ".join(
        f"{row['workload']} " + ", ".join(f"{k} {v}" for k, v in row["grpo"]["split_s"].items())
        for row in table if "grpo" in row)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
