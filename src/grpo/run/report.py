"""Run reports: one self-contained HTML file with the run's curves and its sampled completions.

    grpo report RUN_DIR                  RUN_DIR/report.html and RUN_DIR/plots/*.png
    grpo report RUN_A RUN_B ... [--out DIR]   the runs overlaid, in DIR (default ./report)

Every run writes its own at the end. The HTML has no external reference (plots are PNGs inlined
as data URIs, the completion browser is a few lines of script on inlined JSON), so it opens
offline and can be mailed. `curves.png` in the run directory is the one-look summary (reward and
held-out accuracy).

The reflection-word plot counts, per step, the share of sampled completions that contain each of
REFLECTION_WORDS (whole words, any case): the "aha moment" of DeepSeek-R1 shows as these rising.

A panel that cannot show anything in a run is left out, and the page says why under "Not shown"
(`why_empty`): the clip fractions with num_iterations=1 (every ratio is 1), the reflection words
when no completion holds one, the held-out accuracy without evaluations, the episode panels of a
single-turn run. The page also holds each run's config.yaml; legends sit under their plots. With
several runs, a panel is drawn when any run can fill it, and its caption
names the runs that cannot, and why.

Longer than about 400 lines: the report's figures and its text.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from pathlib import Path

from grpo.run.checkpoint import writing


REFLECTION_WORDS = ("wait", "verify", "check", "let me")
SAMPLES_PER_STEP = 16      # completions kept per step for the browser
MAX_BROWSER_STEPS = 120    # steps kept for the browser, evenly spaced, first and last included

# (file name, title, [(metric, label)], y-limits or None)
PANELS = [
    ("reward", "Reward: mean and spread (shaded: mean ± std, within the step's lowest and highest)",
     [("reward/mean", "reward/mean")], None),
    ("reward_per_fn", "Reward per function (mean)", [], None),
    ("accuracy", "Held-out accuracy (greedy)", [("eval/accuracy", "eval/accuracy")], (-0.02, 1.02)),
    ("zero_std", "Groups whose rewards are all equal (they teach nothing)", [
        ("advantage/zero_std_frac", "advantage/zero_std_frac")], (-0.02, 1.02)),
    ("reward_causes", "Zero rewards by cause (count per step)", [], None),
    ("faults", "Unscorable samples and environment failures (per step), skipped updates (in all)", [
        ("reward/unscorable", "reward/unscorable"), ("episode/env_failures", "episode/env_failures"),
        ("update/skipped_steps", "update/skipped_steps")], None),
    ("kl", "KL to the reference", [("kl", "kl")], None),
    ("clip", "Clipped token fractions", [("clip/frac", "clip/frac"), ("clip/frac_low", "low side"),
                                         ("clip/frac_high", "high side")], None),
    ("entropy", "Entropy of the next-token distribution", [("entropy", "entropy")], None),
    ("grad_norm", "Gradient norm (before clipping to max_grad_norm)", [("grad_norm", "grad_norm")],
     None),
    ("length", "Completion length (tokens, mean)", [("completion/len_mean", "len_mean")], None),
    ("truncated", "Truncated completions (fraction)", [("completion/truncated_frac", "truncated")], (-0.02, 1.02)),
    ("time", "Step time split (s)", [("time/sample_s", "sample"), ("time/reward_s", "reward"),
                                     ("time/reference_s", "reference"), ("time/advantage_s", "advantages"), ("time/update_s", "update"),
                                     ("time/sync_s", "engine sync"),
                                     ("time/step_s", "step")], None),
    ("reflection", "Completions containing reflection words (fraction)", [], (-0.02, 1.02)),
    ("agent", "Episodes: turns and tool calls per episode", [
        ("episode/turns_mean", "turns"), ("episode/tool_calls_mean", "tool calls")], None),
    ("agent_shares", "Episodes: tool use, tool failures, environment tokens (fractions)", [
        ("episode/tool_use_frac", "episodes calling a tool"),
        ("episode/tool_failure_rate", "failed calls"),
        ("episode/env_token_frac", "environment-token share")], (-0.02, 1.02)),
    ("staleness", "Asynchronous GRPO: staleness of the groups (steps) and who waited (s)", [
        ("pipeline/staleness_mean", "staleness, mean over groups"),
        ("pipeline/trainer_wait_s", "trainer waited for its groups"),
        ("pipeline/worker_wait_s", "worker waited for its weights")], None),
    ("offpolicy", "Off-policy correction: pi_old / pi_behaviour per token, masked share", [
        ("offpolicy/ratio_mean", "ratio, mean"), ("offpolicy/ratio_max", "ratio, max"),
        ("offpolicy/masked_frac", "masked tokens")], None),
]
COUNT_PANELS = {"faults", "reward_causes"}
TIMELINE_STEPS = 12        # steps drawn in the phase timeline of an async_steps run


def _read_jsonl(run_dir: Path, name: str) -> list[dict]:
    """The objects of a run's JSONL file; a line that does not parse (the torn last line of a run
    that is still writing) is left out."""
    path = run_dir / name
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue    # a torn last line of a run that is still going
        if isinstance(value, dict) and isinstance(value.get("step"), int):
            out.append(value)
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


def _read_config(run_dir: Path) -> dict:
    """The run's resolved config.yaml, or {} when it has none."""
    import yaml
    path = run_dir / "config.yaml"
    try:
        return yaml.safe_load(path.read_text()) or {} if path.is_file() else {}
    except yaml.YAMLError:
        return {}


