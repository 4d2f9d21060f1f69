"""Padding-free micro-batches (models/packed.py, `packing=on`) against padded ones, in float64:
the same log-probs and gradients to 1e-10 for every policy loss, aggregation, KL estimator and
correction, with ragged completions, shared prompts of different lengths, holes in the loss mask
(multi-turn episodes' context tokens), grouped-query attention, LoRA and checkpointing."""

import copy

import pytest
import torch

from grpo.algorithm.corrections import CORRECTIONS
from grpo.algorithm.loss import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from grpo.models import build_tiny, load_policy, load_tokenizer
from grpo.models import packed
from grpo.models.logprobs import token_logprobs
from helpers import T, grads_and_stats
from test_variants_loss import (KL_COV_COEF, LOSS_KW, MIXED_ADV, MIXED_LOG_RATIOS, naive_selected,
                                rollout_with)

TOL = 1e-10


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny64(request, tmp_path_factory):
    """float64; qwen2 with grouped-query attention (4 query heads, 2 key/value heads)."""
    path = build_tiny(tmp_path_factory.mktemp(request.param), hidden_size=32, layers=2, heads=4,
                      architecture=request.param)
    policy = load_policy(str(path))
    if request.param == "qwen2":
        from transformers import AutoModelForCausalLM
        policy.config.num_key_value_heads = 2
        torch.manual_seed(1)
        policy = AutoModelForCausalLM.from_config(policy.config)
    return policy.double(), load_tokenizer(str(path))


@pytest.fixture(scope="module")
def rollout64(tiny64):
    return rollout_with(*tiny64, MIXED_LOG_RATIOS, MIXED_ADV)


def both(policy, fn, one_pass: bool = True):
    """fn() padded, then packed (and the packed pass checked to have run). `one_pass`: each
    update in one pass of the rows in their order, padded and packed alike, so what differs is
    the forward alone (the loss's float32 parts round differently when rows are reordered)."""
    import grpo.update as update
    out = []
    calls = []
    real, cut = packed.selected_hidden, update.micro_batches

    def spy(*a, **k):
        calls.append(1)
        return real(*a, **k)
    for on in (False, True):
        policy.grpo_packing = on
        packed.selected_hidden = spy
        if one_pass:
            update.micro_batches = lambda rollout, *a: [list(range(len(rollout)))]
        try:
            out.append(fn())
        finally:
            packed.selected_hidden, update.micro_batches = real, cut
            policy.grpo_packing = False
    assert calls, "the packed pass did not run"
    return out


def assert_grads_equal(a, b):
    assert a.keys() == b.keys() and a
    for name in a:
        assert (a[name] - b[name]).abs().max().item() <= TOL, name


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
@pytest.mark.parametrize("loss_type", list(POLICY_LOSSES))
def test_every_loss_and_aggregation_packed_as_padded(tiny64, rollout64, loss_type, aggregation):
    policy, _ = tiny64
    kw = dict(aggregation=aggregation, max_tokens=T, loss_type=loss_type, **LOSS_KW)
    if loss_type in ("clip_cov", "kl_cov"):
        kw["selected"] = torch.tensor([[naive_selected(i, t) for t in range(T)] for i in range(6)])
        kw["kl_cov_coef"] = KL_COV_COEF
    (padded_grads, padded), (packed_grads, packed_) = both(
        policy, lambda: grads_and_stats(policy, rollout64, 6, **kw))      # one pass each
    assert abs(padded["loss"] - packed_["loss"]) <= TOL
    assert_grads_equal(padded_grads, packed_grads)


