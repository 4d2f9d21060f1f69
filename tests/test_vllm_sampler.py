"""The vLLM sampler's contract, on a stand-in engine: vLLM itself needs a GPU and is not a test
dependency. The stand-in generates with the tiny model and records what the trainer asks of it."""

import sys
import types
from types import SimpleNamespace

import pytest
import torch

from grpo.config import ConfigError, build_config
from grpo.vllm_sampler import rollout_from_outputs


def test_outputs_become_a_rollout_with_eos_in_the_mask_and_the_drawn_logprobs(tiny):
    _, tok = tiny
    eos, pad = tok.eos_token_id, tok.pad_token_id
    a, b = tok("ab", add_special_tokens=False).input_ids, tok("xyz", add_special_tokens=False).input_ids

    def completion(ids, text):
        return SimpleNamespace(token_ids=ids, text=text,
                               logprobs=[{t: SimpleNamespace(logprob=-0.5 * (k + 1))} for k, t in enumerate(ids)])

    outputs = [SimpleNamespace(outputs=[completion(a + [eos], "ab"), completion(b, "xyz")])]
    r = rollout_from_outputs(["q"], outputs, 2, tok, max_new_tokens=3, temperature=0.7)
    assert r.completion_mask.tolist() == [[1] * (len(a) + 1) + [0] * (3 - len(a) - 1), [1, 1, 1]]
    assert r.truncated.tolist() == [False, True]
    assert r.completion_ids[0, len(a)].item() == eos and r.completion_ids[0, -1].item() in (pad, eos)
    assert r.sampler_logprobs[1].tolist() == [-0.5, -1.0, -1.5]
    assert r.sampler_logprobs[0, len(a) + 1:].abs().sum() == 0
    assert r.group_ids.tolist() == [0, 0] and r.temperature == 0.7 and r.completions == ["ab", "xyz"]


class FakeEngineModel:
    def __init__(self, path):
        from grpo.models import load_policy
        self.model = load_policy(path)
        self.loaded = []

    def load_weights(self, weights):
        from grpo.resume import _model_names     # as vLLM reads a checkpoint's names
        self.loaded.append(dict(weights))
        weights = _model_names(self.model, dict(weights))
        missing, unexpected = self.model.load_state_dict(weights, strict=False)
        assert not unexpected, unexpected