def why_empty(name: str, keys: list[tuple[str, str]], metrics: list[dict], samples: list[dict],
              config: dict) -> str | None:
    """Why panel `name` can show nothing for this run, or None when it can."""
    if name == "clip" and config.get("num_iterations") == 1:
        return ("num_iterations=1: one update per batch, so pi_old is the policy that is updated, "
                "every ratio is exactly 1 and nothing is ever clipped; with num_iterations (mu) "
                "above 1 the later updates move the ratio and the clip acts")
    if name == "reflection":
        if not samples:
            return "no samples.jsonl: no completions to read"
        if not any(any(rates) for _, rates in reflection_rates(samples).values()):
            mean = sum(len(s.get("completion") or "") for s in samples) / len(samples)
            return (f"none of the {len(samples)} sampled completions ({mean:.0f} characters long on "
                    f"average) contains {', '.join(repr(w) for w in REFLECTION_WORDS)}: they do not "
                    "reason in words (the share rises when a model that does learns to check its "
                    "own reasoning)")
        return None
    if any(_series(metrics, key)[0] for key, _ in keys):
        return None
    if name == "accuracy":
        return "no held-out evaluation in this run (eval_every=0, or no held-out rows)"
    if name.startswith("agent"):
        return "a single-turn run: no tools or environment, so no episodes"
    if name == "staleness":
        return ("a synchronous run (async_steps=0): every group is sampled from the weights it is "
                "trained on")
    if name == "offpolicy":
        return ("no off-policy correction (correction=none, tis_cap=0, and no async_steps with "
                "proximal=decoupled)")
    if name == "reward_causes":
        return ("no reward counted a cause for a zero (built-in rewards count theirs: no answer "
                "found, a bound refused, a timeout, ...)")
    if name.startswith("reward"):
        return "no sample could be scored at any step, so no reward was defined"
    return "no values of " + ", ".join(key for key, _ in keys) + " in metrics.jsonl"


def _series(metrics: list[dict], key: str) -> tuple[list[int], list[float]]:
    rows = [(m["step"], m[key]) for m in metrics
            if isinstance(m.get(key), (int, float)) and math.isfinite(m[key])]
    return [r[0] for r in rows], [r[1] for r in rows]


