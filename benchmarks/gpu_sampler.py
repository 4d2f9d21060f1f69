"""Sampling speed on one CUDA GPU: grpo's own sampler against its limit and against Hugging Face.

    python benchmarks/gpu_sampler.py              # Qwen2.5-0.5B and 1.5B shapes, batch 64 and 512
    python benchmarks/gpu_sampler.py --smoke      # tiny shape, short lengths: checks the script (CPU too)

For each shape (random weights, bfloat16 on the GPU) and batch size, `--tokens` new tokens a row
with EOS ignored (an id the model never draws), one prompt of 32 tokens shared by the batch's rows
as one group:

    grpo_graphs    grpo's own sampler on its static cache, each step a CUDA graph (decode=graphs,
                   what decode=auto takes on CUDA); on a CPU (--smoke) grpo_static, the same
                   step not captured
    hf_static      Hugging Face `generate` with its static cache (`cache_implementation="static"`,
                   which transformers compiles on CUDA): what TRL samples with when it has no vLLM
    grpo_eager     grpo's own sampler as it was before the static cache (decode=eager)
    grpo_compiled  the static step under torch.compile(mode="reduce-overhead") (decode=compiled),
                   at the first batch size only (its compilation is the cost)
    hf_dynamic     `generate` with its default cache

and reports generated tokens/s, peak GPU memory, and the bandwidth bound: each decode step reads
every weight once and the batch's KV cache so far, so at the copy bandwidth measured in the same
run (a device-to-device copy of 2 GiB) a run of T tokens takes at least
sum_t (weight bytes + KV bytes at t) / bandwidth. tokens/s as a fraction of that bound, the best
grpo variant over grpo_eager (today's sampler) and over hf_static are the figures. A variant whose
16-token probe predicts more than `--budget-s` for the whole run is not run, and says so; past
`--deadline-s` the variants left are not run either (the whole script keeps under 6 minutes).
Then the same draws through the static step, its graphs and the eager loop: the rows that differ
(graphs against static: none expected; eager against static: bf16 near-ties). Last, the
log-probs grpo's sampler (its best variant) recorded in bfloat16 on the GPU against a
float32 pass on the CPU over the same tokens (max and mean |difference|). One JSON file goes to
benchmarks/results/, named by the device.
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

PROMPT_TOKENS = 32


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth(device: str, gib: float) -> float:
    """Bytes/s of a device-to-device copy (read + write counted), median of 8."""
    n = int(gib * 2 ** 30 / 4)
    a = torch.empty(n, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    rates = []
    for _ in range(8):
        sync(device)
        start = time.perf_counter()
        b.copy_(a)
        sync(device)
        rates.append(2 * a.numel() * 4 / (time.perf_counter() - start))
    del a, b
    return statistics.median(rates[1:])


def bound_tokens_per_s(model, batch: int, tokens: int, bandwidth: float) -> float:
    """Generated tokens/s if every decode step read its weights and the KV cache so far at
    `bandwidth` and did nothing else."""
    c = model.config
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    head_dim = c.hidden_size // c.num_attention_heads
    width = next(model.parameters()).element_size()          # K and V in the weights' dtype
    kv_per_position = 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * width
    seconds = sum(weight_bytes + kv_per_position * batch * (PROMPT_TOKENS + t)
                  for t in range(tokens)) / bandwidth
    return batch * tokens / seconds


def prompt(tokenizer, batch: int, device: str):
    torch.manual_seed(0)
    ids = torch.randint(10, len(tokenizer) - 10, (1, PROMPT_TOKENS))
    return ids.to(device), torch.ones_like(ids).to(device)


NEVER = 10 ** 9            # an EOS id no row draws: every row runs all its tokens


def run_grpo(model, tokenizer, batch: int, tokens: int, device: str, uniforms=None):
    from grpo.sampling.own import generate_with_lengths
    ids, mask = prompt(tokenizer, batch, device)
    return generate_with_lengths(model, ids, mask, tokens, NEVER, tokenizer.pad_token_id,
                                 group_size=batch, uniforms=uniforms)


_DECODES: dict = {}


def run_static(model, tokenizer, batch: int, tokens: int, device: str, mode: str,
               uniforms=None):
    """grpo's static decoder (sampling/static.py) in `mode`, kept per (batch, tokens, mode) so
    its graphs are captured (or compiled) once, in the warm-up call."""
    from grpo.sampling.static import CAPACITY_ROUND, StaticDecode, generate_static
    key = (id(model), batch, tokens, mode)
    if key not in _DECODES:
        _DECODES.clear()
        if device == "cuda":
            torch.cuda.empty_cache()
        _DECODES[key] = StaticDecode(
            model, rows=batch, slots=batch, capacity=CAPACITY_ROUND + tokens, max_new_tokens=tokens,
            vocab=model.get_output_embeddings().weight.shape[0], eos=torch.tensor([NEVER]),
            pad=tokenizer.pad_token_id, temperature=1.0, warper=None, greedy=False, penalty=1.0,
            mode=mode, log=print)
    ids, mask = prompt(tokenizer, batch, device)
    uniforms = torch.rand(batch, tokens) if uniforms is None else uniforms
    out = generate_static(_DECODES[key], ids, mask, batch, uniforms)
    if _DECODES[key].mode != mode:
        raise RuntimeError(f"decode={mode} fell back to {_DECODES[key].mode}")
    return out


def run_hf(model, tokenizer, batch: int, tokens: int, device: str, cache: str | None):
    ids, mask = prompt(tokenizer, batch, device)
    kwargs = {"cache_implementation": cache} if cache else {}
    return model.generate(ids.repeat(batch, 1), attention_mask=mask.repeat(batch, 1),
                          max_new_tokens=tokens, min_new_tokens=tokens, do_sample=True,
                          temperature=1.0, top_p=1.0, top_k=0, pad_token_id=tokenizer.pad_token_id,
                          **kwargs)


def timed(fn, device: str) -> tuple[float, float]:
    """(seconds, peak GPU GB) of one call, after one warm-up call."""
    fn()
    sync(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    fn()
    sync(device)
    peak = torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else 0.0
    return time.perf_counter() - start, peak


def variants(model, tokenizer, batch: int, device: str, first_batch: bool) -> dict:
    best = "graphs" if device == "cuda" else "static"
    runs = {f"grpo_{best}": lambda n: run_static(model, tokenizer, batch, n, device, best),
            "hf_static": lambda n: run_hf(model, tokenizer, batch, n, device, "static"),
            "grpo_eager": lambda n: run_grpo(model, tokenizer, batch, n, device)}
    if device == "cuda" and first_batch:
        runs["grpo_compiled"] = lambda n: run_static(model, tokenizer, batch, n, device, "compiled")
    runs["hf_dynamic"] = lambda n: run_hf(model, tokenizer, batch, n, device, None)
    return runs


def measure(name: str, model, tokenizer, batch: int, args, device: str, first_batch: bool,
            started: float) -> dict:
    out = {}
    for variant, fn in variants(model, tokenizer, batch, device, first_batch).items():
        if time.perf_counter() - started > args.deadline_s:
            out[variant] = {"skipped": f"past --deadline-s {args.deadline_s:g}"}
            continue
        try:
            probe_s, _ = timed(lambda: fn(16), device)
            predicted = probe_s * args.tokens / 16
            if predicted > args.budget_s:
                out[variant] = {"skipped": f"its 16-token probe predicts {predicted:.0f} s for "
                                           f"{args.tokens} tokens, over --budget-s {args.budget_s:g}"}
                continue
            seconds, peak = timed(lambda: fn(args.tokens), device)
        except Exception as e:     # noqa: BLE001  one variant's failure is a figure too
            out[variant] = {"failed": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"{name} batch {batch} {variant}: {out[variant]}", flush=True)
            continue
        out[variant] = {"tokens_per_s": round(batch * args.tokens / seconds, 1),
                        "seconds": round(seconds, 3), "peak_gpu_gb": round(peak, 2)}
        print(f"{name} batch {batch} {variant}: {out[variant]}", flush=True)
    return out


def logp_difference(model_dir: Path, model, tokenizer, device: str, tokens: int) -> dict:
    """|sampler log-prob (this device, bf16) - float32 log-prob on the CPU| over sampled tokens,
    from grpo's best variant (its static decoder)."""
    from grpo.models import load_policy, token_logprobs
    completion, logprobs, _ = run_static(model, tokenizer, 4, tokens, device,
                                         "graphs" if device == "cuda" else "static")
    ids, mask = prompt(tokenizer, 4, "cpu")
    full = torch.cat([ids.repeat(4, 1), completion.cpu()], dim=1)
    with torch.no_grad():
        exact, _ = token_logprobs(load_policy(str(model_dir)), full, torch.ones_like(full), tokens)
    diff = (logprobs.float().cpu() - exact).abs()
    return {"max": float(diff.max()), "mean": float(diff.mean())}


