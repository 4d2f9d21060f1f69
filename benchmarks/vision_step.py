"""A GRPO step on image prompts, G=8: grpo (image features once per group), grpo computing them
once per completion, and TRL's GRPOTrainer, on the same tiny vision-language model, side by side.

    python benchmarks/vision_step.py --trl-python /path/to/trl-venv/bin/python [--steps 6] [--repeats 2]
    python benchmarks/vision_step.py --trl-python ... --image-size 448 --out benchmarks/results/vision_step_448

The model is a LLaVA-architecture VLM with random weights (grpo.models.tiny), sized so the image
encoder matters: 224x224 images in 16-pixel patches (196 image tokens each; `--image-size 448`
gives 784), a CLIP tower of
hidden 256 and 6 layers (frozen, as grpo's default, and frozen in TRL's run too), a Llama language
model of hidden 256 and 4 layers. Every run: 2 prompts x 8 completions of up to 16 new tokens,
beta 0.04, mu 1, lr 5e-4, temperature 1, one process, the machine's threads. The prompts are the
`shapes` task's pictures scaled up, "how many shapes?".

"per completion" is grpo with each completion given its own copy of its prompt's images and its
own pass over the prompt: every log-prob pass runs the tower on all 16 rows' images instead of the
2 prompts', and the language model on 16 copies of the prompts' tokens (image tokens included)
instead of 2 (sampling still prefills each prompt once in both grpo runs). Step times are medians over every step but
each run's first; memory is each process's peak resident set (VmHWM), median over runs; the
three sides alternate order between repeats.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def make_inputs(work: Path, rows: int = 64, size: int = 224) -> tuple[Path, Path]:
    from grpo.data.tasks.shapes import ShapesTask
    from grpo.models.tiny import build_tiny_vlm

    model = build_tiny_vlm(work / "model", hidden_size=256, layers=4, vision_hidden=256,
                           vision_layers=6, image_size=size, patch_size=16)
    (work / "images").mkdir(exist_ok=True)
    lines = []
    for i, row in enumerate(ShapesTask().train_rows(0)[:rows]):
        path = work / "images" / f"{i}.png"
        row["images"][0].resize((size, size)).save(path)
        lines.append(json.dumps({"question": row["prompt"], "text": row["prompt"],
                                 "answer": row["answer"], "image": str(path)}))
    data = work / "rows.jsonl"
    data.write_text("\n".join(lines) + "\n")
    return model, data


def run_grpo(model: str, data: str, steps: int, per_completion: bool) -> dict:
    """One grpo run in this process (a child of main's), measured."""
    import grpo.vision.inputs as inputs
    from grpo.config import load_config
    from grpo.train import train
    from trl_driver import peak_rss_kb

    if per_completion:          # every row its own copy of its prompt's images, and its own prompt pass
        import grpo.vision
        shared = inputs.encoder_outputs
        inputs.encoder_outputs = lambda m, visuals: shared(
            m, [copy.copy(v) if v is not None else None for v in visuals])
        grpo.vision.shared_prompt_hidden = lambda *args: None
    with tempfile.TemporaryDirectory() as out:
        config = load_config(overrides=[
            f"model={model}", f"dataset={data}", "group_size=8", "prompts_per_step=2",
            f"steps={steps}", "max_new_tokens=16", "beta=0.04", "lr=5e-4", "num_iterations=1",
            "rewards=[exact_answer]", "eval_every=0", f"output_dir={out}", "save_every=0"])
        result = train(config, log=lambda line: print(line, file=sys.stderr))
    times = [m["time/step_s"] for m in result.history if "time/step_s" in m]
    timed = times[1:] if len(times) > 1 else times
    return {"sec_per_step": round(statistics.median(timed), 4), "step_times": [round(t, 4) for t in times],
            "peak_rss_mb": round(peak_rss_kb() / 1024, 1)}


def side(name: str, args, model: Path, data: Path) -> dict:
    if name == "trl":
        command = [args.trl_python, str(HERE / "trl_vision_driver.py"), "--model", str(model),
                   "--rows", str(data), "--steps", str(args.steps), "--max-new-tokens", "16"]
    else:
        command = [sys.executable, str(HERE / "vision_step.py"), "--child", name, "--model", str(model),
                   "--data", str(data), "--steps", str(args.steps)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=HERE)
    if done.returncode:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["wall_s"] = round(time.perf_counter() - started, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trl-python", default="")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--image-size", type=int, default=224, help="pixels a side; (size/16)^2 image tokens")
    ap.add_argument("--out", default=str(HERE / "results" / "vision_step"))
    ap.add_argument("--child", default="")
    ap.add_argument("--model", default="")
    ap.add_argument("--data", default="")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_grpo(args.model, args.data, args.steps, args.child == "per_completion")))
        return
    sides = ["grpo", "per_completion"] + (["trl"] if args.trl_python else [])
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    with tempfile.TemporaryDirectory() as work:
        model, data = make_inputs(Path(work), size=args.image_size)
        for repeat in range(args.repeats):
            for name in (sides if repeat % 2 == 0 else sides[::-1]):
                runs[name].append(side(name, args, model, data))
                print(name, runs[name][-1], file=sys.stderr)
    summary = {s: {"sec_per_step": statistics.median(r["sec_per_step"] for r in rs),
                   "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in rs), "runs": rs}
               for s, rs in runs.items()}
    lines = ["| side | s/step (median) | peak RSS MB | time vs grpo | memory vs grpo |", "|---|---|---|---|---|"]
    base = summary["grpo"]
    for s in sides:
        v = summary[s]
        lines.append(f"| {s} | {v['sec_per_step']:.3f} | {v['peak_rss_mb']:.0f} | "
                     f"{v['sec_per_step'] / base['sec_per_step']:.2f} | {v['peak_rss_mb'] / base['peak_rss_mb']:.2f} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(summary, indent=1))
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