def _plot_panels(runs: list[tuple[str, list[dict], list[dict], dict]], out: Path
                 ) -> tuple[dict[str, Path], dict[str, dict[str, str]]]:
    """The panels' PNGs, and for each panel the runs that cannot fill it with the reason
    (a panel no run can fill has no PNG).
    Longer than about 60 lines: one figure's panels, one after another."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out.mkdir(parents=True, exist_ok=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-", "--", ":", "-."]
    files, empty = {}, {}
    for name, title, keys, ylim in PANELS:
        reasons = {}
        for label, metrics, samples, config in runs:
            run_keys = DYNAMIC_KEYS[name](metrics) if name in DYNAMIC_KEYS else keys
            reason = why_empty(name, run_keys, metrics, samples, config)
            if reason:
                reasons[label] = reason
        empty[name] = reasons
        if len(reasons) == len(runs):
            (out / f"{name}.png").unlink(missing_ok=True)    # a stale one of an earlier report
            continue
        fig, ax = plt.subplots(figsize=(6.4, 3.4), dpi=100)
        drawn = 0
        for r, (label, metrics, samples, _) in enumerate(runs):
            if label in reasons:
                continue
            prefix = f"{label}: " if len(runs) > 1 else ""
            if name in DYNAMIC_KEYS:
                keys = DYNAMIC_KEYS[name](metrics)
            if name == "reflection":
                series = [(w, *reflection_rates(samples)[w]) for w in REFLECTION_WORDS] if samples else []
            elif name == "reward_causes":      # logged at the steps that counted one: 0 elsewhere
                steps = [m["step"] for m in metrics if "reward/mean" in m]
                series = [(lab, steps, [m.get(key, 0) for m in metrics if "reward/mean" in m])
                          for key, lab in keys]
            else:
                series = [(lab, *_series(metrics, key)) for key, lab in keys]
            for i, (lab, xs, ys) in enumerate(series):
                if not xs:
                    continue
                color = colors[(r if len(runs) > 1 else i) % len(colors)]
                style = styles[i % len(styles)] if len(runs) > 1 else "-"
                marker = "o" if name == "accuracy" or len(xs) == 1 else None   # one step: a dot
                ax.plot(xs, ys, style, color=color, marker=marker, markersize=3, label=prefix + lab,
                        linewidth=1.2)
                drawn += 1
                if name == "reward":
                    ax.fill_between(xs, *reward_band(metrics, xs, ys), color=color, alpha=0.15,
                                    linewidth=0)
        if ylim:
            ax.set_ylim(*ylim)
        if name in COUNT_PANELS:      # whole numbers from 0: a flat 0 reads as none, not as a centred line
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylim(bottom=-0.05 * max(1.0, ax.get_ylim()[1]), top=max(1.0, ax.get_ylim()[1]))
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("GRPO step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))     # steps are whole numbers
        ax.grid(alpha=0.3)
        if drawn:
            legend_below(ax, drawn)
        fig.tight_layout()
        files[name] = out / f"{name}.png"
        with writing(files[name]):   # a full disk names the file
            fig.savefig(files[name], bbox_inches="tight")
        plt.close(fig)
    return files, empty


def legend_below(ax, entries: int):
    """The legend under the axes, outside them, so it never covers a curve."""
    return ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2),
                     ncol=min(entries, 3), frameon=False)


def reward_band(metrics: list[dict], xs: list[int], means: list[float]
                ) -> tuple[list[float], list[float]]:
    """The shaded band mean ± std of each step, kept within that step's lowest and highest
    reward (`reward/min`, `reward/max`, where logged): a band outside the rewards a step gave would
    show values the reward never takes (0/1 rewards with mean 0.9 and std 0.3 reach 1.2)."""
    std = dict(zip(*_series(metrics, "reward/std")))
    low, high = dict(zip(*_series(metrics, "reward/min"))), dict(zip(*_series(metrics, "reward/max")))
    lo = [max(y - std.get(x, 0.0), low.get(x, -math.inf)) for x, y in zip(xs, means)]
    hi = [min(y + std.get(x, 0.0), high.get(x, math.inf)) for x, y in zip(xs, means)]
    return lo, hi


def _per_fn_keys(metrics: list[dict]) -> list[tuple[str, str]]:
    return [(k, k.split("/")[1]) for k in sorted({k for m in metrics for k in m})
            if k.startswith("reward/") and k.endswith("/mean") and k != "reward/mean"]


def _cause_keys(metrics: list[dict]) -> list[tuple[str, str]]:
    """`reward/<fn>/zero/<cause>` of every step that counted one, labelled `<fn>: <cause>`."""
    return [(k, f"{k.split('/')[1]}: {k.split('/', 3)[3]}") for k in sorted({k for m in metrics for k in m})
            if k.startswith("reward/") and "/zero/" in k]


DYNAMIC_KEYS = {"reward_per_fn": _per_fn_keys, "reward_causes": _cause_keys}   # keys from the run


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
                                               "advantage", "spans", "images")})
    return out


def _summary(label: str, metrics: list[dict]) -> str:
    train = [m for m in metrics if "reward/mean" in m]
    parts = [f"<b>{html.escape(label)}</b>: {len(train)} steps"]
    for key in ("reward/mean", "eval/accuracy"):
        _, values = _series(metrics, key)
        if values:
            parts.append(f"{key} {values[0]:.3f} → {values[-1]:.3f}")
        elif key == "reward/mean" and train:
            parts.append("reward/mean undefined at every step (no sample scored)")
    seconds = sum(m.get("time/step_s") or 0.0 for m in train)
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
      if (i === 1 && s.images && s.images.length) {  // the prompt's images as thumbnails
        for (const src of s.images) { const img = document.createElement('img'); img.src = src; img.className = 'thumb'; td.appendChild(img); }
        td.appendChild(document.createTextNode(v));
      } else if (i === 2 && s.spans && s.spans.length) {   // an episode: the environment's text marked
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
    runs = [(d.name if d.name else str(d), _read_jsonl(d, "metrics.jsonl"),
             _read_jsonl(d, "samples.jsonl"), _read_config(d)) for d in dirs]
    configs = "\n".join(
        f'<details class="config"><summary>config.yaml of {html.escape(label)}</summary><pre>'
        f'{html.escape((d / "config.yaml").read_text(errors="replace"))}</pre></details>'
        for d, (label, *_) in zip(dirs, runs) if (d / "config.yaml").is_file())
    if len(dirs) == 1:
        _curves(dirs[0], runs[0][1])
    files, empty = _plot_panels(runs, out / "plots")
    timeline = _timeline(dirs[0], out / "plots")
    if timeline is not None:
        files["timeline"] = timeline
        empty["timeline"] = {}
    images = "\n".join(
        f'<figure><img class="plot" alt="{name}" src="data:image/png;base64,'
        f'{base64.b64encode(path.read_bytes()).decode()}">{_caption(empty[name])}</figure>'
        for name, path in files.items())
    titles = {name: title for name, title, _, _ in PANELS} | {"timeline": "Phase timeline"}
    left_out = "".join(f"<li><b>{html.escape(titles[name])}</b>: "
                       f"{html.escape(next(iter(reasons.values())))}</li>"
                       for name, reasons in empty.items() if name not in files)
    not_shown = f'<h2>Not shown</h2>\n<ul id="not-shown">{left_out}</ul>' if left_out else ""
    browser_json = json.dumps(_browser_samples(runs[0][2])).replace("</", "<\\/")  # no early </script>
    title = "GRPO run: " + ", ".join(html.escape(r[0]) for r in runs)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }}
.grid {{ display: flex; flex-wrap: wrap; gap: 8px; }} figure {{ margin: 0; }}
img.plot {{ width: 640px; max-width: 100%; border: 1px solid #ddd; }}
figcaption {{ width: 640px; font-size: 12px; color: #555; }}
span.env {{ background: #e8f0ff; color: #2a4a8a; }}
img.thumb {{ width: 48px; height: 48px; image-rendering: pixelated; margin-right: 4px; vertical-align: middle; border: 1px solid #ccc; }}
table {{ border-collapse: collapse; font-size: 13px; }} td, th {{ border: 1px solid #ddd; padding: 3px 6px;
vertical-align: top; white-space: pre-wrap; max-width: 520px; }}
</style></head><body>
<h1>{title}</h1>
<p>{'<br>'.join(_summary(r[0], r[1]) for r in runs)}</p>
{configs}
<div class="grid">
{images}
</div>
{not_shown}
<h2>Sampled completions{' of ' + html.escape(runs[0][0]) if len(runs) > 1 else ''}</h2>
<p>Up to {SAMPLES_PER_STEP} per step. <label>Step: <select id="step"></select></label></p>
<table><thead><tr><th>group</th><th>prompt</th><th>completion</th><th>reward</th><th>advantage</th></tr></thead>
<tbody id="rows"></tbody></table>
<script type="application/json" id="samples">{browser_json}</script>
<script>{SCRIPT}</script>
</body></html>
"""
    path = out / "report.html"
    with writing(path):
        path.write_text(page, encoding="utf-8")
    return path


