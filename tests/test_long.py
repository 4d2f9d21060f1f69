"""Long completions: no pass holds a [tokens x tokens] or [tokens x vocabulary] tensor, and a run
at 8,192 new tokens trains on this CPU within a memory bound derived from the model's sizes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from grpo.models import heap

ROOT = Path(__file__).resolve().parents[1]


class LargestShapes(TorchDispatchMode):
    """Every tensor any op returns, forward and backward: the shapes with two or more dimensions
    of at least `size` (a [rows, tokens, tokens] or [rows, tokens, vocab] tensor has two)."""

    def __init__(self, size: int):
        super().__init__()
        self.size, self.found, self.ops = size, [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and sum(d >= self.size for d in t.shape) >= 2:
                self.found.append((str(func), tuple(t.shape)))
        return out


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    """hidden 32, 2 layers, 2 heads, a 1,100-token vocabulary: wider than the 1,024-token
    completions of the shape tests, so a [tokens x vocab] tensor has two dimensions that large."""
    from grpo.models import build_tiny, load_policy
    path = build_tiny(tmp_path_factory.mktemp("long"), hidden_size=32, layers=2, heads=2,
                      vocab_size=1100, max_positions=16384)
    return path, load_policy(str(path))


def rows(T: int):
    """Two prompts (3 and 5 tokens, left-padded) x 2 completions of T, T - 7, T - 100, T - 1."""
    prompt = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]]).repeat_interleave(2, 0)
    torch.manual_seed(0)
    completion = torch.randint(3, 90, (4, T))
    lengths = torch.tensor([T, T - 7, T - 100, T - 1])
    completion_mask = (torch.arange(T)[None] < lengths[:, None]).long()
    ids = torch.cat([prompt, completion * completion_mask], 1)
    return ids, torch.cat([(prompt != 0).long(), completion_mask], 1), completion_mask


@pytest.mark.parametrize("checkpointing", [False, True])
def test_no_training_pass_holds_a_tokens_by_tokens_tensor(long_model, checkpointing, monkeypatch):
    from grpo import models
    from grpo.models import token_logprobs
    _, policy = long_model
    # the chunked head holds a fixed number of logits whatever the length (2^24); made small
    # here so that a chunk is far shorter than the completions and the check sees the rule
    monkeypatch.setattr(models.logprobs, "LOGIT_CHUNK_ELEMENTS", 1 << 16)
    T = 1024
    ids, mask, completion_mask = rows(T)
    monkeypatch.setattr(policy, "grpo_checkpointing", checkpointing, raising=False)
    with LargestShapes(T) as seen:
        logp, _ = token_logprobs(policy, ids, mask, T, completion_mask=completion_mask)
        logp.sum().backward()
    policy.zero_grad()
    assert seen.ops > 100 and torch.isfinite(logp).all()
    assert seen.found == []
    # The checker can fail: the mask a row with a hole still needs is [rows, 1, L, L], and the
    # full-logits path holds [rows, T, vocab].
    from grpo.models.decoder import Decoder
    with LargestShapes(T) as seen:
        Decoder(policy)._masked_hidden(ids, mask.bool(), (mask.cumsum(-1) - 1).clamp(min=0))
        policy(input_ids=ids[:1], attention_mask=mask[:1]).logits
    shapes = [shape for _, shape in seen.found]
    assert (4, 1, T + 5, T + 5) in shapes and (1, T + 5, 1100) in shapes


def test_sampling_holds_no_tokens_by_tokens_tensor(long_model):
    from grpo.sampling import generate
    _, policy = long_model
    T = 1024
    prompt = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    with LargestShapes(T) as seen:   # EOS -1 is never drawn: every row decodes all T tokens
        tokens, logp = generate(policy.eval(), prompt, (prompt != 0).long(), T, -1, 0, group_size=2)
    assert tokens.shape == (4, T) and seen.ops > 10 * T
    assert seen.found == []


def test_two_steps_at_8192_new_tokens_train_within_a_derived_memory_bound(long_model, tmp_path):
    """Two GRPO steps of 1 prompt x 2 completions of exactly 8,192 tokens (EOS forced there by
    benchmarks/forced_lengths.py), with a 4,096-token budget per pass, so each row is longer
    than the budget and goes alone (one row per pass, with activation checkpointing).

    The same run at 1,024 tokens is the baseline (interpreter, torch, model, optimizer); what
    8,192 tokens add must be linear in the length. Derived at L = 8,197 (prompt included),
    hidden 32, MLP 128, 2 layers, 600-token vocabulary, float32:
      - KV cache for sampling: 2 rows x 2 layers x (k, v) x L x 32 x 4 B = 4.2 MB
      - one row's pass with checkpointing: per layer input kept [L, 32] (1 MB x 2 layers), one
        layer recomputed at a time, about 12 [L, <=128] tensors (50 MB); the chunked head holds
        one row's L x 1,100 logits at once (36 MB) and their gradient (36 MB)
      - the sampler's token and log-prob buffers [2, L] and the rollout's masks: under 1 MB
    about 130 MB in all, at most, so the bound on the growth from 1,024 tokens is 200 MB. A single
    [rows, heads, L, L] float32 attention matrix would be 2 x 2 x L^2 x 4 B = 1,075 MB. (Masks,
    a boolean [rows, 1, L, L] being 134 MB, are caught by the shape tests above.)
    """
    path, _ = long_model

    def run(T: int) -> dict:
        cmd = [sys.executable, str(ROOT / "benchmarks" / "forced_lengths.py"), "--lengths", str(T), "--",
               "bench", f"model={path}", "task=addition", "prompts_per_step=1", "group_size=2",
               f"max_new_tokens={T}", "steps=2", "beta=0.04", "micro_batch_tokens=4096",
               "gradient_checkpointing=true", "threads=1"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    short, long = run(1024), run(8192)
    assert short["steps"] == long["steps"] == 2
    assert long["completion_len_mean"] == 8192 and short["completion_len_mean"] == 1024
    grown = long["peak_rss_mb"] - short["peak_rss_mb"]
    assert grown < 200, (short["peak_rss_mb"], long["peak_rss_mb"])


def test_a_growing_pruned_cache_decodes_what_a_full_one_does(long_model, monkeypatch):
    """The decoding cache starts with START_ROOM new-token slots, grows by a quarter (at least
    START_ROOM) when full and copies only its filled slots when ended rows leave the batch. With
    room for 2 tokens (so it grows 9 times over 40 tokens) the tokens and log-probs equal those of
    a cache allocated whole."""
    from grpo.models import decoder
    from grpo.sampling import generate
    _, policy = long_model
    prompt = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    uniforms = torch.rand((4, 40), generator=torch.Generator().manual_seed(1))

    def sample(room, eos):
        monkeypatch.setattr(decoder, "START_ROOM", room)
        sizes = []
        real_move = decoder.Decoder._move
        monkeypatch.setattr(decoder.Decoder, "_move", staticmethod(
            lambda state, rows, capacity: (sizes.append((rows is None, capacity)),
                                           real_move(state, rows, capacity))))
        out = generate(policy.eval(), prompt, (prompt != 0).long(), 40, eos, 0, group_size=2,
                       uniforms=uniforms)
        return out, sizes

    (drawn, _), _ = sample(4096, -1)
    eos = int(drawn[1, 10])                 # a token row 1 draws at step 10: it ends by then
    (tokens, logp), moves = sample(2, eos)
    (whole_tokens, whole_logp), whole_moves = sample(4096, eos)
    assert whole_moves and all(not growth and capacity == 5 + 40 for growth, capacity in whole_moves)
    # 5 prompt + 2 slots, then + max(1, a quarter, 2) each time, the last capped at 5 + 40
    assert [capacity for growth, capacity in moves if growth] == [9, 11, 13, 16, 20, 25, 31, 38, 45]
    assert any(not growth for growth, _ in moves)                         # a prune as well
    assert torch.equal(tokens, whole_tokens)
    torch.testing.assert_close(logp, whole_logp, rtol=0, atol=1e-6)


def test_forced_lengths_end_each_row_at_its_length_while_sampling(long_model, monkeypatch):
    """benchmarks/forced_lengths.py ends row r at lengths[r] with EOS during sampling (no EOS
    before it), so the sampler drops ended rows from its batch as it does for a real policy."""
    import importlib.util
    from grpo.models import decoder
    from grpo.sampling import own
    spec = importlib.util.spec_from_file_location("forced_lengths", ROOT / "benchmarks" / "forced_lengths.py")
    forced = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(forced)
    # force() replaces the sampler's generate_with_lengths for good: undone after the test
    monkeypatch.setattr(own, "generate_with_lengths", own.generate_with_lengths)
    kept = []
    real_keep = decoder.Decoder.keep
    monkeypatch.setattr(decoder.Decoder, "keep", staticmethod(
        lambda state, rows: (kept.append(len(rows)), real_keep(state, rows))))
    _, policy = long_model
    lengths = [3, 30, 11, 1]
    forced.force(lengths)
    prompt = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    eos = 7
    tokens, logp = own.generate(policy.eval(), prompt, (prompt != 0).long(), 64, eos, 0, group_size=2)
    assert tokens.shape == (4, 30)
    for r, n in enumerate(lengths):
        assert tokens[r, n - 1] == eos and not (tokens[r, :n - 1] == eos).any()
        assert (tokens[r, n:] == 0).all() and (logp[r, n:] == 0).all() and (logp[r, :n] < 0).all()
    assert kept and kept[-1] == 1            # the batch shrank to the one row still running


@pytest.mark.skipif(heap._TRIM is None, reason="the C library has no malloc_trim")
def test_release_gives_back_free_pages_inside_the_heap():
    """Holes inside the heap stay resident after free() (glibc returns only its top); release()
    hands them back. 64 KiB blocks come from the heap (below glibc's smallest mmap threshold,
    128 KiB); the last block stays allocated so the freed 50 MiB is a hole, not the top."""
    import ctypes
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]

    def resident_mib():
        return next(int(line.split()[1]) for line in open("/proc/self/status")
                    if line.startswith("VmRSS:")) / 1024

    heap.release()
    blocks = [libc.malloc(64 << 10) for _ in range(800)]
    for block in blocks:
        libc.memset(block, 1, 64 << 10)                  # touched: resident
    touched = resident_mib()
    for block in blocks[:-1]:
        libc.free(block)
    freed = resident_mib()
    assert heap.release("cpu") and not heap.release("meta")
    released = resident_mib()
    libc.free(blocks[-1])
    assert touched - freed < 10, (touched, freed)        # free() alone kept the hole resident
    assert freed - released > 40, (freed, released)      # release() gave back most of 50 MiB
