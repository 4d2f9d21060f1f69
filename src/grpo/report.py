"""Run reports: one self-contained HTML file with the run's curves and its sampled completions.

    grpo report RUN_DIR                  RUN_DIR/report.html and RUN_DIR/plots/*.png
    grpo report RUN_A RUN_B ... [--out DIR]   the runs overlaid, in DIR (default ./report)

Every run writes its own at the end. The HTML has no external reference (plots are PNGs inlined
as data URIs, the completion browser is a few lines of script on inlined JSON), so it opens
offline and can be mailed. `curves.png` in the run directory is the one-look summary (reward and
held-out accuracy).

The reflection-word plot counts, per step, the share of sampled completions that contain each of
REFLECTION_WORDS (whole words, any case): the "aha moment" of DeepSeek-R1 shows as these rising.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from pathlib import Path

from grpo.tracking import read_metrics

REFLECTION_WORDS = ("wait", "verify", "check", "let me")
SAMPLES_PER_STEP = 16      # completions kept per step for the browser
MAX_BROWSER_STEPS = 120    # steps kept for the browser, evenly spaced, first and last included

# (file name, title, [(metric, label)], y-limits or None)
PANELS = [
    ("reward", "Reward: mean and spread (shaded: mean ± std)", [("reward/mean", "reward/mean")], None),
    ("reward_per_fn", "Reward per function (mean)", [], None),
    ("accuracy", "Held-out accuracy (greedy)", [("eval/accuracy", "eval/accuracy")], (-0.02, 1.02)),
    ("kl", "KL to the reference", [("kl", "kl")], None),
    ("clip", "Clipped token fractions", [("clip/frac", "clip/frac"), ("clip/frac_low", "low side"),
                                         ("clip/frac_high", "high side")], None),
    ("entropy", "Entropy of the next-token distribution", [("entropy", "entropy")], None),
    ("length", "Completion length (tokens, mean)", [("completion/len_mean", "len_mean")], None),
    ("truncated", "Truncated completions (fraction)", [("completion/truncated_frac", "truncated")], (-0.02, 1.02)),
    ("time", "Step time split (s)", [("time/sample_s", "sample"), ("time/reward_s", "reward"),
                                     ("time/reference_s", "reference"), ("time/update_s", "update"),
                                     ("time/step_s", "step")], None),
    ("reflection", "Completions containing reflection words (fraction)", [], (-0.02, 1.02)),
    ("agent", "Episodes: turns and tool calls per episode", [
        ("episode/turns_mean", "turns"), ("episode/tool_calls_mean", "tool calls")], None),
    ("agent_shares", "Episodes: tool use, tool failures, environment tokens (fractions)", [
        ("episode/tool_use_frac", "episodes calling a tool"),
        ("episode/tool_failure_rate", "failed calls"),
        ("episode/env_token_frac", "environment-token share")], (-0.02, 1.02)),
]


def _read_samples(run_dir: Path) -> list[dict]:
    path = run_dir / "samples.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue    # a torn last line of a run that is still going
    return out


def reflection_rates(samples: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """word -> (steps, share of that step's completions containing the word)."""
    patterns = {w: re.compile(rf"\b{re.escape(w)}\b", re.IGNORECASE) for w in REFLECTION_WORDS}
    by_step: dict[int, list[str]] = {}
    for s in samples:
        by_step.setdefault(s["step"], []).append(s.get("completion") or "")
    steps = sorted(by_step)
    return {w: (steps, [sum(bool(p.search(c)) for c in by_step[st]) / len(by_step[st]) for st in steps])
            for w, p in patterns.items()}


def _series(metrics: list[dict], key: str) -> tuple[list[int], list[float]]:
    rows = [(m["step"], m[key]) for m in metrics
            if isinstance(m.get(key), (int, float)) and math.isfinite(m[key])]
    return [r[0] for r in rows], [r[1] for r in rows]


def _plot_panels(runs: list[tuple[str, list[dict], list[dict]]], out: Path) -> dict[str, Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-", "--", ":", "-."]
    files = {}
    for name, title, keys, ylim in PANELS:
        fig, ax = plt.subplots(figsize=(6.4, 3.4), dpi=100)
        drawn = 0
        for r, (label, metrics, samples) in enumerate(runs):
            prefix = f"{label}: " if len(runs) > 1 else ""
            if name == "reward_per_fn":
                keys = [(k, k.split("/")[1]) for k in sorted({k for m in metrics for k in m})
                        if k.startswith("reward/") and k.endswith("/mean") and k != "reward/mean"]
            if name == "reflection":
                series = [(w, *reflection_rates(samples)[w]) for w in REFLECTION_WORDS] if samples else []
            else:
                series = [(lab, *_series(metrics, key)) for key, lab in keys]
            for i, (lab, xs, ys) in enumerate(series):
                if not xs:
                    continue
                color = colors[(r if len(runs) > 1 else i) % len(colors)]
                style = styles[i % len(styles)] if len(runs) > 1 else "-"
                marker = "o" if name == "accuracy" else None
                ax.plot(xs, ys, style, color=color, marker=marker, markersize=3, label=prefix + lab,
                        linewidth=1.2)
                drawn += 1
                if name == "reward":
                    sx, sd = _series(metrics, "reward/std")
                    std = dict(zip(sx, sd))
                    lo = [y - std.get(x, 0.0) for x, y in zip(xs, ys)]
                    hi = [y + std.get(x, 0.0) for x, y in zip(xs, ys)]
                    ax.fill_between(xs, lo, hi, color=color, alpha=0.15, linewidth=0)
        if not drawn:
            ax.text(0.5, 0.5, "no data in this run", ha="center", va="center", transform=ax.transAxes)
        if ylim:
            ax.set_ylim(*ylim)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        files[name] = out / f"{name}.png"
        fig.savefig(files[name])
        plt.close(fig)
    return files


def _browser_samples(samples: list[dict]) -> list[dict]:
    steps = sorted({s["step"] for s in samples})
    if len(steps) > MAX_BROWSER_STEPS:
        stride = (len(steps) - 1) / (MAX_BROWSER_STEPS - 1)
        steps = sorted({steps[round(i * stride)] for i in range(MAX_BROWSER_STEPS)})
    keep, count = set(steps), {}
    out = []
    for s in samples:
        if s["step"] in keep and count.get(s["step"], 0) < SAMPLES_PER_STEP:
            count[s["step"]] = count.get(s["step"], 0) + 1
            out.append({k: s.get(k) for k in ("step", "group", "prompt", "completion", "reward",
                                               "advantage", "spans")})
    return out


def _summary(label: str, metrics: list[dict]) -> str:
    train = [m for m in metrics if "reward/mean" in m]
    evals = [m for m in metrics if "eval/accuracy" in m]
    parts = [f"<b>{html.escape(label)}</b>: {len(train)} steps"]
    if train:
        parts.append(f"reward/mean {train[0]['reward/mean']:.3f} → {train[-1]['reward/mean']:.3f}")
    if evals:
        parts.append(f"eval/accuracy {evals[0]['eval/accuracy']:.3f} → {evals[-1]['eval/accuracy']:.3f}")
    seconds = sum(m.get("time/step_s", 0.0) for m in train)
    parts.append(f"{seconds / 60:.1f} min of steps")
    return " · ".join(parts)


SCRIPT = """
const samples = JSON.parse(document.getElementById('samples').textContent);
const steps = [...new Set(samples.map(s => s.step))].sort((a, b) => a - b);
const select = document.getElementById('step');
for (const st of steps) { const o = document.createElement('option'); o.value = st; o.textContent = 'step ' + st; select.appendChild(o); }
function show() {
  const body = document.getElementById('rows'); body.innerHTML = '';
  for (const s of samples.filter(s => String(s.step) === select.value)) {
    const tr = document.createElement('tr');
    for (const [i, v] of [s.group, s.prompt, s.completion, s.reward === null ? 'unscorable' : s.reward.toFixed(3), s.advantage.toFixed(3)].entries()) {
      const td = document.createElement('td');
      if (i === 2 && s.spans && s.spans.length) {   // an episode: the environment's text marked
        for (const [start, end, who] of s.spans) {
          const span = document.createElement('span');
          span.textContent = s.completion.slice(start, end);
          if (who === 'env') { span.className = 'env'; span.title = 'tool or environment'; }
          td.appendChild(span);
        }
      } else { td.textContent = v; }
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}
select.addEventListener('change', show);
if (steps.length) { select.value = steps[steps.length - 1]; show(); }
window.addEventListener('load', () => {
  const images = [...document.querySelectorAll('img.plot')];
  document.body.dataset.plotsDrawn = images.filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.plots = images.length;
  document.body.dataset.sampleRows = document.getElementById('rows').children.length;
});
"""


def write_report(*run_dirs: str | Path, out: str | Path | None = None) -> Path:
    """Write report.html and plots/*.png for one run (in its directory) or several overlaid (in
    `out`, default ./report); also curves.png for a single run. Returns the HTML's path."""
    dirs = [Path(d) for d in run_dirs]
    for d in dirs:
        if not (d / "metrics.jsonl").is_file():
            raise FileNotFoundError(f"{d}: no metrics.jsonl; is it a run directory?")
    out = Path(out) if out else (dirs[0] if len(dirs) == 1 else Path("report"))
    runs = [(d.name if d.name else str(d), read_metrics(d), _read_samples(d)) for d in dirs]
    if len(dirs) == 1:
        _curves(dirs[0], runs[0][1])
    files = _plot_panels(runs, out / "plots")
    images = "\n".join(
        f'<figure><img class="plot" alt="{name}" src="data:image/png;base64,'
        f'{base64.b64encode(path.read_bytes()).decode()}"></figure>' for name, path in files.items())
    browser_json = json.dumps(_browser_samples(runs[0][2])).replace("</", "<\\/")  # no early </script>
    title = "GRPO run: " + ", ".join(html.escape(r[0]) for r in runs)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }}
