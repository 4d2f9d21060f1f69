"""On-policy distillation (`teacher=MODEL`): the per-token advantage -(log pi - log teacher) by
hand and against a float64 reference, added to GRPO's or alone, every aggregation and correction
with it, a teacher equal to the student moving nothing, the bad inputs, and resume."""

import json
import math
import os
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from grpo.algorithm.advantages import ADVANTAGES, distillation_advantages
from grpo.config import ConfigError, build_config
from grpo.config.plan import plan_of
from grpo.models import build_tiny, build_tiny_tokenizer
from grpo.run import distributed
from grpo.step import set_advantages
from grpo.train import train
from helpers import make_rollout


def test_the_per_token_advantage_by_hand():
    # student 1/2 and 1/4, teacher 1/4 and 1/2, coef 2: -2 ln 2 where the student is the likelier,
    # +2 ln 2 where the teacher is; the padding token 0
    student = torch.log(torch.tensor([[0.5, 0.25, 0.9]]))
    teacher = torch.log(torch.tensor([[0.25, 0.5, 0.1]]))
    got = distillation_advantages(student, teacher, torch.tensor([[1, 1, 0]]), coef=2.0)
    assert got.tolist()[0] == pytest.approx([-2 * math.log(2), 2 * math.log(2), 0.0], abs=1e-6)


@pytest.mark.parametrize("distill", ["add", "alone"])
def test_set_advantages_against_a_float64_reference(distill):
    tok = build_tiny_tokenizer()
    rollout = make_rollout(tok)
    g = torch.Generator().manual_seed(0)
    N, T = rollout.completion_ids.shape
    rollout.rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 1.0])
    rollout.old_logprobs = -torch.rand(N, T, generator=g) * rollout.completion_mask
    rollout.teacher_logprobs = -torch.rand(N, T, generator=g) * rollout.completion_mask
    c = build_config({"teacher": "x", "distill": distill, "distill_coef": 0.7, "beta": 0.0})
    extra = set_advantages(c, rollout, None, distributed.World(), plan_of(c))
    mask = rollout.completion_mask.double()
    reference = -0.7 * (rollout.old_logprobs.double() - rollout.teacher_logprobs.double()) * mask
    if distill == "add":      # the group-normalized outcome advantage on every token, plus the teacher's
        outcome = ADVANTAGES["group_norm"](rollout.rewards.double(), rollout.group_ids, 1e-4)
        reference = reference + outcome.unsqueeze(-1)
    assert rollout.advantages.shape == (N, T) and rollout.advantages.dtype == torch.float32
    torch.testing.assert_close(rollout.advantages.double(), reference, rtol=0, atol=1e-6)
    gap = ((rollout.old_logprobs.double() - rollout.teacher_logprobs.double()) * mask).sum() / mask.sum()
    assert extra["distill/reverse_kl"] == pytest.approx(float(gap), abs=1e-9)


def tiny_run_keys(tmp_path, model_dir, **more) -> dict:
    return {"model": str(model_dir), "sft_steps": 0, "steps": 2, "prompts_per_step": 2,
            "group_size": 4, "max_new_tokens": 4, "eval_every": 0, "save_every": 0,
            "output_dir": str(tmp_path / "run"), "threads": 1, **more}


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("student"), hidden_size=32, layers=2, heads=2, seed=0)


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("teacher"), hidden_size=48, layers=2, heads=2, seed=7)


def test_a_teacher_equal_to_the_student_gives_zero_advantages_and_moves_nothing(student_dir, tmp_path):
    before = load_file(student_dir / "model.safetensors")
    result = train(build_config(tiny_run_keys(tmp_path, student_dir, teacher=str(student_dir),
                                              algorithm="distill", weight_decay=0.0)),
                   write_files=False, log=lambda line: None)
    steps = [m for m in result.history if "distill/reverse_kl" in m]
    assert len(steps) == 2 and all(m["distill/reverse_kl"] == 0.0 for m in steps)
    after = {k: v.detach().cpu() for k, v in result.policy.state_dict().items()}
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("aggregation, correction", [
    ("sequence_mean", "none"), ("token_mean", "tis"), ("constant", "seq_mis"), ("sequence_sum", "token_mis")])
def test_every_aggregation_and_correction_trains_with_a_teacher(student_dir, teacher_dir, tmp_path,
                                                                aggregation, correction):
    keys = tiny_run_keys(tmp_path, student_dir, teacher=str(teacher_dir), aggregation=aggregation,
                         correction=correction, num_iterations=2)
    if correction != "none":
        keys["correction_cap"] = 2.0
    result = train(build_config(keys), write_files=False, log=lambda line: None)
    steps = [m for m in result.history if "distill/reverse_kl" in m]
    assert len(steps) == 2 and all(math.isfinite(m["loss"]) and m["distill/reverse_kl"] != 0 for m in steps)


def test_another_tokenizer_is_refused_in_one_line(student_dir, tmp_path):
    other = build_tiny(tmp_path / "other", hidden_size=32, layers=2, heads=2, vocab_size=600)
    with pytest.raises(ConfigError, match=r"config key 'teacher': .* has another tokenizer than the "
                                          r"model \(600 tokens against \d+\)"):
        train(build_config(tiny_run_keys(tmp_path, student_dir, teacher=str(other))),
              write_files=False, log=lambda line: None)


def test_distill_alone_needs_a_teacher_and_choices_are_checked():
    with pytest.raises(ConfigError, match="distill=alone \\(algorithm=distill\\) .* needs teacher=MODEL"):
        build_config({"algorithm": "distill"})
    with pytest.raises(ConfigError, match="config key 'distill'"):
        build_config({"teacher": "x", "distill": "both"})


def test_a_distillation_run_killed_and_resumed_equals_an_unbroken_one(student_dir, teacher_dir, tmp_path):
    args = [f"model={student_dir}", f"teacher={teacher_dir}", "algorithm=distill", "sft_steps=0",
            "prompts_per_step=2", "group_size=4", "max_new_tokens=4", "steps=4", "eval_every=2",
            "eval_size=8", "save_every=2", "threads=1", "seed=2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def launch(run, *more, fault=""):
        return subprocess.run([sys.executable, "-m", "grpo", "train", *args, f"output_dir={run}", *more],
                              env={**env, "GRPO_FAULT_KILL_AT": fault}, capture_output=True, text=True,
                              timeout=300)
    whole = launch(tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-2000:]
    assert launch(tmp_path / "killed", fault="step:3").returncode == -signal.SIGKILL
    done = launch(tmp_path / "killed", "resume=auto")
    assert done.returncode == 0, done.stderr[-2000:]

    def metrics(run):
        return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/") and k != "tokens/s"}
                for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics(tmp_path / "killed") == metrics(tmp_path / "whole")
    assert all("distill/reverse_kl" in m for m in metrics(tmp_path / "whole") if "loss" in m)


def test_flat_rewards_are_no_warning_when_a_teacher_teaches_and_its_kl_is_on_the_line():
    from grpo.run.metrics import RunawayWatch, metrics_line
    step = {"advantage/zero_std_frac": 1.0, "reward/mean": 0.0, "entropy": 0.5, "kl": 0.0,
            "time/step_s": 0.4}
    assert "every group's rewards are equal" in RunawayWatch().note(step)
    assert RunawayWatch().note({**step, "distill/reverse_kl": 0.3}) == ""
    assert "teacher kl 0.3000" in metrics_line({**step, "distill/reverse_kl": 0.3}, float("nan"))
