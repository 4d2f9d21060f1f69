"""Live progress: a bar on a terminal, plain lines every `log_every` steps elsewhere."""

import io

from grpo.config import build_config
from grpo.run.progress import Progress, eta
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
    from grpo.run.metrics import RunawayWatch
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


def test_the_flat_reward_note_by_hand():
    from grpo.run.metrics import RunawayWatch
    watch = RunawayWatch()
    flat = {"entropy": 1.0, "kl": 0.0, "reward/mean": 0.0, "advantage/zero_std_frac": 1.0}
    some = {**flat, "advantage/zero_std_frac": 0.75}
    assert [watch.note(m) for m in (flat, flat, some, flat)] == [
        "  [every group's rewards are equal (1 step in a row): advantages 0, nothing learned; "
        "docs/guides/troubleshooting.md]",
        "  [every group's rewards are equal (2 steps in a row): advantages 0, nothing learned; "
        "docs/guides/troubleshooting.md]",
        "",
        "  [every group's rewards are equal (1 step in a row): advantages 0, nothing learned; "
        "docs/guides/troubleshooting.md]"]
    # no sample scored: unscored_warning says so, not this note
    assert watch.note({**flat, "reward/mean": float("nan")}) == ""


def test_a_run_whose_groups_all_have_equal_rewards_says_so_in_its_progress_line(tiny_model_dir,
                                                                               tmp_path):
    def same(prompts, completions, **columns):
        return [1.0] * len(completions)
    lines = []
    result = train(build_config({"model": str(tiny_model_dir), "sft_steps": 0, "steps": 2,
                                 "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4,
                                 "eval_every": 0, "save_every": 0, "threads": 1,
                                 "output_dir": str(tmp_path)}),
                   reward_fns=[same], log=lines.append, write_files=False)
    assert [m["advantage/zero_std_frac"] for m in result.history] == [1.0, 1.0]
    steps = [line for line in lines if line.startswith("step ")]
    assert "[every group's rewards are equal (1 step in a row)" in steps[0]
    assert "[every group's rewards are equal (2 steps in a row)" in steps[1]


def test_the_bar_names_elapsed_time_elapsed_and_remaining_time_left():
    import re
    screen = Terminal()

    def log(line):
        screen.write(line + "\n")

    log.stream = screen
    with Progress("step", 4, log, every=10) as bar:
        bar.update(1, "reward 0.100")
        bar.bar.refresh()
    out = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())   # colours and cursor moves
    # rich's columns: elapsed as H:MM:SS, then the time remaining (-:--:-- before it is known)
    assert re.search(r"\d:\d\d:\d\d elapsed (\d:\d\d:\d\d|-:--:--) left", out), out
    assert not re.search(r"\d:\d\d:\d\d left \d", out)


def test_a_dataset_is_named_before_it_is_read_and_a_small_one_is_noted(tiny_model_dir, tmp_path):
    import json
    path = tmp_path / "three.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=?", "answer": str(i + 1)}) + "\n"
                            for i in range(3)))
    lines = []
    train(build_config({"model": str(tiny_model_dir), "dataset": str(path), "steps": 1,
                        "prompts_per_step": 4, "group_size": 2, "max_new_tokens": 2, "eval_every": 0,
                        "save_every": 0, "threads": 1, "output_dir": str(tmp_path / "run")}),
          log=lines.append, write_files=False)
    size = path.stat().st_size / 1e6
    assert lines[0] == f"dataset: reading {path} ({size:.1f} MB)"      # before anything else
    assert lines[1] == f"dataset: 3 rows from {path}"
    assert (f"{path} has 3 rows (after the checks), fewer than prompts_per_step=4: every step "
            "repeats prompts, each as a group of its own; set prompts_per_step=3 or lower for "
            "distinct prompts") in lines


def test_the_end_of_run_line_names_the_report(tiny_model_dir, tmp_path, capsys):
    from grpo.commands.cli import main
    out = tmp_path / "run"
    assert main(["train", f"model={tiny_model_dir}", "sft_steps=0", "steps=1", "prompts_per_step=2",
                 "group_size=2", "max_new_tokens=2", "eval_every=0", "threads=1",
                 f"output_dir={out}"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"run directory: {out}  (report.html, metrics.jsonl, curves.png, final/)"
    assert (out / "report.html").is_file() and (out / "curves.png").is_file()
