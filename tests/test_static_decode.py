"""grpo's own sampler on a static cache (sampling/static.py): the same tokens and log-probs as the
eager loop from the same draws, whatever the slots, buckets and compaction; continuous batching
that does not change a row; the compiled step against the eager one; and the config refusals."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import grpo.sampling.static as static
from grpo.config import ConfigError, build_config
from grpo.models import build_tiny
from grpo.sampling import HFSampler, own_sampler
from grpo.sampling.static import bucket_of, buckets
from grpo.train import train

PROMPTS = ["What is 2+3?", "Name a colour:", "x", "The quick brown fox jumps over"]
G, T = 4, 40


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny(request, tmp_path_factory):
    path = build_tiny(tmp_path_factory.mktemp(request.param), hidden_size=64, layers=2,
                      architecture=request.param)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    return AutoModelForCausalLM.from_pretrained(path), tokenizer


def draws(n=len(PROMPTS) * G, seed=1):
    return torch.rand(n, T, generator=torch.Generator().manual_seed(seed))


def sample(model, tokenizer, decode, slots=0, prompts=PROMPTS, uniforms=None, greedy=False,
           tokens=T, **kw):
    s = own_sampler(model, tokenizer, max_new_tokens=tokens, decode=decode, decode_slots=slots, **kw)
    return s.sample(prompts, G, uniforms=draws() if uniforms is None else uniforms, greedy=greedy)


def assert_same(a, b, logp_tol=0.0):
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.completion_mask, b.completion_mask)
    assert torch.equal(a.truncated, b.truncated)
    assert a.completions == b.completions
    assert (a.sampler_logprobs - b.sampler_logprobs).abs().max().item() <= logp_tol


SETTINGS = [{}, {"temperature": 0.8, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.3},
            {"min_p": 0.05}, {"stop": ("e",)}]


@pytest.mark.parametrize("settings", SETTINGS, ids=["plain", "cut-penalty", "min_p", "stop"])
def test_static_slots_and_continuous_batching_draw_what_eager_draws_float64(tiny, settings):
    """In float64 every row is the eager loop's, token for token, with the same log-probs to
    1e-12: all rows in slots at once, 5 slots (rows wait and take freed ones) and 1 slot."""
    model, tokenizer = tiny
    model = model.double()
    eager = sample(model, tokenizer, "eager", **settings)
    assert 0 < eager.truncated.sum() < len(eager.truncated)          # uneven: some end, some cut
    for slots in (0, 5, 1):
        assert_same(eager, sample(model, tokenizer, "static", slots, **settings), 1e-12)
    model.float()


def test_long_rows_attend_over_growing_spans_and_draw_what_eager_draws(tiny, monkeypatch):
    """300 tokens: a step attends over 128, then 256, then all 364 slots (span_for), as the
    longest running row grows (top_k=5 keeps EOS out of most draws: rows run long)."""
    model, tokenizer = tiny
    model = model.double()
    spans, tick = [], static.StaticDecode.tick
    monkeypatch.setattr(static.StaticDecode, "tick",
                        lambda self, n, span: (spans.append(span), tick(self, n, span)))
    u = torch.rand(8, 300, generator=torch.Generator().manual_seed(4))
    kw = {"prompts": PROMPTS[:2], "uniforms": u, "tokens": 300, "top_k": 5}
    eager = sample(model, tokenizer, "eager", **kw)
    assert eager.truncated.any()
    assert_same(eager, sample(model, tokenizer, "static", 3, **kw), 1e-12)
    assert sorted(set(spans)) == [128, 256, 364]
    model.float()


def test_greedy_is_the_eager_argmax(tiny):
    model, tokenizer = tiny
    model = model.double()
    assert_same(sample(model, tokenizer, "eager", greedy=True),
                sample(model, tokenizer, "static", 3, greedy=True), 1e-12)
    model.float()


def test_float32_differs_only_where_a_changed_sum_flips_a_near_tie(tiny):
    """In float32 the static step sums attention over more (masked) slots: a draw that falls
    within float noise of a boundary between two tokens may flip. Counted over 64 rows: none
    or almost none; the log-probs of equal rows agree to float32 noise."""
    model, tokenizer = tiny
    prompts = [f"{i} + {i % 7} =" for i in range(16)]
    u = draws(len(prompts) * G)
    a = sample(model, tokenizer, "eager", prompts=prompts, uniforms=u)
    b = sample(model, tokenizer, "static", 24, prompts=prompts, uniforms=u)
    differ = (a.completion_ids != b.completion_ids).any(-1) | (a.truncated != b.truncated)
    print(f"rows that differ in float32: {int(differ.sum())} of {len(differ)}")
    assert int(differ.sum()) <= 2
    same = ~differ
    gap = (a.sampler_logprobs[same] - b.sampler_logprobs[same]).abs().max().item()
    assert gap < 1e-4


def test_a_row_does_not_depend_on_which_rows_share_its_steps(tiny):
    """Continuous batching's rule: a row's tokens are a function of its prompt, its own draws
    and the weights. The last two prompts alone, with their rows' draws, give the same rows."""
    model, tokenizer = tiny
    model = model.double()
    u = draws()
    whole = sample(model, tokenizer, "static", 3, uniforms=u)
    part = sample(model, tokenizer, "static", 2, prompts=PROMPTS[2:], uniforms=u[2 * G:])
    assert torch.equal(whole.completion_ids[2 * G:, :part.completion_ids.shape[1]],
                       part.completion_ids)
    assert torch.equal(whole.truncated[2 * G:], part.truncated)
    model.float()