class FakeLLM:
    """Enough of vllm.LLM: generate with n completions per prompt, sleep, wake_up, the engine."""
    made = []

    def __init__(self, model, enable_sleep_mode, logprobs_mode, **kwargs):
        from grpo.models import load_tokenizer
        assert enable_sleep_mode and logprobs_mode == "processed_logprobs"
        self.inner = FakeEngineModel(model)
        self.tok = load_tokenizer(model)
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(
            driver_worker=SimpleNamespace(model_runner=SimpleNamespace(model=self.inner))))
        self.events = []
        FakeLLM.made.append(self)

    def sleep(self, level):
        self.events.append("sleep")

    def wake_up(self):
        self.events.append("wake")

    def generate(self, prompts, params, use_tqdm=False):
        if isinstance(params, list):     # one request per episode turn: token ids in and out
            return [self.turn(p["prompt_token_ids"], q) for p, q in zip(prompts, params)]
        from grpo.sampling import HFSampler
        self.events.append("generate")
        sampler = HFSampler(self.inner.model, self.tok, max_new_tokens=params.max_tokens,
                            temperature=params.temperature or 1.0)
        rows = [{"images": p["multi_modal_data"]["image"]} if isinstance(p, dict) else {} for p in prompts]
        self.requests, self.params = prompts, params
        texts = [p["prompt"] if isinstance(p, dict) else p for p in prompts]
        r = sampler.sample(texts, params.n, greedy=params.temperature == 0, rows=rows)
        outs = []
        for i in range(len(prompts)):
            comps = []
            for j in range(i * params.n, (i + 1) * params.n):
                n = int(r.completion_mask[j].sum())
                ids = r.completion_ids[j, :n].tolist()
                comps.append(SimpleNamespace(token_ids=ids, text=r.completions[j], logprobs=[
                    {t: SimpleNamespace(logprob=float(r.sampler_logprobs[j, k]))} for k, t in enumerate(ids)]))
            outs.append(SimpleNamespace(outputs=comps))
        return outs


    @torch.no_grad()
    def turn(self, ids, params):
        """Sample from the model until EOS, the stop string (kept) or max_tokens, recomputing the
        whole history at every token: the engine knows nothing of the trainer's cache."""
        self.events.append("turn")
        model, out, logprobs, reason = self.inner.model, [], [], "length"
        for _ in range(params.max_tokens):
            logits = model(torch.tensor([ids + out])).logits[0, -1].float()
            logits = logits / (params.temperature or 1.0)
            logp = torch.log_softmax(logits, -1)
            token = int(logits.argmax()) if params.temperature == 0 else int(
                torch.multinomial(logp.exp(), 1))
            out.append(token)
            logprobs.append({token: SimpleNamespace(logprob=float(logp[token]))})
            if token == self.tok.eos_token_id or self.tok.decode(out, skip_special_tokens=True).endswith(
                    tuple(params.stop)):
                reason = "stop"
                break
        return SimpleNamespace(outputs=[SimpleNamespace(token_ids=out, logprobs=logprobs,
                                                        finish_reason=reason, text="")])


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM = FakeLLM
    module.SamplingParams = lambda **kw: SimpleNamespace(**kw)
    monkeypatch.setitem(sys.modules, "vllm", module)
    FakeLLM.made.clear()
    return module


def test_training_with_the_vllm_sampler_sleeps_for_each_update_and_syncs_after(tiny_model_dir, tmp_path, fake_vllm):
    from grpo.train import train
    config = build_config({"model": str(tiny_model_dir), "sampler": "vllm", "steps": 2, "sft_steps": 2,
                           "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4,
                           "eval_every": 0, "save_every": 0, "threads": 1, "tis_cap": 2.0,
                           "output_dir": str(tmp_path)})
    result = train(config, log=lambda line: None)
    (llm,) = FakeLLM.made
    # synced once at start (the cold start changed the weights), then after each step's update
    assert len(llm.inner.loaded) == 3
    assert llm.events == ["generate", "sleep", "wake", "generate", "sleep", "wake"]
    for name, p in result.policy.state_dict().items():
        assert torch.equal(llm.inner.model.state_dict()[name], p), name
    assert all("sampler/logp_diff" in m for m in result.history)
    # the engine sampled with the weights the trainer had: the trainer's and sampler's log-probs agree
    assert max(m["sampler/logp_diff"] for m in result.history) < 1e-4


