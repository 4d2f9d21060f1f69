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
    W5 long         hidden 256, 4 layers, 32,000-token vocabulary, 8 prompts x 4 completions of
                    forced lengths 64, 128, ..., 2,048 (shuffled; benchmarks/forced_lengths.py and
                    trl_driver.py --lengths make both libraries sample exactly these); TRL with its
                    memory defaults: gradient checkpointing on, micro-batches of 4 completions;
                    grpo with gradient_checkpointing=true too and its default token budget

    python benchmarks/vs_trl.py --trl-python ... --longest [--longest-max 65536]

finds instead the longest completion one step of 1 prompt x 4 completions trains within 16 GiB
on the W5 model, by doubling from 2,048 tokens: each side at its leanest (grpo with
gradient_checkpointing=true, one row per pass by its token budget; TRL with gradient
checkpointing and micro-batches of 1). A run is stopped when its resident memory passes 16 GiB
(sampled every 0.2 s) or after --longest-time seconds; each attempt's peak and time are reported.
`--sides grpo` or `--sides trl` runs one library (two such runs may go side by side, each with
`--threads 1`; the result is memory, so they need not take turns).

Step times are medians over every step but each run's first; memory is each process's peak
resident set (VmHWM, which unlike ru_maxrss does not inherit the launcher's), median over runs. The float32 matrix-multiply peak is measured here, between
runs, and model FLOP/s use grpo.commands.bench's estimate over the tokens each library computes: TRL
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

from grpo.commands.bench import flops_per_step, matmul_peak

HERE = Path(__file__).parent
WORKLOADS = {
    "W1": dict(hidden_size=128, layers=4, heads=2, vocab_size=None, max_new_tokens=16),
    "W2": dict(hidden_size=512, layers=8, heads=8, vocab_size=None, max_new_tokens=64),
    "W3": dict(hidden_size=256, layers=2, heads=4, vocab_size=151936, max_new_tokens=128),
    "W4": dict(hidden_size=512, layers=8, heads=8, vocab_size=None, max_new_tokens=64, ragged=True),
    "W5": dict(hidden_size=256, layers=4, heads=4, vocab_size=32000, max_new_tokens=2048, group=4,
               max_positions=1 << 17, forced=True),
}
LIMIT_BYTES = 16 << 30


def w5_lengths() -> list[int]:
    """The forced lengths of W5's 32 rows: 64, 128, ..., 2,048, shuffled with seed 0."""
    import random
    lengths = [64 * k for k in range(1, 33)]
    random.Random(0).shuffle(lengths)
    return lengths
LR, BETA, PROMPTS, GROUP = 5e-4, 0.04, 8, 8


def build_workload(name: str, root: Path, prompts: Path) -> Path:
    from grpo.models import build_tiny
    spec = WORKLOADS[name]
    path = root / name
    if (path / "config.json").exists():
        return path
    build_tiny(path, hidden_size=spec["hidden_size"], layers=spec["layers"], heads=spec["heads"],
               architecture="qwen2", vocab_size=spec["vocab_size"],
               max_positions=spec.get("max_positions", 512))
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
    from grpo import assembly
    from grpo.config import load_config
    from grpo.models import load_tokenizer
    config = load_config(None, [f"model={model_dir}", "task=addition"])
    data = assembly.load_data(config, None)
    rows = data.train_rows[:2048]
    texts = assembly.prompt_texts(config, load_tokenizer(str(model_dir)), rows, assembly.agent_of(config))
    with open(path, "w") as f:
        for row, text in zip(rows, texts):
            f.write(json.dumps({"prompt": text, "answer": row["answer"]}) + "\n")
    return path


def run_json(cmd: list[str], log: Path, limit_bytes: int = 0, timeout: float = 0) -> dict:
    """Run `cmd`, return the JSON of its last output line. With `limit_bytes`, the process is
    killed when its resident memory passes the limit; with `timeout`, after that many seconds;
    either returns {"failed": why, "rss_mb": highest resident memory seen}."""
    with open(log, "a") as err:
        err.write("\n$ " + " ".join(cmd) + "\n")
        err.flush()
        if not limit_bytes and not timeout:
            out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, check=True).stdout
            return json.loads(out.strip().splitlines()[-1])
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        started, seen, why = time.perf_counter(), 0, ""
        while proc.poll() is None:
            rss = resident_bytes(proc.pid)
            seen = max(seen, rss)
            if limit_bytes and rss > limit_bytes:
                why = f"resident memory passed {limit_bytes / 2 ** 30:.0f} GiB"
            elif timeout and time.perf_counter() - started > timeout:
                why = f"not done in {timeout:.0f} s"
            if why:
                proc.kill()
                proc.wait()
                return {"failed": why, "rss_mb": round(seen / 2 ** 20, 1),
                        "wall_s": round(time.perf_counter() - started, 1)}
            time.sleep(0.2)
        out = proc.stdout.read()
        if proc.returncode:
            return {"failed": f"exit status {proc.returncode}", "rss_mb": round(seen / 2 ** 20, 1)}
        result = json.loads(out.strip().splitlines()[-1])
        result["wall_s"] = round(time.perf_counter() - started, 1)
        return result