@pytest.mark.parametrize("rows", [4, 2, 1])
def test_packed_micro_batches_change_only_the_summation_order(tiny64, rollout64, rows):
    """Packed passes cut by group order (update.packed_batches), padded ones by length: the
    same step up to the float32 rounding of each pass's loss (as test_variants_loss's
    micro-batching test allows)."""
    policy, _ = tiny64
    kw = dict(aggregation="token_mean", max_tokens=T, loss_type="clip", **LOSS_KW)
    (ga, a), (gb, b) = both(policy, lambda: grads_and_stats(policy, rollout64, rows, **kw),
                            one_pass=False)
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-6)
    scale = max(g.abs().max().item() for g in ga.values())
    for name in ga:
        torch.testing.assert_close(gb[name], ga[name], rtol=1e-6, atol=1e-6 * scale)


@pytest.mark.parametrize("estimator", list(KL_ESTIMATORS))
def test_every_kl_estimator_packed_as_padded(tiny64, rollout64, estimator):
    policy, _ = tiny64
    kw = dict(LOSS_KW, aggregation="token_mean", max_tokens=T, loss_type="clip",
              kl_estimator=estimator, beta=0.3)
    (ga, a), (gb, b) = both(policy, lambda: grads_and_stats(policy, rollout64, 6, **kw))
    assert abs(a["loss"] - b["loss"]) <= TOL and abs(a["kl"] - b["kl"]) <= TOL
    assert_grads_equal(ga, gb)


@pytest.mark.parametrize("correction", list(CORRECTIONS))
def test_every_correction_packed_as_padded(tiny64, rollout64, correction):
    policy, _ = tiny64
    gen = torch.Generator().manual_seed(3)
    mask = rollout64.completion_mask
    sampler = rollout64.old_logprobs + 0.3 * torch.randn(mask.shape, generator=gen,
                                                         dtype=torch.float64) * mask
    is_weights = CORRECTIONS[correction](rollout64.old_logprobs - sampler, mask, cap=1.5)
    assert 0 < (is_weights * mask).sum()
    kw = dict(LOSS_KW, aggregation="sequence_mean", max_tokens=T, loss_type="clip",
              is_weights=is_weights)
    (ga, a), (gb, b) = both(policy, lambda: grads_and_stats(policy, rollout64, 6, **kw))
    assert abs(a["loss"] - b["loss"]) <= TOL
    assert_grads_equal(ga, gb)


def ragged(tok, G=3):
    """Two prompts of different lengths, G rows each; completions of 7, 3, 1, 5, 0 and 2 tokens."""
    enc = tok(["ab", "hello there"], return_tensors="pt", padding=True, add_special_tokens=False)
    gen = torch.Generator().manual_seed(2)
    Tc = 7
    completion = torch.randint(5, 90, (2 * G, Tc), generator=gen)
    lengths = torch.tensor([7, 3, 1, 5, 0, 2])
    attended = (torch.arange(Tc)[None] < lengths[:, None]).long()
    ids = torch.cat([enc.input_ids.repeat_interleave(G, 0), completion], 1)
    mask = torch.cat([enc.attention_mask.repeat_interleave(G, 0), attended], 1)
    return ids, mask, attended, Tc


def logprobs_and_grads(policy, ids, mask, Tc, select, **kw):
    policy.zero_grad(set_to_none=True)
    logp, _ = token_logprobs(policy, ids, mask, Tc, completion_mask=select, **kw)
    cotangent = torch.randn(logp.shape, generator=torch.Generator().manual_seed(4),
                            dtype=logp.dtype)
    (logp * cotangent).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in policy.named_parameters() if p.grad is not None}
    policy.zero_grad(set_to_none=True)
    return logp.detach(), grads


def test_ragged_rows_with_holes_in_the_loss_mask(tiny64):
    """A multi-turn episode's completion attends to tokens it does not train on (an
    environment's answer): the selection has holes inside the attended run."""
    policy, tok = tiny64
    ids, mask, attended, Tc = ragged(tok)
    select = attended.clone()
    select[0, 2:4] = 0
    select[3, 0] = 0
    (la, ga), (lb, gb) = both(policy, lambda: logprobs_and_grads(policy, ids, mask, Tc, select))
    assert (la - lb).abs().max().item() <= TOL and (lb[select == 0] == 0).all()
    assert_grads_equal(ga, gb)


