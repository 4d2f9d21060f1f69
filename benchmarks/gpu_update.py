"""The update on one CUDA GPU: grpo's forward and backward against the matrix-multiply rate and
against Hugging Face's forward.

    python benchmarks/gpu_update.py              # Qwen2.5-0.5B and 1.5B shapes, 64 x 1,024 tokens
    python benchmarks/gpu_update.py --smoke      # tiny shape, short lengths: checks the script (CPU too)

For each shape (random weights; float32 weights with bf16 compute on a GPU, `mixed_precision=bf16`),
one optimizer step's worth of rows (64 completions of `--tokens` tokens after a 32-token prompt, 8
prompts x G = 8, old and reference log-probs given, beta 0.04) goes through:

    packed     grpo's update (update.accumulate_gradients) with packing=on: no padding, each
               prompt once, Flash Attention over variable lengths
    padded     the same with packing=off: rows padded to the micro-batch's width
    hf_sdpa    Hugging Face's own forward (attn_implementation="sdpa") over the same padded rows,
               grpo's chunked head and loss on its hidden states, backward

each timed as the median of `--repeats` after a warm-up (the fused AdamW step timed apart). It
reports tokens/s, peak GPU memory, and model FLOP/s as a fraction of the bf16 matmul rate
measured in the same run (a 8192^3 matmul): 6 x (non-embedding parameters) per token, plus the
head (6 x hidden x vocab per completion token) and causal attention (6 x layers x hidden x
length^2 / 2 per row, forward and backward), counted for the tokens that exist (padding
excluded). Last, at the largest shape, the longest single completion one update trains within
the GPU's memory with activation checkpointing (doubling from 4,096 until it does not fit). A
variant past `--deadline-s` is not run and says so. One JSON file goes to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import SHAPES, SMOKE, build   # noqa: E402

PROMPT_TOKENS, PROMPTS, GROUP = 32, 8, 8


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def matmul_rate(device: str, n: int) -> float:
    """FLOP/s of an n x n x n matmul in bf16 (float32 on a CPU), median of 5."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    times = []
    for _ in range(6):
        sync(device)
        start = time.perf_counter()
        a @ b
        sync(device)
        times.append(time.perf_counter() - start)
    return 2 * n ** 3 / statistics.median(times[1:])


