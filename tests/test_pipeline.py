"""Asynchronous GRPO (pipeline/): staleness bounded by schedule, so runs stay exact.

The groups trained at step t come from the weights after step t-1-k with step t's draws: checked
against a synchronous sampler given those weights, across 0 (in the trainer), 1 and 2 worker
processes, after a SIGKILL and resume, and with a worker killed mid-run."""

import json
import os
import re
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from grpo import assembly
from grpo.config import ConfigError, build_config
from grpo.data import PromptStream
from grpo.pipeline import PipelineError, split_threads, version_for
from grpo.pipeline.transport import buckets, load_snapshot, snapshot
from grpo.rollout import concat
from grpo.sampling import HFSampler
from grpo.pipeline.inline import sample_scored_groups
from grpo.train import train

BASE = {"sft_steps": 0, "prompts_per_step": 4, "group_size": 4, "max_new_tokens": 6, "steps": 5,
        "eval_every": 0, "save_every": 0, "lr": 3e-3, "threads": 1, "seed": 5, "beta": 0.04,
        "report_to": []}
CLOCKS = ("time/", "tokens/s", "pipeline/trainer_wait_s", "pipeline/worker_wait_s", "pipeline/publish_s")


def varied(prompts, completions, **kw):
    """A reward with contrast inside every group, so each update moves the weights."""
    return [(len(c) + sum(map(ord, c))) % 5 / 4 for c in completions]


def run(tmp_path, name, model, **keys):
    c = build_config({**BASE, "model": str(model), "output_dir": str(tmp_path / name), **keys})
    return train(c, reward_fns=[varied], log=lambda line: None)


def exact(history):
    """The metrics a repeated run must repeat: all but wall-clock figures."""
    return [{k: v for k, v in row.items() if not k.startswith(CLOCKS)} for row in history]


def weights(result):
    return {k: v.detach().clone() for k, v in result.policy.state_dict().items()}


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_schedule_names_the_version_each_step_trains_on():
    assert [version_for(t, 0) for t in range(1, 5)] == [0, 1, 2, 3]        # today's loop
    assert [version_for(t, 1) for t in range(1, 6)] == [0, 0, 1, 2, 3]     # after step t-2
    assert [version_for(t, 2) for t in range(1, 6)] == [0, 0, 0, 1, 2]
    assert split_threads(2, 1) == (1, 1) and split_threads(16, 3) == (4, 4) and split_threads(1, 2) == (1, 1)


def test_async_steps_0_is_the_synchronous_loop(tiny_model_dir, tmp_path, monkeypatch):
    default = run(tmp_path, "default", tiny_model_dir, steps=3)
    import grpo.assembly.groups as loop
    monkeypatch.setattr(loop, "Groups", lambda *a, **k: pytest.fail("async_steps=0 started a pipeline"))
    zero = run(tmp_path, "zero", tiny_model_dir, steps=3, async_steps=0)
    assert exact(zero.history) == exact(default.history)
    assert same_weights(weights(zero), weights(default))
    assert not any(k.startswith("pipeline/") for k in zero.history[-1])


def test_one_worker_two_workers_and_in_trainer_sampling_train_the_same_run(tiny_model_dir, tmp_path):
    runs = {n: run(tmp_path, f"w{n}", tiny_model_dir, async_steps=1, rollout_workers=n) for n in (1, 2, 0)}
    one = runs[1]
    assert [row["pipeline/staleness_max"] for row in one.history] == [0, 1, 1, 1, 1]
    # In-trainer sampling draws the whole batch, as one worker does: bit for bit.
    assert exact(runs[0].history) == exact(one.history)
    assert same_weights(weights(runs[0]), weights(one))
    # Two workers each draw half of it: the same tokens, rewards and advantages, but each recorded
    # log-prob comes from a forward over a batch of another size, which CPU matmul kernels may round
    # differently in float32 (seen with the packages of a fresh install): the metrics and weights
    # agree to that rounding.
    for n in (0, 2):
        assert (tmp_path / f"w{n}" / "samples.jsonl").read_text() == (tmp_path / "w1" / "samples.jsonl").read_text()
    for two, ones in zip(exact(runs[2].history), exact(one.history)):
        assert two.keys() == ones.keys()
        for k in ones:
            if k in ("loss",):       # a difference of values near 0: absolute, at float32 rounding
                assert two[k] == pytest.approx(ones[k], abs=1e-6), k
            else:
                assert two[k] == pytest.approx(ones[k], rel=1e-5), k
    w2, w1 = weights(runs[2]), weights(one)
    assert all(torch.allclose(w2[k], w1[k], rtol=0, atol=1e-6) for k in w1)
    sync = run(tmp_path, "sync", tiny_model_dir)
    # Step 1 samples version 0 with step 1's draws in both; then the async run trains on older groups.
    def step_samples(name, step):
        lines = (tmp_path / name / "samples.jsonl").read_text().splitlines()
        return [line for line in lines if json.loads(line)["step"] == step]
    assert step_samples("sync", 1) == step_samples("w1", 1) != []
    assert step_samples("sync", 3) != step_samples("w1", 3)
    assert not same_weights(weights(sync), weights(one))