def resident_bytes(pid: int) -> int:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def ours(model: Path, max_new: int, steps: int, threads: int, log: Path, group: int = GROUP,
         prompts: int = PROMPTS, lengths: list[int] | None = None, extra: tuple[str, ...] = (),
         limit_bytes: int = 0, timeout: float = 0) -> dict:
    head = ([sys.executable, str(HERE / "forced_lengths.py"), "--lengths", ",".join(map(str, lengths)), "--"]
            if lengths else [sys.executable, "-m", "grpo.commands.cli"])
    return run_json(head + ["bench", f"model={model}", "task=addition",
                            f"prompts_per_step={prompts}", f"group_size={group}",
                            f"max_new_tokens={max_new}", f"beta={BETA}", "num_iterations=1", f"lr={LR}",
                            f"steps={steps}", f"threads={threads}", *extra], log, limit_bytes, timeout)


def trl(python: str, model: Path, prompt_file: Path, max_new: int, steps: int, threads: int,
        log: Path, group: int = GROUP, prompts: int = PROMPTS, lengths: list[int] | None = None,
        extra: tuple[str, ...] = (), limit_bytes: int = 0, timeout: float = 0) -> dict:
    forced = ["--lengths", ",".join(map(str, lengths))] if lengths else []
    return run_json([python, str(HERE / "trl_driver.py"), "--model", str(model), "--prompts",
                     str(prompt_file), "--steps", str(steps), "--max-new-tokens", str(max_new),
                     "--prompts-per-step", str(prompts), "--group-size", str(group),
                     "--beta", str(BETA), "--lr", str(LR), "--threads", str(threads), *forced, *extra],
                    log, limit_bytes, timeout)


def side_args(name: str) -> dict:
    """What a workload changes in each side's command: group size, forced lengths, TRL's options."""
    spec = WORKLOADS[name]
    common = {"group": spec.get("group", GROUP),
              "lengths": w5_lengths() if spec.get("forced") else None}
    long = name == "W5"                    # both sides checkpoint activations, as TRL does by default
    trl_extra = ("--gradient-checkpointing", "--micro-batch", "4") if long else ()
    grpo_extra = ("gradient_checkpointing=true",) if long else ()
    return {"grpo": {**common, "extra": grpo_extra}, "trl": {**common, "extra": trl_extra}}


