"""Two processes under torchrun (gloo) against one process with the whole batch."""

import json
import os
import re
import shutil
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


def torchrun(n: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n),
            f"--master-port={free_port()}", "-m", "grpo", "train"]


def compare_runs(one, two, tiny_model_dir, two_only: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """Metrics equal up to summation order (`two_only`: keys only processes that share logged,
    left out); returns the two final weights."""
    a_rows = metrics(one)
    b_rows = [{k: v for k, v in m.items() if k not in two_only} for m in metrics(two)]
    assert len(a_rows) == len(b_rows) == 3
    for a, b in zip(a_rows, b_rows):
        assert a.keys() == b.keys()
        for key in a:
            # The same completions are sampled (the draws depend on the seed, step and row, not on
            # the process), so counts and rewards are equal; losses and statistics are sums of the
            # same float32 terms in another order (two partial sums and an all-reduce).
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (a["step"], key)
    p1 = load_file(one / "final" / "model.safetensors")
    p2 = load_file(two / "final" / "model.safetensors")
    assert p1.keys() == p2.keys()
    moved = max((p1[k] - load_file(tiny_model_dir / "model.safetensors")[k]).abs().max().item()
                for k in p1)
    assert moved > 1e-4  # the runs trained: a comparison of untouched weights would prove nothing
    return p1, p2


@pytest.mark.parametrize("aggregation", ["sequence_mean", "token_mean"])
def test_two_processes_equal_one_with_the_whole_batch(tiny_model_dir, tmp_path, aggregation):
    (tmp_path / "shaped.py").write_text(REWARD)
    args = [f"model={tiny_model_dir}", f"aggregation={aggregation}", "rewards=[shaped:distinct]", *ARGS]
    run([sys.executable, "-m", "grpo", "train", *args, f"output_dir={tmp_path / 'one'}"], tmp_path)
    run([*torchrun(2), *args, f"output_dir={tmp_path / 'two'}"], tmp_path)
    p1, p2 = compare_runs(tmp_path / "one", tmp_path / "two", tiny_model_dir)
    for k in p1:
        # The gradients differ only in float32 summation order (about 1e-7 relative); Adam divides
        # by sqrt(v), so an entry near 0 can move its weight by a little more than that. Measured:
        # at most 3e-7 after 3 steps, with weights moved by 3e-3. 1e-6 is 1/1000 of one lr step.
        torch.testing.assert_close(p1[k], p2[k], rtol=0, atol=1e-6, msg=k)


@pytest.mark.parametrize("extra", [
    # shares of the batch large enough to select tokens in 4 x 4 completions of 6 tokens; clip_cov's
    # band is wide open, so its draw is over every token of the batch
    ["algorithm=clip_cov", "clip_cov_fraction=0.2", "clip_cov_low=-1e9", "clip_cov_high=1e9"],
    ["algorithm=kl_cov", "kl_cov_fraction=0.2", "num_iterations=2"],
    ["algorithm=reinforce_pp"],           # beta=0.04 from ARGS: the KL in the per-token return
    ["algorithm=reinforce_pp_baseline"],
], ids=["clip_cov", "kl_cov", "reinforce_pp", "reinforce_pp_baseline"])
def test_batch_statistics_of_two_processes_equal_one(tiny_model_dir, tmp_path, extra):
    """The covariance methods' means, ranking and draw, and REINFORCE++'s token mean and std, are
    over every process's tokens: two processes with two prompts each train as one with four."""
    (tmp_path / "shaped.py").write_text(REWARD)
    args = [f"model={tiny_model_dir}", "rewards=[shaped:distinct]", *ARGS, *extra]
    run([sys.executable, "-m", "grpo", "train", *args, f"output_dir={tmp_path / 'one'}"], tmp_path)
    run([*torchrun(2), *args, f"output_dir={tmp_path / 'two'}"], tmp_path)
    p1, p2 = compare_runs(tmp_path / "one", tmp_path / "two", tiny_model_dir)
    # Summation order only, amplified by Adam on entries whose gradient is nearly 0 (see the FSDP
    # test below). Measured: clip_cov 1 of 36,224 entries beyond 1e-6 (1.01e-6). Another selection
    # of tokens, or another mean or std, moves most entries by up to 3e-3 (three lr steps).
    diff = torch.cat([(p1[k] - p2[k]).abs().flatten() for k in p1])
    assert diff.max().item() < 1e-5
    assert (diff > 1e-6).sum().item() <= diff.numel() // 10_000
    if "clip_cov" in extra[0] or "kl_cov" in extra[0]:
        assert all(m["cov/selected_frac"] > 0.15 for m in metrics(tmp_path / "two"))


def test_fsdp_two_processes_equal_one_with_the_whole_batch(tiny_model_dir, tmp_path):
    """FSDP2 (fully_shard) on gloo: 2 processes x 2 prompts against 1 process x 4 prompts, both
    sharded (torchrun with one process shards over a mesh of one), so the forward path is the same
    and only the sharding and the reduce-scatter differ."""
    (tmp_path / "shaped.py").write_text(REWARD)
    args = [f"model={tiny_model_dir}", "parallel=fsdp", "rewards=[shaped:distinct]", *ARGS]
    run([*torchrun(1), *args, f"output_dir={tmp_path / 'one'}"], tmp_path)
    run([*torchrun(2), *args, f"output_dir={tmp_path / 'two'}"], tmp_path)
    p1, p2 = compare_runs(tmp_path / "one", tmp_path / "two", tiny_model_dir)
    diff = torch.cat([(p1[k] - p2[k]).abs().flatten() for k in p1])
    # Adam's first steps move each weight by about lr * g / (|g| + 1e-8): for a gradient entry
    # that is nearly 0, float32 summation-order noise (1e-7 of the largest entries) changes that
    # fraction, so a few weights move by a visible part of one step. Measured after 3 steps at
    # lr 1e-3: 28 of 1,062,912 entries beyond 1e-6, the largest 1.5e-5. A sharding or reduction
    # error would move most entries by up to 2e-3 (two lr steps).
    assert diff.max().item() < 1e-4
    assert (diff > 1e-6).sum().item() <= diff.numel() // 10_000


def test_prompts_per_step_must_divide_among_processes(tiny_model_dir, tmp_path):
    cmd = [*torchrun(2), f"model={tiny_model_dir}",
           *[a for a in ARGS if not a.startswith("prompts_per_step")], "prompts_per_step=3",
           f"output_dir={tmp_path / 'x'}"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "'prompts_per_step' (3) must be divisible by the number of processes (2)" in done.stderr


def test_an_fsdp_checkpoint_continues_in_two_processes_and_in_one(tiny_model_dir, tmp_path):
    """Checkpoints hold whole weights and optimizer state keyed by name, so the number of
    processes may change. 2 sharded processes stop after step 2; the run continues to step 4 in
    2 sharded processes (equal to never stopping, bit for bit) and in 1 unsharded process (equal
    up to summation order, as the one-against-two test above)."""
    (tmp_path / "shaped.py").write_text(REWARD)
    args = [f"model={tiny_model_dir}", "parallel=fsdp", "rewards=[shaped:distinct]", "save_every=2",
            *[a for a in ARGS if not a.startswith("steps=")]]
    run([*torchrun(2), *args, "steps=4", f"output_dir={tmp_path / 'whole'}"], tmp_path)
    run([*torchrun(2), *args, "steps=2", f"output_dir={tmp_path / 'two'}"], tmp_path)
    shutil.copytree(tmp_path / "two", tmp_path / "one")
    run([*torchrun(2), *args, "steps=4", "resume=auto", f"output_dir={tmp_path / 'two'}"], tmp_path)
    run([sys.executable, "-m", "grpo", "train", *args, "steps=4", "resume=auto",
         f"output_dir={tmp_path / 'one'}"], tmp_path)
    whole = load_file(tmp_path / "whole" / "final" / "model.safetensors")
    two = load_file(tmp_path / "two" / "final" / "model.safetensors")
    one = load_file(tmp_path / "one" / "final" / "model.safetensors")
    assert all(torch.equal(whole[k], two[k]) for k in whole)
    assert metrics(tmp_path / "two") == metrics(tmp_path / "whole")
    rows_one, rows_whole = metrics(tmp_path / "one"), metrics(tmp_path / "whole")
    assert [r["step"] for r in rows_one] == [1, 2, 3, 4]
    for a, b in zip(rows_one, rows_whole):
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (a["step"], key)
    diff = torch.cat([(whole[k] - one[k]).abs().flatten() for k in whole])
    assert diff.max().item() < 1e-4   # the bound and its reason: test_fsdp_two_processes_...
    assert (diff > 1e-6).sum().item() <= diff.numel() // 10_000


def test_two_processes_equal_one_on_a_multi_turn_task(agent_model_dir, tmp_path):
    """Episodes of several turns (guess_number answers every turn; the calculator answers calls)
    under DDP: the same episodes are sampled in two processes as in one, so every metric, the
    episode metrics included, and the final weights agree."""
    (tmp_path / "shaped.py").write_text(REWARD)
    args = [f"model={agent_model_dir}", "task=calculator", "environment=guess_number",
            "max_turns=3", "rewards=[shaped:distinct]", *[a for a in ARGS if a != "task=addition"], "max_new_tokens=12"]
    run([sys.executable, "-m", "grpo", "train", *args, f"output_dir={tmp_path / 'one'}"], tmp_path)
    run([*torchrun(2), *args, f"output_dir={tmp_path / 'two'}"], tmp_path)
    p1, p2 = compare_runs(tmp_path / "one", tmp_path / "two", agent_model_dir)
    rows = metrics(tmp_path / "one")
    assert max(m["episode/turns_mean"] for m in rows) > 1.5        # several turns, really
    assert all(m["episode/env_token_frac"] > 0 for m in rows)
    diff = torch.cat([(p1[k] - p2[k]).abs().flatten() for k in p1])
    # As with FSDP above: Adam turns float32 summation-order noise in a near-zero gradient entry
    # into a visible part of a step. Measured: 2 of 36,224 entries beyond 1e-6, the largest
    # 1.5e-6; a wrong mask or a lost episode would move most entries by up to 3e-3 (lr x 3 steps).
    assert diff.max().item() < 2e-5
    assert (diff > 1e-6).sum().item() <= diff.numel() // 1000


def test_a_vision_language_model_in_two_processes_with_ddp_and_fsdp_equals_one(tmp_path):
    """Image prompts: one process with the whole batch, two under DDP and two under FSDP2 (the
    projector its own unit, the frozen tower gathered with the root before the features)."""
    import random
    from grpo.data.tasks.shapes import draw
    from grpo.models.tiny import build_tiny_vlm
    model_dir = build_tiny_vlm(tmp_path / "vlm", hidden_size=64, layers=2, vision_hidden=32, vision_layers=1)
    (tmp_path / "pics").mkdir()
    lines = []
    for i in range(16):
        draw(1 + i % 4, random.Random(i)).save(tmp_path / "pics" / f"{i}.png")
        lines.append(json.dumps({"question": "how many shapes?", "answer": str(1 + i % 4), "image": f"pics/{i}.png"}))
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "shaped.py").write_text(REWARD)
    args = [f"model={model_dir}", f"dataset={tmp_path / 'd.jsonl'}", "rewards=[shaped:distinct]",
            *[a for a in ARGS if not a.startswith("task=")]]
    run([sys.executable, "-m", "grpo", "train", *args, f"output_dir={tmp_path / 'one'}"], tmp_path)
    run([*torchrun(2), *args, f"output_dir={tmp_path / 'ddp'}"], tmp_path)
    run([*torchrun(2), *args, "parallel=fsdp", f"output_dir={tmp_path / 'fsdp'}"], tmp_path)
    for two in ("ddp", "fsdp"):
        p1, p2 = compare_runs(tmp_path / "one", tmp_path / two, model_dir)
        for k in p1:
            torch.testing.assert_close(p1[k], p2[k], rtol=0, atol=1e-5, msg=(two, k))


def run_to_its_end(cmd: list[str], tmp_path, env: dict, timeout: int) -> subprocess.CompletedProcess:
    """`cmd` run to its end; one that is still running after `timeout` seconds (a process waiting
    for another that has stopped) fails the test, its whole process group killed."""
    import signal
    proc = subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"still running after {timeout} s: {err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_a_failed_upload_on_rank_0_ends_a_two_process_run_with_its_one_line_error(tiny_model_dir,
                                                                                  tmp_path):
    """push_to_hub to a hub that refuses the connection: rank 0 uploads after the run, alone, and
    fails. The other process has passed the run's last barrier and ended well, so nothing waits
    for rank 0: the run ends with rank 0's one-line error, its files saved. (Rank 1 used to wait
    at a barrier for rank 0 until torchrun stopped it, on one machine, with SIGTERM and a line of
    its own; on another machine, until the collective's timeout.)"""
    env = {"HF_HUB_OFFLINE": "0", "HF_TOKEN": "hf_test", "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    args = [f"model={tiny_model_dir}", *[a for a in ARGS if not a.startswith("steps=")], "steps=1",
            "push_to_hub=someone/tiny-grpo", f"output_dir={tmp_path / 'run'}"]
    done = run_to_its_end([*torchrun(2), *args], tmp_path, env, timeout=240)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("grpo train: error")]
    assert len(errors) == 1, done.stderr[-3000:]
    assert errors[0].startswith(f"grpo train: error: push_to_hub: {tmp_path / 'run' / 'final'} "
                                "could not be uploaded to someone/tiny-grpo: ")
    assert "<NO_OTHER_FAILURES>" in done.stderr, done.stderr[-3000:]   # torchrun: rank 1 ended well
    assert "SIGTERM" not in done.stderr
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
    assert (tmp_path / "run" / "report.html").is_file()


