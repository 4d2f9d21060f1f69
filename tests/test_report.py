"""The run report: drawn in a real headless Chromium from a real short run, and its numbers."""

import os
import re
import shutil
import subprocess

import pytest

from grpo.config import build_config
from grpo.run.report import PANELS, reflection_rates, write_report
from grpo.train import train

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(n)), None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"),
    reason="Chromium is not installed (.ci/run installs it; apt-get install chromium)")


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tmp_path_factory):
    out = []
    for seed in (0, 1):
        run = tmp_path_factory.mktemp(f"run{seed}")
        # the second run makes two updates per batch, so its ratios can be clipped
        train(build_config({"model": str(tiny_model_dir), "sft_steps": 2, "steps": 4, "prompts_per_step": 2,
                            "group_size": 4, "max_new_tokens": 4, "eval_every": 2, "eval_size": 8,
                            "save_every": 0, "threads": 1, "seed": seed, "output_dir": str(run),
                            "num_iterations": 1 + seed}),
              log=lambda line: None)
        out.append(run)
    return out


def render(html_path, tmp_path):
    """Chromium's DOM after the page's scripts ran, its console lines, and a screenshot."""
    assert CHROMIUM, "Chromium is needed for this test in CI"
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--enable-logging=stderr", "--v=0", "--window-size=1300,2400"]
    url = html_path.resolve().as_uri()
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    shot = tmp_path / "shot.png"
    subprocess.run([*flags, f"--screenshot={shot}", url], capture_output=True, timeout=120)
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    return dom.stdout, console, shot


def drawn_pixels(png) -> int:
    from PIL import Image
    image = Image.open(png).convert("L")
    return sum(image.histogram()[:200])   # dark pixels: axes, lines, text


# What the first run (num_iterations=1, single-turn, digits for answers) cannot show
LEFT_OUT = {"clip", "reflection", "agent", "agent_shares", "staleness", "offpolicy", "reward_causes"}


@needs_chromium
def test_the_report_of_a_real_run_draws_in_chromium(runs, tmp_path):
    path = write_report(runs[0])
    assert path == runs[0] / "report.html"
    drawn = [name for name, *_ in PANELS if name not in LEFT_OUT]
    assert all((runs[0] / "plots" / f"{name}.png").stat().st_size > 5000 for name in drawn)
    assert "src=\"http" not in path.read_text() and "src='http" not in path.read_text()  # offline
    dom, console, shot = render(path, tmp_path)
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert f'data-plots="{len(drawn)}"' in body
    assert f'data-plots-drawn="{len(drawn)}"' in body       # every image decoded, width > 0
    assert 'data-sample-rows="8"' in body                    # the last step's 2 x 4 completions
    assert not console, console                              # no error, nothing logged at all
    assert shot.stat().st_size > 20_000 and drawn_pixels(shot) > 10_000


@needs_chromium
def test_several_runs_overlay_in_one_report(runs, tmp_path):
    path = write_report(*runs, out=tmp_path / "both")
    text = path.read_text()
    assert f"GRPO run: {runs[0].name}, {runs[1].name}" in text
    dom, console, _ = render(path, tmp_path)
    drawn = len(PANELS) - len(LEFT_OUT - {"clip"})     # the second run fills the clip panel
    assert f'data-plots-drawn="{drawn}"' in dom and not console


def test_a_panel_that_cannot_show_anything_is_left_out_saying_why(runs, tmp_path):
    import html
    page = html.unescape(write_report(runs[0]).read_text())
    not_shown = page.split('<ul id="not-shown">')[1].split("</ul>")[0]
    for name in LEFT_OUT:
        assert not (runs[0] / "plots" / f"{name}.png").exists(), name
        assert f'alt="{name}"' not in page
    assert "Clipped token fractions</b>: num_iterations=1: one update per batch" in not_shown
    assert "every ratio is exactly 1 and nothing is ever clipped" in not_shown
    assert "sampled completions" in not_shown and "contains 'wait', 'verify', 'check', 'let me'" in not_shown
    assert "a single-turn run: no tools or environment" in not_shown
    assert "no reward counted a cause for a zero" in not_shown
    # The second run made two updates per batch: its clip panel is drawn; laid over the first,
    # the caption says which run it leaves out and why
    assert (runs[1] / "plots" / "clip.png").stat().st_size > 5000
    both = html.unescape(write_report(*runs, out=tmp_path / "both").read_text())
    caption = both.split('alt="clip"')[1].split("</figure>")[0]
    assert f"{runs[0].name}: not drawn, num_iterations=1" in caption


def test_every_run_writes_its_report(runs):
    assert (runs[1] / "report.html").is_file() and (runs[1] / "curves.png").is_file()


def test_reflection_rates_count_whole_words_per_step():
    samples = [{"step": 1, "completion": "Wait, let me check."}, {"step": 1, "completion": "waiting"},
               {"step": 2, "completion": "I verify: 3"}, {"step": 2, "completion": "LET ME see"},
               {"step": 2, "completion": ""}, {"step": 2, "completion": "checkmate"}]
    rates = reflection_rates(samples)
    # step 1: "Wait" in 1 of 2 ("waiting" is not the word); step 2: 1 of 4 each for verify, let me
    assert rates["wait"] == ([1, 2], [0.5, 0.0])
    assert rates["check"] == ([1, 2], [0.5, 0.0])
    assert rates["verify"] == ([1, 2], [0.0, 0.25])
    assert rates["let me"] == ([1, 2], [0.5, 0.25])


