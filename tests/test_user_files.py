"""A newcomer's first hour: a user's own files in a temporary directory (a dataset, a YAML with
typos, an environment module, a model directory that is not one), run as the user runs them:
through `grpo` (cli.main, in-process), `load_config`, `build_config` and `train`."""

import json
import shutil

import pytest

from grpo.build import ConfigError, load_data
from grpo.cli import main
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
        "lora": "a LoRA adapter, not a whole model",
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
        assert last.startswith(f"grpo eval: error: config key 'model': cannot load '{tmp_path / name}': "), last
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