def rollout(tokenizer, tokens: int, device: str, rows: int = PROMPTS * GROUP):
    """`rows` completions of `tokens` tokens (a ragged eighth shorter, to be realistic about
    padding: lengths spread over [tokens / 2, tokens]) after PROMPTS prompts of PROMPT_TOKENS."""
    from grpo.rollout import Rollout
    gen = torch.Generator().manual_seed(0)
    V = len(tokenizer)
    prompts = torch.randint(10, V - 10, (PROMPTS, PROMPT_TOKENS), generator=gen)
    lengths = torch.randint(tokens // 2, tokens + 1, (rows,), generator=gen)
    lengths[0] = tokens
    mask = (torch.arange(tokens)[None] < lengths[:, None]).long()
    group = torch.arange(PROMPTS).repeat_interleave(rows // PROMPTS)
    old = -torch.rand(rows, tokens, generator=gen) * 5 * mask
    return Rollout(prompts=[""] * rows, completions=[""] * rows, group_ids=group,
                   prompt_ids=prompts[group], prompt_mask=torch.ones(rows, PROMPT_TOKENS, dtype=torch.long),
                   completion_ids=torch.randint(10, V - 10, (rows, tokens), generator=gen) * mask,
                   completion_mask=mask, sampler_logprobs=old.clone(),
                   truncated=torch.zeros(rows, dtype=torch.bool),
                   advantages=torch.randn(rows, generator=gen), old_logprobs=old,
                   ref_logprobs=old + 0.1 * torch.randn(rows, tokens, generator=gen) * mask)


def flops(config, params_no_embed: int, lengths: list[int], completion_tokens: int) -> float:
    L, H, V = config.num_hidden_layers, config.hidden_size, config.vocab_size
    tokens = sum(lengths)
    return (6 * params_no_embed * tokens + 6 * H * V * completion_tokens
            + sum(6 * L * H * n * n / 2 for n in lengths))


def update_once(policy, r, settings, packing: bool, micro_batch_size: int) -> None:
    from grpo.update import accumulate_gradients
    policy.grpo_packing = packing
    accumulate_gradients(policy, r, micro_batch_size=micro_batch_size, aggregation="sequence_mean",
                         max_tokens=r.completion_ids.shape[1], settings=settings)
    policy.zero_grad(set_to_none=True)


def hf_once(hf, policy, r, device: str) -> None:
    """Hugging Face's forward (sdpa) over padded rows, grpo's chunked head on its hidden states."""
    from grpo.models import selected_logprobs
    part = r.to(device)
    T = part.completion_ids.shape[1]
    with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
        hidden = hf.model(input_ids=part.input_ids, attention_mask=part.attention_mask,
                          use_cache=False).last_hidden_state[:, -T - 1:-1]
    mask = part.completion_mask.bool()
    logp, _ = selected_logprobs(hidden[mask].float(), hf.get_output_embeddings(),
                                part.completion_ids[mask])
    (-(logp * part.advantages[:, None].expand_as(mask)[mask]).sum() / mask.sum()).backward()
    hf.zero_grad(set_to_none=True)


def timed(fn, device: str, repeats: int) -> tuple[float, float]:
    fn()                                   # warm-up: kernels, allocator, autotuning
    sync(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if device == "cuda" else 0.0
    return statistics.median(times), peak


def longest_trainable(policy, tokenizer, device: str, start: int, settings, limit_s: float) -> dict:
    """Double one row's completion from `start` until an update with checkpointing no longer
    fits (or takes more than `limit_s`)."""
    policy.grpo_checkpointing, fits, tried = True, 0, []
    length = start
    while True:
        r = rollout(tokenizer, length, device, rows=PROMPTS)
        r = r.rows([0])
        begun = time.perf_counter()
        try:
            update_once(policy, r, settings, True, 1)
            sync(device)
        except torch.OutOfMemoryError:
            tried.append({"tokens": length, "fits": False})
            break
        finally:
            policy.zero_grad(set_to_none=True)
            if device == "cuda":
                torch.cuda.empty_cache()
        seconds = time.perf_counter() - begun
        fits = length
        tried.append({"tokens": length, "fits": True, "seconds": round(seconds, 2)})
        if seconds > limit_s or length >= 131072:
            break
        length *= 2
    policy.grpo_checkpointing = False
    return {"longest_tokens": fits, "tried": tried}


def measure(name: str, shape: dict, args, device: str, rate: float, started: float) -> dict:
    from grpo.algorithm.loss import LossSettings
    from grpo.models import load_policy, load_tokenizer
    from transformers import AutoModelForCausalLM
    work = Path(tempfile.mkdtemp(prefix=f"grpo-update-{name}-"))
    build(shape, 512 if args.smoke else 151936, work)
    tokenizer = load_tokenizer(str(work))
    policy = load_policy(str(work), "float32").to(device)
    if device == "cuda":
        policy.grpo_autocast = torch.bfloat16                 # mixed_precision=bf16
    policy.train()
    settings = LossSettings(beta=0.04)
    r = rollout(tokenizer, args.tokens, device)
    lengths = (r.prompt_mask.sum(-1) + r.completion_mask.sum(-1)).tolist()
    embed = policy.get_input_embeddings().weight.numel()
    model_flops = flops(policy.config, sum(p.numel() for p in policy.parameters()) - embed,
                        lengths, int(r.completion_mask.sum()))
    entry = {"params": sum(p.numel() for p in policy.parameters()), "rows": len(r),
             "tokens": int(sum(lengths)), "padded_tokens": len(r) * (PROMPT_TOKENS + args.tokens),
             "model_flops_per_update": model_flops, "variants": {}}
    hf = None
    for variant in ("packed", "padded", "hf_sdpa"):
        if time.perf_counter() - started > args.deadline_s:
            entry["variants"][variant] = {"skipped": f"past --deadline-s {args.deadline_s:g}"}
            continue
        try:
            if variant == "hf_sdpa":
                hf = AutoModelForCausalLM.from_pretrained(str(work), attn_implementation="sdpa").to(device)
                hf.train()
                fn = lambda: hf_once(hf, policy, r, device)          # noqa: E731
            else:
                fn = lambda packing=variant == "packed": update_once(    # noqa: E731
                    policy, r, settings, packing, args.micro_batch_size)
            seconds, peak = timed(fn, device, args.repeats)
        except Exception as e:      # noqa: BLE001  one variant's failure is a figure too
            entry["variants"][variant] = {"failed": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"{name} {variant}: {entry['variants'][variant]}", flush=True)
            continue
        got = {"seconds": round(seconds, 6), "tokens_per_s": round(entry["tokens"] / seconds, 1),
               "model_flops_per_s": round(model_flops / seconds, 1),
               "fraction_of_matmul_rate": round(model_flops / seconds / rate, 4),
               "peak_gpu_gib": round(peak, 2)}
        entry["variants"][variant] = got
        print(f"{name} {variant}: {got}", flush=True)
    del hf
    v = entry["variants"]
    for a, b in (("packed", "padded"), ("packed", "hf_sdpa")):
        if "seconds" in v.get(a, {}) and "seconds" in v.get(b, {}):
            entry[f"{a}_speedup_over_{b}"] = round(v[b]["seconds"] / v[a]["seconds"], 3)
    from grpo.update import make_optimizer
    optimizer = make_optimizer(policy, 1e-6, 0.0)
    for p in policy.parameters():
        p.grad = torch.zeros_like(p)
    entry["adamw_step_s"] = round(timed(optimizer.step, device, args.repeats)[0], 4)
    entry["adamw_fused"] = bool(optimizer.defaults.get("fused"))
    if name == args.longest_at and time.perf_counter() - started < args.deadline_s:
        policy.zero_grad(set_to_none=True)
        del optimizer
        entry["longest_completion"] = longest_trainable(
            policy, tokenizer, device, 64 if args.smoke else 4096, settings,
            5.0 if args.smoke else 60.0)
    del policy
    if device == "cuda":
        torch.cuda.empty_cache()
    return entry


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shape and lengths (runs on a CPU)")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--micro-batch-size", type=int, default=64)
    ap.add_argument("--deadline-s", type=float, default=300.0)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.smoke:
        raise SystemExit("no CUDA GPU here: run with --smoke to check the script on a CPU")
    shapes = SMOKE if args.smoke else SHAPES
    if args.smoke:
        args.tokens, args.repeats = min(args.tokens, 16), 1
    args.longest_at = list(shapes)[-1]
    from grpo.run.progress import libraries_quiet
    started = time.perf_counter()
    with libraries_quiet():
        rate = matmul_rate(device, 512 if args.smoke else 8192)
        report = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                  "torch": torch.__version__, "completion_tokens": args.tokens,
                  "rows": PROMPTS * GROUP, "prompt_tokens": PROMPT_TOKENS,
                  "matmul_flops_per_s": round(rate, 1), "models": {}}
        for name, shape in shapes.items():
            report["models"][name] = measure(name, shape, args, device, rate, started)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = report["device"].replace(" ", "-").lower()
    path = out / f"gpu_update-{tag}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=1))
    print(json.dumps(report))
    print(path)


if __name__ == "__main__":
    main()
