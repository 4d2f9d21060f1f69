"""The `grpo` command as a user runs it: a subprocess."""

import json
import subprocess
import sys


def grpo(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "grpo.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def test_unknown_key_is_one_line_not_a_traceback():
    out = grpo("train", "nosuchkey=1")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "nosuchkey" in lines[0] and "nearest valid key" in lines[0]
    assert "Traceback" not in out.stderr


def test_wrong_type_is_one_line():
    out = grpo("train", "group_size=many")
    assert out.returncode == 2
    assert out.stderr.strip() == "grpo train: error: config key 'group_size' expects an integer, got 'many'"


def test_help_lists_every_key_with_default():
    from grpo.config import KEYS
    out = grpo("train", "--help")
    assert out.returncode == 0
    for key in KEYS:
        assert f"  {key}=" in out.stdout


def test_train_runs_and_writes_the_run_directory(tmp_path):
    out = grpo("train", "steps=2", "sft_steps=2", "eval_every=2", "eval_size=10",
               f"output_dir={tmp_path / 'run'}")
    assert out.returncode == 0, out.stderr
    assert "step 2/2" in out.stdout
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "eval/accuracy" in m] == [0, 2]
    assert (tmp_path / "run" / "final" / "config.json").is_file()


def test_bench_prints_one_json_line(tiny_model_dir):
    out = grpo("bench", f"model={tiny_model_dir}", "task=addition", "prompts_per_step=2",
               "group_size=2", "max_new_tokens=4", "steps=3", "beta=0.04")
    assert out.returncode == 0, out.stderr
    line = json.loads(out.stdout.strip())
    assert line["steps"] == 3
    for key in ("sec_per_step", "tokens_per_s", "peak_rss_mb", "model_flops_per_s"):
        assert line[key] > 0, key


def test_sft_then_eval(tmp_path):
    out = grpo("sft", "sft_steps=3", f"output_dir={tmp_path}")
    assert out.returncode == 0, out.stderr
    out = grpo("eval", f"model={tmp_path / 'final'}", "eval_size=10")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["eval/n"] == 10 and 0.0 <= result["eval/accuracy"] <= 1.0


def test_the_example_recipes_are_valid_configs():
    from pathlib import Path
    from grpo.config import load_config
    recipes = sorted(Path(__file__).parent.parent.joinpath("examples").glob("*.yaml"))
    assert len(recipes) == 3
    for path in recipes:
        config = load_config(str(path))
        if path.name == "agent-calculator.yaml":       # the CPU demo
            assert config.data.task == "calculator" and config.model.model == "tiny"
            continue
        assert config.sampling.sampler == "vllm" and config.model.dtype == "bfloat16", path


def test_every_test_the_faults_table_names_exists():
    import re
    from pathlib import Path
    root = Path(__file__).parent.parent
    text = (root / "docs" / "faults.md").read_text()
    named = re.findall(r"`(test_\w+\.py)::(test_\w+)`", text)
    assert len(named) >= 20
    for module, name in named:
        assert f"def {name}(" in (root / "tests" / module).read_text(), (module, name)


def test_every_function_the_walkthrough_links_exists():
    import re
    from pathlib import Path
    root = Path(__file__).parent.parent
    text = (root / "docs" / "walkthrough.md").read_text()
    links = re.findall(r"\[`(\w+)\.(\w+)`\]\(\.\./(src/grpo/[\w/]+\.py)\)", text)
    assert len(links) >= 25
    for module, name, path in links:
        assert Path(path).stem in (module, "__init__"), (module, path)
        assert f"def {name}(" in (root / path).read_text(), (module, name)