def test_the_report_plots_every_metric_the_troubleshooting_guide_sends_users_to(runs):
    # advantage/zero_std_frac, grad_norm, skipped updates, zero causes and the unscorable count had
    # no plot, though the guide opens with "every metric named here is a plot there".
    from pathlib import Path
    from grpo.run.report import DYNAMIC_KEYS
    guide = (Path(__file__).parent.parent / "docs" / "guides" / "troubleshooting.md").read_text()
    named = set(re.findall(r"`((?:[a-z_]+/)+[a-z_<>]+|grad_norm|kl|entropy)`", guide))
    plotted = {key for _, _, keys, _ in PANELS for key, _ in keys}
    patterns = {"reward_per_fn": "reward/<fn>/mean", "reward_causes": "reward/<fn>/zero/<cause>"}
    assert set(patterns) == set(DYNAMIC_KEYS)
    in_the_file_only = {"tokens/prompt", "eval/n", "eval/rows"}   # counts the guide finds in metrics.jsonl
    missing = named - plotted - set(patterns.values()) - in_the_file_only
    assert not missing, missing
    assert {"advantage/zero_std_frac", "grad_norm", "update/skipped_steps", "reward/unscorable"} <= named
    for name in ("zero_std", "grad_norm", "faults"):
        assert (runs[0] / "plots" / f"{name}.png").stat().st_size > 5000, name


def test_the_zero_causes_panel_reads_every_cause_with_0_at_steps_that_counted_none(tmp_path):
    import json
    rows = [{"step": 1, "reward/mean": 0.5, "reward/math_accuracy/zero/no_answer": 3},
            {"step": 2, "reward/mean": 0.6},
            {"step": 3, "reward/mean": 0.7, "reward/math_accuracy/zero/bound": 1}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_report(tmp_path)
    from grpo.run.report import DYNAMIC_KEYS
    assert DYNAMIC_KEYS["reward_causes"](rows) == [
        ("reward/math_accuracy/zero/bound", "math_accuracy: bound"),
        ("reward/math_accuracy/zero/no_answer", "math_accuracy: no_answer")]
    assert (tmp_path / "plots" / "reward_causes.png").stat().st_size > 5000


def test_the_report_holds_the_runs_config(runs):
    import html
    page = html.unescape(write_report(runs[0]).read_text())
    section = page.split('<details class="config">')[1].split("</details>")[0]
    assert f"config.yaml of {runs[0].name}" in section
    assert "group_size: 4" in section and "max_new_tokens: 4" in section and "seed: 0" in section


def test_the_reward_band_stays_within_the_rewards_a_step_gave():
    from grpo.run.report import reward_band
    # 0/1 rewards: 9 of 10 right has mean 0.9, std 0.3162: mean + std = 1.2162 passes 1
    metrics = [{"step": 1, "reward/mean": 0.9, "reward/std": 0.3162, "reward/min": 0.0, "reward/max": 1.0},
               {"step": 2, "reward/mean": 0.5, "reward/std": 0.25, "reward/min": 0.0, "reward/max": 1.0},
               {"step": 3, "reward/mean": 0.1, "reward/std": 0.3162}]           # an older run: no min/max
    lo, hi = reward_band(metrics, [1, 2, 3], [0.9, 0.5, 0.1])
    assert lo == pytest.approx([0.5838, 0.25, 0.1 - 0.3162]) and hi == pytest.approx([1.0, 0.75, 0.4162])


def test_step_metrics_log_each_steps_lowest_and_highest_reward():
    import torch
    from grpo.run.metrics import step_metrics
    from grpo.rollout import Rollout
    n, T = 4, 2
    rollout = Rollout(prompts=["p"] * n, completions=["c"] * n, group_ids=torch.tensor([0, 0, 1, 1]),
                      prompt_ids=torch.zeros(n, 1, dtype=torch.long),
                      prompt_mask=torch.ones(n, 1, dtype=torch.long),
                      completion_ids=torch.zeros(n, T, dtype=torch.long),
                      completion_mask=torch.ones(n, T, dtype=torch.long), sampler_logprobs=torch.zeros(n, T),
                      truncated=torch.zeros(n, dtype=torch.bool))
    rollout.rewards = torch.tensor([0.25, float("nan"), -1.5, 2.0])
    rollout.rewards_per_fn = {}
    update = {k: 0.0 for k in ("kl", "clip/frac", "clip/frac_low", "clip/frac_high", "ratio/mean",
                               "entropy", "loss", "grad_norm")}
    m = step_metrics(rollout, [update], sample_s=1.0, reward_s=0.0, update_s=0.0)
    assert (m["reward/min"], m["reward/max"], m["reward/unscorable"]) == (-1.5, 2.0, 1)


def test_the_legend_sits_below_the_axes_and_covers_no_curve():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from grpo.run.report import legend_below
    fig, ax = plt.subplots(figsize=(6.4, 3.4), dpi=100)
    for k in range(5):                       # curves through every corner of the axes
        ax.plot([0, 1, 2], [k, 4 - k, k], label=f"a long label for curve {k}")
    legend = legend_below(ax, 5)
    fig.canvas.draw()
    box, axes = legend.get_window_extent(), ax.get_window_extent()
    assert box.y1 <= axes.y0, (box, axes)    # wholly under the plotting area
    plt.close(fig)
