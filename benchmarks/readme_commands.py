"""Run every command of the README and docs as written, each in a fresh copy of the project.

    python benchmarks/readme_commands.py            # every runnable command (about half an hour)
    python benchmarks/readme_commands.py --list     # what would run, and what is left out and why
    python benchmarks/readme_commands.py --only "task=shapes"

A command is a line of a ```bash block in README.md or docs/ (comments after `#` kept, as a shell
reads them). Each runs with `bash -c` in its own copy of the project's files (tracked and untracked,
not ignored), as a user would type it on a fresh clone: the README's first command creates the
copy's `.venv`; the others run with that virtual environment's `bin` first on PATH, as after its
`. .venv/bin/activate`. Left out, with the reason printed: lines with a placeholder for the user's
own files or machines (DIR, data.jsonl, HOST, `...`), and the benchmarks against TRL, which install
TRL from the network and run for hours. tests/test_readme_commands.py runs the first command in CI.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLACEHOLDERS = (("...", "stands for the user's own keys"), ("DIR", "names the user's model"),
                ("data.jsonl", "names the user's data"), ("games.jsonl", "names the user's data"),
                ("HOST", "names the user's machines"), ("trl-env", "installs TRL and runs for hours"),
                ("vs_trl.py", "installs TRL and runs for hours"),
                ("time_to_accuracy.py", "installs TRL and runs for hours"))


def commands(root: Path = ROOT) -> list[tuple[str, str]]:
    """(file, command) for every command line of a ```bash block, README first."""
    files = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    found = []
    for path in files:
        for block in re.findall(r"```(?:bash|sh)\n(.*?)```", path.read_text(), re.DOTALL):
            for line in block.splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    found.append((str(path.relative_to(root)), line.strip()))
    return found


def left_out(command: str) -> str | None:
    """Why a command cannot run as written here, or None."""
    if command in (ROOT / ".ci" / "run").read_text():
        return "the test suite: .ci/run runs it on a clean clone"
    for mark, why in PLACEHOLDERS:
        if mark in command.split("#")[0]:
            return f"{mark!r} {why}"
    return None


def fresh_copy(dest: Path, root: Path = ROOT) -> Path:
    """The project's files as a clone would have them (and files not yet committed), without
    the virtual environment, runs or anything git ignores."""
    if (root / ".git").exists():
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root,
                                capture_output=True, check=True).stdout.decode().split("\0")
        for name in filter(None, listed):
            source = root / name
            if source.is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, dest / name)
    else:
        shutil.copytree(root, dest, ignore=shutil.ignore_patterns(".venv", "runs", "__pycache__"))
    return dest


def user_env(venv: Path | None = None) -> dict:
    """This process's environment as a new shell has it: no virtual environment active (unless
    `venv`, then as after activating it)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    here = Path(sys.prefix) / "bin"
    path = [p for p in env.get("PATH", "").split(os.pathsep) if Path(p) != here]
    if venv is not None:
        env["VIRTUAL_ENV"] = str(venv)
        path.insert(0, str(venv / "bin"))
    env["PATH"] = os.pathsep.join(path)
    return env


def run(command: str, cwd: Path, env: dict, timeout: float) -> tuple[int, float, str]:
    started = time.monotonic()
    try:
        done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout)
        code, tail = done.returncode, (done.stdout + done.stderr)[-2000:]
    except subprocess.TimeoutExpired:
        code, tail = 124, f"did not finish within {timeout:g} s"
    return code, time.monotonic() - started, tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print the commands and exit")
    parser.add_argument("--only", default="", help="run the commands containing this text (and the first)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per command")
    parser.add_argument("--work", default="", help="where the copies go (default: a temporary directory)")
    args = parser.parse_args(argv)
    found = commands()
    if args.list:
        for where, command in found:
            why = left_out(command)
            print(f"{'skip' if why else 'run '}  {where}: {command}" + (f"   ({why})" if why else ""))
        return 0
    import tempfile
    work = Path(args.work or tempfile.mkdtemp(prefix="readme-commands-"))
    first_file, first = found[0]
    base = fresh_copy(work / "first")
    print(f"{first_file}: {first}", flush=True)
    code, seconds, tail = run(first, base, user_env(), args.timeout)
    print(f"  exit {code} in {seconds:.0f} s", flush=True)
    failed = [] if code == 0 else [(first, tail)]
    venv = base / ".venv"
    seen = {first.split("#")[0].strip()}
    for k, (where, command) in enumerate(found[1:], 1):
        bare = command.split("#")[0].strip()
        if bare in seen or (args.only and args.only not in command):
            continue        # the same command in two places runs once
        seen.add(bare)
        why = left_out(command)
        if why:
            print(f"{where}: {command}\n  left out: {why}")
            continue
        copy = fresh_copy(work / f"c{k}")
        if command.startswith("python3 -m venv"):
            env = user_env()
        else:
            env = user_env(venv)
        print(f"{where}: {command}", flush=True)
        code, seconds, tail = run(command, copy, env, args.timeout)
        print(f"  exit {code} in {seconds:.0f} s", flush=True)
        if code != 0:
            failed.append((command, tail))
    for command, tail in failed:
        print(f"\nFAILED: {command}\n{tail}")
    print(f"\n{len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
