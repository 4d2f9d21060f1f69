"""A newcomer's first hour: a user's own files in a temporary directory (a dataset, a YAML with
typos, an environment module, a model directory that is not one), run as the user runs them:
through `grpo` (cli.main, in-process), `load_config`, `build_config` and `train`."""

import json
import shutil

import pytest

from grpo.assembly import ConfigError, load_data
from grpo.commands.cli import main
from grpo.config import build_config, load_config
from grpo.train import train

SMALL = ["sft_steps=0", "steps=1", "prompts_per_step=2", "group_size=2", "max_new_tokens=4",
         "eval_every=0", "save_every=0", "threads=1"]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def humaneval(tmp_path):
    """Two rows as HumanEval publishes them."""
    rows = [{"task_id": f"t/{i}", "prompt": f"def {name}(a, b):\n    \"\"\"a {op} b\"\"\"\n",
             "canonical_solution": f"    return a {op} b\n",
             "test": f"def check(candidate):\n    assert candidate(3, 2) == {value}\n",
             "entry_point": name}
            for i, (name, op, value) in enumerate([("add", "+", 5), ("sub", "-", 1)])]
    return write_jsonl(tmp_path / "HumanEval.jsonl", rows)


def gsm8k(tmp_path, n=6):
    """GSM8K-style rows: a question and a worked answer ending in `#### n`."""
    rows = [{"question": f"Ann has {i} apples and buys {i + 1} more. How many now?",
             "answer": f"She has {i} and buys {i + 1}, so {i} + {i + 1} = {2 * i + 1} apples in "
                       f"all.\n#### {2 * i + 1}"} for i in range(n)]
    return write_jsonl(tmp_path / "test.jsonl", rows)


def run_cli(capsys, *args):
    status = main(list(args))
    out = capsys.readouterr()
    return status, out.out, out.err


# ---- 1. Every key a run was given is used or refused -------------------------------------------------

def test_grpo_eval_reads_eval_dataset_without_a_dataset(tiny_model_dir, tmp_path, monkeypatch, capsys):
    # before: the built-in `largest` task was evaluated (n=200) and nothing said so
    monkeypatch.chdir(tmp_path)
    humaneval(tmp_path)
    status, out, err = run_cli(capsys, "eval", f"model={tiny_model_dir}", "eval_dataset=HumanEval.jsonl",
                               "rewards=[code_tests]", "max_new_tokens=4", "output_dir=out")
    assert status == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["eval/n"] == 2
    rows = [json.loads(line) for line in open(result["rows_file"])]
    assert [r["prompt"][:7] for r in rows] == ["def add", "def sub"]
    assert "eval/accuracy: code_tests, the first of the rewards" in err


def test_a_math_eval_file_is_scored_by_math_accuracy_and_its_golds_are_checked(tiny_model_dir, tmp_path):
    path = gsm8k(tmp_path)
    data = load_data(load_config(None, [f"eval_dataset={path}"]))
    assert len(data.eval_rows) == 6 and data.eval_rows[0]["answer"].endswith("#### 1")
    assert data.accuracy_source == "math_accuracy, for rows from a file"
    # HumanEval's rows hold no answer: scoring them by math_accuracy would be 0 for every row
    with pytest.raises(Exception, match=r"config key 'eval_dataset': .*HumanEval.jsonl row 1: no value in "
                                        r"the answer column 'answer', which eval/accuracy compares with"):
        load_data(load_config(None, [f"eval_dataset={humaneval(tmp_path)}"]))


@pytest.mark.parametrize("command", ["train", "eval"])
@pytest.mark.parametrize("with_dataset", [False, True])
def test_a_missing_eval_dataset_is_an_error_naming_the_key_and_the_path(tiny_model_dir, tmp_path, monkeypatch,
                                                                        capsys, command, with_dataset):
    monkeypatch.chdir(tmp_path)
    gsm8k(tmp_path)
    dataset = ["dataset=test.jsonl"] if with_dataset else []
    status, _, err = run_cli(capsys, command, f"model={tiny_model_dir}", "eval_dataset=does_not_exist.jsonl",
                             *dataset, *SMALL, "output_dir=run")
    assert status == 2
    assert err.strip().splitlines()[-1] == ("grpo " + command + ": error: config key 'eval_dataset': "
                                            "dataset file not found: does_not_exist.jsonl")
    assert not (tmp_path / "run").exists()


def test_the_rewards_and_their_sources_are_printed_and_written_to_config_yaml(tiny_model_dir, tmp_path):
    path = gsm8k(tmp_path)
    cases = [
        ({"dataset": str(path)}, "math_accuracy x1 (the default with dataset=; rewards= chooses others)"),
        ({}, "exact_answer x1 (task largest's own reward)"),
        ({"dataset": str(path), "rewards": ["math_accuracy", "think_format"], "reward_weights": [1, 0.5]},
         "math_accuracy x1 (rewards=), think_format x0.5 (rewards=)"),
    ]
    for i, (values, printed) in enumerate(cases):
        out = tmp_path / f"run{i}"
        config = build_config({**load_config(None, SMALL).flat(), "model": str(tiny_model_dir),
                               "output_dir": str(out), **values})
        lines = []
        train(config, log=lines.append)
        assert any(line.startswith(f"rewards: {printed}; eval/accuracy: ") for line in lines), lines
        text = (out / "config.yaml").read_text()
        head = [line for line in text.splitlines() if line.startswith("#")]
        assert head[0] == "# The reward this run optimized, term by term, and where each came from:"
        # the file still loads back as the run's config
        assert load_config(str(out / "config.yaml")) == config


