"""Training on two machines, made of network namespaces on this one (tests/nodes.py): each node
has its own address, host name, /tmp, /dev/shm and /etc/hosts; the run directory is on a shared
directory, as a cluster's shared file system; the model and the reward's module are each node's
own copies. torchrun rendezvous (c10d) on node a's address, as on a cluster. Each run is held
against the same run on one process of this machine."""

import json
import re
import time
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from nodes import Nodes, unavailable

pytestmark = pytest.mark.skipif(bool(unavailable()), reason=f"no nodes here: {unavailable()}")

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 300


def launch(node, rdzv: str, args: list[str], env: dict, log: Path, *more: str) -> subprocess.Popen:
    """One node's torchrun: 2 nodes x 1 process, c10d rendezvous at `rdzv`."""
    return node.popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                       "--nproc-per-node", "1", "--rdzv-backend", "c10d", f"--rdzv-endpoint={rdzv}",
                       "--rdzv-id", "grpo-test", *more, "-m", "grpo", "train", *args],
                      env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def on_two_nodes(tmp_path, model, args: list[str], env_b: dict | None = None) -> tuple[int, int, str, list[Path]]:
    """`grpo train args` on nodes a and b, each with its own copy of `model`; their exit codes,
    what they printed, and their own /tmp as this machine sees them."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    code = tmp_path / "code"
    with Nodes(2, tmp_path / "nodes", shared=[tmp_path / "shared"], keep=[ROOT, Path(sys.prefix)],
               seed=[code, Path(model)], cwd=code) as (a, b):
        logs = [tmp_path / f"{n.name}.log" for n in (a, b)]
        rdzv = f"{a.address}:29400"
        runs = [launch(a, rdzv, args, env, logs[0]), launch(b, rdzv, args, {**env, **(env_b or {})}, logs[1])]
        codes = []
        for run in runs:
            try:
                codes.append(run.wait(timeout=TIMEOUT))
            except subprocess.TimeoutExpired:
                codes.append(None)
        printed = "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in logs)
        assert None not in codes, f"a node ran past {TIMEOUT} s\n{printed}"
        return codes[0], codes[1], printed, [a.tmp, b.tmp]


REWARD = '''
def distinct(prompts, completions, **columns):
    """Varies between completions of a random model, so advantages and gradients are not 0."""
    return [len(set(c)) / 6 for c in completions]
'''
ARGS = ["task=addition", "prompts_per_step=4", "group_size=4", "max_new_tokens=6", "steps=3",
        "sft_steps=0", "eval_every=0", "seed=0", "threads=1", "lr=1e-3", "beta=0.04",
        "micro_batch_size=4", "rewards=[shaped:distinct]", "report_to=[]"]


@pytest.fixture
def model(tiny_model_dir, tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "shaped.py").write_text(REWARD)
    return tiny_model_dir


def one_process(tmp_path, args: list[str], name: str, torchrun: bool = False) -> Path:
    """The same run on one process of this machine (under torchrun with 1 process for FSDP, so
    that both shard)."""
    head = ([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--standalone"]
            if torchrun else [sys.executable])
    done = subprocess.run([*head, "-m", "grpo", "train", *args, f"output_dir={tmp_path / name}"],
                          cwd=tmp_path / "code", env={**os.environ, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp_path / name


CLOCKS = ("time/", "tokens/s", "pipeline/trainer_wait_s", "pipeline/worker_wait_s", "pipeline/publish_s")


def metrics(run: Path) -> list[dict]:
    """All but wall-clock figures."""
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(CLOCKS)}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def own_files(tmp: Path, tmp_path: Path, model) -> list[str]:
    """What a node wrote in its own /tmp: its files other than the copies it was given."""
    given = [Path("/tmp") / p.relative_to("/tmp") for p in (Path(model), tmp_path / "code")]
    return sorted(str(p) for p in (Path("/tmp") / f.relative_to(tmp) for f in tmp.rglob("*") if f.is_file())
                  if not any(p.is_relative_to(g) for g in given))


# async: each trainer forks its own rollout worker, which samples share r*N + j of each step
# (test_pipeline.py), so two nodes with one worker each sample what one process with two does
@pytest.mark.parametrize("extra,one_more,two_more", [
    ([], [], []), (["parallel=fsdp"], [], []),
    (["async_steps=1"], ["rollout_workers=2"], ["rollout_workers=1"])], ids=["ddp", "fsdp", "async"])
def test_two_nodes_train_as_one_process_with_the_whole_batch(model, tmp_path, extra, one_more, two_more):
    args = [f"model={model}", *ARGS, *extra]
    one = one_process(tmp_path, [*args, *one_more], "one", torchrun="parallel=fsdp" in extra)
    a, b, printed, tmps = on_two_nodes(tmp_path, model, [*args, *two_more, f"output_dir={tmp_path / 'shared' / 'two'}"])
    assert (a, b) == (0, 0), printed
    two = tmp_path / "shared" / "two"
    assert len(metrics(one)) == len(metrics(two)) == 3      # written once, by one process
    for x, y in zip(metrics(one), metrics(two)):
        assert x.keys() == y.keys()
        # the same completions (draws depend on seed, step and row, not on the process); sums of
        # the same float32 terms in another order (test_distributed.py)
        assert not [k for k in x if x[k] != pytest.approx(y[k], rel=1e-5, abs=1e-6)], x["step"]
    p1, p2 = load_file(one / "final" / "model.safetensors"), load_file(two / "final" / "model.safetensors")
    start = load_file(Path(model) / "model.safetensors")
    assert max((p1[k] - start[k]).abs().max().item() for k in p1) > 1e-4     # it trained
    assert max((p1[k] - p2[k]).abs().max().item() for k in p1) < 1e-4       # test_distributed's bound
    for tmp in tmps:    # neither node wrote anything in its own /tmp
        assert own_files(tmp, tmp_path, model) == []


def test_a_node_killed_mid_run_resumes_on_two_nodes_exactly(model, tmp_path):
    """Node b's trainer SIGKILLed at step 3 of 4 (checkpoints every 2 steps); both nodes started
    again with resume=auto: the metrics and weights of the unbroken run on two nodes."""
    args = [f"model={model}", *ARGS, "steps=4", "save_every=2", "keep_last=1"]
    whole = tmp_path / "shared" / "whole"
    a, b, printed, _ = on_two_nodes(tmp_path, model, [*args, f"output_dir={whole}"])
    assert (a, b) == (0, 0), printed
    broken = tmp_path / "shared" / "broken"
    a, b, printed, _ = on_two_nodes(tmp_path, model, [*args, f"output_dir={broken}"],
                                 env_b={"GRPO_FAULT_KILL_AT": "step:3"})
    assert a != 0 and b != 0, printed
    node_a = printed[:printed.index("--- node-b.log")]
    assert re.search(r"^grpo train: error: process [01] on node-a lost its peers: process [01] on node-b "
                     r"\(10\.77\.0\.2\) closed its connection: it stopped, or its machine did\. ", node_a,
                     re.MULTILINE), node_a
    assert "[rank" not in node_a                                  # no traceback of its own

    # the checkpoint of step 2 is the last; node a may have logged step 3 before its peer's
    # loss reached it (resume takes the log back to the checkpoint)
    assert [p.name for p in (broken / "checkpoints").iterdir()] == ["step-2"]
    assert [m["step"] for m in metrics(broken)][:2] == [1, 2] and len(metrics(broken)) <= 3
    a, b, printed, _ = on_two_nodes(tmp_path, model, [*args, f"output_dir={broken}", "resume=auto"])
    assert (a, b) == (0, 0), printed
    assert metrics(broken) == metrics(whole)
    p1, p2 = load_file(whole / "final" / "model.safetensors"), load_file(broken / "final" / "model.safetensors")
    assert all(torch.equal(p1[k], p2[k]) for k in p1)
    assert [p.name for p in (broken / "checkpoints").iterdir()] == ["step-4"]


def test_a_node_cut_off_mid_run_stops_both_within_the_timeout_naming_the_peer(model, tmp_path):
    """Node b's link goes down after step 2: each trainer waits collective_timeout_s in its next
    collective, then stops in one line naming the other machine (docs/faults.md). torchrun's own
    agent on node b then waits for its rendezvous store on node a, which it cannot reach, until
    the link is back (or TCP gives up): it ends once the link is mended."""
    args = [f"model={model}", *ARGS, "steps=200", "save_every=2", "collective_timeout_s=15",
            f"output_dir={tmp_path / 'shared' / 'cut'}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    code = tmp_path / "code"
    with Nodes(2, tmp_path / "nodes", shared=[tmp_path / "shared"], keep=[ROOT, Path(sys.prefix)],
               seed=[code, Path(model)], cwd=code) as (a, b):
        logs = [tmp_path / f"{n.name}.log" for n in (a, b)]
        runs = [launch(n, f"{a.address}:29400", args, env, log) for n, log in zip((a, b), logs)]
        checkpoint = tmp_path / "shared" / "cut" / "checkpoints" / "step-2"
        deadline = time.monotonic() + TIMEOUT
        while not checkpoint.exists() and time.monotonic() < deadline and all(r.poll() is None for r in runs):
            time.sleep(0.2)
        assert checkpoint.exists(), "\n".join(log.read_text()[-2000:] for log in logs)
        b.cut()
        cut_at = time.monotonic()
        said = [None, None]                        # seconds from the cut to each trainer's line
        while None in said and time.monotonic() - cut_at < 15 + 60:
            for i, log in enumerate(logs):
                if said[i] is None and "grpo train: error:" in log.read_text():
                    said[i] = round(time.monotonic() - cut_at, 1)
            time.sleep(0.2)
        printed = [log.read_text() for log in logs]
        assert None not in said, printed
        runs[0].wait(timeout=60)                   # node a's torchrun ends
        b.mend()
        runs[1].wait(timeout=60)                   # node b's, once it reaches its store again
        ended = round(time.monotonic() - cut_at, 1)
        printed = [log.read_text() for log in logs]
    print(f"from the cut: the trainers' lines after {said} s; node b's torchrun ended {ended} s after it")
    assert all(run.returncode not in (None, 0) for run in runs), printed
    for mine, other, text in (("node-a", "node-b (10.77.0.2)", printed[0]), ("node-b", "node-a (10.77.0.1)", printed[1])):
        lines = [line for line in text.splitlines() if line.startswith("grpo train: error:")]
        assert len(lines) == 1 and re.fullmatch(
            rf"grpo train: error: process [01] on {mine} lost its peers: no answer from process [01] on "
            rf"{re.escape(other)} within 15 s \(collective_timeout_s\): a machine cut off from the network, "
            r"stopped or stuck\. Every process stops; .*resume=auto.*", lines[0]), text[-3000:]
        assert "[rank" not in text, text[-3000:]                       # no process's traceback
    assert min(said) >= 15                                             # not before the timeout


def test_a_server_on_another_node_needs_a_shared_weights_dir_and_is_refused_in_one_line_without(model, tmp_path):
    """From node a, node a's own name and address are this machine, node b's are another's; a
    trainer on node a pointed at a server on node b, with the weights going through node a's
    /dev/shm (no vllm_weights_dir), stops before any work in one line naming the missing shared
    file system. Nothing listens on node b: the check needs no server."""
    with Nodes(2, tmp_path / "nodes", keep=[ROOT, Path(sys.prefix)], seed=[Path(model)]) as (a, b):
        seen = a.run([sys.executable, "-c", "from grpo.run.distributed import on_this_machine as m; "
                      "print([m(h) for h in ('node-a', '10.77.0.1', 'localhost', 'node-b', '10.77.0.2')])"],
                     timeout=60)
        assert seen.stdout.strip() == "[True, True, True, False, False]", seen.stderr[-2000:]
        done = a.run([sys.executable, "-m", "grpo", "train", f"model={model}", "sampler=vllm_server",
                      "vllm_url=http://node-b:8000", "steps=1", "output_dir=/tmp/run"], timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "grpo train: error: config key 'vllm_weights_dir': the vLLM server at http://node-b:8000 runs on "
        "another machine, and a server reads each weight version from a file by its path, written under "
        "/dev/shm unless vllm_weights_dir is set: this machine's own. Set vllm_weights_dir to a directory "
        "on a file system this machine and the servers' share, at the same path")
    assert not a.own("/tmp/run").exists()                               # before any work