def longest(args, out: Path, log: Path, prompt_file: Path, model: Path) -> None:
    """Double the completion length from 2,048 until a side's step passes 16 GiB or its time."""
    results: dict[str, list[dict]] = {"grpo": [], "trl": []}
    for side in args.sides.split(","):
        if side == "trl" and not args.trl_python:
            continue
        length = 2048
        while length <= args.longest_max:
            print(f"longest: {side} at {length} tokens", file=sys.stderr)
            if side == "grpo":
                r = ours(model, length, 1, args.threads, log, group=4, prompts=1, lengths=[length],
                         extra=("gradient_checkpointing=true",), limit_bytes=LIMIT_BYTES,
                         timeout=args.longest_time)
            else:
                r = trl(args.trl_python, model, prompt_file, length, 1, args.threads, log, group=4,
                        prompts=1, lengths=[length], extra=("--gradient-checkpointing", "--micro-batch", "1"),
                        limit_bytes=LIMIT_BYTES, timeout=args.longest_time)
            r["length"] = length
            results[side].append(r)
            print(f"longest: {side} at {length}: " + (r["failed"] if "failed" in r else
                  f"{r['peak_rss_mb']} MB peak, {r['wall_s']} s"), file=sys.stderr)
            (out / f"longest{args.tag}.json").write_text(json.dumps(results, indent=1))
            if "failed" in r:
                break
            length *= 2
    markdown = longest_markdown(results)
    (out / f"longest{args.tag}.md").write_text(markdown)
    print(markdown)


def longest_markdown(results: dict[str, list[dict]]) -> str:
    """The search's table: each length's peak memory and wall time per side, or why it stopped."""
    lines = ["| completion tokens | grpo peak MB | grpo s | TRL peak MB | TRL s |", "|---|---|---|---|---|"]
    for n in sorted({r["length"] for rs in results.values() for r in rs}):
        cells = []
        for side in ("grpo", "trl"):
            r = next((r for r in results.get(side, []) if r["length"] == n), None)
            cells += (["-", "-"] if r is None else
                      [f"stopped ({r['failed']}; {r['rss_mb']:.0f} MB resident when stopped)", "-"]
                      if "failed" in r else [f"{r['peak_rss_mb']:.0f}", str(r["wall_s"])])
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    for side in ("grpo", "trl"):
        done = [r["length"] for r in results.get(side, []) if "failed" not in r]
        if results.get(side):
            lines.append(f"\n{side}: longest completion that trained: {max(done) if done else 'none'}")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trl-python", default="", help="python of an environment with TRL installed")
    ap.add_argument("--workloads", default="W1,W2,W3,W4")
    ap.add_argument("--steps", type=int, default=4, help="steps per run; the first is not timed")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="", help="suffix of the result files (vs_trl<TAG>.json)")
    ap.add_argument("--longest", action="store_true", help="search the longest completion instead")
    ap.add_argument("--longest-max", type=int, default=65536)
    ap.add_argument("--longest-time", type=float, default=3600, help="seconds per attempt")
    ap.add_argument("--sides", default="grpo,trl", help="--longest: which libraries, in order")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    (out / "models").mkdir(parents=True, exist_ok=True)
    log = out / "vs_trl.log"
    names = args.workloads.split(",")
    prompts = write_prompts(out / "addition_prompts.jsonl", build_workload("W1", out / "models", None))
    if args.longest:
        longest(args, out, log, prompts, build_workload("W5", out / "models", prompts))
        return
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
                result = (ours(models[n], max_new, args.steps, args.threads, log, **side_args(n)["grpo"])
                          if side == "grpo" else
                          trl(args.trl_python, models[n], prompts, max_new, args.steps, args.threads, log,
                              **side_args(n)["trl"]))
                runs[n][side].append(result)
            peaks.append(matmul_peak())
    peak = statistics.median(peaks)
    table = summarize(runs, peak, prompts)
    (out / f"vs_trl{args.tag}.json").write_text(json.dumps({"matmul_peak_flops": peak, "peaks": peaks,
                                                 "threads": args.threads, "table": table,
                                                 "runs": runs}, indent=1))
    markdown = to_markdown(table, peak, args)
    (out / f"vs_trl{args.tag}.md").write_text(markdown)
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
            group = WORKLOADS[name].get("group", GROUP)
            tokens = PROMPTS * (group if side == "trl" else 1) * prompt_tokens + PROMPTS * group * length
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
