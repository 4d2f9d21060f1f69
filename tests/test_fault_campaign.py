"""The fault campaign (benchmarks/fault_campaign.py) in its fast form: one case of each kind, on
real `grpo train` processes. Its figure is its last line, `K of N cases hold`; every case must."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_fast_campaign_holds_in_every_case():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fault_campaign.py"), "--fast"],
                          capture_output=True, text=True, timeout=1200)
    lines = done.stdout.strip().splitlines()
    figure = re.fullmatch(r"(\d+) of (\d+) cases hold", lines[-1] if lines else "")
    assert figure, done.stdout[-3000:] + done.stderr[-3000:]
    held, cases = int(figure[1]), int(figure[2])
    # One of each kind: a SIGKILL at a named point and at a random moment, a corrupted checkpoint,
    # a reward server under raise and under skip, a directory in use, changed data, a bad output_dir.
    assert cases == 8, done.stdout
    failed = [line for line in lines if line.startswith("FAILED")]
    assert held == cases and not failed and done.returncode == 0, "\n".join(failed) or done.stderr[-3000:]
