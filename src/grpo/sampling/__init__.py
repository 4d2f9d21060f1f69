"""Step 1 of GRPO: sample a group of G completions per prompt from the current policy.

A `Sampler` returns a `Rollout` with completion masks built from the generated lengths (the EOS
token included), never from the pad id, which often equals EOS. It also returns the log-probs it
drew each token with, after temperature and the cut (top-k, top-p, min-p: models.Cut), which
the training log-probs apply too, so pi_old is the distribution that sampled.

Stop strings end a completion as EOS does, and the completion keeps them: its tokens run to the
one that completes the stop string, and its text, mask and log-probs hold exactly those tokens
(transformers' `stop_strings`; vLLM with `include_stop_str_in_output=True`).

    interface.py   what every engine meets and shares: the `Sampler` protocol, EOS ids, masks
                   from lengths, prompts with images
    own.py         grpo's own sampler (`sampler=hf`): `HFSampler` and its decode loop
    static.py      the same sampler on a static KV cache: slots, buckets, CUDA graphs
                   (`decode=static|graphs|compiled`; `own_sampler` picks by `decode`)
    engine.py      an engine with weights of its own, and the Sampler on any such engine
    engines.py     several engines as one (`vllm_url=[...]`), failover shared by every process
    vllm.py        vLLM as that engine, in the trainer's process
    vllm_server.py a `vllm serve` process as that engine, over HTTP, and its weights files
    episodes.py    multi-turn episodes, on grpo's own sampler or an engine

This face only re-exports the names other packages use.
"""

from grpo.sampling.interface import (Sampler, SharesThePolicy, completion_lengths, eos_ids,
                                     mask_from_lengths, vision_prompts)
from grpo.sampling.own import (PRUNE_FRACTION, HFSampler, cut_warper, draw, drawn_from, generate,
                               generate_with_lengths, placeholders, prompt_tokens_seen, stop_check,
                               vision_turns)
from grpo.sampling.static import StaticSampler, own_sampler, static_mode

__all__ = [
    "Sampler", "SharesThePolicy", "completion_lengths", "eos_ids", "mask_from_lengths",
    "vision_prompts",
    "PRUNE_FRACTION", "HFSampler", "cut_warper", "draw", "drawn_from", "generate",
    "generate_with_lengths", "placeholders", "prompt_tokens_seen", "stop_check", "vision_turns",
    "StaticSampler", "own_sampler", "static_mode",
]
