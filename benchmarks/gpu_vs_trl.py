"""grpo against TRL's GRPOTrainer (1.16, use_vllm=False) on one CUDA GPU, side by side.

    python benchmarks/gpu_vs_trl.py                     # Qwen2.5-0.5B shape, 8 x 8 x 512, < 7 min
    python benchmarks/gpu_vs_trl.py --smoke --trl-python .venv-trl/bin/python   # tiny, on a CPU

One model for both: Qwen2.5-0.5B's published configuration with random weights and a character
tokenizer padded to its 151,936-token vocabulary (gpu_check.build; a random model of that width
almost never draws EOS, so completions run to the limit on both sides). The same 64 prompts, as
grpo formats them, go to both. The same settings on both sides, printed with the result:

    8 prompts x 8 completions of up to 512 new tokens, temperature 1, beta 0.04, mu 1, lr 1e-6,
    float32 weights with bfloat16 autocast (grpo: dtype=float32 mixed_precision=bf16; TRL:
    bf16=True), gradient checkpointing on (TRL's default), and a reward that varies between a
    random model's completions (`distinct`), so advantages and updates are not 0.

Beyond those, each library runs as its user gets it: TRL samples with Hugging Face `generate`
(its dynamic cache) and trains in micro-batches of 8 (its default), 8 accumulated, loss_type
"grpo"; grpo with its CUDA defaults (decode=auto: the static cache with CUDA graphs; packing=auto:
padding-free passes; its token budget per pass). Each run is a process of its own (so the peak
GPU memory is that library's alone); the sides alternate which goes first, `--repeats` times.
s/step is the median over every step but each run's first; the split is grpo's five phases and
TRL's time in `generate` against the rest; peak GPU memory is torch's, median over runs. The bf16
matrix-multiply rate is measured in this run, and each side's model FLOP/s is a fraction of it
(grpo.commands.bench's estimate over the tokens each computes: TRL a prompt per completion, grpo a
prompt per group). The ratios are grpo / TRL. One JSON file goes to --out; a table is printed last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gpu_check import SHAPES, SMOKE, bf16_matmul_rate, build   # noqa: E402
from vs_trl import run_json                                    # noqa: E402

from grpo.commands.bench import flops_per_step                 # noqa: E402

REWARD = '''
def distinct(prompts, completions, **columns):
    """Varies between a random model's completions, so advantages and updates are not 0."""
    return [len(set(c[:200])) / 100 for c in completions]
