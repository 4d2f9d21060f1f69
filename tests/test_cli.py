"""The `grpo` command as a user runs it: a subprocess."""

import json
import subprocess
import sys


def grpo(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "grpo.commands.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def test_unknown_key_is_one_line_not_a_traceback():
    out = grpo("train", "nosuchkey=1")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "nosuchkey" in lines[0] and "no key here is close to it" in lines[0]
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


def test_eval_honours_the_sampler_key_as_training_does(tmp_path):
    """grpo eval and grpo explain are assembled as a run is: sampler=vllm samples on vLLM
    (tests/test_vllm.py), or, where vLLM is not installed, refuses in one line before any model
    loads (grpo eval once evaluated with grpo's own sampler whatever the key said)."""
    import importlib.util
    import pytest
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: tests/test_vllm.py evaluates on it")
    for command in ("eval", "explain"):     # explain samples its group as a run would
        out = grpo(command, "sampler=vllm", "eval_size=4", f"output_dir={tmp_path}")
        assert out.returncode == 2 and "Traceback" not in out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            f"grpo {command}: error: config key 'sampler': sampler=vllm needs vLLM"), lines


def test_the_example_recipes_are_valid_configs():
    from pathlib import Path
    from grpo.config import load_config
    recipes = sorted(Path(__file__).parent.parent.joinpath("examples").glob("*.yaml"))
    assert len(recipes) == 4
    for path in recipes:
        config = load_config(str(path))
        if path.name == "agent-calculator.yaml":       # the CPU demos
            assert config.data.task == "calculator" and config.model.model == "tiny"
            continue
        if path.name == "reasoning-gym-aiw.yaml":
            assert config.data.task == "reasoning_gym:aiw" and config.model.model == "tiny"
            assert config.data.task_args["task_types"] == ["siblings"]
            continue
        assert config.sampling.sampler == "vllm" and config.compute_dtype == "bfloat16", path
        assert config.model.dtype == "float32", path     # AdamW's 1e-6 steps round away in bf16


def test_every_test_the_faults_table_names_exists():
    import re
    from pathlib import Path
    root = Path(__file__).parent.parent
    text = (root / "docs" / "faults.md").read_text()
    named = re.findall(r"`(test_\w+\.py)::(test_\w+)`", text)
    assert len(named) >= 20
    for module, name in named:
        assert f"def {name}(" in (root / "tests" / module).read_text(), (module, name)


def test_every_function_the_walkthrough_links_exists():     # or class
    import re
    from pathlib import Path
    root = Path(__file__).parent.parent
    text = (root / "docs" / "walkthrough.md").read_text()
    links = re.findall(r"\[`(\w+)\.(\w+)`\]\(\.\./(src/grpo/[\w/]+\.py)\)", text)
    assert len(links) >= 25
    for module, name, path in links:
        assert Path(path).stem in (module, "__init__"), (module, path)
        source = (root / path).read_text()
        assert f"def {name}(" in source or f"class {name}" in source, (module, name)


# ---------------------------------------------------------------- exit codes and each command's help

GSM8K_LIKE = [{"question": "Ali has 3 boxes of 4 pens. How many pens?", "answer": "12 pens.\n#### 12"},
              {"question": "What is 10 - 4?", "answer": "#### 6"},
              {"question": "Mia has 2 cats and 3 dogs. How many pets?", "answer": "#### 5"}]


