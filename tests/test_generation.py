"""Generation settings: top_k, min_p and stop strings in grpo's own sampler, with the training
log-probs cut the same way; a chat template given as text or as a file."""

import math

import pytest
import torch

from grpo.config import ConfigError, build_config
from grpo.models import Cut, load_tokenizer, token_logprobs
from grpo.sampling import HFSampler
from grpo.update import logprobs_of

NEG = float("-inf")


# ---- The cut, by hand ------------------------------------------------------------------------------

def test_top_k_keeps_the_k_largest_logits_and_their_ties():
    assert Cut(top_k=2).apply_(torch.tensor([[2.0, 1.0, 0.0, -1.0]])).tolist() == [[2.0, 1.0, NEG, NEG]]
    # the 2nd largest value is 1, held by two tokens: both stay (transformers' TopKLogitsWarper)
    assert Cut(top_k=2).apply_(torch.tensor([[2.0, 1.0, 1.0, 0.0]])).tolist() == [[2.0, 1.0, 1.0, NEG]]
    # a drawn target is always kept (it was inside the sampler's cut)
    kept = Cut(top_k=1).apply_(torch.tensor([[2.0, 1.0, 0.0]]), torch.tensor([2]))
    assert kept.tolist() == [[2.0, NEG, 0.0]]


def test_min_p_drops_tokens_below_min_p_times_the_largest_probability():
    # p_i / p_max = exp(l_i - 2) = 1, 0.368, 0.135, 0.050
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    assert Cut(min_p=0.3).apply_(logits.clone()).tolist() == [[2.0, 1.0, NEG, NEG]]
    assert Cut(min_p=0.4).apply_(logits.clone()).tolist() == [[2.0, NEG, NEG, NEG]]
    assert Cut(min_p=0.1).apply_(logits.clone()).tolist() == [[2.0, 1.0, 0.0, NEG]]
    # after the cut the kept tokens renormalize: min_p=0.3 leaves e^2 / (e^2 + e^1)
    p = Cut(min_p=0.3).apply_(logits.clone()).softmax(-1)
    assert p[0, 0].item() == pytest.approx(math.e / (math.e + 1), abs=1e-6)


# ---- The sampler and the trainer see one distribution ----------------------------------------------

def _prompts():
    return ["abc", "12+3=", "hello"]


def test_top_k_1_samples_what_greedy_decoding_does_with_log_prob_0(tiny):
    policy, tok = tiny
    torch.manual_seed(0)
    sampled = HFSampler(policy, tok, max_new_tokens=8, top_k=1).sample(_prompts(), 2)
    greedy = HFSampler(policy, tok, max_new_tokens=8).sample(_prompts(), 2, greedy=True)
    assert sampled.completion_ids.tolist() == greedy.completion_ids.tolist()
    assert sampled.top_k == 1
    # one token left: each drawn with probability 1, in the sampler and in the trainer alike
    assert sampled.sampler_logprobs.abs().max().item() == 0.0
    trained = logprobs_of(policy, sampled, micro_batch_size=8)
    assert trained.abs().max().item() == 0.0


@pytest.mark.parametrize("settings", [dict(top_k=5, min_p=0.05, temperature=0.8),
                                      dict(top_k=7, top_p=0.9, min_p=0.02, temperature=1.3)])
def test_the_recorded_log_probs_are_those_training_computes(tiny, settings):
    policy, tok = tiny
    torch.manual_seed(1)
    rollout = HFSampler(policy, tok, max_new_tokens=10, **settings).sample(_prompts(), 4)
    trained = logprobs_of(policy, rollout, micro_batch_size=6)
    torch.testing.assert_close(trained, rollout.sampler_logprobs, rtol=0, atol=2e-5)
    # and the cut is real: under the uncut distribution the same tokens are less likely
    plain = token_logprobs(policy, rollout.input_ids, rollout.attention_mask,
                           rollout.completion_ids.shape[1], temperature=settings["temperature"],
                           completion_mask=rollout.completion_mask)[0]
    assert (plain.sum() < trained.sum() - 0.5).item()


