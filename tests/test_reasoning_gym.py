"""reasoning-gym's tasks (`task=reasoning_gym:NAME`, data/tasks/gym.py; the reward in
rewards/tasks.py): rows per seed, held-out rows apart, the task's own score as the reward, the bad
inputs in one line, and a run that resumes exactly."""

import json
import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("reasoning_gym")

from grpo.config import ConfigError, load_config   # noqa: E402
from grpo.data.tasks import get_task                # noqa: E402
from grpo.rewards import faults, reasoning_gym      # noqa: E402

ADDITION = {"min_terms": 2, "max_terms": 2, "max_digits": 1, "operators": ["+"],
            "allow_negation": False, "allow_parentheses": False, "size": 60, "eval_size": 30}


def test_rows_are_the_same_for_a_seed_and_held_out_rows_never_ask_a_training_question():
    task = get_task("reasoning_gym:basic_arithmetic", {"max_digits": 2, "size": 80, "eval_size": 40})
    again = get_task("reasoning_gym:basic_arithmetic", {"max_digits": 2, "size": 80, "eval_size": 40})
    assert task.train_rows(3) == again.train_rows(3) and len(task.train_rows(3)) == 80
    assert task.train_rows(3) != task.train_rows(4)               # the run's seed picks them
    assert task.eval_rows() == again.eval_rows() and len(task.eval_rows()) == 40   # one for every run
    held = {r["prompt"] for r in task.eval_rows()}
    for seed in (0, 3, 4, 10_000):
        assert not held & {r["prompt"] for r in task.train_rows(seed)}
    # a small problem space: 1-digit sums have 121 questions; with 30 held out, training gets
    # rows from the other 91 only
    small = get_task("reasoning_gym:basic_arithmetic", ADDITION)
    held = {r["prompt"] for r in small.eval_rows()}
    assert len(held) <= 30 and not held & {r["prompt"] for r in small.train_rows(0)}
    row = small.train_rows(0)[0]
    entry = json.loads(row["rg_entry"])
    assert row["prompt"] == entry["question"] and row["answer"] == entry["answer"]
    assert small.demonstration(row) == f"<answer>{row['answer']}</answer>"


def test_held_out_questions_are_distinct_and_a_task_they_exhaust_is_one_line():
    small = get_task("reasoning_gym:basic_arithmetic", {**ADDITION, "eval_size": 60})
    questions = [r["prompt"] for r in small.eval_rows()]
    assert len(questions) == len(set(questions)) == 60
    every = get_task("reasoning_gym:basic_arithmetic", {**ADDITION, "eval_size": 5000})
    assert len(every.eval_rows()) == 121                # "1-digit" terms run 0..10: 11 x 11 sums, all held out
    with pytest.raises(ConfigError, match=r"made no row that is not held out \(121 held-out questions\); "
                                          r"lower task_args eval_size"):
        every.train_rows(0)


def test_several_tasks_are_drawn_by_weight_each_with_its_own_knobs():
    task = get_task("reasoning_gym:basic_arithmetic:3,leg_counting:1",
                    {"basic_arithmetic": {"max_digits": 1}, "size": 400, "eval_size": 20})
    rows = task.train_rows(0)
    share = sum(r["rg_task"] == "basic_arithmetic" for r in rows) / len(rows)
    assert 0.68 < share < 0.82                                    # 3 : 1, drawn
    assert {json.loads(r["rg_config"])["max_digits"] for r in rows if r["rg_task"] == "basic_arithmetic"} == {1}
    assert all(r["rg_config"] == "{}" for r in rows if r["rg_task"] == "leg_counting")


