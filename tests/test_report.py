"""The run report: drawn in a real headless Chromium from a real short run, and its numbers."""

import os
import re
import shutil
import subprocess

import pytest

from grpo.config import build_config
from grpo.report import PANELS, reflection_rates, write_report
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
LEFT_OUT = {"clip", "reflection", "agent", "agent_shares", "staleness", "offpolicy"}


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
