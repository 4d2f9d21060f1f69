"""Live progress: a bar on a terminal, plain lines every `log_every` steps elsewhere."""

import io

from grpo.config import build_config
from grpo.progress import Progress, eta
from grpo.train import train


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_not_a_terminal_gets_lines_every_log_every_and_no_bar(tiny_model_dir, tmp_path):
    lines = []
    train(build_config({"model": str(tiny_model_dir), "sft_steps": 0, "steps": 7, "log_every": 3,
                        "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4, "eval_every": 0,
                        "save_every": 0, "threads": 1, "output_dir": str(tmp_path)}), log=lines.append)
    steps = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1] for line in steps] == ["3/7", "6/7", "7/7"]   # every 3rd, and the last
    assert all("reward" in line and "kl" in line and line.endswith(" left") for line in steps)
    assert not any("\r" in line or "\x1b" in line for line in lines)


def test_a_terminal_gets_a_bar_with_the_time_left_and_the_lines():
    screen = Terminal()

    def log(line):
        screen.write(line + "\n")

    log.stream = screen
    with Progress("step", 4, log, every=2) as bar:
        assert bar.bar is not None
        for done in range(1, 5):
            bar.update(done, f"reward {done / 10:.3f}")
    out = screen.getvalue()
    assert "step 2/4  reward 0.200" in out and "step 4/4  reward 0.400" in out
    assert "step 1/4  reward 0.100  " not in out     # only every 2nd is kept as a line
    assert "left" in out and "━" in out              # the bar was drawn


def test_eta_is_the_mean_rate_times_what_is_left():
    assert eta(30.0, 3, 10) == "1m10s"               # 10 s a unit, 7 units left
    assert eta(5.0, 10, 10) == "0m00s"


def test_the_runaway_note_by_hand():
    from grpo.metrics import RunawayWatch
    watch = RunawayWatch()
    # entropies of the tiny model at lr=5e-3 after a cold start: 0.70, 0.573, 0.376, then 0.205,
    # 0.205 / mean(0.70, 0.573, 0.376) = 0.205 / 0.5497 = 0.373 < 0.5: the fourth step is noted
    notes = [watch.note({"entropy": e, "kl": k}) for e, k in
             [(0.70, 0.0), (0.573, 0.05), (0.376, 0.2), (0.205, 0.3)]]
    assert notes[:3] == ["", "", ""]
    assert notes[3] == "  [entropy 0.205, under half of the last 3 steps' 0.550: collapsing, lower lr]"
    # a mean of 1.0 over the last three and 0.5 now is not under half; kl 1.31 is above 1, and
    # the reward 0.5 is under 0.8 * mean(0.9, 0.9, 0.9) = 0.72: noted
    watch = RunawayWatch()
    for e in (1.0, 1.0, 1.0):
        watch.note({"entropy": e, "kl": 0.0, "reward/mean": 0.9})
    assert watch.note({"entropy": 0.5, "kl": 1.31, "reward/mean": 0.5}) == (
        "  [kl 1.31 above 1 and reward 0.500 under 0.8 of the last 3 steps' 0.900: running away "
        "from the reference, lower lr]")
    # the demo's end: kl 1.71 with the reward where it was (0.898 >= 0.8 * 0.93): no note
    watch = RunawayWatch()
    for r in (0.93, 0.94, 0.92):
        watch.note({"entropy": 0.3, "kl": 1.3, "reward/mean": r})
    assert watch.note({"entropy": 0.3, "kl": 1.71, "reward/mean": 0.898}) == ""


def test_a_run_whose_entropy_collapses_says_so_in_its_progress_line(tiny_model_dir, tmp_path):
    def run(lr):
        lines = []
        train(build_config({"model": str(tiny_model_dir), "sft_steps": 30, "sft_lr": 1e-2, "steps": 6,
                            "lr": lr, "prompts_per_step": 4, "group_size": 4, "eval_every": 0,
                            "save_every": 0, "threads": 1, "output_dir": str(tmp_path / str(lr))}),
              log=lines.append, write_files=False)
        return [line for line in lines if line.startswith("step ")]
    calm, runaway = run(5e-4), run(1e-2)
    assert not any("collapsing" in line for line in calm)
    assert "collapsing, lower lr]" in runaway[-1] and runaway[-1].endswith(" left")