def test_enum_fields_take_their_words_as_yaml_gives_them_and_the_reward_reads_them_back():
    # aiw's task_types is a list of TaskType members; YAML and the command line give words
    task = get_task("reasoning_gym:aiw", {"task_types": ["siblings"], "task_type_weights": [1.0],
                                          "size": 30, "eval_size": 10})
    rows = task.train_rows(0)
    assert {json.loads(r["rg_entry"])["metadata"]["task_type"] for r in rows} == {"siblings"}
    assert json.loads(rows[0]["rg_config"])["task_types"] == ["siblings"]
    columns = {k: [r[k] for r in rows[:3]] for k in ("rg_task", "rg_config", "rg_entry")}
    right = [f"<answer>{r['answer']}</answer>" for r in rows[:3]]
    wrong = [f"<answer>{int(r['answer']) + 1}</answer>" for r in rows[:3]]
    assert reasoning_gym([r["prompt"] for r in rows[:3]], right, **columns) == [1.0] * 3
    assert reasoning_gym([r["prompt"] for r in rows[:3]], wrong, **columns) == [0.0] * 3
    with pytest.raises(ConfigError, match=r"reasoning-gym's aiw has no task_types 'cousins'; it takes "
                                          r"\['siblings', 'friends', 'colleagues'\]"):
        get_task("reasoning_gym:aiw", {"task_types": ["cousins"], "task_type_weights": [1.0]})


def completions_for(rows):
    """Right, wrong, missing, contained (partial credit), several tags, a tag left open, spaces."""
    a = [r["answer"] for r in rows]
    return [f"<answer>{a[0]}</answer>", "<answer>nope</answer>", "no tags at all",
            f"<answer>x{a[3]}x</answer>", f"<answer>1</answer> then <answer>{a[4]}</answer>",
            f"<answer>{a[5]}", f"<answer>  {a[6]}  </answer>", "<answer></answer>"]


def test_the_reward_is_the_tasks_own_score_of_its_own_extraction():
    import reasoning_gym as rg
    from reasoning_gym.utils import extract_answer
    for name, knobs in (("basic_arithmetic", {"max_digits": 1}), ("leg_counting", {}),
                        ("word_sorting", {}), ("family_relationships", {})):
        task = get_task(f"reasoning_gym:{name}", {**knobs, "size": 8, "eval_size": 4})
        rows = task.train_rows(1)[:8]
        completions = completions_for(rows)
        columns = {k: [r[k] for r in rows] for k in ("rg_task", "rg_config", "rg_entry")}
        got = reasoning_gym([""] * 8, completions, **columns)
        dataset = rg.create_dataset(name, seed=0, size=1, **knobs)
        want = [dataset.score_answer(extract_answer(c), json.loads(r["rg_entry"]))
                for c, r in zip(completions, rows)]
        assert got == want, name
        assert got[0] == 1.0 and got[2] == 0.0


def test_a_scorer_that_raises_scores_zero_and_is_counted():
    rows = get_task("reasoning_gym:basic_arithmetic", ADDITION).train_rows(0)[:2]
    broken = [{**r, "rg_entry": json.dumps({"question": "?"})} for r in rows]   # no answer, no metadata
    with faults.counting() as counts:
        got = reasoning_gym(["", ""], ["<answer>1</answer>", "<answer>2</answer>"],
                            **{k: [r[k] for r in broken] for k in ("rg_task", "rg_config", "rg_entry")})
    assert got == [0.0, 0.0]
    assert counts.metrics() == {"reward/reasoning_gym/zero/scorer_raised": 2}


@pytest.mark.parametrize("task, args, message", [
    ("reasoning_gym:basic_arithmetc", {}, "reasoning-gym has no task 'basic_arithmetc'; did you mean 'basic_arithmetic'"),
    ("reasoning_gym:basic_arithmetic", {"max_digit": 1}, "reasoning-gym's basic_arithmetic refuses {'max_digit': 1}"),
    ("reasoning_gym:basic_arithmetic:0", {}, "weight '0' of 'basic_arithmetic' must be above 0"),
    ("reasoning_gym:leg_counting,gcd", {"lcm": {}}, r"\['lcm'\] name none of the tasks"),
    ("reasoning_gym:gcd", {"prompt": "terse"}, "prompt 'terse' is not one of reasoning-gym's system prompts"),
    ("largest", {"size": 5}, "the built-in task 'largest' takes no arguments"),
])
def test_bad_task_names_and_knobs_are_one_line_naming_the_key(task, args, message):
    with pytest.raises(ConfigError, match=message):
        get_task(task, args)