def same_rows(model, tokenizer, device: str, batch: int, tokens: int) -> dict:
    """The same draws through each decoding: how many of `batch` rows differ anywhere from the
    static step's (graphs replay the static step's kernels: none should), and how many differ
    from the eager loop's (bf16 rounding of another summation can flip a near-tie)."""
    torch.manual_seed(1)
    u = torch.rand(batch, tokens)
    static = run_static(model, tokenizer, batch, tokens, device, "static", u)[0]
    out = {"rows": batch, "tokens": tokens,
           "eager_rows_differing_from_static": int((run_grpo(
               model, tokenizer, batch, tokens, device, u)[0] != static).any(-1).sum())}
    if device == "cuda":
        graphs = run_static(model, tokenizer, batch, tokens, device, "graphs", u)[0]
        out["graphs_rows_differing_from_static"] = int((graphs != static).any(-1).sum())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shape and lengths (runs on a CPU)")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--budget-s", type=float, default=40.0)
    ap.add_argument("--deadline-s", type=float, default=320.0)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.smoke:
        raise SystemExit("no CUDA GPU here: run with --smoke to check the script on a CPU")
    shapes = SMOKE if args.smoke else SHAPES
    if args.smoke:
        args.tokens, args.batches = min(args.tokens, 24), [2, 4]
    from grpo.models import load_policy
    from grpo.run.progress import libraries_quiet
    from transformers import AutoTokenizer
    with libraries_quiet():
        report = measure_all(args, device, shapes, load_policy, AutoTokenizer)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = report["device"].replace(" ", "-").lower()
    path = out / f"gpu_sampler-{tag}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=1))
    print(json.dumps(report))
    print(path)