def test_the_groups_of_step_t_are_those_a_synchronous_sampler_draws_with_the_weights_after_t_2(
        tiny_model_dir, tmp_path):
    run(tmp_path, "async", tiny_model_dir, async_steps=1, save_every=1, keep_last=10)
    c = build_config({**BASE, "model": str(tiny_model_dir), "output_dir": str(tmp_path / "x")})
    data = assembly.load_data(c, [varied], log=lambda line: None)
    policy, tokenizer = assembly.load_model_and_tokenizer(c, None, lambda line: None)
    checkpoints = tmp_path / "async" / "checkpoints"
    for t in (3, 4, 5):
        # weights after step t-2; the data position before step t (a k=1 checkpoint after step
        # t-2 holds the position after the groups it queued, those of step t-1)
        policy.load_state_dict(load_file(checkpoints / f"step-{t - 2}" / "model.safetensors"), strict=False)
        stream = PromptStream(data.train_rows, c.run.seed)
        stream.load_state_dict(torch.load(checkpoints / f"step-{t - 2}" / "trainer_state.pt",
                                          weights_only=False)["stream"])
        sampler = HFSampler(policy, tokenizer, max_new_tokens=6)
        expected, _ = sample_scored_groups(c, sampler, tokenizer, data, stream, step=t)
        # what the worker sent for step t, kept by the checkpoint after step t-1
        (queued,) = torch.load(checkpoints / f"step-{t - 1}" / "pipeline.pt", weights_only=False)
        (part,) = queued["queued"][t]
        got = part.rollout
        assert part.version == t - 2
        assert got.completions == expected.completions
        for field in ("completion_ids", "completion_mask", "sampler_logprobs", "prompt_ids", "rewards"):
            assert torch.equal(getattr(got, field), getattr(expected, field)), (t, field)
        assert set(got.versions[got.completion_mask.bool()].tolist()) == {t - 2}


def test_a_part_queued_as_a_dict_by_an_older_grpo_is_read_as_a_part():
    """pipeline.pt of an older grpo holds each worker's part as a dict; Groups reads it as a Part."""
    from grpo.pipeline.worker import Part
    rollout = object()
    old = {"step": 4, "rollout": rollout, "extra": {"pipeline/x": 1.0}, "version": 2,
           "timer": {"sample": 0.5, "reward": 0.25}, "stream": {"epoch": 1, "position": 3},
           "faults": {"format": 2}, "work": (10.0, 11.0), "wait": (9.0, 10.0)}
    part = Part.of(old)
    assert part == Part(step=4, version=2, rollout=rollout, stream={"epoch": 1, "position": 3},
                        sample_s=0.5, reward_s=0.25, extra={"pipeline/x": 1.0},
                        faults={"format": 2}, work=(10.0, 11.0), wait=(9.0, 10.0))
    assert Part.of(part) is part