def test_without_the_extra_the_task_says_how_to_install_it(monkeypatch):
    from grpo.data.tasks.registry import _task
    _task.cache_clear()                                                 # made anew, as in a fresh process
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)            # import fails
    with pytest.raises(ConfigError, match=r"needs reasoning-gym, an optional extra: pip install -e '\.\[tasks\]'"):
        get_task("reasoning_gym:gcd", {})


def test_the_prompt_tells_the_answer_format_unless_a_system_prompt_is_given():
    from reasoning_gym.utils import SYSTEM_PROMPTS
    from grpo.inputs import prompt_texts
    from grpo.models import build_tiny_tokenizer
    tokenizer = build_tiny_tokenizer()
    rows = [{"prompt": "Calculate 1 + 2."}]
    config = load_config(None, ["task=reasoning_gym:basic_arithmetic", "task_args={prompt: direct}"])
    assert prompt_texts(config, tokenizer, rows, None) == [f"{SYSTEM_PROMPTS['direct']}\nCalculate 1 + 2."]
    mine = load_config(None, ["task=reasoning_gym:basic_arithmetic", "system_prompt=Sum it."])
    assert prompt_texts(mine, tokenizer, rows, None) == ["Sum it.\nCalculate 1 + 2."]


def test_a_run_killed_and_resumed_equals_an_unbroken_one(tiny_model_dir, tmp_path):
    args = [f"model={tiny_model_dir}", "task=reasoning_gym:basic_arithmetic",
            "task_args=" + json.dumps({**ADDITION, "prompt": "direct"}), "sft_steps=3",
            "prompts_per_step=2", "group_size=4", "max_new_tokens=8", "steps=4", "eval_every=2",
            "eval_size=8", "save_every=2", "threads=1", "seed=5"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def launch(run, *more, fault=""):
        return subprocess.run([sys.executable, "-m", "grpo", "train", *args, f"output_dir={run}", *more],
                              env={**env, "GRPO_FAULT_KILL_AT": fault}, capture_output=True, text=True,
                              timeout=300)
    whole = launch(tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-2000:]
    assert launch(tmp_path / "killed", fault="step:3").returncode == -signal.SIGKILL
    done = launch(tmp_path / "killed", "resume=auto")
    assert done.returncode == 0, done.stderr[-2000:]

    def metrics(run):
        return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/") and k != "tokens/s"}
                for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics(tmp_path / "killed") == metrics(tmp_path / "whole")
    assert any("eval/accuracy" in m for m in metrics(tmp_path / "whole"))


def test_a_curriculum_sets_the_tasks_knobs_by_level_and_refuses_what_it_cannot():
    task = get_task("reasoning_gym:basic_arithmetic", {"curriculum": 0.8, "operators": ["+"], "size": 20,
                                                       "eval_size": 10})
    assert task.max_level == 4
    assert {k: task.knobs_at("basic_arithmetic", 0)[k] for k in ("max_terms", "max_digits")} == {"max_terms": 2, "max_digits": 1}
    assert {k: task.knobs_at("basic_arithmetic", 1)[k] for k in ("max_terms", "max_digits")} == {"max_terms": 3, "max_digits": 2}
    assert task.knobs_at("basic_arithmetic", 1)["operators"] == ["+"]          # the user's knobs stay
    assert task.describe(1) == "basic_arithmetic: min_terms 2, max_terms 3, min_digits 1, max_digits 2"
    assert json.loads(task.train_rows(0, level=1)[0]["rg_config"])["max_digits"] == 2
    with pytest.raises(ConfigError, match=r"curriculum is the held-out accuracy that raises the level, in \(0, 1\]"):
        get_task("reasoning_gym:basic_arithmetic", {"curriculum": 2})
    with pytest.raises(ConfigError, match=r"level 9 is not one of the curriculum's 0\.\.4"):
        get_task("reasoning_gym:basic_arithmetic", {"curriculum": 0.5, "level": 9})
    with pytest.raises(ConfigError, match="a curriculum changes the rows .* use async_steps=0"):
        load_config(None, ["task=reasoning_gym:gcd", "task_args={curriculum: 0.5}", "async_steps=1"])


def test_raising_the_level_changes_the_rows_and_a_stream_resumes_at_its_level():
    from types import SimpleNamespace
    from grpo.run.distributed import World
    from grpo.train import raise_level
    from grpo.assembly.run import prompt_stream
    from grpo.config import build_config
    task = get_task("reasoning_gym:basic_arithmetic", {"curriculum": 0.5, "size": 30, "eval_size": 10})
    data = SimpleNamespace(curriculum=task, train_rows=task.train_rows(0), eval_rows=task.eval_rows()[:8])
    stream = prompt_stream(build_config({}), data)
    said = []
    run = SimpleNamespace(data=data, stream=stream, world=World(), log=said.append)
    raise_level(run, 0.4, 10)                     # under the threshold: nothing
    assert stream.level == 0 and said == []
    raise_level(run, 0.5, 20)
    assert stream.level == 1 and stream.rows == task.train_rows(0, 1)
    assert run.data.eval_rows == task.eval_rows(1)[:8]
    assert said == ["curriculum: held-out accuracy 0.500 reached 0.5 at step 20: level 0 -> 1 "
                    "(basic_arithmetic: min_terms 2, max_terms 3, min_digits 1, max_digits 2)"]
    stream.next_batch(7)
    state = stream.state_dict()
    fresh = SimpleNamespace(curriculum=task, train_rows=task.train_rows(0), eval_rows=task.eval_rows()[:8])
    again = prompt_stream(build_config({}), fresh)
    again.load_state_dict(state)                     # a resumed run: its level, rows and held-out rows
    assert again.level == 1 and again.next_batch(12) == stream.next_batch(12)
    assert fresh.eval_rows == task.eval_rows(1)[:8]


def test_a_run_whose_level_rises_resumes_at_that_level_exactly(tiny_model_dir, tmp_path):
    # the held-out score is a reward that is always 1 (eval_rewards), so the level rises at each
    # evaluation: steps 2 and 4 of 6
    (tmp_path / "always.py").write_text("def one(prompts, completions, **columns):\n"
                                         "    return [1.0] * len(completions)\n")
    args = [f"model={tiny_model_dir}", "task=reasoning_gym:basic_arithmetic",
            "task_args={curriculum: 0.9, size: 40, eval_size: 8, prompt: direct}", "eval_rewards=[always:one]",
            "sft_steps=2", "prompts_per_step=2", "group_size=4", "max_new_tokens=8", "steps=6",
            "eval_every=2", "save_every=3", "threads=1", "seed=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tmp_path)}

    def launch(run, *more, fault=""):
        return subprocess.run([sys.executable, "-m", "grpo", "train", *args, f"output_dir={run}", *more],
                              env={**env, "GRPO_FAULT_KILL_AT": fault}, capture_output=True, text=True,
                              timeout=300, cwd=tmp_path)
    whole = launch(tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-2000:]
    assert "level 0 -> 1" in whole.stdout + whole.stderr and "level 1 -> 2" in whole.stdout + whole.stderr
    assert launch(tmp_path / "killed", fault="step:5").returncode == -signal.SIGKILL
    done = launch(tmp_path / "killed", "resume=auto")          # from step 3's checkpoint, at level 1
    assert done.returncode == 0, done.stderr[-2000:]

    def metrics(run):
        return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/") and k != "tokens/s"}
                for line in (run / "metrics.jsonl").read_text().splitlines()]
    levels = [m["task/level"] for m in metrics(tmp_path / "whole") if "task/level" in m]
    assert levels == [0, 0, 1, 1, 2, 2]
    assert metrics(tmp_path / "killed") == metrics(tmp_path / "whole")
