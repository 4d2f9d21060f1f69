"""benchmarks/pipeline_sim.py against step times worked out by hand. Unless a test says otherwise:
one prompt of one completion per step, 10 tokens at 0.1 s a decode step (decode 1 s), 10 tokens
at 0.1 s a token on one trainer device (update 1 s), nothing else costing time."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("pipeline_sim", ROOT / "benchmarks" / "pipeline_sim.py")
sim = importlib.util.module_from_spec(spec)
sys.modules["pipeline_sim"] = sim           # its dataclasses look their module up there
spec.loader.exec_module(sim)


def inputs(**kw):
    base = {"prompts_per_step": 1, "group_size": 1, "steps": 6, "async_steps": 1,
            "lengths": {"kind": "constant", "value": 10}, "decode_step_s": 0.1,
            "train_s_per_token": 0.1}
    return sim.load_inputs({**base, **kw})


def ends(res):
    return [round(t, 9) for t in res.step_end]


def test_k1_overlaps_decode_with_the_update():
    # Worker: step t decodes in [t, t+1] (step t needs v(t-1), out at t+1). Trainer: step t in
    # [t+1, t+2]. So steps end at 2, 3, 4, ...: 1 s a step against 2 s synchronous.
    out = sim.compare(inputs())
    assert ends(out["run"]) == [2, 3, 4, 5, 6, 7]
    assert out["run"].median_step_s == 1.0
    assert ends(out["baseline"]) == [2, 4, 6, 8, 10, 12]
    assert out["speedup_step"] == 2.0 and out["speedup_total"] == 12 / 7
    assert out["run"].trainer_idle == pytest.approx(1 / 7)      # waits for step 0 only


def test_k0_on_separate_devices_is_the_synchronous_loop():
    # decode 1 + scoring 0.25 + log-probs 0.5 + update 1 = 2.75 s a step, whether the sampler is a
    # separate worker (k = 0, no weight-sync cost) or the same process; the timing policy with
    # k = 0 and one slot is the same serial loop.
    kw = {"async_steps": 0, "reward_s_per_completion": 0.25, "logprob_s_per_token": 0.05}
    separate = sim.simulate(inputs(**kw))
    assert ends(separate) == ends(sim.simulate(inputs(**kw, colocated=True)))
    assert ends(separate) == [round(2.75 * (t + 1), 9) for t in range(6)]
    timing = sim.simulate(inputs(**kw, policy="timing", max_batch_rows=1))
    assert ends(timing) == ends(separate)


def test_the_trainer_waits_when_decoding_is_slower():
    # decode 2 s, update 1 s, k = 1: the worker never waits (step t needs v(t-1), out at 2t+1 <=
    # 2t), decodes back to back, step t ready at 2t+2; the trainer runs [2t+2, 2t+3] and waits
    # 1 s a step (2 s for step 0). Total 13 s, trainer busy 6 s, worker busy 12 s.
    res = sim.simulate(inputs(decode_step_s=0.2))
    assert ends(res) == [3, 5, 7, 9, 11, 13]
    assert res.trainer_wait_s == pytest.approx(7) and res.worker_wait_s == 0
    assert res.trainer_idle == pytest.approx(7 / 13) and res.worker_idle == pytest.approx(1 / 13)
    assert (9.0, 10.0, "trainer", "waits for step 4's groups (worker 0)") in res.timeline


def test_a_worker_ahead_waits_for_its_weights():
    # decode 1 s, update 2 s, k = 1: trainer step t in [2t+1, 2t+3]; step t >= 2 needs v(t-1),
    # out at 2t-1, while the worker is free at 2t-2: it waits 1 s for each step from 2 on.
    res = sim.simulate(inputs(train_s_per_token=0.2))
    assert ends(res) == [3, 5, 7, 9, 11, 13]
    assert res.worker_wait_s == pytest.approx(4) and res.trainer_wait_s == pytest.approx(1)
    assert (4.0, 5.0, "worker 0", "waits for weights v2") in res.timeline


def test_weight_sync_costs_where_they_fall():
    # Sync 0.5 s (the trainer blocked for all of it), loading 0.25 s. k = 1: the trainer's cycle
    # is update + its sync = 1.5 s; the worker, needing v(t-1) at U[t-2] + 0.5, then loading and
    # decoding, is ready at U[t-2] + 1.75 < U[t-1] + 0.5, so the trainer sets the pace.
    # k = 0 on separate devices: every phase is serial, 0.5 + 0.25 + 1 + 1 = 2.75 s a step
    # (the first step has no weights to move: 2 s). The colocated baseline moves nothing: 2 s.
    sync = {"weight_sync_s": 0.5, "weight_sync_trainer_s": 0.5, "weight_load_s": 0.25}
    out = sim.compare(inputs(**sync))
    assert ends(out["run"]) == [2, 3.5, 5, 6.5, 8, 9.5]
    assert ends(out["baseline"]) == [2, 4, 6, 8, 10, 12]
    assert ends(sim.simulate(inputs(**sync, async_steps=0))) == [2, 4.75, 7.5, 10.25, 13, 15.75]


def test_shared_cores_slow_every_phase_of_the_split_run_only():
    # One machine, worker and trainer on one core each: decode and update take 1.8 s each, so
    # k = 1 steps take 1.8 s; the baseline (one process, all cores) still takes 1 + 1 = 2 s.
    out = sim.compare(inputs(shared_cores_slowdown=1.8))
    assert out["run"].median_step_s == pytest.approx(1.8)
    assert out["baseline"].median_step_s == pytest.approx(2.0)
    assert out["speedup_step"] == pytest.approx(2 / 1.8)


def test_a_ragged_batch_lasts_as_long_as_its_longest_row():
    # a = 10 ms, b = 1 ms a row: with ended rows dropped a batch costs a*max + b*sum
    # = 1.0 + 0.13; kept (padding) (a + 4b) * 100 = 1.4; b = 0 leaves a * max = 1.0.
    lens = [100, 10, 10, 10]
    inp = inputs(decode_step_s=0.01, decode_row_s=0.001)
    assert max(sim.decode(inp, lens, 1.0)) == pytest.approx(1.13)
    assert max(sim.decode(inputs(decode_step_s=0.01, decode_row_s=0.001, drop_finished_rows=False),
                          lens, 1.0)) == pytest.approx(1.4)
    # Two rows at a time, b = 0: ragged batches [100, 10] then [10, 10] take 1.0 + 0.1 s; with
    # continuous batching the 10-token rows follow one another beside the long one: 1.0 s.
    ragged = inputs(decode_step_s=0.01, max_batch_rows=2)
    assert max(sim.decode(ragged, lens, 1.0)) == pytest.approx(1.1)
    continuous = inputs(decode_step_s=0.01, max_batch_rows=2, continuous_batching=True)
    assert sim.decode(continuous, lens, 1.0) == pytest.approx([1.0, 0.1, 0.2, 0.3])


def test_long_tail_lengths_set_each_steps_decode_time():
    # Lognormal lengths capped at 400: each step's decode phase (one batch, b = 0) is
    # a * the step's longest completion, and the cap holds.
    inp = inputs(prompts_per_step=4, group_size=8, steps=5, decode_step_s=0.01,
                 lengths={"kind": "lognormal", "median": 50, "sigma": 1.5, "max": 400})
    lengths = sim.draw_lengths(inp)
    res = sim.simulate(inp, lengths)
    assert res.phases["decode"] == pytest.approx([0.01 * max(step) for step in lengths])
    assert max(map(max, lengths)) == 400 and min(map(min, lengths)) >= 1
    assert sim.draw_lengths(inp) == lengths                      # the seed fixes them


def test_a_remote_judge_with_a_concurrency_limit():
    # Four completions ending at 1, 2, 3, 4 s; a judge answering in 0.5 s, 2 calls at once.
    # After generation: 4 + ceil(4 / 2) * 0.5 = 5.0; sent as they end: 4 + 0.5 = 4.5; a 0.3 s
    # per-batch call after that adds 0.3.
    judge = {"reward_s_per_completion": 0.5, "reward_concurrency": 2}
    assert sim.score(inputs(**judge), [1, 2, 3, 4]) == 5.0
    assert sim.score(inputs(**judge, reward_overlaps_generation=True), [1, 2, 3, 4]) == 4.5
    assert sim.score(inputs(**judge, reward_s_per_batch=0.3), [1, 2, 3, 4]) == pytest.approx(5.3)
    # In a step: decode 1 s, then 4 completions scored 2 at a time, 1 s, then the update.
    res = sim.simulate(inputs(**judge, group_size=4, async_steps=0, train_s_per_token=0.025))
    assert ends(res) == [3, 6, 9, 12, 15, 18]


def test_the_timing_policy_streams_updates_within_a_step():
    # Two groups a step, two updates a step (one group each), one slot, k = 0: groups of step
    # t decode one after the other once v(t) is out, and each update starts as soon as its group
    # is in: decode [3t, 3t+1], [3t+1, 3t+2], updates [3t+1, 3t+2], [3t+2, 3t+3]: 3 s a step,
    # where the schedule policy (whole steps) takes 2 + 2 = 4 s.
    kw = {"prompts_per_step": 2, "async_steps": 0, "updates_per_step": 2, "steps": 4}
    timing = sim.simulate(inputs(**kw, policy="timing", max_batch_rows=1))
    assert ends(timing) == [3, 6, 9, 12]
    assert ends(sim.simulate(inputs(**kw, max_batch_rows=1))) == [4, 8, 12, 16]
    # k = 1: the newest weights, at most one version behind: 1 s a step, as the schedule policy.
    timing = sim.simulate(inputs(policy="timing", max_batch_rows=1))
    assert ends(timing) == [2, 3, 4, 5, 6, 7] and max(timing.staleness) == 1


def test_inputs_from_a_file_and_the_command_line(tmp_path, capsys):
    path = tmp_path / "inputs.json"
    path.write_text(json.dumps({"prompts_per_step": 1, "group_size": 1, "steps": 4,
                                "lengths": {"kind": "constant", "value": 10},
                                "decode_step_s": 0.1, "train_s_per_token": 0.1}))
    sim.main(["--inputs", str(path), "--async-steps", "1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["run"]["median_step_s"] == 1.0 and out["baseline"]["median_step_s"] == 2.0
    with pytest.raises(ValueError, match="unknown input"):
        sim.load_inputs({"async_step": 1})
    with pytest.raises(SystemExit) as done:
        sim.main(["--help"])
    assert done.value.code == 0 and "lognormal" in capsys.readouterr().out


def test_the_verl_calibration_reproduces_the_colocate_row():
    # The colocate-sync inputs are calibrated to the doc's per-step phase times (means over 400
    # steps; here medians over 3 simulated steps of the same lengths the calibration saw).
    sync, calib = sim.verl_inputs(steps=3)
    res = sim.simulate(sync)
    phase = res.summary()["phase_median_s"]
    assert phase["decode"] == pytest.approx(177.85, rel=1e-3)
    assert phase["logprob"] == pytest.approx(53.92, rel=0.05)
    assert res.median_step_s == pytest.approx(356.30, rel=0.05)
    assert math.isclose(sim._parse_hm("1d 16h 48m"), 40.8)


def test_partial_rollouts_pause_rows_and_draining_waits_for_them():
    # One slot, decode 1.5 s, update 1 s, k = 1, loading 0.5 s. Step 0's update ends at 2.5 with
    # group 1 (started at 1.5) a third from done. Partial rollout: the worker pauses to load in
    # [2.5, 3.0] and group 1 ends at 3.5, so update 1 is [3.5, 4.5]. Without it the worker lets
    # group 1 end at 3.0, then loads: update 1 is [3.0, 4.0].
    kw = {"policy": "timing", "max_batch_rows": 1, "steps": 2, "decode_step_s": 0.15,
          "weight_load_s": 0.5}
    assert ends(sim.simulate(inputs(**kw))) == [2.5, 4.5]
    assert ends(sim.simulate(inputs(**kw, partial_rollout=False))) == [2.5, 4.0]


def test_workers_can_take_whole_steps_in_turn():
    # Two workers, split "steps": worker t % 2 samples all of step t. Decode 2 s, update 1 s,
    # k = 1 (step t needs v(t-1), out when update t-2 ends). Steps 0 and 1 decode in [0, 2];
    # updates [2, 3], [3, 4]; step 2 needs v1 (3): [3, 5]; step 3 needs v2 (4): [4, 6]; updates
    # [5, 6], [6, 7]; step 4 needs v3 (6): [6, 8]; step 5 needs v4 (7): [7, 9]; updates [8, 9],
    # [9, 10].
    res = sim.simulate(inputs(decode_step_s=0.2, rollout_workers=2, split="steps"))
    assert ends(res) == [3, 4, 6, 7, 9, 10]


def test_scoring_beside_the_next_decode_hides_the_decode_behind_a_slow_judge():
    # decode 0.1 s (1 token), a judge 0.5 s per batch, update 0.3 s (3 tokens' cost on 1 token).
    # Scored after decoding, a worker takes 0.6 s a step; with its scorer thread scoring step t
    # while it decodes step t+1 (versions allow it at k=1: step t+1 needs v(t), out once step
    # t-1 is trained), the scorer is the bottleneck: 0.5 s a step. Synchronous: 0.1 + 0.5 + 0.3.
    kw = dict(steps=20, lengths={"kind": "constant", "value": 1}, reward_s_per_batch=0.5,
              train_s_per_token=0.3)
    serial = sim.compare(inputs(**kw))
    beside = sim.compare(inputs(score_beside_decode=True, **kw))
    assert serial["run"].median_step_s == pytest.approx(0.6)
    assert beside["run"].median_step_s == pytest.approx(0.5)
    assert beside["baseline"].median_step_s == pytest.approx(0.9)
