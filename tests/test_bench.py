"""grpo bench's FLOP estimate, by hand."""

import pytest
import torch

from grpo.commands.bench import flops_per_step, summarize


def test_flops_per_step_counts_each_pass():
    # 10 parameters, 24 tokens. mu = 1, beta > 0: sampling + reference forwards (2 x 2 x 10 x 24
    # = 960) and one forward+backward (6 x 10 x 24 = 1440).
    assert flops_per_step(10, 24, num_iterations=1, beta=0.04) == 2400
    # mu = 2 adds the pi_old forward and a second forward+backward; beta = 0 drops the reference.
    assert flops_per_step(10, 24, num_iterations=2, beta=0.0) == 2 * 10 * 24 * 2 + 6 * 10 * 24 * 2


def test_summarize_counts_a_groups_prompt_once_and_skips_the_first_step():
    step = {"tokens/completion": 20, "completion/len_mean": 5.0}
    history = [{"step": 1, "time/step_s": 9.0, "tokens/prompt": 16, **step},      # warm-up: not timed
               {"step": 2, "time/step_s": 2.0, "tokens/prompt": 16, **step}]
    out = summarize(history, params=10, num_iterations=1, beta=0.04, group_size=4)
    # 16 prompt tokens over rows = 4 computed (groups of 4); 4 + 20 = 24 tokens -> 2400 FLOPs in 2 s
    assert out["model_flops_per_s"] == 1200
    assert out["sec_per_step"] == 2.0 and out["tokens_per_s"] == 10.0
    assert out["step_times"] == [9.0, 2.0]


