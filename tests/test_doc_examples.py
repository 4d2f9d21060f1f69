"""Every Python example in the README and docs/guides runs as written: each block in a fresh
process in an empty directory, with the tiny model where it names a hub model, a few rows in
GSM8K's format where it loads `openai/gsm8k`, and runs cut to two short steps
(tests/doc_example_shims.py). An example that raises fails here, named by file and line."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs" / "guides").glob("*.md"))]


def examples() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        text = path.read_text()
        for m in re.finditer(r"```python\n(.*?)```", text, re.DOTALL):
            line = text[:m.start()].count("\n") + 2
            found.append((f"{path.relative_to(ROOT)}:{line}", m.group(1)))
    return found


def test_the_guides_hold_the_examples_this_test_runs():
    where = [name.split(":")[0] for name, _ in examples()]
    assert "README.md" in where and "docs/guides/python-api.md" in where
    assert len(examples()) >= 6


@pytest.mark.parametrize("name,code", examples(), ids=[name for name, _ in examples()])
def test_the_example_runs_as_written(name, code, tmp_path, tiny_model_dir):
    env = dict(os.environ, GRPO_DOC_TINY=str(tiny_model_dir),
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parent),
                                           os.environ.get("PYTHONPATH", "")]))
    script = tmp_path / "example.py"
    script.write_text("import doc_example_shims  # noqa: F401\n" + code)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{name} does not run as written:\n{done.stderr[-3000:]}"
    if "train(" in code:                  # a training example ends by printing what it trained
        assert done.stdout.strip(), name