def test_a_stop_string_ends_the_completion_and_is_kept(tiny):
    policy, tok = tiny
    free = HFSampler(policy, tok, max_new_tokens=12).sample(["abc"], 1, greedy=True)
    ids = free.completion_ids[0, : int(free.completion_mask[0].sum())].tolist()
    assert len(ids) >= 4, "the test needs a longer greedy completion"
    stop = tok.decode(ids[2:4])                      # the text of its 3rd and 4th tokens
    # the first k whose text holds the stop string: 4, unless it occurs earlier
    k = next(n for n in range(1, len(ids) + 1) if stop in tok.decode(ids[:n]))
    stopped = HFSampler(policy, tok, max_new_tokens=12, stop=(stop,)).sample(["abc"], 1, greedy=True)
    assert int(stopped.completion_mask.sum()) == k
    assert stopped.completion_ids[0, :k].tolist() == ids[:k]
    assert stopped.completions[0] == tok.decode(ids[:k]) and stopped.completions[0].endswith(stop)
    assert not bool(stopped.truncated[0])            # it ended, as at EOS
    assert (stopped.sampler_logprobs[0, k:] == 0).all()
    trained = logprobs_of(policy, stopped, micro_batch_size=4)
    torch.testing.assert_close(trained, stopped.sampler_logprobs, rtol=0, atol=2e-5)


def test_stop_strings_cut_each_row_of_a_group_where_its_own_text_stops(tiny):
    policy, tok = tiny
    torch.manual_seed(3)
    rollout = HFSampler(policy, tok, max_new_tokens=16, stop=("e", "1")).sample(_prompts(), 4)
    for row in range(len(rollout)):
        n = int(rollout.completion_mask[row].sum())
        text = tok.decode(rollout.completion_ids[row, :n].tolist())
        before = tok.decode(rollout.completion_ids[row, : n - 1].tolist())
        assert "e" not in before and "1" not in before
        ended_at_eos = rollout.completion_ids[row, n - 1].item() == tok.eos_token_id
        stopped = "e" in text or "1" in text        # (a token such as "<answer>" may end past it)
        assert bool(rollout.truncated[row]) == (n == 16 and not ended_at_eos and not stopped)
        assert ended_at_eos or stopped or n == 16


# ---- Config ----------------------------------------------------------------------------------------

def test_the_keys_are_range_checked_and_refused_where_they_would_be_ignored():
    with pytest.raises(ConfigError, match="config key 'top_k' must be 0 or more"):
        build_config({"top_k": -1})
    with pytest.raises(ConfigError, match=r"config key 'min_p' must be in \[0, 1\)"):
        build_config({"min_p": 1.0})
    with pytest.raises(ConfigError, match="config key 'stop': an empty stop string"):
        build_config({"stop": ["</answer>", ""]})
    with pytest.raises(ConfigError, match="config keys top_k, stop: .*sampler=vllm does not yet"):
        build_config({"top_k": 5, "stop": ["x"], "sampler": "vllm"})
    c = build_config({"top_k": 5, "min_p": 0.1, "stop": ["</answer>"]})
    assert (c.sampling.top_k, c.sampling.min_p, c.sampling.stop) == (5, 0.1, ["</answer>"])


def test_a_run_samples_with_the_keys(tmp_path, tiny_model_dir):
    from grpo.train import train
    c = build_config({"model": str(tiny_model_dir), "sft_steps": 0, "steps": 1, "eval_every": 0,
                      "prompts_per_step": 2, "group_size": 3, "max_new_tokens": 8, "top_k": 1,
                      "stop": ["="], "output_dir": str(tmp_path / "run")})
    seen = []

    def reward(prompts, completions, **columns):
        seen.extend(completions)
        return [0.0] * len(completions)
    train(c, reward_fns=[reward], log=lambda line: None)
    seen = seen[-6:]                                 # step 1's groups (after any check at start)
    # top_k=1: each group's three completions are the same greedy one
    assert seen[0] == seen[1] == seen[2] and seen[3] == seen[4] == seen[5]
    assert all("=" not in s[:-1] for s in seen)