ENVIRONMENT = '''
class HalfPoint:
    """Every turn is worth 0.5, whatever the model writes."""

    def reset(self, row):
        return None

    def step(self, text):
        return ("ok", 0.5, True)
'''


def test_with_an_environment_and_no_rewards_the_environment_reward_is_the_only_one(
        agent_model_dir, tmp_path, monkeypatch):
    # before: math_accuracy was added to the environment's reward, and this dataset (no answer
    # column) stopped the load asking for one
    (tmp_path / "halfenv.py").write_text(ENVIRONMENT)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = write_jsonl(tmp_path / "tasks.jsonl", [{"prompt": f"{i} + {i} ="} for i in range(4)])
    config = load_config(None, [f"model={agent_model_dir}", f"dataset={path}", f"eval_dataset={path}",
                                "environment=halfenv:HalfPoint", "max_turns=1", "eval_size=2",
                                f"output_dir={tmp_path / 'run'}", *SMALL, "max_new_tokens=12",
                                "eval_every=1"])
    lines = []
    result = train(config, log=lines.append)
    step = next(m for m in result.history if "reward/mean" in m)
    # the environment's 0.5 per episode that reached it (one cut at max_new_tokens never does)
    assert step["reward/mean"] == step["reward/environment/mean"] > 0
    assert not any(k.startswith("reward/math_accuracy") for k in step)
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert {s["reward"] for s in samples} <= {0.0, 0.5}
    # held-out episodes are scored by the environment too, not by math_accuracy (no answers here)
    evals = [m["eval/accuracy"] for m in result.history if "eval/accuracy" in m]
    assert len(evals) == 2 and all(a in (0.0, 0.25, 0.5) for a in evals) and max(evals) > 0
    assert any("rewards: environment x1 (environment halfenv:HalfPoint's episode reward; alone, as no "
               "rewards= is set); eval/accuracy: environment halfenv:HalfPoint's episode reward" in line
               for line in lines)
    assert "#   environment  weight 1" in (tmp_path / "run" / "config.yaml").read_text()


# ---- 4. Defaults that fit a user's data ---------------------------------------------------------------

def test_a_dataset_without_completions_trains_with_the_cold_start_off(tiny_model_dir, tmp_path):
    # before: the demo's sft_steps=10 stopped the run asking for a `completion` column
    path = gsm8k(tmp_path)
    config = load_config(None, [f"model={tiny_model_dir}", f"dataset={path}", *SMALL[1:],
                                f"output_dir={tmp_path / 'run'}"])
    assert config.run.sft_steps == 0
    lines = []
    train(config, log=lines.append)
    assert ("cold start: off (sft_steps=0, the default with dataset=); it has no 'completion' column "
            "to imitate") in lines
    # asked for explicitly, a cold start with nothing to imitate is refused
    explicit = load_config(None, [f"model={tiny_model_dir}", f"dataset={path}", "sft_steps=5", *SMALL[1:],
                                  f"output_dir={tmp_path / 'run2'}"])
    with pytest.raises(ConfigError, match=r"config key 'sft_steps' asks for a cold start, but the dataset "
                                          r".*test.jsonl has no 'completion' column"):
        train(explicit, log=lambda line: None)


def test_limits_that_cut_most_answers_or_skip_most_prompts_are_said_with_the_key(tiny_model_dir, tmp_path):
    path = gsm8k(tmp_path)
    lines = []
    train(load_config(None, [f"model={tiny_model_dir}", f"dataset={path}", *SMALL,
                             f"output_dir={tmp_path / 'run'}"]), log=lines.append)
    cut = [line for line in lines if "cuts most answers" in line]
    assert len(cut) == 1 and cut[0].startswith("max_new_tokens=4 cuts most answers: 6 of 6 reference "
                                               "answers ('answer' column of ")
    assert cut[0].endswith("tokens); raise max_new_tokens")
    # prompts the context cannot hold: the error counts them all, skip says when it is most
    rows = [{"question": "9" * 600, "answer": "1"}] * 3 + [{"question": "1+1", "answer": "2"}]
    long = write_jsonl(tmp_path / "long.jsonl", rows)
    values = [f"model={tiny_model_dir}", f"dataset={long}", *SMALL]
    with pytest.raises(Exception, match=r"long.jsonl row \d: the prompt has 60\d tokens; .* context of 512 "
                                        r"\(3 of 4 prompts do\).*long_prompts=skip"):
        train(load_config(None, values + [f"output_dir={tmp_path / 'r2'}"]), log=lambda line: None)
    lines = []
    train(load_config(None, values + ["long_prompts=skip", f"output_dir={tmp_path / 'r3'}"]),
          log=lines.append)
    assert any(line.startswith("long_prompts=skip: left out 3 of 4 train prompts longer than 508 tokens: "
                               f"most of {long}; a model with a longer context, or a lower max_new_tokens")
               for line in lines), lines


