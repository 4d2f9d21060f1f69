"""The GPU check: one command, on one CUDA GPU, needing only torch, transformers and this package.

    python benchmarks/gpu_check.py                   # Qwen2.5-0.5B- and 1.5B-shaped models, ~5-8 min
    python benchmarks/gpu_check.py --smoke           # tiny shapes, short lengths: checks the script (CPU too)

No vLLM and no download: each model is built from a Qwen2.5-shaped configuration with random weights
and a character tokenizer padded to Qwen2.5's 151,936-token vocabulary (a random model of that
width almost never samples EOS, so completions run to `max_new_tokens`). For each shape it trains
a few GRPO steps (float32 master weights, mixed_precision=bf16, gradient checkpointing, 8 prompts x
8 completions of 1,024 new tokens) and reports:

    sampling_tokens_per_s   completion tokens per second of the sampling phase
    update_tokens_per_s     completion tokens per second of the update phase (forward+backward+AdamW)
    model_flops_per_s       grpo.commands.bench's model-FLOP estimate per second of step
    peak_fraction           model_flops_per_s / the bf16 matrix-multiply rate measured in this run
    peak_gpu_memory_gb      torch.cuda.max_memory_allocated over the steps
    split_s                 median seconds per step in sample, reward, reference, advantage, update
    logp_vs_cpu_float32     largest and mean |log p| difference between CUDA bfloat16 (autocast)
                            and CPU float32 on the same rows (4 rows x 256 tokens)

Before the shapes, the exactness checks on the same device (`exact`, about a minute; alone with
`--part exact`): for each family the CPU tests cover (Llama; Qwen2 with grouped-query attention),
on a 4-layer model of Qwen2.5-0.5B's width with left-padded and ragged rows,

    decoder_vs_hf           the lean decoder's hidden states and weight gradients against Hugging
                            Face's forward, in float32 and in bfloat16 (max |diff| and the
                            relative norm ||got - want|| / ||want||)
    autocast_vs_float32     per-token log-probs under bfloat16 autocast (mixed_precision=bf16)
                            against float32, on the device
    checkpointing           gradients with activation checkpointing against without
    chunked_head            the chunked head's log-probs and gradients (several chunks) against
                            log_softmax over the whole logits
    cli                     `grpo train` for 2 steps, and 2 steps with async_steps=1, as commands:
                            their exit status and the steps metrics.jsonl holds

and writes one JSON file to benchmarks/results/ (its path is printed last).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

SHAPES = {   # Qwen2.5's published configurations, less the weights
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
}
SMOKE = {"smoke": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)}
REWARD = '''
def distinct(prompts, completions, **columns):
    """Varies between a random model's completions, so advantages and updates are not 0."""
    return [len(set(c[:200])) / 100 for c in completions]