# ---- A chat template of one's own ------------------------------------------------------------------

TEMPLATE = ("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% endif %}")


def test_a_chat_template_given_as_text_or_as_a_file_is_used(tmp_path, tiny_model_dir):
    from grpo.data import format_prompt
    path = tmp_path / "chat.jinja"
    path.write_text(TEMPLATE)
    for value in (TEMPLATE, str(path)):
        c = build_config({"chat_template": value})
        tok = load_tokenizer(str(tiny_model_dir), c.model.chat_template)
        assert tok.chat_template == TEMPLATE
        assert format_prompt(tok, "2+2=", c.model.chat_template, "Be brief.") == \
            "[system]Be brief.[user]2+2=[assistant]"
    with pytest.raises(ConfigError, match=r"config key 'chat_template' must be .*'nope.jinja' is none"):
        build_config({"chat_template": "nope.jinja"})


def test_explain_takes_the_sampling_keys():
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "grpo.commands.cli", "explain", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0
    assert all(f"  {key}=" in done.stdout for key in ("top_k", "min_p", "stop"))


def test_sampled_evaluation_draws_from_the_whole_distribution_and_restores_the_cut(tiny):
    # pass@k with eval_samples > 1 was drawn under the run's top_k and min_p (only top_p was reset)
    from grpo.evaluate import sampling_at
    model, tok = tiny
    sampler = HFSampler(model, tok, max_new_tokens=4, temperature=1.3, top_p=0.9, top_k=1, min_p=0.5)
    with sampling_at(sampler, 0.7, seed=0, device=None) as s:
        assert (s.temperature, s.top_p, s.top_k, s.min_p) == (0.7, 1.0, 0, 0.0)
    assert (sampler.temperature, sampler.top_p, sampler.top_k, sampler.min_p) == (1.3, 0.9, 1, 0.5)


# ---- The repetition penalty --------------------------------------------------------------------------

def test_the_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    from grpo.models import penalize_
    scores = torch.tensor([[2.0, -1.0, 0.5, -0.5]])
    seen = torch.tensor([[True, True, False, False]])
    assert penalize_(scores, seen, 2.0).tolist() == [[1.0, -2.0, 0.5, -0.5]]
    # logits [1, -1, 0], tokens 0 and 1 seen, factor 2: [0.5, -2, 0], so
    # log p(0) = 0.5 - log(e^0.5 + e^-2 + e^0) = 0.5 - log(2.784058) = -0.523909
    penalized = penalize_(torch.tensor([[1.0, -1.0, 0.0]]), torch.tensor([[True, True, False]]), 2.0)
    assert penalized.log_softmax(-1)[0, 0].item() == pytest.approx(-0.523909, abs=1e-6)


def test_the_training_penalty_marks_prompt_tokens_and_those_drawn_before_each_position():
    from grpo.models import Penalty
    # prompt [pad, 5, 3] (the pad, token 0, is not in the prompt), completion [3, 7, 7, pad]
    penalty = Penalty.of(2.0, torch.tensor([[0, 5, 3]]), torch.tensor([[0, 1, 1]]),
                         torch.tensor([[3, 7, 7, 0]]), torch.tensor([[1, 1, 1, 0]]), vocab=8)
    positive = torch.ones(3, 8)                 # the three completion positions, all logits 1
    penalized = [set((penalty.scale(positive)[j] == 0.5).nonzero().squeeze(-1).tolist())
                 for j in range(3)]
    assert penalized == [{3, 5}, {3, 5}, {3, 5, 7}]
    assert penalty.scale(-positive)[2].tolist() == [1, 1, 1, 2, 1, 2, 1, 2]   # negatives x 2
    assert Penalty.of(1.0, *[torch.zeros(1, 1, dtype=torch.long)] * 4, vocab=8) is None