def test_a_killed_rollout_worker_is_replaced_and_the_run_is_unchanged(tiny_model_dir, tmp_path, monkeypatch):
    whole = run(tmp_path, "whole", tiny_model_dir, async_steps=1)
    # SIGKILL as the worker starts its third step, with step 2's groups still on their way
    monkeypatch.setenv("GRPO_FAULT_KILL_AT", "rollout:3")
    lines = []
    c = build_config({**BASE, "model": str(tiny_model_dir), "output_dir": str(tmp_path / "killed"),
                      "async_steps": 1})
    killed = train(c, reward_fns=[varied], log=lines.append)
    # The worker dies as it starts step 3; its scoring thread may or may not have sent step 2's
    # groups by then, so the trainer finds the death at step 2 or at step 3, and that step is
    # sampled again from its own version (t - 2) with the same draws: the run is the same either way.
    assert any("rollout worker 0 died" in line and re.search(
        r"step (2 is sampled again from version 0|3 is sampled again from version 1)", line)
               for line in lines), "\n".join(lines)
    assert killed.history[-1]["pipeline/worker_restarts"] == 1
    strip = lambda h: [{k: v for k, v in r.items() if k != "pipeline/worker_restarts"} for r in exact(h)]
    assert strip(killed.history) == strip(whole.history)
    assert same_weights(weights(killed), weights(whole))


def test_a_worker_that_keeps_dying_stops_the_run_with_a_clear_error(tiny_model_dir, tmp_path, monkeypatch):
    trainer = os.getpid()

    def dies(prompts, completions, **kw):
        if os.getpid() == trainer:       # the start check's dry call, in the trainer's process
            return [0.0] * len(completions)
        os.kill(os.getpid(), signal.SIGKILL)
    c = build_config({**BASE, "model": str(tiny_model_dir), "output_dir": str(tmp_path / "d"),
                      "async_steps": 1, "worker_restarts": 1})
    with pytest.raises(PipelineError, match=r"rollout worker 0 has died 2 times, more than worker_restarts=1"):
        train(c, reward_fns=[dies], log=lambda line: None)


def test_a_stuck_worker_times_out_with_the_peer_and_the_transfer_named(tiny_model_dir, tmp_path):
    import time
    trainer = os.getpid()

    def slow(prompts, completions, **kw):
        if os.getpid() != trainer:       # not the start check's dry call, in the trainer's process
            time.sleep(30)
        return [0.0] * len(completions)
    c = build_config({**BASE, "model": str(tiny_model_dir), "output_dir": str(tmp_path / "slow"),
                      "async_steps": 1, "transfer_timeout_s": 2})
    started = time.time()
    with pytest.raises(PipelineError, match=r"the groups of step 1 .*from rollout worker 0: nothing arrived "
                                        r"within 2 s \(transfer_timeout_s\)"):
        train(c, reward_fns=[slow], log=lambda line: None)
    assert time.time() - started < 20


def test_a_stuck_engine_client_times_out_with_the_transfer_named(tiny_model_dir, tmp_path):
    """rollout_workers=0: the groups come from a thread of the trainer; a reward that never
    returns there stops the run after transfer_timeout_s, as a stuck worker process does."""
    import time
    calls = []

    def slow(prompts, completions, **kw):
        calls.append(len(completions))
        if len(calls) > 1:         # the trainer's dry call before training passes; the client's hang
            time.sleep(30)
        return [0.0] * len(completions)
    c = build_config({**BASE, "model": str(tiny_model_dir), "output_dir": str(tmp_path / "slow"),
                      "async_steps": 1, "rollout_workers": 0, "transfer_timeout_s": 2})
    started = time.time()
    with pytest.raises(PipelineError, match=r"^the groups of step 1 from the engine client \(grpo's own sampler\): "
                                        r"nothing arrived within 2 s \(transfer_timeout_s\)"):
        train(c, reward_fns=[slow], log=lambda line: None)
    assert time.time() - started < 20


def test_a_reward_error_in_a_worker_reaches_the_trainer_as_itself(tiny_model_dir, tmp_path):
    calls = []

    def broken(prompts, completions, **kw):
        calls.append(len(completions))
        if len(calls) > 1:      # the trainer's dry call before training passes; the worker's fail
            raise KeyError("no column 'answer_key' in this row")
        return [0.0] * len(completions)
    c = build_config({**BASE, "model": str(tiny_model_dir), "output_dir": str(tmp_path / "e"),
                      "async_steps": 1})
    with pytest.raises(Exception, match="answer_key"):
        train(c, reward_fns=[broken], log=lambda line: None)


def launch(args, run_dir, fault="", resume=False):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GRPO_FAULT_KILL_AT": fault}
    cmd = [sys.executable, "-m", "grpo", "train", *args, f"output_dir={run_dir}"]
    return subprocess.run(cmd + (["resume=auto"] if resume else []), env=env, capture_output=True,
                          text=True, timeout=300)