def test_the_sampler_benchmark_runs_its_smoke_mode_on_a_cpu(tmp_path):
    """benchmarks/gpu_sampler.py (grpo's sampler against the bandwidth bound and Hugging Face's
    generate) in its --smoke mode: every figure measured and written; the bound by hand."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    here = Path(__file__).resolve().parents[1] / "benchmarks"
    done = subprocess.run([sys.executable, str(here / "gpu_sampler.py"), "--smoke", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(Path(done.stdout.strip().splitlines()[-1]).read_text())
    assert report["device"] == "cpu" and report["copy_bandwidth_gb_s"] > 0
    smoke = report["models"]["smoke"]
    for batch in ("2", "4"):
        got = smoke["batches"][batch]
        for variant in ("grpo_static", "grpo_eager", "hf_static", "hf_dynamic"):
            assert 0 < got[variant]["tokens_per_s"] < got["bound_tokens_per_s"], (batch, variant)
            assert got[f"{variant}_fraction_of_bound"] == pytest.approx(
                got[variant]["tokens_per_s"] / got["bound_tokens_per_s"], abs=1e-4)
        assert got["grpo_best"] == "grpo_static"          # no graphs on a CPU: the static step
        assert got["grpo_best_over_grpo_eager"] == pytest.approx(
            got["grpo_static"]["tokens_per_s"] / got["grpo_eager"]["tokens_per_s"], abs=2e-3)
        assert got["grpo_best_over_hf_static"] == pytest.approx(
            got["grpo_static"]["tokens_per_s"] / got["hf_static"]["tokens_per_s"], abs=2e-3)
    same = smoke["same_draws"]               # float32 here: a near-tie may flip one of the two
    assert same["rows"] == 2 and same["tokens"] == 24
    assert same["eager_rows_differing_from_static"] <= 1
    # float32 on both sides here: the static sampler's recorded log-probs are the CPU pass's
    assert smoke["logp_vs_cpu_float32"]["max"] < 1e-4
    # the bound by hand: 2 layers, 2 KV heads of 16 (hidden 64 / 4 heads), float32, a 32-token
    # prompt, 24 tokens, batch 4: sum_t (weights + 2*2*2*16*4 * 4 * (32 + t)) / bandwidth
    sys.path.insert(0, str(here))
    from gpu_sampler import bound_tokens_per_s

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1000))          # 4,000 bytes
            self.config = type("C", (), dict(hidden_size=64, num_attention_heads=4,
                                             num_key_value_heads=2, num_hidden_layers=2))
    per_position = 2 * 2 * 2 * 16 * 4                                 # 512 bytes
    seconds = sum(4000 + per_position * 4 * (32 + t) for t in range(24)) / 1e9
    assert bound_tokens_per_s(Model(), 4, 24, 1e9) == pytest.approx(4 * 24 / seconds)


def test_the_update_benchmark_runs_its_smoke_mode_on_a_cpu(tmp_path):
    """benchmarks/gpu_update.py in its --smoke mode: packed, padded and Hugging Face's forward
    timed, their FLOP/s a fraction of the measured matmul rate, the AdamW step and the longest
    completion tried; the FLOP count by hand."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    here = Path(__file__).resolve().parents[1] / "benchmarks"
    done = subprocess.run([sys.executable, str(here / "gpu_update.py"), "--smoke", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(Path(done.stdout.strip().splitlines()[-1]).read_text())
    smoke = report["models"]["smoke"]
    assert report["matmul_flops_per_s"] > 0 and smoke["tokens"] < smoke["padded_tokens"]
    for variant in ("packed", "padded", "hf_sdpa"):
        got = smoke["variants"][variant]
        assert got["tokens_per_s"] == pytest.approx(smoke["tokens"] / got["seconds"], rel=1e-3)
        assert got["fraction_of_matmul_rate"] == pytest.approx(
            smoke["model_flops_per_update"] / got["seconds"] / report["matmul_flops_per_s"], rel=1e-2)
    assert smoke["packed_speedup_over_padded"] > 0 and smoke["adamw_fused"] is True
    assert smoke["longest_completion"]["longest_tokens"] >= 64
    # the FLOP count by hand: 2 layers, hidden 4, vocab 10, 100 non-embedding parameters,
    # rows of 3 and 5 tokens, 4 completion tokens: 6*100*8 + 6*4*10*4 + 6*2*4*(9 + 25)/2
    sys.path.insert(0, str(here))
    from gpu_update import flops
    config = type("C", (), dict(num_hidden_layers=2, hidden_size=4, vocab_size=10))
    assert flops(config, 100, [3, 5], 4) == 4800 + 960 + 816


def test_the_gpu_check_runs_its_smoke_mode_on_a_cpu(tmp_path):
    """benchmarks/gpu_check.py is run on GPUs only when one is lent; its --smoke mode (tiny
    shapes) checks here that every figure it reports is measured and written."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"
    done = subprocess.run([sys.executable, str(script), "--smoke", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(Path(done.stdout.strip().splitlines()[-1]).read_text())
    smoke = report["models"]["smoke"]
    for key in ("sampling_tokens_per_s", "update_tokens_per_s", "model_flops_per_s", "peak_fraction"):
        assert smoke[key] > 0, key
    assert 0 < smoke["logp_vs_cpu_float32"]["max"] < 0.1    # bfloat16 autocast against float32
    assert 0 < smoke["logp_vs_cpu_float32"]["mean"] <= smoke["logp_vs_cpu_float32"]["max"]
    assert smoke["completion_len_mean"] > 8 and set(smoke["split_s"]) == {"sample", "reward",
                                                                           "reference", "advantage",
                                                                           "update"}
    exact = report["exact"]
    for family in ("llama", "qwen2"):
        got = exact[family]
        # float32 on a CPU: the lean decoder and Hugging Face's forward agree to rounding
        assert got["float32"]["hidden"]["rel_norm"] < 1e-6 and got["float32"]["finite"]
        assert got["float32"]["grad_rel_norm_max"] < 1e-5
        assert got["checkpointing"]["grad"]["rel_norm"] < 1e-6
        assert got["chunked_head"]["chunks"] == 4 and got["chunked_head"]["logp"]["max_abs"] < 1e-5
        assert got["chunked_head"]["hidden_grad"]["rel_norm"] < 1e-5
        assert 0 < got["autocast_vs_float32"]["mean_abs"] <= got["autocast_vs_float32"]["max_abs"] < 0.1
        assert got["bfloat16"]["finite"] and got["bfloat16"]["grad_rel_norm_max"] < 0.1
    assert exact["cli"] == {"sync": {"exit": 0, "steps": 2, "loss_finite": True},
                            "async_steps_1": {"exit": 0, "steps": 2, "loss_finite": True}}


def run_smoke(script: str, tmp_path, *more: str) -> dict:
    import json
    import subprocess
    import sys
    from pathlib import Path
    here = Path(__file__).resolve().parents[1] / "benchmarks"
    done = subprocess.run([sys.executable, str(here / script), "--smoke", "--out", str(tmp_path), *more],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(Path(done.stdout.strip().splitlines()[-1]).read_text())


def test_the_side_by_side_with_trl_runs_its_smoke_mode_on_a_cpu(tmp_path):
    """benchmarks/gpu_vs_trl.py --smoke: grpo's side measured; TRL's where this environment has
    it (CI's has not: it is then named as not run, and no ratio is made up)."""
    import importlib.util
    report = run_smoke("gpu_vs_trl.py", tmp_path, "--repeats", "1")
    grpo = report["table"]["grpo"]
    assert grpo["sec_per_step"] > 0 and grpo["steps_timed"] == 2 and grpo["peak_rss_mb"] > 0
    assert set(grpo["split_s"]) == {"sample", "reward", "reference", "advantage", "update"}
    assert report["settings"]["grpo"]["gradient_checkpointing"] is True
    assert report["settings"]["grpo"]["beta"] == 0.04 and report["settings"]["grpo"]["group_size"] == 4
    if importlib.util.find_spec("trl") is None:
        assert report["trl"].startswith("not run: ") and "trl" not in report["table"]
        assert "time_ratio" not in report["table"]
    else:
        assert report["table"]["time_ratio"] == pytest.approx(
            grpo["sec_per_step"] / report["table"]["trl"]["sec_per_step"], abs=1e-3)


def test_the_weight_handoff_benchmark_runs_its_smoke_mode_on_a_cpu(tmp_path):
    """benchmarks/gpu_handoff.py --smoke: the write to a closed file timed in both dtypes, the
    bfloat16 file half the float32 one."""
    report = run_smoke("gpu_handoff.py", tmp_path, "--dir", str(tmp_path))
    smoke = report["shapes"]["smoke"]
    for dtype in ("bfloat16", "float32"):
        got = smoke[dtype]
        assert got["total_s"] > 0 and got["to_host_s"] > 0 and len(got["totals_s"]) == 3
    assert smoke["bfloat16"]["gb"] == pytest.approx(smoke["float32"]["gb"] / 2, abs=2e-3)


def test_the_kill_and_resume_run_runs_its_smoke_mode_on_a_cpu(tmp_path):
    """benchmarks/gpu_resume.py --smoke: the killed run exits by SIGKILL past its first
    checkpoint, the resumed one finishes with every file, and on this CPU its metrics and
    weights equal the unbroken run's."""
    report = run_smoke("gpu_resume.py", tmp_path)
    assert report["whole"]["exit"] == 0 and report["resumed"]["exit"] == 0
    assert report["killed"]["exit"] == -9 and report["killed"]["killed_after_steps"] >= 3
    for run in ("whole", "resumed"):
        files = report["files"][run]
        assert files["metrics"] and files["final"] and files["report"] and files["checkpoints"]
    assert report["resume"]["metrics_equal"] and report["resume"]["steps"] == [6, 6]
    assert report["resume"]["weights_max_abs_diff"] == 0.0