def _timeline(run_dir: Path, out: Path) -> Path | None:
    """An async_steps run's first steps from pipeline.jsonl: when the trainer waited for its groups
    and worked, and when each rollout worker waited for weights and worked (None without it)."""
    rows = _read_jsonl(run_dir, "pipeline.jsonl")[:TIMELINE_STEPS + 1]
    if not rows:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = min([rows[0]["trainer_wait"][0]] + [w["wait"][0] for w in rows[0]["workers"]])
    lanes = ["trainer"] + [f"worker {j}" for j in range(len(rows[0]["workers"]))]
    fig, ax = plt.subplots(figsize=(6.4, 1.2 + 0.45 * len(lanes)), dpi=100)
    for i, row in enumerate(rows[:TIMELINE_STEPS]):
        waited, got = row["trainer_wait"]
        ends = rows[i + 1]["trainer_wait"][0] if i + 1 < len(rows) else None
        ax.broken_barh([(waited - t0, got - waited)], (0.6, 0.8), color="#d62728", alpha=0.6)
        if ends is not None:
            ax.broken_barh([(got - t0, ends - got)], (0.6, 0.8), color="#1f77b4")
            ax.text(got - t0, 1.0, str(row["step"]), fontsize=6, va="center")
        for j, w in enumerate(row["workers"]):
            y = 1.6 + j
            ax.broken_barh([(w["wait"][0] - t0, w["wait"][1] - w["wait"][0])], (y, 0.8),
                           color="#d62728", alpha=0.6)
            ax.broken_barh([(w["work"][0] - t0, w["work"][1] - w["work"][0])], (y, 0.8), color="#2ca02c")
            ax.text(w["work"][0] - t0, y + 0.4, str(row["step"]), fontsize=6, va="center")
    ax.set_yticks([1.0 + i for i in range(len(lanes))], lanes, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds. Red: waiting. Trainer, blue: step n with its logging, evaluation and "
                  "checkpoint. Worker, green: sampling and scoring step n", fontsize=7)
    ax.set_title(f"Phase timeline of the first {min(len(rows), TIMELINE_STEPS)} steps", fontsize=10)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "timeline.png"
    with writing(path):
        fig.savefig(path)
    plt.close(fig)
    return path


def _caption(reasons: dict[str, str]) -> str:
    """Under a panel of several runs: the runs it leaves out, and why."""
    if not reasons:
        return ""
    return "<figcaption>" + "; ".join(f"{html.escape(label)}: not drawn, {html.escape(why)}"
                                      for label, why in reasons.items()) + "</figcaption>"


def _curves(run_dir: Path, metrics: list[dict]) -> Path:
    """`curves.png`: reward/mean per step and eval/accuracy per evaluation."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    ax.plot(*_series(metrics, "reward/mean"), label="reward/mean (train)", color="tab:blue", alpha=0.8)
    ax.plot(*_series(metrics, "eval/accuracy"), "o-", label="eval/accuracy (held-out, greedy)",
            color="tab:orange")
    ax.set_xlabel("GRPO step")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(f"GRPO run: {run_dir.name}")
    fig.tight_layout()
    path = run_dir / "curves.png"
    with writing(path):
        fig.savefig(path)
    plt.close(fig)
    return path