def test_sigkill_mid_pipeline_then_resume_equals_an_uninterrupted_run(tiny_model_dir, tmp_path):
    args = [f"model={tiny_model_dir}", "sft_steps=2", "prompts_per_step=4", "group_size=4",
            "max_new_tokens=6", "steps=6", "eval_every=3", "eval_size=8", "save_every=2", "lr=3e-3",
            "threads=2", "seed=4", "async_steps=1", "num_iterations=2", "report_to=[]"]
    whole = launch(args, tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-2000:]
    run_dir = tmp_path / "killed"
    # killed after step 3's update, with step 4's groups in flight in the worker
    done = launch(args, run_dir, fault="step:3")
    assert done.returncode == -signal.SIGKILL
    assert (run_dir / "checkpoints" / "step-2" / "pipeline.pt").is_file()
    done = launch(args, run_dir, resume=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "step-2 at step 3/6" in done.stdout

    def rows(path):
        return exact([json.loads(line) for line in path.read_text().splitlines()])
    # step by step first, so that a difference names the first step where the two runs part
    for resumed, uninterrupted in zip(rows(run_dir / "metrics.jsonl"), rows(tmp_path / "whole" / "metrics.jsonl")):
        assert resumed == uninterrupted
    assert rows(run_dir / "metrics.jsonl") == rows(tmp_path / "whole" / "metrics.jsonl")
    assert (run_dir / "samples.jsonl").read_text() == (tmp_path / "whole" / "samples.jsonl").read_text()
    a = load_file(tmp_path / "whole" / "final" / "model.safetensors")
    b = load_file(run_dir / "final" / "model.safetensors")
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


FAULTY_REWARDS = """
import os, signal, time
TRAINER = os.getpid()     # imported in the trainer; its rollout workers are forks of it


def stuck(prompts, completions, **kw):
    if os.getpid() != TRAINER:      # not the start check's dry call, which runs in the trainer
        time.sleep(60)
    return [0.0] * len(completions)


def kills_the_spare(prompts, completions, **kw):
    if os.getpid() != TRAINER:
        os.kill(os.getppid(), signal.SIGKILL)     # the spare process that forked this worker
        os.kill(os.getpid(), signal.SIGKILL)
    return [0.0] * len(completions)
"""


@pytest.mark.parametrize("keys, fault, says", [
    (["rewards=[faulty:stuck]", "transfer_timeout_s=2"], "",
     r"the groups of step 1( \(\d+ bytes\))? from rollout worker 0: nothing arrived within 2 s "
     r"\(transfer_timeout_s\); the peer is stuck or the machine is overloaded"),
    (["worker_restarts=0"], "rollout:1",
     r"the groups of step 1: rollout worker 0 closed the connection \(.+\); rollout worker 0 has "
     r"died 1 times, more than worker_restarts=0"),
    (["rewards=[faulty:kills_the_spare]"], "",
     r"rollout worker 0 cannot be started: the spare process that starts rollout workers "
     r"\(pid \d+\) has exited \((broken pipe|it closed its pipe)\); the run cannot go on"),
], ids=["transfer_timeout", "lost_worker", "killed_spare"])
def test_the_command_ends_a_failed_pipeline_with_one_line_and_status_2(tiny_model_dir, tmp_path, keys,
                                                                       fault, says):
    # Each used to end `grpo train` with a traceback and status 1 (a bug's), where one line and
    # status 2 were promised.
    (tmp_path / "faulty.py").write_text(FAULTY_REWARDS)
    args = [f"model={tiny_model_dir}", "sft_steps=0", "prompts_per_step=4", "group_size=4",
            "max_new_tokens=6", "steps=3", "eval_every=0", "threads=2", "async_steps=1",
            "report_to=[]", *keys]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GRPO_FAULT_KILL_AT": fault}
    done = subprocess.run([sys.executable, "-m", "grpo", "train", *args, f"output_dir={tmp_path / 'run'}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = done.stderr.splitlines()     # one line, no traceback
    assert line.startswith("grpo train: error: ") and re.search(says, line), line


def test_weights_travel_in_buckets_and_come_back_whole(tiny):
    policy, _ = tiny
    params = [p for p in policy.parameters() if p.requires_grad]
    layout = buckets(params, limit=4096)
    assert sorted(i for b in layout for i in b) == list(range(len(params))) and len(layout) > 1
    flat = snapshot(policy)
    other = __import__("copy").deepcopy(policy)
    with torch.no_grad():
        for p in other.parameters():
            p.zero_()
    load_snapshot(other, flat)
    assert all(torch.equal(a, b) for a, b in zip(policy.state_dict().values(), other.state_dict().values()))


@pytest.mark.parametrize("keys, message", [
    ({"async_steps": 1, "correction": "tis"}, "set proximal=decoupled"),
    ({"async_steps": 1, "tis_cap": 2.0}, "tis_cap"),
    ({"correction": "clip_it"}, "must be none, is, tis"),
    ({"correction": "icepop", "correction_cap": 1.0}, "correction_cap' must be above 1"),
    ({"proximal": "newest"}, "proximal' must be behaviour or decoupled"),
    ({"async_steps": -1}, "async_steps"),
    ({"transfer_timeout_s": 0}, "transfer_timeout_s"),
])
def test_bad_pipeline_and_correction_keys_are_named(keys, message):
    with pytest.raises(ConfigError, match=message):
        build_config(keys)


def test_workers_that_cannot_share_the_groups_evenly_are_refused_before_any_work(tiny_model_dir, tmp_path):
    c = build_config({**BASE, "model": str(tiny_model_dir), "output_dir": str(tmp_path / "odd"),
                      "async_steps": 1, "rollout_workers": 3})
    with pytest.raises(ConfigError, match=r"'prompts_per_step' \(4\) must be divisible by the number of "
                                          r"rollout workers \(3: rollout_workers=3"):
        train(c, log=lambda line: None)


def test_multi_turn_episodes_sampled_by_two_workers_are_those_the_trainer_samples(agent_model_dir, tmp_path):
    """Episodes (guess_number answers every turn) split over two workers: every token, mask and
    reward is the same as one sampler's. The episode sampler's recorded log-probs depend on which
    rows share its batched prefill at float32 rounding (measured: at most 9.5e-7), so with
    proximal=behaviour, where they are pi_old, the metrics agree to that rounding, not bit for bit."""
    keys = dict(async_steps=1, task="calculator", environment="guess_number", max_turns=3,
                max_new_tokens=12, steps=3, save_every=1, keep_last=5)
    two = run(tmp_path, "two", agent_model_dir, rollout_workers=2, **keys)
    zero = run(tmp_path, "zero", agent_model_dir, rollout_workers=0, **keys)
    assert max(row["episode/turns_mean"] for row in two.history) > 1.5    # several turns, really
    for step in (2, 3):
        (a,), (b,) = (torch.load(tmp_path / n / "checkpoints" / f"step-{step - 1}" / "pipeline.pt",
                                 weights_only=False) for n in ("two", "zero"))
        x = concat([p.rollout for p in a["queued"][step]], 0).trimmed()
        y = concat([p.rollout for p in b["queued"][step]], 0).trimmed()
        assert x.completions == y.completions and x.episodes == y.episodes
        for field in ("prompt_ids", "completion_ids", "completion_mask", "context_mask", "rewards", "versions"):
            assert torch.equal(getattr(x, field), getattr(y, field)), (step, field)
        assert (x.sampler_logprobs - y.sampler_logprobs).abs().max() < 1e-5
    for r2, r0 in zip(exact(two.history), exact(zero.history)):
        assert r2.keys() == r0.keys()
        assert all(r2[k] == pytest.approx(r0[k], rel=1e-4, abs=1e-6) for k in r2)


def test_with_lora_the_adapter_alone_travels_and_the_run_is_exact(tiny_model_dir, tmp_path):
    keys = dict(async_steps=1, lora_r=4, steps=3, beta=0.04)
    one = run(tmp_path, "one", tiny_model_dir, **keys)
    zero = run(tmp_path, "zero", tiny_model_dir, rollout_workers=0, **keys)
    assert exact(one.history) == exact(zero.history)
    assert same_weights(weights(one), weights(zero))
    travels = [n for n, p in one.policy.named_parameters() if p.requires_grad]
    assert travels and all("lora_" in n for n in travels)
    adapter = sum(p.numel() for n, p in one.policy.named_parameters() if "lora_" in n)
    assert sum(t.numel() for t in snapshot(one.policy)) == adapter < sum(p.numel() for p in one.policy.parameters()) / 5


def test_the_decoupled_objective_with_a_correction_logs_what_it_did(tiny_model_dir, tmp_path):
    result = run(tmp_path, "decoupled", tiny_model_dir, async_steps=2, proximal="decoupled",
                 correction="icepop", correction_cap=1.02, num_iterations=2, steps=4)
    rows = result.history
    assert [r["pipeline/staleness_max"] for r in rows] == [0, 1, 2, 2]
    # step 1 trains on its own weights' samples: pi_prox = pi_behaviour up to float noise
    assert abs(rows[0]["offpolicy/ratio_mean"] - 1) < 1e-4 and rows[0]["offpolicy/masked_frac"] == 0
    # two steps stale with lr 3e-3: some tokens' ratios leave [1/1.02, 1.02] and are masked
    assert rows[-1]["offpolicy/ratio_max"] > 1.02 and 0 < rows[-1]["offpolicy/masked_frac"] < 1


def test_dynamic_sampling_over_several_workers_is_refused_before_any_work(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"dynamic_sampling' with async_steps needs one rollout worker"):
        train(build_config({**BASE, "model": str(tiny_model_dir), "output_dir": str(tmp_path / "ds"),
                            "async_steps": 1, "rollout_workers": 2, "dynamic_sampling": True}),
              log=lambda line: None)
    assert not (tmp_path / "ds").exists()


def test_two_trainers_with_a_worker_each_equal_one_trainer_with_two_workers(tiny_model_dir, tmp_path):
    """Under torchrun every trainer process forks its own rollout workers, and worker j of
    trainer r samples share r*N + j of every step: so 2 x 1 samples what 1 x 2 does, and the two
    runs agree up to DDP's summation order (test_distributed.py's tolerance)."""
    from test_distributed import ARGS as DDP_ARGS, REWARD, torchrun
    from test_distributed import run as run_cmd
    (tmp_path / "shaped.py").write_text(REWARD)
    args = [f"model={tiny_model_dir}", *DDP_ARGS, "rewards=[shaped:distinct]", "async_steps=1",
            "report_to=[]"]
    run_cmd([sys.executable, "-m", "grpo", "train", *args, "rollout_workers=2",
             f"output_dir={tmp_path / 'one'}"], tmp_path)
    run_cmd([*torchrun(2), *args, "rollout_workers=1", f"output_dir={tmp_path / 'two'}"], tmp_path)
    def rows(name):
        return exact([json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()])
    one, two = rows("one"), rows("two")
    assert [r["pipeline/staleness_max"] for r in two] == [0, 1, 1] and len(one) == 3
    for a, b in zip(one, two):
        assert a.keys() == b.keys()
        assert all(a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6) for k in a), a["step"]
    p1, p2 = (load_file(tmp_path / n / "final" / "model.safetensors") for n in ("one", "two"))
    start = load_file(tiny_model_dir / "model.safetensors")
    assert max((p1[k] - start[k]).abs().max().item() for k in p1) > 1e-4     # it trained
    assert max((p1[k] - p2[k]).abs().max().item() for k in p1) < 2e-5


def test_an_async_checkpoint_resumed_without_async_steps_is_refused(tiny_model_dir, tmp_path):
    run(tmp_path, "r", tiny_model_dir, async_steps=1, steps=2, save_every=2)
    c = build_config({**BASE, "model": str(tiny_model_dir), "output_dir": str(tmp_path / "r"),
                      "steps": 4, "resume": "auto"})
    written = (tmp_path / "r" / "config.yaml").read_text()
    with pytest.raises(ConfigError, match=r"was written with async_steps .*resume it with the async_steps"):
        train(c, reward_fns=[varied], log=lambda line: None)
    assert (tmp_path / "r" / "config.yaml").read_text() == written    # refused before any work


def test_forked_workers_on_a_gpu_model_are_refused_and_an_engine_client_is_not():
    from types import SimpleNamespace
    from grpo.assembly import check_pipeline
    on_gpu = SimpleNamespace(parameters=lambda: iter([SimpleNamespace(is_cuda=True)]))
    with pytest.raises(ConfigError, match=r"^config key 'rollout_workers': the rollout workers are "
                                          r"forks.*set rollout_workers=0"):
        check_pipeline(build_config({"async_steps": 1}), None, on_gpu)
    check_pipeline(build_config({"async_steps": 0}), None, on_gpu)            # sync: fine on a GPU
    # a thread of the trainer samples: with grpo's own sampler, or on vLLM
    check_pipeline(build_config({"async_steps": 1, "rollout_workers": 0}), None, on_gpu)
    check_pipeline(build_config({"async_steps": 1, "sampler": "vllm_server",
                                 "vllm_url": "http://127.0.0.1:1"}), None, on_gpu)


def test_dynamic_sampling_with_async_steps_on_two_trainers_equals_one(tiny_model_dir, tmp_path):
    """DAPO's dynamic sampling under async_steps on 2 trainer processes: each process's engine
    client (a thread; rollout_workers=0) samples its part of each round, and the clients gather
    every round in a group of their own, so both keep the same groups and refill together. The
    run equals one process up to DDP's summation order, refills and dropped groups included."""
    from test_distributed import ARGS as DDP_ARGS, torchrun
    from test_distributed import run as run_cmd
    # a reward that differs within every group from step 1: where a step's advantages are all 0
    # its true gradient is 0, and AdamW turns FSDP2's rounding of that 0 (1e-8) into a full step
    (tmp_path / "often_equal.py").write_text(
        "def has_a(prompts, completions, **columns):\n"
        "    return [float(len(set(c))) for c in completions]\n")
    args = [f"model={tiny_model_dir}", *DDP_ARGS, "rewards=[often_equal:has_a]", "async_steps=1",
            "rollout_workers=0", "dynamic_sampling=true", "max_sampling_rounds=3", "seed=1",
            "report_to=[]"]
    run_cmd([sys.executable, "-m", "grpo", "train", *args, f"output_dir={tmp_path / 'one'}"], tmp_path)
    run_cmd([*torchrun(2), *args, f"output_dir={tmp_path / 'two'}"], tmp_path)
    def rows(name):
        return exact([json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()])
    one, two = rows("one"), rows("two")
    assert [r["pipeline/staleness_max"] for r in two] == [0, 1, 1] and len(one) == 3
    assert sum(r["sampling/dropped_groups"] for r in one) > 0          # refills happened
    # (with this seed every step kept an even number of groups: none left out to share evenly)
    assert [r["sampling/unshared_groups"] for r in two] == [0, 0, 0]
    assert all(0 <= r["pipeline/staleness_mean"] <= 1 for r in one + two)
    for a, b in zip(one, two):
        assert {k for k in a} | {"sampling/unshared_groups", "time/gather_s"} >= b.keys() >= a.keys()
        assert all(a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6) for k in a), a["step"]
    p1, p2 = (load_file(tmp_path / n / "final" / "model.safetensors") for n in ("one", "two"))
    assert max((p1[k] - p2[k]).abs().max().item() for k in p1) < 2e-5


def test_staleness_counts_the_groups_a_step_kept_only():
    """Dynamic sampling keeps groups 0 and 2 and drops 1: at step 5 (the trainer holds version
    4), group 0 drawn by version 3 is 1 behind and group 2 drawn by version 2 is 2 behind: mean
    1.5, max 2 (the dropped id 1 is no group; it was counted as one infinitely old)."""
    from types import SimpleNamespace
    from grpo.step import staleness
    kept = SimpleNamespace(group_ids=torch.tensor([0, 0, 2, 2]),
                           versions=torch.tensor([[3, 3, -1], [3, -1, -1], [2, 2, 2], [2, -1, -1]]))
    assert staleness(kept, 5) == {"pipeline/staleness_mean": 1.5, "pipeline/staleness_max": 2.0}


def test_async_steps_with_fsdp2_trainers_samples_what_ddp_trainers_do(tmp_path):
    """parallel=fsdp with async_steps on 2 processes (an engine client each; forks are refused
    with FSDP2): every process gathers the whole parameters for each version inside the step, so
    the clients sample what DDP trainers' clients do (the same rewards), and the updates agree to
    FSDP2's reduction order."""
    from test_distributed import torchrun
    from test_distributed import run as run_cmd
    # a reward that differs within every group from step 1: where a step's advantages are all 0
    # its true gradient is 0, and AdamW turns FSDP2's rounding of that 0 (1e-8) into a full step
    (tmp_path / "often_equal.py").write_text(
        "def has_a(prompts, completions, **columns):\n"
        "    return [float(len(set(c))) for c in completions]\n")
    args = ["model=tiny", "task=addition", "prompts_per_step=4", "group_size=4", "max_new_tokens=6",
            "steps=3", "sft_steps=0", "eval_every=0", "seed=1", "threads=1", "lr=1e-3", "beta=0.04",
            "micro_batch_size=4", "rewards=[often_equal:has_a]", "async_steps=1", "rollout_workers=0",
            "report_to=[]"]
    for mode in ("fsdp", "ddp"):
        run_cmd([*torchrun(2), *args, f"parallel={mode}", f"output_dir={tmp_path / mode}"], tmp_path)
    def rows(name):
        return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    fsdp, ddp = rows("fsdp"), rows("ddp")
    assert [r["pipeline/staleness_max"] for r in fsdp] == [0, 1, 1]
    assert [r["reward/mean"] for r in fsdp] == [r["reward/mean"] for r in ddp]
    assert all(r["reward/std"] > 0 for r in ddp)                         # every step learns
    for a, b in zip(fsdp, ddp):
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
        assert a["kl"] == pytest.approx(b["kl"], rel=1e-4, abs=1e-9)


def test_an_async_run_resumed_from_its_last_checkpoint_can_be_extended(tiny_model_dir, tmp_path):
    """async_steps=1, 3 steps, then resume=auto with steps=5: the last checkpoint (step 3) holds
    no queued groups and no version older than 3, so step 4 samples from version 3 (staleness 0,
    said in one line) and step 5 from version 3 as scheduled (staleness 1). Before: refused,
    blaming async_steps, which the user kept."""
    run = {**BASE, "model": str(tiny_model_dir), "output_dir": str(tmp_path), "async_steps": 1,
           "save_every": 1}
    lines = []
    train(build_config({**run, "steps": 3}), reward_fns=[varied], log=lines.append)
    result = train(build_config({**run, "steps": 5, "resume": "auto"}), reward_fns=[varied],
                   log=lines.append)
    assert [m["step"] for m in result.history] == [4, 5]
    assert [m["pipeline/staleness_max"] for m in result.history] == [0, 1]
    assert ("async_steps=1: the checkpoint was written 0 step(s) before the end of the run it "
            "belonged to, which kept no older weights: step(s) 4-4 sample from version 3 (staleness "
            "0 instead of 1); from step 5 on, as scheduled") in lines
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]