def test_sampling_settings_and_checkpointing_packed_as_padded(tiny64):
    policy, tok = tiny64
    ids, mask, attended, Tc = ragged(tok)
    kw = dict(temperature=0.7, top_p=0.9, top_k=20, repetition_penalty=1.2)
    policy.grpo_checkpointing = True
    try:
        (la, ga), (lb, gb) = both(policy, lambda: logprobs_and_grads(policy, ids, mask, Tc,
                                                                     attended, **kw))
    finally:
        policy.grpo_checkpointing = False
    assert (la - lb).abs().max().item() <= TOL
    assert_grads_equal(ga, gb)


def test_lora_packed_as_padded(tiny64):
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    policy, tok = tiny64
    model = get_peft_model(copy.deepcopy(policy), LoraConfig(r=4, lora_alpha=8, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    for name, p in model.named_parameters():       # B = 0 at start: give the adapter a value
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    base = model.get_base_model()
    ids, mask, attended, Tc = ragged(tok)
    (la, ga), (lb, gb) = both(base, lambda: logprobs_and_grads(model, ids, mask, Tc, attended))
    assert (la - lb).abs().max().item() <= TOL
    assert_grads_equal(ga, gb)
    assert any("lora_A" in n for n in ga)


def test_packable_by_hand():
    # prompts left-padded, completions right-padded: packable; a completion with a hole or a
    # right-padded prompt is not (it goes the padded way)
    assert packed.packable(torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]]), T=2)
    assert not packed.packable(torch.tensor([[0, 1, 1, 0, 1]]), T=2)
    assert not packed.packable(torch.tensor([[1, 0, 1, 1, 0]]), T=2)


def test_varlen_reference_by_hand():
    """One head, d = 1, one query document of 2 queries over 3 keys (causal at the lower right:
    query 0 sees keys 0-1, query 1 all three). q = 0 makes every score 0: each output is the
    mean of the values it sees, (1 + 2) / 2 and (1 + 2 + 6) / 3."""
    q = torch.zeros(2, 1, 1, dtype=torch.float64)
    k = torch.zeros(3, 1, 1, dtype=torch.float64)
    v = torch.tensor([1.0, 2.0, 6.0], dtype=torch.float64).view(3, 1, 1)
    out = packed.varlen(q, k, v, torch.tensor([0, 2]), torch.tensor([0, 3]), 2, 3, gqa=False)
    assert out.flatten().tolist() == [1.5, 3.0]


def test_varlen_attention_is_asked_for_in_the_words_each_torch_release_takes():
    """torch's varlen_attn changed its arguments between releases (2.11 has no enable_gqa): the
    lower-right causal mask and grouped-query attention are asked for as each signature allows."""
    from grpo.models.packed import varlen_arguments

    def newest(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size=(-1, -1), enable_gqa=False): ...

    def windowed(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size=(-1, -1)): ...

    def causal(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False): ...

    def neither(q, k, v, cu_q, cu_k, max_q, max_k): ...
    assert varlen_arguments(newest, gqa=True) == ({"window_size": (-1, 0), "enable_gqa": True}, False)
    assert varlen_arguments(newest, gqa=False) == ({"window_size": (-1, 0)}, False)
    assert varlen_arguments(windowed, gqa=True) == ({"window_size": (-1, 0)}, True)   # repeat k, v
    assert varlen_arguments(causal, gqa=True) == ({"is_causal": True}, True)
    assert varlen_arguments(causal, gqa=False) == ({"is_causal": True}, False)
    assert varlen_arguments(neither, gqa=True) is None                               # the reference
    from torch.nn.attention.varlen import varlen_attn                                # this torch's
    assert varlen_arguments(varlen_attn, gqa=True) is not None