.grid {{ display: flex; flex-wrap: wrap; gap: 8px; }} figure {{ margin: 0; }}
img.plot {{ width: 640px; max-width: 100%; border: 1px solid #ddd; }}
span.env {{ background: #e8f0ff; color: #2a4a8a; }}
table {{ border-collapse: collapse; font-size: 13px; }} td, th {{ border: 1px solid #ddd; padding: 3px 6px;
vertical-align: top; white-space: pre-wrap; max-width: 520px; }}
</style></head><body>
<h1>{title}</h1>
<p>{'<br>'.join(_summary(r[0], r[1]) for r in runs)}</p>
<div class="grid">
{images}
</div>
<h2>Sampled completions{' of ' + html.escape(runs[0][0]) if len(runs) > 1 else ''}</h2>
<p>Up to {SAMPLES_PER_STEP} per step. <label>Step: <select id="step"></select></label></p>
<table><thead><tr><th>group</th><th>prompt</th><th>completion</th><th>reward</th><th>advantage</th></tr></thead>
<tbody id="rows"></tbody></table>
<script type="application/json" id="samples">{browser_json}</script>
<script>{SCRIPT}</script>
</body></html>
"""
    path = out / "report.html"
    path.write_text(page, encoding="utf-8")
    return path


def _curves(run_dir: Path, metrics: list[dict]) -> Path:
    """`curves.png`: reward/mean per step and eval/accuracy per evaluation."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [m for m in metrics if "reward/mean" in m]
    evals = [m for m in metrics if "eval/accuracy" in m]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot([m["step"] for m in train], [m["reward/mean"] for m in train], label="reward/mean (train)",
            color="tab:blue", alpha=0.8)
    ax.plot([m["step"] for m in evals], [m["eval/accuracy"] for m in evals], "o-",
            label="eval/accuracy (held-out, greedy)", color="tab:orange")
    ax.set_xlabel("GRPO step")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(f"GRPO run: {run_dir.name}")
    fig.tight_layout()
    path = run_dir / "curves.png"
    fig.savefig(path)
    plt.close(fig)
    return path
