"""The README's Python example runs as written, and its two commands stay the first thing in it."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_python_example_runs(tmp_path, monkeypatch, capsys):
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.DOTALL).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    assert (tmp_path / "runs" / "mine" / "final" / "config.json").is_file()
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert float(printed) <= 1.0


def test_first_commands_are_demo_then_tests():
    block = re.search(r"```bash\n(.*?)```", README.read_text(), re.DOTALL).group(1)
    commands = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert commands[0].endswith("grpo train")
    assert commands[1].endswith("python -m pytest -q")
    ci = (README.parent / ".ci" / "run").read_text()
    assert commands[1] in ci


def test_the_real_vllm_tests_run_in_ci_as_the_readme_gives_them():
    text = README.read_text()
    setup = re.search(r"^python3 -m venv \.venv-vllm .*$", text, re.MULTILINE).group(0)
    run = re.search(r"^python -m pytest -q -m vllm$", text, re.MULTILINE).group(0)
    ci = (README.parent / ".ci" / "run").read_text()
    assert f"{setup} && {run}" in ci