def test_packing_key_sets_the_model_and_auto_is_off_on_a_cpu(tmp_path):
    from grpo.assembly.model import set_packing
    from grpo.config import ConfigError, build_config
    model = torch.nn.Linear(2, 2)
    set_packing(model, build_config({}))
    assert model.grpo_packing is False
    set_packing(model, build_config({"packing": "on"}))
    assert model.grpo_packing is True
    with pytest.raises(ConfigError, match=r"config key 'packing' must be auto, on or off, got 'yes'"):
        build_config({"packing": "yes"})


def test_packed_batches_keep_groups_together_and_count_real_tokens_once(tiny64):
    """make_rollout: prompts "ab" (2 tokens) and "hello" (5), 3 rows each, completions of
    5, 2, 3 | 4, 1, 5 tokens. Group 0 costs 2 + 10 = 12 real tokens, group 1 5 + 10 = 15.
    A budget of 14: rows 0-2 (12), then row 3 (5 + 4 = 9), row 4 (+1 = 10), row 5 (+5 = 15 > 14)."""
    from helpers import make_rollout
    from grpo.update import packed_batches
    rollout = make_rollout(tiny64[1])
    assert packed_batches(rollout, 256, 0) == [[0, 1, 2, 3, 4, 5]]
    assert packed_batches(rollout, 256, 14) == [[0, 1, 2], [3, 4], [5]]
    assert packed_batches(rollout, 2, 0) == [[0, 1], [2, 3], [4, 5]]


def test_the_packed_budget_by_hand(tiny64):
    """hidden 32, 2 layers, float64 (8 bytes): 34 x 32 x 2 = 2,176 values, 17,408 bytes a token;
    a quarter of 100 MB is 1,436 tokens. With checkpointing: 32 x 2 + 34 x 32 = 1,152 values,
    9,216 bytes: 2,712 tokens."""
    from grpo.update import packed_budget
    policy, _ = tiny64
    assert packed_budget(policy, free_bytes=10 ** 8) == 25_000_000 // 17_408 == 1436
    policy.grpo_checkpointing = True
    try:
        assert packed_budget(policy, free_bytes=10 ** 8) == 25_000_000 // 9_216 == 2712
    finally:
        policy.grpo_checkpointing = False


def test_a_demo_run_packed_has_the_padded_runs_numbers_up_to_float32_sums(tmp_path):
    """The demo (cold start, 2 GRPO steps, an evaluation) with packing=on against packing=off,
    float32: the same samples (sampling does not pack), and every metric equal up to the
    summation order of float32 (relative 1e-4)."""
    from grpo.config import build_config
    from grpo.train import train

    def run(packing):
        c = build_config({"steps": 2, "sft_steps": 2, "eval_every": 2, "eval_size": 8,
                          "packing": packing, "output_dir": str(tmp_path / packing)})
        return [{k: v for k, v in m.items() if not k.startswith(("time/", "tokens/s"))}
                for m in train(c, log=lambda s: None, write_files=False).history]
    on, off = run("on"), run("off")
    assert [sorted(m) for m in on] == [sorted(m) for m in off]
    for a, b in zip(on, off):
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key


def test_an_episode_rollout_packed_as_padded(tiny64, rollout64):
    """A multi-turn rollout: every real token after the prompt attended (`context_mask`), the
    environment's tokens left out of the loss (`loss_mask`), through the whole update."""
    import dataclasses
    policy, _ = tiny64
    mask = rollout64.completion_mask
    env = torch.zeros_like(mask)
    env[0, 1:3] = 1                       # an answer inside row 0's completion
    env[3, 1] = 1
    episode = dataclasses.replace(rollout64, context_mask=mask.clone(), loss_mask=mask * (1 - env))
    kw = dict(LOSS_KW, aggregation="token_mean", max_tokens=T, loss_type="clip")
    (ga, a), (gb, b) = both(policy, lambda: grads_and_stats(policy, episode, 6, **kw))
    plain = grads_and_stats(policy, rollout64, 6, **kw)[1]
    assert a["loss"] != pytest.approx(plain["loss"], rel=1e-6)      # the holes do act
    assert abs(a["loss"] - b["loss"]) <= TOL
    assert_grads_equal(ga, gb)