TYPOS = """\
learning_rate: 1.0e-5
num_generations: 4
gruop_size: 4
per_device_train_batch_size: 8
steps: 2
"""


def test_every_unknown_key_of_a_yaml_and_the_command_line_is_in_one_message(tmp_path, capsys):
    (tmp_path / "run.yaml").write_text(TYPOS)
    status, _, err = run_cli(capsys, "train", str(tmp_path / "run.yaml"), "max_completion_length=64",
                             "sampling=1")
    assert status == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("grpo train: error: 6 unknown config keys: ")
    for part in ["'learning_rate': it is called 'lr' here",
                 "'num_generations': it is called 'group_size' here",
                 "'gruop_size': the nearest valid key is 'group_size'",
                 "'per_device_train_batch_size': it has no single equivalent here: a step samples "
                 "prompts_per_step prompts with group_size completions each",
                 "'max_completion_length': it is called 'max_new_tokens' here",
                 "'sampling': it is a section name, not a key: keys are flat"]:
        assert part in line, part


# ---- 5. Errors that name the key and the path for every model-loading failure -------------------------

def bad_model_dirs(tmp_path, tiny_model_dir):
    """The directories users point `model=` at by mistake, and what the error says of each."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hello")
    (tmp_path / "stopped" / "checkpoints" / "step-2").mkdir(parents=True)
    (tmp_path / "lora").mkdir()
    (tmp_path / "lora" / "adapter_config.json").write_text("{}")
    (tmp_path / "lora" / "adapter_model.safetensors").write_text("")
    shutil.copytree(tmp_path / "lora", tmp_path / "lora_run" / "final")   # a LoRA run's directory
    (tmp_path / "no_weights").mkdir()
    shutil.copy(tiny_model_dir / "config.json", tmp_path / "no_weights")
    shutil.copytree(tiny_model_dir, tmp_path / "no_tokenizer")
    for f in (tmp_path / "no_tokenizer").iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            f.unlink()
    (tmp_path / "model.safetensors").write_text("")
    return {
        "empty": "an empty directory",
        "junk": r"not a model directory \(no config.json; it holds notes.txt\)",
        "stopped": r"a run directory without final/ .*model=.*stopped/checkpoints/step-N, or continue "
                   r"the run with resume=auto",
        "lora": r"a LoRA adapter whose adapter_config.json names no base model \(base_model_name_or_path\)",
        "lora_run": "a LoRA adapter whose adapter_config.json names no base model",
        "no_weights": r"config.json but no weights \(model.safetensors\)",
        "no_tokenizer": "no tokenizer files",
        "model.safetensors": "a file, not a model directory",
        "nowhere/at/all": "no such directory",
    }


def test_every_model_path_mistake_is_one_line_naming_the_key_and_the_path(tiny_model_dir, tmp_path, capsys):
    import re
    for name, why in bad_model_dirs(tmp_path, tiny_model_dir).items():
        status, _, err = run_cli(capsys, "eval", f"model={tmp_path / name}", "eval_size=2")
        assert status == 2, name
        last = err.strip().splitlines()[-1]
        shown = tmp_path / name / ("final" if name == "lora_run" else "")   # its final/ is named
        assert last.startswith(f"grpo eval: error: config key 'model': cannot load '{shown}': "), last
        assert re.search(why, last), (name, last)
        assert "sentencepiece" not in err and "tiktoken" not in err and "Traceback" not in err


def test_a_run_directory_loads_its_final_model_with_a_line(tiny_model_dir, tmp_path, capsys):
    shutil.copytree(tiny_model_dir, tmp_path / "demo" / "final")
    status, out, err = run_cli(capsys, "eval", f"model={tmp_path / 'demo'}", "eval_size=2",
                               "max_new_tokens=2", f"output_dir={tmp_path / 'out'}")
    assert status == 0, err
    assert (f"model={tmp_path / 'demo'} is a run directory: loading its final model, "
            f"{tmp_path / 'demo' / 'final'}") in err
    assert json.loads(out.strip().splitlines()[-1])["eval/n"] == 2


def test_a_reward_model_path_that_is_not_a_model_names_the_rewards_key(tmp_path):
    (tmp_path / "rm").mkdir()
    with pytest.raises(ConfigError, match=rf"config key 'rewards': cannot load '{tmp_path / 'rm'}': an "
                                          r"empty directory.*\(the reward model model:"):
        load_data(load_config(None, [f"rewards=[model:{tmp_path / 'rm'}]"]))


def test_grpo_sft_on_a_dataset_asks_for_sft_steps(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "say a:", "completion": "aaa"}])
    status, _, err = run_cli(capsys, "sft", "dataset=pairs.jsonl")
    assert status == 2
    assert err.strip() == ("grpo sft: error: config key 'sft_steps' is 0 (with dataset= unless set): "
                           "nothing to tune; set sft_steps=N")