def test_buckets_by_hand():
    assert buckets(12) == [1, 2, 4, 8, 12]
    assert buckets(64)[:6] == [1, 2, 4, 8, 16, 24] and buckets(64)[-1] == 64 and len(buckets(64)) == 11
    assert buckets(300)[-4:] == [256, 272, 288, 300]
    assert buckets(64, few=True) == [1, 2, 4, 8, 16, 32, 64]
    assert buckets(1) == [1]
    assert bucket_of(9, buckets(64)) == 16 and bucket_of(64, buckets(64)) == 64


def test_ended_rows_leave_for_smaller_buckets(tiny, monkeypatch):
    model, tokenizer = tiny
    sizes, moves = [], []
    tick, compact = static.StaticDecode.tick, static.StaticDecode.compact
    monkeypatch.setattr(static.StaticDecode, "tick",
                        lambda self, n, span: (sizes.append(n), tick(self, n, span)))
    monkeypatch.setattr(static.StaticDecode, "compact",
                        lambda self, keep: (moves.append(len(keep)), compact(self, keep)))
    out = sample(model, tokenizer, "static", 0, stop=("e",))
    ended = int((~out.truncated).sum())
    assert ended >= 8 and sizes[0] == 16 and sizes[-1] < 16            # compacted as rows ended
    assert sizes == sorted(sizes, reverse=True)                        # buckets only shrink
    assert len(sizes) == T - 1                                         # the first token: prefill
    assert moves and moves == sorted(moves, reverse=True) and moves[0] < 16


def test_the_static_decoder_is_kept_between_calls_of_the_same_shape(tiny):
    model, tokenizer = tiny
    s = own_sampler(model, tokenizer, max_new_tokens=T, decode="static")
    a = s.sample(PROMPTS, G, uniforms=draws(seed=2))
    kept = s._kept[1]
    b = s.sample(PROMPTS[::-1], G, uniforms=draws(seed=3))
    assert s._kept[1] is kept
    e = own_sampler(model, tokenizer, max_new_tokens=T, decode="eager")
    assert type(e) is HFSampler
    assert torch.equal(a.completion_ids, e.sample(PROMPTS, G, uniforms=draws(seed=2)).completion_ids)
    assert torch.equal(b.completion_ids,
                       e.sample(PROMPTS[::-1], G, uniforms=draws(seed=3)).completion_ids)


def test_compiled_step_draws_what_the_eager_step_draws(tiny):
    """torch.compile(mode="reduce-overhead") of the static step (on a CPU: compiled kernels, no
    graphs) against the same step eager, float32: the same tokens, log-probs to 1e-5."""
    model, tokenizer = tiny
    if model.config.model_type != "qwen2":
        pytest.skip("compiled once, on one family: compiling costs about 20 s on a CPU")
    said = []
    eager = sample(model, tokenizer, "static", top_p=0.9)
    s = own_sampler(model, tokenizer, max_new_tokens=T, decode="compiled", top_p=0.9,
                    log=said.append)
    compiled = s.sample(PROMPTS, G, uniforms=draws())
    assert said == [] and s._kept[1].compiled is not None
    assert_same(eager, compiled, 1e-5)