MACHINE_OF_ITS_OWN = """
import os, sys
from grpo.commands.cli import main

# each process writes to and reads from its own directory, as on machines without a shared disk
sys.exit(main(["train", *sys.argv[2:], f"output_dir={sys.argv[1]}/machine-{os.environ['RANK']}/run"]))
"""


def test_processes_that_do_not_share_output_dir_stop_in_one_line(tiny_model_dir, tmp_path):
    """Two processes that each see their own output_dir, as machines without a shared file system
    do. model=tiny: rank 0 builds the model in output_dir/base_model for every process to read,
    and process 1 does not see it (it failed to load it, and rank 0 died on the closed
    connection). resume: process 1 finds no checkpoint where rank 0 finds step 1 (it started
    from step 0 beside rank 0 at step 2). Each stops every process before training, in the same
    one line, naming what process 1 does not see."""
    (tmp_path / "machine.py").write_text(MACHINE_OF_ITS_OWN)

    def command(*more):
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                f"--master-port={free_port()}", str(tmp_path / "machine.py"), str(tmp_path),
                *[a for a in ARGS if not a.startswith("steps=")], *more]

    def errors(done) -> set[str]:
        assert done.returncode != 0
        assert "[rank" not in done.stderr, done.stderr[-3000:]      # no process's traceback
        return {line for line in done.stderr.splitlines() if line.startswith("grpo train: error")}

    tiny = run_to_its_end(command("model=tiny", "steps=1"), tmp_path, {}, timeout=300)
    assert errors(tiny) == {f"grpo train: error: config key 'model': process 1 does not see "
                            f"{tmp_path / 'machine-1' / 'run' / 'base_model'}, where process 0 "
                            "built the tiny model: under torchrun on several machines, output_dir "
                            "must be on a file system they share"}, repr(tiny.stderr[-3000:])
    shutil.rmtree(tmp_path / "machine-0")
    first = run_to_its_end(command(f"model={tiny_model_dir}", "steps=1"), tmp_path, {}, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = tmp_path / "machine-0" / "run"
    assert not (tmp_path / "machine-1").exists()                  # only rank 0 writes
    resumed = run_to_its_end(command(f"model={tiny_model_dir}", "steps=2", "resume=auto"), tmp_path,
                             {}, timeout=300)
    assert errors(resumed) == {
        f"grpo train: error: config key 'resume': process 0 continues from "
        f"{run_dir / 'checkpoints' / 'step-1'}, process 1 from none (step 0): every process reads "
        "the checkpoint, so on several machines output_dir must be on a file system they share"}, \
        repr(resumed.stderr[-3000:])
    assert [m["step"] for m in metrics(run_dir)] == [1]           # nothing trained


def test_a_process_that_does_not_see_the_tiny_model_is_named():
    from grpo.assembly import unseen_model
    assert unseen_model([("/runs/a/base_model", True), ("/runs/a/base_model", True)]) is None
    assert unseen_model([("/a/base_model", True), ("/b/base_model", True), ("/c/base_model", False)]) \
        == ("config key 'model': process 2 does not see /c/base_model, where process 0 built the "
            "tiny model: under torchrun on several machines, output_dir must be on a file system "
            "they share")


def test_the_readmes_torchrun_command_runs_as_written_with_the_default_model(tmp_path):
    """README.md's first torchrun line, with the default (tiny) model that every rank must find:
    its `...` becomes a short run, and torchrun gets a free port."""
    from pathlib import Path
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    line = next(line for line in readme.splitlines() if line.startswith("torchrun --nproc-per-node 2 "))
    command = line.split("#")[0].split()
    assert command[0] == "torchrun" and command[-1] == "..."
    short = ["steps=2", "sft_steps=2", "eval_every=0", "threads=1"]
    run([*torchrun(2)[:3], f"--master-port={free_port()}", *command[1:-1], *short], tmp_path)
    steps = metrics(tmp_path / "runs" / "demo")
    assert [m["step"] for m in steps] == [1, 2]
    assert (tmp_path / "runs" / "demo" / "final" / "config.json").is_file()


SOME_GROUPS_FLAT = '''
import hashlib

def some_flat(prompts, completions, **columns):
    """0 for every completion of a third of the prompts (by a hash of the prompt that every
    process computes alike), so dynamic sampling drops those groups and samples more."""
    return [0.0 if int(hashlib.md5(p.encode()).hexdigest(), 16) % 3 == 0 else len(set(c)) / 6
            for p, c in zip(prompts, completions)]
'''


def test_dapo_with_dynamic_sampling_in_two_processes_equals_one(tiny_model_dir, tmp_path):
    """algorithm=dapo (dynamic_sampling) under torchrun: every process gathers each round's scored
    groups, so all agree which groups are kept and how many more to sample; a refill smaller than
    the number of processes (one group over two) is sampled by the first. The step is then shared
    out as one process would have trained it."""
    (tmp_path / "flat.py").write_text(SOME_GROUPS_FLAT)
    args = [f"model={tiny_model_dir}", "algorithm=dapo", "rewards=[flat:some_flat]", *ARGS]
    run([sys.executable, "-m", "grpo", "train", *args, f"output_dir={tmp_path / 'one'}"], tmp_path)
    run([*torchrun(2), *args, f"output_dir={tmp_path / 'two'}"], tmp_path)
    two = metrics(tmp_path / "two")
    assert sum(m["sampling/dropped_groups"] for m in two) > 0
    assert sum(m["sampling/extra_rounds"] for m in two) > 0
    assert [m["sampling/unshared_groups"] for m in two] == [0, 0, 0]   # the step was filled
    p1, p2 = compare_runs(tmp_path / "one", tmp_path / "two", tiny_model_dir,
                          two_only=("sampling/unshared_groups",))
    diff = torch.cat([(p1[k] - p2[k]).abs().flatten() for k in p1])
    assert diff.max().item() < 1e-5


def test_dapo_groups_two_processes_cannot_share_are_counted_apart_from_dropped_ones(tiny_model_dir,
                                                                                  tmp_path):
    """With no extra round a step keeps 4 - dropped groups; where that is odd, two processes leave
    one out so that their shares are equal. `sampling/dropped_groups` still counts the groups
    without contrast, as one process does; the one left out is `sampling/unshared_groups`. The
    round's gather is timed apart from the rewards."""
    (tmp_path / "flat.py").write_text(SOME_GROUPS_FLAT)
    args = [f"model={tiny_model_dir}", "algorithm=dapo", "max_sampling_rounds=0",
            "rewards=[flat:some_flat]", *ARGS]
    run([sys.executable, "-m", "grpo", "train", *args, f"output_dir={tmp_path / 'one'}"], tmp_path)
    run([*torchrun(2), *args, f"output_dir={tmp_path / 'two'}"], tmp_path)
    one = [json.loads(line) for line in open(tmp_path / "one" / "metrics.jsonl")]
    two = [json.loads(line) for line in open(tmp_path / "two" / "metrics.jsonl")]
    dropped = [m["sampling/dropped_groups"] for m in one]
    assert [m["sampling/dropped_groups"] for m in two] == dropped
    assert [m["sampling/unshared_groups"] for m in two] == [(4 - d) % 2 for d in dropped]
    assert any(d % 2 for d in dropped)       # the case this test is for happened
    assert "sampling/unshared_groups" not in one[0] and "time/gather_s" not in one[0]
    assert all(m["time/gather_s"] >= 0 for m in two)


def test_sampler_vllm_under_torchrun_is_refused_in_one_line_before_any_work(tmp_path):
    """sampler=vllm would start an engine inside every trainer process; under torchrun it is
    refused in one line naming the key and the shared form (grpo launch --nproc-per-node)."""
    done = subprocess.run([*torchrun(2), "model=tiny", "sampler=vllm", "steps=1",
                           f"output_dir={tmp_path / 'run'}"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode != 0
    said = [line for line in done.stderr.splitlines() if line.startswith("grpo train: error:")]
    assert said and all(line == said[0] for line in said)
    assert not re.search(r'File ".*/grpo/[^"]*\.py"', done.stderr)   # torchrun's own report only
    assert said[0].startswith("grpo train: error: config key 'sampler': vllm starts an engine "
                              "inside each trainer process, and this run has 2")
    assert "grpo launch --nproc-per-node 2" in said[0]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_lost_peer_is_one_line_naming_it(monkeypatch):
    """What gloo raises when a peer dies or goes silent, as the one line `grpo train` ends with
    (tests/test_nodes.py shows it on two machines)."""
    from grpo.run import distributed
    from grpo.step import TrainingError
    monkeypatch.setattr(distributed, "PEERS", [("node-a", "10.0.0.1"), ("node-b", "10.0.0.2"),
                                               ("node-c", "10.0.0.3")])
    monkeypatch.setattr(distributed, "COLLECTIVE_TIMEOUT_S", 15.0)
    then = ("Every process stops; once all machines are back, start every process again with "
            "resume=auto (the last checkpoint is kept)")
    closed = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                          "[10.0.0.3]:47260. This is typically caused by a remote worker crashing.")
    assert distributed.lost_peer(closed) == (
        "process 0 on node-a lost its peers: process 2 on node-c (10.0.0.3) closed its connection: it "
        f"stopped, or its machine did. {then}")
    reset = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer")
    assert distributed.lost_peer(reset) == (
        "process 0 on node-a lost its peers: one of process 1 on node-b (10.0.0.2), process 2 on node-c "
        f"(10.0.0.3) closed its connection: it stopped, or its machine did. {then}")
    silent = RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
                          "waiting 15000ms for recv operation to complete")
    assert distributed.lost_peer(silent) == (
        "process 0 on node-a lost its peers: no answer from process 1 on node-b (10.0.0.2), process 2 on "
        "node-c (10.0.0.3) within 15 s (collective_timeout_s): a machine cut off from the network, "
        f"stopped or stuck. {then}")
    assert distributed.lost_peer(RuntimeError("shape mismatch in gloo's buffer")) is None
    assert distributed.lost_peer(TrainingError("gloo: the reward timed out")) is None   # not torch's own
