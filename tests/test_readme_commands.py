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


QUOTED = {   # a run the README quotes -> its words
    "AVX2": r"torch's AVX2 kernels\) it went from (.*?) on\.",
    "AVX512": r"get_cpu_capability names them, the same seed went from (.*?) on;",
    "AVX512 with AMX": r"an Intel Xeon with AVX-512 and AMX, from (.*?) on\.",
}
FLOOR = r"Every run measured was at (\d\.\d+) or more at step (\d+)\."
RUNS = ROOT / "benchmarks" / "results" / "demo_runs.json"   # numerics fingerprint -> a quoted run


def quoted_demo_accuracies(readme: str) -> dict[str, dict[int, float]]:
    """The held-out accuracies the README quotes for the demo's runs: "it went from 0.370 at step
    0 to 0.685 at step 80 and 0.845 from step 160 on" -> {0: .37, 80: .685, 160: .845}."""
    text = " ".join(readme.split())
    quoted = {}
    for run, pattern in QUOTED.items():
        sentence = re.search(pattern, text).group(1)
        quoted[run] = {int(step): float(value) for value, step in
                       re.findall(r"(\d\.\d+) (?:at|from) step (\d+)", sentence)}
    return quoted


def quoted_floor(readme: str) -> tuple[float, int]:
    """(accuracy, step): every quoted run was at `accuracy` or more at `step`."""
    value, step = re.search(FLOOR, " ".join(readme.split())).groups()
    return float(value), int(step)


def test_the_quoted_accuracies_are_read_from_the_readme():
    text = ("In the run pictured (seed 0, torch's AVX2 kernels) it went from 0.370 at step 0 to 0.685 "
            "at step 80 and 0.845\nfrom step 160 on. The trajectory moves: on a CPU where torch uses "
            "AVX-512 kernels, as torch.backends.cpu.get_cpu_capability names them, the same seed went "
            "from 0.370 at step 0 to 0.940 from step 40 on; on an Intel Xeon with AVX-512 and AMX, "
            "from 0.370 at step 0 to 0.530\nat step 60 and 0.940 from step 260 on. Every run measured "
            "was at 0.845 or more at step 300. The same seed")
    assert quoted_demo_accuracies(text) == {"AVX2": {0: 0.370, 80: 0.685, 160: 0.845},
                                            "AVX512": {0: 0.370, 40: 0.940},
                                            "AVX512 with AMX": {0: 0.370, 60: 0.530, 260: 0.940}}
    assert quoted_floor(text) == (0.845, 300)


def test_every_fingerprinted_run_is_quoted_and_holds_the_floor():
    readme = (ROOT / "README.md").read_text()
    quoted, (floor, at) = quoted_demo_accuracies(readme), quoted_floor(readme)
    known = json.loads(RUNS.read_text())
    assert known and all(entry["run"] in quoted for entry in known.values())
    for run in quoted.values():        # the floor is true of every quoted run ("from step N on")
        assert run[0] == 0.370 and run[max(run)] >= floor and max(run) <= at


def numerics(copy: Path) -> str:
    """benchmarks/numerics.py's fingerprint, run by the fresh copy's own torch."""
    done = subprocess.run([str(copy / ".venv" / "bin" / "python"), str(copy / "benchmarks" / "numerics.py")],
                          cwd=copy, env=user_env(copy / ".venv"), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()[-1]


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
    readme = (ROOT / "README.md").read_text()
    runs, (floor, at) = quoted_demo_accuracies(readme), quoted_floor(readme)
    fingerprint = numerics(copy)
    said = (f"a fresh install measured {measured} on a CPU whose numerics fingerprint is "
            f"{fingerprint}: update the README")
    assert measured[0] == runs["AVX2"][0], said                  # every quoted run starts there
    assert measured[at] >= floor, f"the README says every run was at {floor} or more at step {at}; {said}"
    known = json.loads(RUNS.read_text()).get(fingerprint)
    if known is not None:              # a CPU that computes the demo's step as a quoted run's did
        quoted = runs[known["run"]]
        assert {s: measured[s] for s in quoted} == quoted, f"the README quotes {quoted}; {said}"
        last_step = max(quoted)
        held = {s: v for s, v in measured.items() if s >= last_step}
        assert set(held.values()) == {quoted[last_step]}, f"'from step {last_step} on': {held}"