def test_decode_is_refused_where_it_cannot_apply(tmp_path, tiny):
    with pytest.raises(ConfigError, match=r"config key 'decode'.*sampler=vllm"):
        build_config({"decode": "static", "sampler": "vllm"})
    with pytest.raises(ConfigError, match=r"config key 'decode'.*multi-turn"):
        build_config({"decode": "graphs", "tools": ["calculator"]})
    with pytest.raises(ConfigError, match=r"config key 'decode_slots'.*decode=eager"):
        build_config({"decode": "eager", "decode_slots": 4})
    with pytest.raises(ConfigError, match=r"config key 'decode' must be auto, eager, static, graphs or compiled, got 'cuda_graphs'"):
        build_config({"decode": "cuda_graphs"})
    model, tokenizer = tiny
    with pytest.raises(ValueError, match=r"decode=graphs captures CUDA graphs; the policy is on cpu"):
        own_sampler(model, tokenizer, max_new_tokens=4, decode="graphs")
    assert type(own_sampler(model, tokenizer, max_new_tokens=4, decode="auto")) is HFSampler
    c = build_config({"steps": 1, "sft_steps": 0, "decode": "graphs", "eval_every": 0,
                      "output_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"config key 'decode': decode=graphs captures CUDA"):
        train(c, log=lambda s: None, write_files=False)


def test_a_demo_run_decoding_static_has_the_eager_runs_numbers(tmp_path):
    """Every metric equal but the sampler's own float32 log-probs, summed in another order:
    `sampler/logp_diff` (against the trainer's forward) stays at float32 noise in both."""
    def run(decode):
        c = build_config({"steps": 2, "sft_steps": 2, "eval_every": 2, "eval_size": 8,
                          "decode": decode, "output_dir": str(tmp_path / decode)})
        return [{k: v for k, v in m.items() if not k.startswith(("time/", "tokens/s"))}
                for m in train(c, log=lambda s: None, write_files=False).history]
    static_run, eager_run = run("static"), run("eager")
    noise = [m.pop("sampler/logp_diff", 0.0) for m in static_run + eager_run]
    assert static_run == eager_run and max(noise) < 1e-5


def test_a_model_the_lean_decoder_does_not_run_is_refused_a_static_mode(tmp_path):
    from transformers import LlamaConfig
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, hidden_act="gelu")   # lean decoder: silu only
    model = AutoModelForCausalLM.from_config(config)
    tokenizer = AutoTokenizer.from_pretrained(build_tiny(tmp_path))
    with pytest.raises(ConfigError, match=r"config key 'decode': decode=static needs a model "
                                          r"grpo's lean decoder runs"):
        own_sampler(model, tokenizer, max_new_tokens=4, decode="static")
    assert type(own_sampler(model, tokenizer, max_new_tokens=4, decode="auto")) is HFSampler


def test_new_weight_tensors_make_a_new_static_decoder(tiny):
    """A kept decoder (and its captured graphs) reads the parameters it was built on; a model
    whose weights now live in other tensors gets a new one, which samples from them."""
    import copy
    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    s = own_sampler(model, tokenizer, max_new_tokens=T, decode="static")
    s.sample(PROMPTS, G, uniforms=draws())
    kept = s._kept[1]
    with torch.no_grad():
        model.model.norm.weight.mul_(2.0)                       # in place: the same tensors
    s.sample(PROMPTS, G, uniforms=draws())
    assert s._kept[1] is kept
    norm = model.model.norm
    norm.weight = torch.nn.Parameter(norm.weight.detach() * 3)  # a new tensor, other values
    fresh = s.sample(PROMPTS, G, uniforms=draws())
    assert s._kept[1] is not kept
    eager = own_sampler(model, tokenizer, max_new_tokens=T, decode="eager")
    assert torch.equal(fresh.completion_ids, eager.sample(PROMPTS, G, uniforms=draws()).completion_ids)


def test_a_task_with_tools_is_refused_a_static_decode_before_any_work(tmp_path):
    c = build_config({"task": "calculator", "steps": 1, "sft_steps": 0, "decode": "static",
                      "eval_every": 0, "output_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"config key 'decode': decode=static decodes "
                                          r"single-turn completions; multi-turn episodes"):
        train(c, log=lambda s: None, write_files=False)


def test_mixed_precision_samples_from_a_bf16_copy_refreshed_each_call(tiny, monkeypatch):
    """mixed_precision=bf16 on CUDA: the static step reads a bf16 copy of the float32 policy,
    refreshed from it at each call (one cast a call, not one a token). Forced here on a CPU:
    the copy is bf16, follows an update of the policy, and its log-probs (recorded in float32)
    are within bf16 noise of the float32 step's on the tokens both drew."""
    import copy
    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    monkeypatch.setattr(static.StaticSampler, "_compute_dtype", lambda self: torch.bfloat16)
    half = own_sampler(model, tokenizer, max_new_tokens=T, decode="static")
    full = own_sampler(model, tokenizer, max_new_tokens=T, decode="eager")
    a, b = half.sample(PROMPTS, G, uniforms=draws()), full.sample(PROMPTS, G, uniforms=draws())
    shadow = half._shadow[1]
    assert next(shadow.parameters()).dtype == torch.bfloat16 and a.sampler_logprobs.dtype == torch.float32
    assert half._kept[1].slots.keys[0].dtype == torch.bfloat16
    width = min(a.completion_ids.shape[1], b.completion_ids.shape[1])
    same = (a.completion_ids[:, :width] == b.completion_ids[:, :width]).int().cumprod(-1).bool()
    assert same[:, 0].float().mean() >= 0.75          # bf16 flips some draws, not most
    gap = (a.sampler_logprobs[:, :width] - b.sampler_logprobs[:, :width]).abs()[same]
    print(f"bf16 copy against float32: {int(same.sum())} tokens in common prefixes, "
          f"|logp gap| max {gap.max():.4f} mean {gap.mean():.4f}")
    assert 0 < gap.max() < 0.05
    with torch.no_grad():
        model.model.norm.weight.mul_(1.5)                                # an update, in place
    half.sample(PROMPTS, G, uniforms=draws())
    assert half._shadow[1] is shadow
    assert torch.equal(shadow.model.norm.weight, model.model.norm.weight.bfloat16())


def test_smaller_calls_reuse_the_decoder_and_larger_ones_grow_it(tiny):
    model, tokenizer = tiny
    s = own_sampler(model, tokenizer, max_new_tokens=T, decode="static")
    e = own_sampler(model, tokenizer, max_new_tokens=T, decode="eager")
    s.sample(PROMPTS, G, uniforms=draws())
    kept = s._kept[1]
    small = s.sample(PROMPTS[:1], G, uniforms=draws(G, seed=5))          # 4 rows of 16
    assert s._kept[1] is kept
    assert torch.equal(small.completion_ids,
                       e.sample(PROMPTS[:1], G, uniforms=draws(G, seed=5)).completion_ids)
    more = PROMPTS + ["A much longer prompt than the others, past sixty-four characters " * 2]
    big = s.sample(more, G, uniforms=draws(len(more) * G, seed=6))
    longest = max(len(tokenizer(p, add_special_tokens=False).input_ids) for p in more)
    assert longest > 64 and s._kept[1].N == len(more) * G
    assert s._kept[1].slots.capacity == -(-longest // 64) * 64 + T
    assert torch.equal(big.completion_ids,
                       e.sample(more, G, uniforms=draws(len(more) * G, seed=6)).completion_ids)


def test_rotary_embeddings_that_follow_the_batch_are_refused_a_static_decode(tmp_path):
    from transformers import LlamaConfig
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    model = AutoModelForCausalLM.from_config(config)
    tokenizer = AutoTokenizer.from_pretrained(build_tiny(tmp_path))
    with pytest.raises(ConfigError, match=r"config key 'decode': decode=static runs rows of "
                                          r"different lengths in one step; dynamic rotary"):
        own_sampler(model, tokenizer, max_new_tokens=4, decode="static")
    assert type(own_sampler(model, tokenizer, max_new_tokens=4, decode="auto")) is HFSampler


def test_slots_that_fit_the_free_memory_by_hand(tiny):
    """A slot of the tiny model holds 2 (keys, values) x 2 layers x 4 heads x 16 dims x 4 bytes
    = 1,024 bytes a position; 104 positions make 106,496 bytes. 0.3 of 1 MB holds 2 slots; of
    1 GB, more than the 16 rows asked for; on a CPU every row gets one."""
    from grpo.sampling.static import slots_that_fit
    model, _ = tiny
    assert slots_that_fit(model, 16, 104, free_bytes=10 ** 6) == 2        # 300,000 // 106,496
    assert slots_that_fit(model, 16, 104, free_bytes=10 ** 9) == 16
    assert slots_that_fit(model, 16, 104, free_bytes=10) == 1
    assert slots_that_fit(model, 16, 104) == 16