def test_an_async_run_stopped_by_sigterm_keeps_its_timeline(tiny_model_dir, tmp_path):
    """pipeline.jsonl (when the trainer waited and each worker worked, per step; `grpo report`
    draws it) is written when the run stops on a signal, as when it ends (before: lost)."""
    import time
    run = tmp_path / "run"
    args = [f"model={tiny_model_dir}", "sft_steps=0", "prompts_per_step=4", "group_size=4",
            "max_new_tokens=6", "steps=500", "eval_every=0", "save_every=0", "threads=2",
            "async_steps=1", "report_to=[]", f"output_dir={run}"]
    proc = subprocess.Popen([sys.executable, "-m", "grpo", "train", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 240
    while time.time() < deadline and not (
            (run / "metrics.jsonl").exists() and len((run / "metrics.jsonl").read_text().splitlines()) >= 3):
        assert proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    timeline = [json.loads(line) for line in (run / "pipeline.jsonl").read_text().splitlines()]
    assert [row["step"] for row in timeline] == steps and len(steps) >= 3


def test_the_engine_client_thread_has_a_tokenizer_of_its_own(tiny_model_dir, tmp_path):
    """rollout_workers=0: the client samples in a thread of the trainer while evaluation, on the
    main thread, tokenizes too; a fast tokenizer is not to be shared between threads (Rust's
    'Already borrowed' under multi-turn episodes), so the client's sampler has its own copy,
    which encodes the same."""
    run = assembly.assemble(build_config({**BASE, "model": str(tiny_model_dir), "output_dir": str(tmp_path),
                                          "async_steps": 1, "rollout_workers": 0}), log=lambda line: None)
    try:
        (client,) = run.groups.workers
        theirs = client.sampler.tokenizer
        assert theirs is not run.tokenizer and theirs._tokenizer is not run.tokenizer._tokenizer
        assert theirs("largest of 3 8 5 1:").input_ids == run.tokenizer("largest of 3 8 5 1:").input_ids
    finally:
        run.groups.close()