'''


def build(shape: dict, vocab: int, where: Path) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from grpo.models import build_tiny_tokenizer
    tokenizer = build_tiny_tokenizer(vocab)
    config = Qwen2Config(vocab_size=len(tokenizer), max_position_embeddings=32768,
                         rope_theta=1_000_000.0, rms_norm_eps=1e-6, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                         **shape)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(where)
    tokenizer.save_pretrained(where)
    return where


def bf16_matmul_rate(device: str, size: int) -> float:
    """Median FLOP/s of a bfloat16 [size x size] product on `device` (float32 on a CPU)."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    rates = []
    for _ in range(8):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(4):
            a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        rates.append(4 * 2 * size ** 3 / (time.perf_counter() - start))
    return statistics.median(rates[1:])


def logp_difference(model_dir: Path, device: str, rows: int, tokens: int) -> dict:
    """max and mean |log p| between the trainer's bfloat16-autocast pass on `device` and float32
    on a CPU, over every completion token."""
    from grpo.models import load_policy, token_logprobs
    cpu = load_policy(str(model_dir))
    torch.manual_seed(1)
    ids = torch.randint(10, 90, (rows, tokens))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        exact, _ = token_logprobs(cpu, ids, mask, tokens - 8)
        fast = cpu.to(device)
        fast.grpo_autocast = torch.bfloat16
        got, _ = token_logprobs(fast, ids.to(device), mask.to(device), tokens - 8)
    gap = (got.float().cpu() - exact).abs()
    return {"max": float(gap.max()), "mean": float(gap.mean())}


FAMILIES = ("llama", "qwen2")      # the lean decoder's CPU tests (tests/test_decoder.py)


def gap(got: torch.Tensor, want: torch.Tensor) -> dict:
    """max |got - want| and ||got - want|| / ||want||, in float64."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    return {"max_abs": float((got - want).abs().max()),
            "rel_norm": float((got - want).norm() / want.norm().clamp_min(1e-300))}


def family_model(family: str, args, device: str):
    """A 4-layer model of `family` at the width of the run's first shape (grouped-query attention
    for Qwen2), random weights, float32, on `device`."""
    from transformers import LlamaConfig, Qwen2Config
    shape = dict(next(iter(args.shapes.values())))
    shape["num_hidden_layers"] = min(4, shape["num_hidden_layers"])
    if family == "llama":
        shape["num_key_value_heads"] = shape["num_attention_heads"]
    config = (LlamaConfig if family == "llama" else Qwen2Config)(
        vocab_size=args.exact_vocab, max_position_embeddings=4096, rms_norm_eps=1e-6, **shape)
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_config(config).float().to(device)


def ragged_batch(rows: int, length: int, vocab: int, device: str):
    """Left-padded rows of different lengths (a real prompt batch), ids drawn at random."""
    torch.manual_seed(1)
    ids = torch.randint(10, vocab, (rows, length), device=device)
    lengths = torch.linspace(length // 3, length, rows).long().to(device)
    mask = (torch.arange(length, device=device)[None] >= (length - lengths)[:, None]).long()
    ids = ids * mask
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def decoder_against_hf(model, ids, mask, pos) -> dict:
    """The lean decoder's hidden states and weight gradients against Hugging Face's forward."""
    from grpo.models.decoder import Decoder
    backbone = getattr(model, model.base_model_prefix)
    real = mask.bool()
    want = backbone(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state[real]
    (want.float() ** 2).mean().backward()
    want_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    got = Decoder(model).hidden(ids, mask, pos)[real]
    (got.float() ** 2).mean().backward()
    grads = [gap(p.grad, want_grads[n]) for n, p in model.named_parameters()]
    model.zero_grad()
    return {"hidden": gap(got, want), "finite": bool(torch.isfinite(got).all()),
            "grad_rel_norm_max": max(g["rel_norm"] for g in grads),
            "grad_max_abs": max(g["max_abs"] for g in grads)}


def completion_logprobs(model, ids, mask, T: int, checkpointing: bool = False):
    """token_logprobs of the last T positions and the gradient of their sum."""
    from grpo.models import token_logprobs
    model.grpo_checkpointing = checkpointing
    logp, _ = token_logprobs(model, ids, mask, T)
    logp.sum().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad()
    model.grpo_checkpointing = False
    return logp.detach(), grads


def chunked_head(model, ids, mask, T: int) -> dict:
    """The chunked head (selected_logprobs, several chunks) against log_softmax over all logits."""
    from grpo.models import logprobs as lp
    from grpo.models.decoder import Decoder
    with torch.no_grad():
        hidden = Decoder(model).hidden(ids, mask, (mask.cumsum(-1) - 1).clamp(min=0))[:, -T - 1:-1]
    hidden = hidden.reshape(-1, hidden.shape[-1]).detach().requires_grad_(True)
    targets = ids[:, -T:].reshape(-1)
    head = model.get_output_embeddings()
    rows = -(-hidden.shape[0] // 4)                 # 4 chunks, whatever the width of the head
    saved, lp.LOGIT_CHUNK_ELEMENTS = lp.LOGIT_CHUNK_ELEMENTS, rows * head.weight.shape[0]
    try:
        got, _ = lp.selected_logprobs(hidden, head, targets)
        g_hidden, = torch.autograd.grad(got.sum(), hidden)
    finally:
        lp.LOGIT_CHUNK_ELEMENTS = saved
    chunks = -(-hidden.shape[0] // rows)
    want = torch.log_softmax(head(hidden).float(), -1).gather(-1, targets[:, None])[:, 0]
    w_hidden, = torch.autograd.grad(want.sum(), hidden)
    return {"chunks": chunks, "logp": gap(got, want), "hidden_grad": gap(g_hidden, w_hidden)}


def cli_runs(args, work: Path) -> dict:
    """`grpo train` for 2 steps, then 2 steps with async_steps=1, as a user runs them."""
    import subprocess
    model_dir = build(SMOKE["smoke"], 512, work / "cli-model")
    data = work / "cli.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Say {i}.", "answer": "x"}) + "\n" for i in range(16)))
    out = {}
    for name, more in (("sync", []), ("async_steps_1", ["async_steps=1"])):
        run_dir = work / f"cli-{name}"
        try:
            done = subprocess.run(
                [sys.executable, "-m", "grpo.commands.cli", "train", f"model={model_dir}", f"dataset={data}",
                 "rewards=[gpu_check_reward:distinct]", "steps=2", "prompts_per_step=2", "group_size=4",
                 "max_new_tokens=16", "sft_steps=0", "eval_every=0", "dtype=float32",
                 f"mixed_precision={'bf16' if args.device == 'cuda' else 'no'}", f"output_dir={run_dir}",
                 *more], capture_output=True, text=True, cwd=work, timeout=args.cli_limit_s)
        except subprocess.TimeoutExpired:
            out[name] = {"exit": None, "stopped": f"not done in {args.cli_limit_s} s"}
            continue
        metrics = run_dir / "metrics.jsonl"
        steps = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
        out[name] = {"exit": done.returncode, "steps": sum("time/step_s" in m for m in steps),
                     "loss_finite": all(math.isfinite(m.get("loss", 0.0)) for m in steps)}
        if done.returncode:
            out[name]["stderr_tail"] = done.stderr[-600:]
    return out


def exact(args, work: Path, save=lambda: None) -> dict:
    """The exactness checks of the module docstring, on args.device; `save()` after each part
    (what is done is kept if a later part runs out of time)."""
    device, out = args.device, args.report.setdefault("exact", {})
    for family in FAMILIES:
        model = family_model(family, args, device)
        ids, mask, pos = ragged_batch(4, args.exact_tokens, args.exact_vocab, device)
        entry = {"float32": decoder_against_hf(model, ids, mask, pos)}
        T = args.exact_tokens // 4
        f32, g32 = completion_logprobs(model, ids, mask, T)
        ckpt, gckpt = completion_logprobs(model, ids, mask, T, checkpointing=True)
        entry["checkpointing"] = {"logp": gap(ckpt, f32), "grad": gap(gckpt, g32)}
        model.grpo_autocast = torch.bfloat16
        auto, gauto = completion_logprobs(model, ids, mask, T)
        # the packed passes (packing=auto on CUDA: Flash's variable-length attention in bf16)
        from grpo.models.packed import packable
        model.grpo_packing = True
        packed, gpacked = completion_logprobs(model, ids, mask, T)
        model.grpo_packing = False
        del model.grpo_autocast
        diff = (auto.float() - f32).abs()
        entry["autocast_vs_float32"] = {"max_abs": float(diff.max()), "mean_abs": float(diff.mean())}
        entry["packed_vs_padded_bf16"] = {"packable": packable(mask, T), "logp": gap(packed, auto),
                                          "grad": gap(gpacked, gauto)}
        entry["chunked_head"] = chunked_head(model, ids, mask, T)
        entry["bfloat16"] = decoder_against_hf(model.to(torch.bfloat16), ids, mask, pos)
        out[family] = entry
        save()
        del model
    out["cli"] = cli_runs(args, work)
    save()
    return out


def check(name: str, shape: dict, args, device: str, peak: float, work: Path) -> dict:
    from grpo.commands.bench import flops_per_step
    from grpo.config import build_config
    from grpo.train import train
    model_dir = build(shape, args.vocab, work / name)
    data = work / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Say something about {i}.", "answer": "x"}) + "\n"
                            for i in range(64)))
    config = build_config({
        "model": str(model_dir), "dataset": str(data), "rewards": ["gpu_check_reward:distinct"],
        "dtype": "float32", "mixed_precision": "bf16", "gradient_checkpointing": True,
        "prompts_per_step": args.prompts, "group_size": args.group, "max_new_tokens": args.tokens,
        "steps": args.steps, "sft_steps": 0, "eval_every": 0, "save_every": 0, "beta": 0.04,
        "lr": 1e-6, "tis_cap": 2.0, "output_dir": str(work / f"run-{name}")})
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    result = train(config, log=lambda line: print(f"  {name}: {line}", file=sys.stderr),
                   write_files=False)
    wall = time.perf_counter() - started
    steps = [m for m in result.history if "time/step_s" in m]
    timed = steps[1:] if len(steps) > 1 else steps      # the first step pays the warm-up
    med = lambda key: statistics.median(m.get(key, 0.0) for m in timed)   # noqa: E731
    params = sum(p.numel() for p in result.policy.parameters())
    flops = statistics.median(flops_per_step(params, m["tokens/prompt"] / args.group
                                             + m["tokens/completion"], 1, 0.04) / m["time/step_s"]
                              for m in timed)
    out = {
        "params": params, "steps": len(steps), "wall_s": round(wall, 1),
        "completion_len_mean": round(statistics.mean(m["completion/len_mean"] for m in timed), 1),
        "sampling_tokens_per_s": round(med("tokens/completion") / med("time/sample_s"), 1),
        "update_tokens_per_s": round(med("tokens/completion") / med("time/update_s"), 1),
        "model_flops_per_s": float(f"{flops:.4g}"), "peak_fraction": round(flops / peak, 4),
        "split_s": {k: round(med(f"time/{k}_s"), 3) for k in ("sample", "reward", "reference", "advantage", "update")},
        "sec_per_step": round(med("time/step_s"), 3),
        "sampler_logp_diff": round(statistics.mean(m.get("sampler/logp_diff", float("nan"))
                                                   for m in timed), 5),
    }
    if device == "cuda":
        out["peak_gpu_memory_gb"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)
        del result
        torch.cuda.empty_cache()
    out["logp_vs_cpu_float32"] = logp_difference(model_dir, device, 4, args.logp_tokens)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes and lengths (runs on a CPU)")
    ap.add_argument("--only", choices=sorted(SHAPES), help="one of the shapes")
    ap.add_argument("--part", choices=("all", "exact", "shapes"), default="all",
                    help="the exactness checks, the shapes' training steps, or both (default)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cuda" and not args.smoke:
        raise SystemExit("no CUDA GPU here: run with --smoke to check the script on a CPU")
    shapes = SMOKE if args.smoke else ({args.only: SHAPES[args.only]} if args.only else SHAPES)
    args.vocab = 512 if args.smoke else 151936
    args.tokens, args.prompts, args.group = (16, 2, 4) if args.smoke else (1024, 8, 8)
    args.steps = 2 if args.smoke else 3
    args.logp_tokens = 32 if args.smoke else 256
    args.device, args.shapes = device, shapes
    args.exact_vocab, args.exact_tokens = (512, 32) if args.smoke else (32000, 256)
    args.cli_limit_s = 240 if args.smoke else 50
    peak = bf16_matmul_rate(device, 256 if args.smoke else 8192)
    import transformers
    report = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "torch": torch.__version__, "transformers": transformers.__version__, "matmul_rate_flops": float(f"{peak:.4g}"),
              "matmul_dtype": "bfloat16" if device == "cuda" else "float32",
              "new_tokens": args.tokens, "prompts_x_group": [args.prompts, args.group], "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "gpu_check_reward.py").write_text(REWARD)
        sys.path.insert(0, str(work))
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"gpu_check{'-smoke' if args.smoke else ''}-{time.strftime('%Y%m%d-%H%M%S')}.json"
        if args.part in ("all", "exact"):
            args.report = report
            exact(args, work, save=lambda: path.write_text(json.dumps(report, indent=1) + "\n"))
            print(json.dumps({"exact": report["exact"]}), file=sys.stderr)
            path.write_text(json.dumps(report, indent=1) + "\n")     # kept if a shape runs out of time
        for name, shape in (shapes.items() if args.part in ("all", "shapes") else ()):
            report["models"][name] = check(name, shape, args, device, peak, work)
            print(json.dumps({name: report["models"][name]}), file=sys.stderr)
            path.write_text(json.dumps(report, indent=1) + "\n")
    print(path)


if __name__ == "__main__":
    main()