def measure_all(args, device: str, shapes: dict, load_policy, AutoTokenizer) -> dict:
    started = time.perf_counter()
    report = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "torch": torch.__version__, "tokens": args.tokens, "prompt_tokens": PROMPT_TOKENS,
              "copy_bandwidth_gb_s": round(copy_bandwidth(device, 0.05 if args.smoke else 2) / 1e9, 1),
              "models": {}}
    bandwidth = report["copy_bandwidth_gb_s"] * 1e9
    for name, shape in shapes.items():
        work = Path(tempfile.mkdtemp(prefix=f"grpo-sampler-{name}-"))
        build(shape, 128 if args.smoke else 1024, work)
        tokenizer = AutoTokenizer.from_pretrained(str(work))
        model = load_policy(str(work), "float32" if device == "cpu" else "bfloat16").to(device).eval()
        entry = {"params": sum(p.numel() for p in model.parameters()), "batches": {}}
        with torch.no_grad():
            for batch in args.batches:
                got = measure(name, model, tokenizer, batch, args, device,
                              batch == args.batches[0], started)
                bound = bound_tokens_per_s(model, batch, args.tokens, bandwidth)
                got["bound_tokens_per_s"] = round(bound, 1)
                rates = {k: v["tokens_per_s"] for k, v in got.items()
                         if isinstance(v, dict) and "tokens_per_s" in v}
                for k, rate in rates.items():
                    got[f"{k}_fraction_of_bound"] = round(rate / bound, 4)
                ours = [k for k in rates if k.startswith("grpo_") and k != "grpo_eager"]
                if ours:
                    best = max(ours, key=rates.get)
                    got["grpo_best"] = best
                    for peer in ("grpo_eager", "hf_static"):
                        if peer in rates:
                            got[f"grpo_best_over_{peer}"] = round(rates[best] / rates[peer], 3)
                entry["batches"][str(batch)] = got
            entry["same_draws"] = same_rows(model, tokenizer, device, min(args.batches),
                                            min(args.tokens, 128))
            entry["logp_vs_cpu_float32"] = logp_difference(work, model, tokenizer, device,
                                                           min(args.tokens, 64))
        report["models"][name] = entry
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    return report


if __name__ == "__main__":
    main()