def test_sampler_vllm_without_vllm_is_a_clear_error(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)   # import vllm raises ImportError
    from grpo.train import train
    config = build_config({"model": str(tiny_model_dir), "sampler": "vllm", "steps": 1, "sft_steps": 0,
                           "eval_every": 0, "output_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"config key 'sampler': sampler=vllm needs vLLM, which is not installed here: pip install 'vllm>=0.11' \(GPU only; in a clone of grpo: pip install -e '.\[vllm\]'\)"):
        train(config, log=lambda line: None)


def test_episodes_on_the_vllm_engine_keep_the_engines_tokens_and_logprobs(agent_model_dir, tmp_path,
                                                                          fake_vllm):
    """Multi-turn on the engine: each turn is a request with the episode's token ids so far; the
    trainer's recomputed log-probs of the policy tokens equal the engine's (the environment's
    tokens, which the engine never drew, take no part)."""
    from grpo.train import train
    config = build_config({"model": str(agent_model_dir), "sampler": "vllm", "task": "calculator",
                           "environment": "guess_number", "max_turns": 3, "max_new_tokens": 12,
                           "steps": 2, "sft_steps": 0, "prompts_per_step": 2, "group_size": 4,
                           "eval_every": 0, "save_every": 0, "threads": 1, "tis_cap": 2.0,
                           "output_dir": str(tmp_path)})
    result = train(config, log=lambda line: None)
    (llm,) = FakeLLM.made
    assert llm.events.count("turn") > 8            # more requests than the 8 episodes: turns
    assert max(m["episode/turns_mean"] for m in result.history) > 1.5
    assert all(m["episode/env_token_frac"] > 0 for m in result.history)
    assert max(m["sampler/logp_diff"] for m in result.history) < 1e-4


def test_a_rollout_worker_samples_with_its_own_engine_synced_to_each_version(tiny_model_dir, tmp_path, fake_vllm):
    """async_steps: the worker (a fork of the trainer, the stand-in engine with it) makes its own
    engine and syncs it to every version it samples from; the trainer's engine only evaluates."""
    from grpo.train import train
    config = build_config({"model": str(tiny_model_dir), "sampler": "vllm", "steps": 4, "sft_steps": 2,
                           "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4,
                           "eval_every": 0, "save_every": 0, "threads": 1, "async_steps": 1,
                           "proximal": "decoupled", "correction": "tis", "output_dir": str(tmp_path)})
    result = train(config, log=lambda line: None)
    (llm,) = FakeLLM.made            # the trainer's, made before the worker was forked
    assert "generate" not in llm.events and "sleep" not in llm.events
    diffs = [m["sampler/logp_diff"] for m in result.history]
    # steps 1 and 2 sample version 0: the cold start's weights, which the engine (loaded from the
    # model directory, before the cold start) has only if the worker synced it; at step 1 the
    # trainer holds the same weights, so the two policies' log-probs agree
    assert diffs[0] < 1e-4
    assert [r["pipeline/staleness_max"] for r in result.history] == [0, 1, 1, 1]


def test_image_prompts_reach_the_engine_as_multimodal_input_and_train(tmp_path, fake_vllm):
    # Structurally, against the stand-in engine: prompts with their PIL images as vLLM's
    # multi_modal_data, placeholders biased away, the rollout's prompt ids the processor's, and
    # weights synced under the checkpoint's names.
    import json
    import random
    from grpo.tasks.shapes import draw
    from grpo.train import train
    (tmp_path / "pics").mkdir()
    rows = []
    for i in range(8):
        draw(1 + i % 4, random.Random(i)).save(tmp_path / "pics" / f"{i}.png")
        rows.append({"question": "how many shapes?", "answer": str(1 + i % 4), "image": f"pics/{i}.png"})
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = build_config({"model": "tiny-vlm", "sampler": "vllm", "dataset": str(tmp_path / "d.jsonl"),
                           "rewards": ["exact_answer"], "steps": 2, "prompts_per_step": 2, "group_size": 2,
                           "max_new_tokens": 3, "eval_every": 0, "save_every": 0, "threads": 1,
                           "tis_cap": 2.0, "output_dir": str(tmp_path / "run")})
    result = train(config, log=lambda line: None)
    (llm,) = FakeLLM.made
    assert all(isinstance(r, dict) and len(r["multi_modal_data"]["image"]) == 1 for r in llm.requests)
    assert "<image>" in llm.requests[0]["prompt"]
    image_token = result.tokenizer.convert_tokens_to_ids("<image>")
    assert llm.params.logit_bias == {image_token: -100.0}
    assert llm.events.count("generate") == 2 and len(llm.inner.loaded) == 3
    assert any(name.startswith("language_model.") for name in llm.inner.loaded[-1])   # checkpoint names
    for name, p in result.policy.state_dict().items():
        assert torch.equal(llm.inner.model.state_dict()[name], p), name
    assert max(m["sampler/logp_diff"] for m in result.history) < 1e-4
