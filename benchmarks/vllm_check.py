"""The vLLM path on one GPU: tokens per second against the HF sampler, and a few training steps'
time split with sampler=vllm. Needs a CUDA GPU with vLLM installed (pip install -e '.[vllm]' in the clone);
no download: the model is a Qwen2-style random model built here (the 0.5B shape by default).

    python benchmarks/vllm_check.py [--hidden 896 --layers 24 --prompts 32 --group 8 --max-new 256]

Prints one JSON object (and writes it to --out/vllm_check.json): for each sampler, completion
tokens per second (median of 3 timed rounds after one warm-up) and their ratio; then the medians
of time/sample_s, time/reference_s, time/update_s and time/step_s over the training steps with
sampler=vllm, and the largest sampler/logp_diff (vLLM's log-probs against the trainer's; small
values mean the weight sync works).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--heads", type=int, default=14)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()

    import torch
    if not torch.cuda.is_available():
        sys.exit("vllm_check: needs a CUDA GPU")
    from grpo.config import build_config
    from grpo.models import build_tiny, load_policy, load_tokenizer
    from grpo.sampling import HFSampler
    from grpo.data.tasks import get_task
    from grpo.train import train
    from grpo.sampling.vllm import VLLMSampler

    work = Path(tempfile.mkdtemp(prefix="vllm-check-"))
    path = str(build_tiny(work / "model", hidden_size=args.hidden, layers=args.layers,
                          heads=args.heads, architecture="qwen2"))
    tok = load_tokenizer(path)
    rows = get_task("addition").train_rows(0)[: args.prompts]
    prompts = [r["prompt"] for r in rows]
    result: dict = {"model": {"hidden": args.hidden, "layers": args.layers},
                    "prompts": args.prompts, "group": args.group, "max_new_tokens": args.max_new,
                    "gpu": torch.cuda.get_device_name()}

    def tokens_per_s(sampler) -> float:
        sampler.sample(prompts, args.group)   # warm-up
        rates = []
        for _ in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            r = sampler.sample(prompts, args.group)
            torch.cuda.synchronize()
            rates.append(int(r.completion_mask.sum()) / (time.perf_counter() - t0))
        return statistics.median(rates)

    policy = load_policy(path, "bfloat16").cuda()
    hf = tokens_per_s(HFSampler(policy, tok, max_new_tokens=args.max_new))
    del policy
    torch.cuda.empty_cache()
    engine = VLLMSampler(path, tok, max_new_tokens=args.max_new, gpu_memory_utilization=0.5)
    fast = tokens_per_s(engine)
    del engine
    torch.cuda.empty_cache()
    result["tokens_per_s"] = {"hf": hf, "vllm": fast, "vllm_over_hf": fast / hf}

    config = build_config({"model": path, "sampler": "vllm", "task": "addition", "dtype": "bfloat16",
                           "prompts_per_step": args.prompts, "group_size": args.group,
                           "max_new_tokens": args.max_new, "steps": args.steps, "sft_steps": 0,
                           "eval_every": 0, "save_every": 0, "lr": 1e-6, "tis_cap": 2.0,
                           "vllm_gpu_memory_utilization": 0.3, "output_dir": str(work / "run")})
    history = train(config, log=lambda line: print(line, file=sys.stderr)).history
    steps = [m for m in history if "time/step_s" in m][1:] or history   # the first warms up
    result["train_split_s"] = {k: statistics.median(m[k] for m in steps) for k in
                               ("time/sample_s", "time/reference_s", "time/update_s", "time/step_s")}
    result["sampler_logp_diff_max"] = max(m["sampler/logp_diff"] for m in history)
    print(json.dumps(result, indent=1))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "vllm_check.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