'''
BETA, LR = 0.04, 1e-6


def write_prompts(work: Path, model_dir: Path) -> tuple[Path, Path, float]:
    """The rows grpo reads, the same prompts as grpo formats them (TRL's file), and the mean
    prompt length in tokens."""
    from grpo.config import build_config
    from grpo.inputs import prompt_texts
    from grpo.models import load_tokenizer
    rows = [{"prompt": f"Say something about {i}.", "answer": "x"} for i in range(64)]
    data = work / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokenizer = load_tokenizer(str(model_dir))
    texts = prompt_texts(build_config({"model": str(model_dir), "dataset": str(data)}), tokenizer,
                         rows, None)
    formatted = work / "trl_prompts.jsonl"
    formatted.write_text("".join(json.dumps({"prompt": t, "answer": r["answer"]}) + "\n"
                                 for t, r in zip(texts, rows)))
    length = statistics.mean(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    return data, formatted, length


def grpo_command(args, model_dir: Path, data: Path) -> list[str]:
    return [sys.executable, "-m", "grpo.commands.cli", "bench", f"model={model_dir}",
            f"dataset={data}", "rewards=[gpu_vs_trl_reward:distinct]",
            f"prompts_per_step={args.prompts}", f"group_size={args.group}",
            f"max_new_tokens={args.tokens}", f"beta={BETA}", "num_iterations=1", f"lr={LR}",
            "temperature=1.0", f"steps={args.steps}", "dtype=float32",
            f"mixed_precision={'bf16' if args.cuda else 'no'}", "gradient_checkpointing=true"]


def trl_command(args, model_dir: Path, prompts: Path) -> list[str]:
    return [args.trl_python, str(HERE / "trl_driver.py"), "--model", str(model_dir), "--prompts",
            str(prompts), "--steps", str(args.steps), "--max-new-tokens", str(args.tokens),
            "--prompts-per-step", str(args.prompts), "--group-size", str(args.group),
            "--beta", str(BETA), "--lr", str(LR), "--reward", "distinct", "--micro-batch",
            str(args.micro), "--gradient-checkpointing", *(["--bf16"] if args.cuda else [])]


def trl_missing(python: str) -> str:
    """Why TRL cannot run under `python` ('' when it can)."""
    done = subprocess.run([python, "-c", "import datasets; from trl import GRPOConfig, GRPOTrainer"],
                          capture_output=True, text=True)
    return "" if done.returncode == 0 else (done.stderr.strip().splitlines() or ["no output"])[-1]


def side_summary(results: list[dict], peak: float, params: int, tokens: float, memory_key: str) -> dict:
    ok = [r for r in results if "failed" not in r]
    if not ok:
        return {"failed": [r.get("failed") for r in results]}
    times = [t for r in ok for t in (r["step_times"][1:] or r["step_times"])]
    sec = statistics.median(times)
    out = {"sec_per_step": round(sec, 4), "steps_timed": len(times), "runs": len(ok),
           "completion_len_mean": round(statistics.mean(r["completion_len_mean"] for r in ok), 1),
           "peak_fraction": round(flops_per_step(params, tokens, 1, BETA) / sec / peak, 4),
           "split_s": {k: round(statistics.median(r["split_s"][k] for r in ok), 4)
                       for k in ok[0]["split_s"]}}
    memory = [r[memory_key] for r in ok if memory_key in r]
    if memory:
        out[memory_key] = statistics.median(memory)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shape and lengths (runs on a CPU)")
    ap.add_argument("--trl-python", default=sys.executable,
                    help="python of an environment with TRL 1.16 and datasets (default: this one)")
    ap.add_argument("--steps", type=int, default=3, help="steps per run; the first is not timed")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--deadline", type=float, default=380,
                    help="seconds: no run starts after this, and a run is stopped at it")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args()
    args.cuda = torch.cuda.is_available()
    if not args.cuda and not args.smoke:
        raise SystemExit("no CUDA GPU here: run with --smoke to check the script on a CPU")
    name, shape = next(iter((SMOKE if args.smoke else {"qwen2.5-0.5b": SHAPES["qwen2.5-0.5b"]}).items()))
    vocab = 512 if args.smoke else 151936
    args.tokens, args.prompts, args.group, args.micro = (16, 2, 4, 4) if args.smoke else (512, 8, 8, 8)
    started = time.perf_counter()
    device = "cuda" if args.cuda else "cpu"
    peak = bf16_matmul_rate(device, 8192 if args.cuda else 256)
    missing = trl_missing(args.trl_python)
    report = {"device": torch.cuda.get_device_name() if args.cuda else "cpu", "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "shape": name, "new_tokens": args.tokens,
              "prompts_x_group": [args.prompts, args.group], "steps_per_run": args.steps,
              "matmul_rate_flops": float(f"{peak:.4g}"),
              "matmul_dtype": "bfloat16" if args.cuda else "float32",
              "trl": f"not run: {missing}" if missing else "run", "runs": {"grpo": [], "trl": []}}
    say = lambda what: print(f"[{time.perf_counter() - started:5.0f}s] {what}", file=sys.stderr, flush=True)   # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "gpu_vs_trl_reward.py").write_text(REWARD)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(work), os.environ.get("PYTHONPATH")) if p)
        model_dir = build(shape, vocab, work / name)
        data, formatted, prompt_len = write_prompts(work, model_dir)
        from safetensors import safe_open
        from transformers import AutoConfig
        with safe_open(str(model_dir / "model.safetensors"), "pt") as f:     # tied: the head is the embedding
            params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
        report["params"], report["prompt_tokens_mean"] = params, round(prompt_len, 1)
        log = Path(args.out) / "logs"
        log.mkdir(parents=True, exist_ok=True)
        log = log / f"gpu_vs_trl{'-smoke' if args.smoke else ''}-runs.log"
        partial = Path(args.out) / f"gpu_vs_trl{'-smoke' if args.smoke else ''}-partial.json"
        for r in range(args.repeats):
            for side in (("grpo", "trl") if r % 2 == 0 else ("trl", "grpo")):
                if side == "trl" and missing:
                    continue
                left = args.deadline - (time.perf_counter() - started)
                before = [r.get("wall_s", 30) for r in report["runs"][side]]
                if left < max([30, *before]):          # not enough time for a run like the last one
                    say(f"repeat {r + 1} {side}: skipped, {args.deadline:.0f} s deadline")
                    continue
                say(f"repeat {r + 1}/{args.repeats}: {side}")
                command = grpo_command(args, model_dir, data) if side == "grpo" else trl_command(
                    args, model_dir, formatted)
                result = run_json(command, log, timeout=left)
                say(f"  {side}: " + (result["failed"] if "failed" in result else
                                     f"{result['sec_per_step']} s/step"))
                report["runs"][side].append(result)
                partial.write_text(json.dumps(report, indent=1) + "\n")   # kept if stopped later
        vocab_size = AutoConfig.from_pretrained(model_dir).vocab_size
    rows = args.prompts * args.group
    completion = lambda side: statistics.mean(r["completion_len_mean"] for r in report["runs"][side]   # noqa: E731
                                              if "failed" not in r) if any(
        "failed" not in r for r in report["runs"][side]) else 0.0
    memory_key = "peak_gpu_memory_mb" if args.cuda else "peak_rss_mb"
    table = {"grpo": side_summary(report["runs"]["grpo"], peak, params,
                                  args.prompts * prompt_len + rows * completion("grpo"), memory_key)}
    if report["runs"]["trl"]:
        table["trl"] = side_summary(report["runs"]["trl"], peak, params,
                                    rows * (prompt_len + completion("trl")), memory_key)
    if "sec_per_step" in table["grpo"] and "sec_per_step" in table.get("trl", {}):
        table["time_ratio"] = round(table["grpo"]["sec_per_step"] / table["trl"]["sec_per_step"], 3)
        if memory_key in table["grpo"] and memory_key in table["trl"]:
            table["memory_ratio"] = round(table["grpo"][memory_key] / table["trl"][memory_key], 3)
    report["table"], report["vocab_size"] = table, vocab_size
    report["settings"] = {"grpo": next((r["config"] for r in report["runs"]["grpo"] if "config" in r), None),
                          "trl": next((r["settings"] for r in report["runs"]["trl"] if "settings" in r), None)}
    if not missing:
        report["trl"] = "run" if "sec_per_step" in table.get("trl", {}) else "failed (runs.log)"
    report["wall_s"] = round(time.perf_counter() - started, 1)
    out = Path(args.out)
    path = out / f"gpu_vs_trl{'-smoke' if args.smoke else ''}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    partial.unlink(missing_ok=True)
    print(markdown(report, memory_key), file=sys.stderr)
    print(path)


def markdown(report: dict, memory_key: str) -> str:
    t = report["table"]
    lines = [f"{report['device']}, {report['shape']}, {report['prompts_x_group'][0]} x "
             f"{report['prompts_x_group'][1]} x {report['new_tokens']} tokens; {report['matmul_dtype']} "
             f"matmul rate {report['matmul_rate_flops'] / 1e12:.1f} TFLOP/s; TRL: {report['trl']}",
             f"| library | s/step | {memory_key} | % of matmul rate | completion mean | split (s) |",
             "|---|---|---|---|---|---|"]
    for side in ("grpo", "trl"):
        s = t.get(side)
        if not s:
            continue
        if "failed" in s:
            lines.append(f"| {side} | failed: {s['failed']} | | | | |")
            continue
        lines.append(f"| {side} | {s['sec_per_step']} | {s.get(memory_key, '-')} | "
                     f"{s['peak_fraction']:.1%} | {s['completion_len_mean']} | "
                     + ", ".join(f"{k} {v}" for k, v in s["split_s"].items()) + " |")
    lines.append(f"grpo / TRL: time {t.get('time_ratio', '-')}, memory {t.get('memory_ratio', '-')}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
