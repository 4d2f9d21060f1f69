"""Two processes under torchrun (gloo) against one process with the whole batch."""

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

ARGS = ["task=addition", "prompts_per_step=4", "group_size=4", "max_new_tokens=6", "steps=3",
        "sft_steps=0", "eval_every=0", "seed=0", "threads=1", "lr=1e-3", "beta=0.04",
        "micro_batch_size=4"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


REWARD = '''
def distinct(prompts, completions, **columns):
    """Varies between completions of a random model, so advantages and gradients are not 0."""
    return [len(set(c)) / 6 for c in completions]
'''


def run(cmd: list[str], tmp_path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def metrics(run_dir) -> list[dict]:
    rows = [json.loads(line) for line in open(run_dir / "metrics.jsonl")]
    return [{k: v for k, v in m.items() if not k.startswith(("time/", "tokens/s"))} for m in rows]


@pytest.mark.parametrize("aggregation", ["sequence_mean", "token_mean"])
def test_two_processes_equal_one_with_the_whole_batch(tiny_model_dir, tmp_path, aggregation):
    (tmp_path / "shaped.py").write_text(REWARD)
    args = [f"model={tiny_model_dir}", f"aggregation={aggregation}", "rewards=[shaped:distinct]", *ARGS]
    run([sys.executable, "-m", "grpo", "train", *args, f"output_dir={tmp_path / 'one'}"], tmp_path)
    run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         f"--master-port={free_port()}", "-m", "grpo", "train", *args,
         f"output_dir={tmp_path / 'two'}"], tmp_path)
    one, two = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert len(one) == len(two) == 3
    for a, b in zip(one, two):
        assert a.keys() == b.keys()
        for key in a:
            # The same completions are sampled (the draws depend on the seed, step and row, not on
            # the process), so counts and rewards are equal; losses and statistics are sums of the
            # same float32 terms in another order (two partial sums and an all-reduce).
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (a["step"], key)
    p1 = load_file(tmp_path / "one" / "final" / "model.safetensors")
    p2 = load_file(tmp_path / "two" / "final" / "model.safetensors")
    assert p1.keys() == p2.keys()
    moved = max((p1[k] - load_file(tiny_model_dir / "model.safetensors")[k]).abs().max().item()
                for k in p1)
    assert moved > 1e-4  # the runs trained: a comparison of untouched weights would prove nothing
    for k in p1:
        # The gradients differ only in float32 summation order (about 1e-7 relative); Adam divides
        # by sqrt(v), so an entry near 0 can move its weight by a little more than that. Measured:
        # at most 3e-7 after 3 steps, with weights moved by 3e-3. 1e-6 is 1/1000 of one lr step.
        torch.testing.assert_close(p1[k], p2[k], rtol=0, atol=1e-6, msg=k)


def test_prompts_per_step_must_divide_among_processes(tiny_model_dir, tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           f"--master-port={free_port()}", "-m", "grpo", "train", f"model={tiny_model_dir}",
           *[a for a in ARGS if not a.startswith("prompts_per_step")], "prompts_per_step=3",
           f"output_dir={tmp_path / 'x'}"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "'prompts_per_step' (3) must be divisible by the number of processes (2)" in done.stderr
