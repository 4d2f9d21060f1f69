"""The README's first command, run as written on a fresh copy of the project (a new virtual
environment, the demo run), and the demo's figures the README quotes, measured by that run.

benchmarks/readme_commands.py runs the other commands of the README and docs the same way."""

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from readme_commands import commands, fresh_copy, left_out, user_env  # noqa: E402


QUOTED = {   # torch's CPU kernels (torch.backends.cpu.get_cpu_capability()) -> the README's words
    "AVX2": r"torch's AVX2 kernels\) it went from (.*?) on;",
    "AVX512": r"AVX-512 kernels, as torch\.backends\.cpu\.get_cpu_capability names them, the same "
              r"seed went from (.*?) on\.",
}


def quoted_demo_accuracies(readme: str) -> dict[str, dict[int, float]]:
    """The held-out accuracies the README quotes for the demo run, per CPU kernel width: "it went
    from 0.370 at step 0 to 0.685 at step 80 and 0.845 from step 160 on" -> {0: .37, 80: .685,
    160: .845}."""
    text = " ".join(readme.split())
    quoted = {}
    for kernels, pattern in QUOTED.items():
        sentence = re.search(pattern, text).group(1)
        quoted[kernels] = {int(step): float(value) for value, step in
                           re.findall(r"(\d\.\d+) (?:at|from) step (\d+)", sentence)}
    return quoted


def test_the_quoted_accuracies_are_read_from_the_readme():
    text = ("In the run pictured (seed 0, torch's AVX2 kernels) it went from 0.370 at step 0 to 0.685 "
            "at step 80 and 0.845\nfrom step 160 on; on a CPU where torch uses AVX-512 kernels, as "
            "torch.backends.cpu.get_cpu_capability names them, the same seed went from 0.370 at step 0 "
            "to 0.940 from step 40 on. The same seed")
    assert quoted_demo_accuracies(text) == {"AVX2": {0: 0.370, 80: 0.685, 160: 0.845},
                                            "AVX512": {0: 0.370, 40: 0.940}}


def kernels() -> str:
    """The kernels torch picks on this CPU (as the fresh copy's torch, the same build, does)."""
    import torch
    return torch.backends.cpu.get_cpu_capability()


def test_the_readme_demo_command_runs_as_written_and_gives_the_quoted_numbers(tmp_path):
    where, command = commands()[0]
    assert where == "README.md" and command.endswith("grpo train") and left_out(command) is None
    copy = fresh_copy(tmp_path / "grpo")
    done = subprocess.run(["bash", "-c", command], cwd=copy, env=user_env(), capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    run = copy / "runs" / "demo"
    assert (run / "report.html").is_file() and (run / "final" / "config.json").is_file()
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    measured = {m["step"]: m["eval/accuracy"] for m in metrics if "eval/accuracy" in m}
    by_kernels = quoted_demo_accuracies((ROOT / "README.md").read_text())
    assert kernels() in by_kernels, f"the README quotes no run with {kernels()} kernels: add one"
    quoted = by_kernels[kernels()]
    last_step = max(quoted)
    assert {s: measured[s] for s in quoted} == quoted, (
        f"the README quotes {quoted} for {kernels()} kernels; a fresh install measured {measured}: "
        "update the README")
    held = {s: v for s, v in measured.items() if s >= last_step}
    assert set(held.values()) == {quoted[last_step]}, f"'from step {last_step} on': {held}"