def test_the_chunked_penalized_log_probs_and_gradients_are_those_of_plain_autograd(monkeypatch):
    from grpo import models
    from grpo.models import Penalty, selected_logprobs
    monkeypatch.setattr(models.logprobs, "LOGIT_CHUNK_ELEMENTS", 3 * 40)   # 3 positions per chunk, 4 chunks
    gen = torch.Generator().manual_seed(0)
    completion = torch.randint(0, 40, (2, 6), generator=gen)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    penalty = Penalty.of(1.7, torch.randint(0, 40, (2, 3), generator=gen), torch.ones(2, 3),
                         completion, mask, vocab=40)
    head = torch.nn.Linear(16, 40, bias=False)
    hidden = torch.randn(int(mask.sum()), 16, generator=gen, requires_grad=True)
    targets = completion[mask.bool()]
    logp, _ = selected_logprobs(hidden, head, targets, temperature=0.7, penalty=penalty, top_k=30)
    (logp * torch.linspace(-1, 1, len(logp))).sum().backward()
    chunked = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None
    logits = head(hidden) / 0.7
    logits = logits * penalty.scale(logits.detach())
    keep = Cut(top_k=30).apply_(logits.detach().clone(), targets).isfinite()
    logits = torch.where(keep, logits, NEG)
    plain = logits.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    (plain * torch.linspace(-1, 1, len(plain))).sum().backward()
    torch.testing.assert_close(logp, plain, rtol=0, atol=1e-5)
    torch.testing.assert_close(chunked[0], hidden.grad, rtol=0, atol=1e-5)
    torch.testing.assert_close(chunked[1], head.weight.grad, rtol=0, atol=1e-5)


def test_penalized_samples_repeat_less_and_training_scores_them_as_they_were_drawn(tiny):
    policy, tok = tiny

    def sample(penalty):
        torch.manual_seed(2)
        return HFSampler(policy, tok, max_new_tokens=16, temperature=0.7, top_k=20,
                         repetition_penalty=penalty).sample(_prompts(), 4)

    def repeated(rollout) -> float:       # share of completion tokens already in prompt or completion
        hits = total = 0
        for prompt, ids, mask in zip(rollout.prompt_ids.tolist(), rollout.completion_ids.tolist(),
                                     rollout.completion_mask.tolist()):
            before = set(prompt) - {tok.pad_token_id}
            for token, real in zip(ids, mask):
                if real:
                    hits, total = hits + (token in before), total + 1
                    before.add(token)
        return hits / total
    plain, penalized = sample(1.0), sample(3.0)
    assert penalized.repetition_penalty == 3.0
    assert repeated(penalized) < repeated(plain) - 0.1, (repeated(plain), repeated(penalized))
    trained = logprobs_of(policy, penalized, micro_batch_size=5)
    torch.testing.assert_close(trained, penalized.sampler_logprobs, rtol=0, atol=2e-5)
    unpenalized = token_logprobs(policy, penalized.input_ids, penalized.attention_mask,
                                 penalized.completion_ids.shape[1], temperature=0.7, top_k=20,
                                 completion_mask=penalized.completion_mask)[0]
    assert (unpenalized - trained).abs().max().item() > 0.1


def test_the_repetition_penalty_key_is_checked_and_refused_where_it_would_be_ignored(tiny):
    from grpo.evaluate import sampling_at
    with pytest.raises(ConfigError, match=r"config key 'repetition_penalty' must be above 0"):
        build_config({"repetition_penalty": 0})
    with pytest.raises(ConfigError, match="config key repetition_penalty: .*sampler=vllm does not yet"):
        build_config({"repetition_penalty": 1.2, "sampler": "vllm"})
    with pytest.raises(ConfigError, match="config key repetition_penalty: single-turn"):
        build_config({"repetition_penalty": 1.2, "environment": "guess_number"})
    assert build_config({"repetition_penalty": 1.2}).sampling.repetition_penalty == 1.2
    # evaluation measures the model's own distribution: greedy and sampled, unpenalized
    model, tok = tiny
    sampler = HFSampler(model, tok, max_new_tokens=4, repetition_penalty=1.5)
    assert sampler.sample(["abc"], 1, greedy=True).repetition_penalty == 1.0
    with sampling_at(sampler, 0.7, seed=0, device=None) as s:
        assert s.repetition_penalty == 1.0
    assert sampler.repetition_penalty == 1.5
