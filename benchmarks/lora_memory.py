"""Peak memory of a GRPO step with beta > 0: LoRA (reference = base with the adapter off) against
full fine-tuning (reference = a frozen copy), on the same model, one process each.

    python benchmarks/lora_memory.py [--model DIR] [--lora-r 16] [--prompts 8 --group 8 --max-new 64]

Without --model it builds W2 of benchmarks/vs_trl.py (Qwen2-style, hidden 512, 8 layers, 34M
parameters). Each side runs `grpo bench` for 3 steps (8 prompts x 8 completions, 64 new tokens,
beta 0.04) and reports its peak resident memory (VmHWM) and median step time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def bench(model: str, args, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "grpo.commands.cli", "bench", f"model={model}", "task=addition",
           f"prompts_per_step={args.prompts}", f"group_size={args.group}",
           f"max_new_tokens={args.max_new}", "beta=0.04", "steps=3", "micro_batch_size=64",
           "micro_batch_tokens=2048", *extra]
    out = subprocess.run(cmd, check=True, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="")
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=64)
    args = ap.parse_args()
    model = args.model
    if not model:
        from grpo.models import build_tiny
        model = str(Path(args.out) / "models" / "W2")
        if not (Path(model) / "config.json").exists():
            build_tiny(model, hidden_size=512, layers=8, heads=8, architecture="qwen2")
    full = bench(model, args, [])
    lora = bench(model, args, [f"lora_r={args.lora_r}", f"lora_alpha={2 * args.lora_r}"])
    result = {"full": {k: full[k] for k in ("peak_rss_mb", "sec_per_step", "params")},
              "lora": {k: lora[k] for k in ("peak_rss_mb", "sec_per_step")}, "lora_r": args.lora_r,
              "memory_ratio": round(lora["peak_rss_mb"] / full["peak_rss_mb"], 3)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