def package_path() -> str:
    """PYTHONPATH for a subprocess started in another directory: this grpo first."""
    import os
    from pathlib import Path
    import grpo
    return os.pathsep.join([str(Path(grpo.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def bad_inputs(tmp_path):
    """For every command, a mistake a user makes with their own files, and what the error names."""
    data = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_LIKE)
    (tmp_path / "run.yaml").write_text("steps: 3\nlearning_rat: 1e-5\n")
    (tmp_path / "not_a_run").mkdir()
    return {
        "train": (["run.yaml"], "unknown config key 'learning_rat'"),
        "launch": (["run.yaml", "--nproc-per-node", "2"], "unknown config key 'learning_rat'"),
        "sft": ([f"dataset={data}", "sft_steps=5", "output_dir=out"], "no 'completion' column"),
        "eval": (["model=no_such_model_dir", "eval_size=4"], "config key 'model'"),
        "score": ([f"dataset={data}"], "no completion column"),
        "bench": (["task=no_such_task"], "unknown task 'no_such_task'"),
        "explain": ([f"dataset={data}", "--row", "0"], "rows are numbered from 1, as in the file"),
        "report": (["not_a_run"], "not_a_run: no metrics.jsonl"),
    }


def test_every_command_exits_2_with_one_line_on_a_users_mistake(tmp_path, monkeypatch, capsys):
    from grpo.commands.cli import COMMANDS, main
    monkeypatch.chdir(tmp_path)
    cases = bad_inputs(tmp_path)
    assert set(cases) == set(COMMANDS)       # a new command gets a case here
    for command, (args, named) in cases.items():
        status = main([command, *args])
        err = capsys.readouterr().err
        assert status == 2, (command, err)
        assert err.startswith(f"grpo {command}: error: ") and named in err, (command, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, (command, err)


def test_usage_mistakes_exit_2_naming_the_options(tmp_path, monkeypatch, capsys):
    from grpo.commands.cli import main
    monkeypatch.chdir(tmp_path)
    for argv, named in [(["explain", "--row"], "--row needs a value: --row N"),
                        (["explain", "--row", "two"], "--row expects a row number"),
                        (["explain", "--rows", "2"], "unknown option '--rows'; grpo explain's options: --row"),
                        (["eval", "--json"], "unknown option '--json'; grpo eval's options: --out, --print-config"),
                        (["report"], "give at least one RUN_DIR"),
                        (["report", "run", "--out"], "--out needs a value"),
                        (["train", "steps=3", "oops"], "expected key=value, got 'oops'")]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert named in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert main(["nosuchcommand"]) == 2


def test_each_commands_help_lists_its_own_options_and_keys(capsys):
    from grpo.commands.cli import main
    helps = {}
    for command in ("train", "sft", "eval", "score", "bench", "explain", "report"):
        assert main([command, "--help"]) == 0
        helps[command] = capsys.readouterr().out
        assert helps[command].startswith(f"usage: grpo {command}")
    for flag in ("--row N", "--prompt TEXT", "--answer A", "--json", "--overview", "--print-config"):
        assert flag in helps["explain"], flag
    assert "--completions COLUMN" in helps["score"] and "--out DIR" in helps["report"]
    assert "  num_iterations=" in helps["explain"] and "  save_every=" not in helps["explain"]
    assert "  eval_k=" in helps["eval"] and "  num_iterations=" not in helps["eval"]
    assert "  rewards=" in helps["score"] and "  model=" not in helps["score"]
    assert "  sft_lr=" in helps["sft"] and "  beta=" not in helps["sft"]
    assert "keys" not in helps["report"]
    assert len({helps[c] for c in helps}) == len(helps)        # no two the same


def test_sigterm_outside_the_training_loop_exits_143_with_a_line(tmp_path):
    import os
    import signal
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": package_path()}
    # the demo's random model writes up to 300 tokens per answer: seconds per batch of 64
    proc = subprocess.Popen([sys.executable, "-m", "grpo", "eval", "max_new_tokens=300",
                             "eval_size=400", "threads=1", "output_dir=out"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    for line in proc.stderr:          # the first batch is done: the second is being sampled
        if line.startswith("eval 64/400"):
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == "grpo eval: stopped by SIGTERM before it finished"
    assert not (tmp_path / "out" / "eval.jsonl").exists()


def test_no_install_line_names_the_other_grpo_on_the_package_index():
    # A package named `grpo` on the public index is another project: `pip install 'grpo[lora]'`
    # would install it. grpo installs from a clone (pip install -e '.[lora]').
    import re
    from pathlib import Path
    from grpo.config import reference_markdown
    root = Path(__file__).parent.parent
    files = [root / "README.md", *(root / "docs").rglob("*.md"), *(root / "src" / "grpo").rglob("*.py"),
             *(root / "examples").rglob("*"), *(root / "benchmarks").rglob("*")]
    texts = {str(f.relative_to(root)): f.read_text() for f in files
             if f.is_file() and f.suffix in (".md", ".py", ".yaml", ".sh") and f.name != "config.md"}
    texts["docs/config.md, as generated"] = reference_markdown()   # the file itself: test_config.py
    assert len(texts) > 50
    found = [f"{name}:{n}: {line.strip()}" for name, text in texts.items()
             for n, line in enumerate(text.splitlines(), 1) if re.search(r"\bgrpo\[", line)]
    assert not found, "install from a clone, pip install -e '.[extra]':\n" + "\n".join(found)


def test_a_missing_optional_package_names_what_installs_it():
    from grpo.run.tracking import INSTALL
    from grpo.sampling.vllm import VLLMUnavailable  # noqa: F401  (the module imports without vLLM)
    assert INSTALL["wandb"] == "'wandb>=0.19' (in a clone of grpo: pip install -e '.[wandb]')"
    assert INSTALL["mlflow"].endswith("(in a clone of grpo: pip install -e '.[mlflow]')")


def test_help_lists_every_built_in_task_from_the_task_table():
    from grpo.config import field_docs
    from grpo.data.tasks import TASKS
    out = grpo("train", "--help").stdout
    (line,) = [line for line in out.splitlines() if line.strip().startswith("tasks:")]
    assert line.split(":", 1)[1].replace(" ", "").split(",") == list(TASKS)     # shapes too
    assert "shapes" in TASKS
    # the key's own text (docs/config.md is made from it) names each one as well
    doc = field_docs()["task"]
    assert all(name in doc for name in TASKS), doc


def test_the_recipes_readme_quotes_the_gpu_measurement_on_record():
    """examples/README.md said no GPU had been measured while docs/performance.md reported an
    H200: it quotes the measurement now, each figure as the results file holds it."""
    import json
    import re
    from pathlib import Path
    root = Path(__file__).parent.parent
    text = (root / "examples" / "README.md").read_text()
    assert "No GPU was available" not in text
    name = re.search(r"benchmarks/results/(async_gpu_check-[\d-]+\.json)", text).group(1)
    assert name in (root / "docs" / "performance.md").read_text()
    record = json.loads((root / "benchmarks" / "results" / name).read_text())
    sync = record["runs"]["sync"]
    assert record["device"] == "NVIDIA H200" and "one H200" in text
    assert f"took {sync['sec_per_step']:.1f} s a step (sampling {sync['sample_s']:.1f} s, the update " \
           f"{sync['update_s']:.1f} s)" in " ".join(text.split())
    assert f"at most {sync['peak_gpu_memory_gb']:.1f} GB of GPU memory" in " ".join(text.split())
