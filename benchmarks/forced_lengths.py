"""Run a grpo command with every sampled completion forced to a given length, so that grpo and
TRL (benchmarks/trl_driver.py --lengths) do the same work on a model with random weights.

    python benchmarks/forced_lengths.py --lengths 64,2048,... -- bench model=DIR max_new_tokens=2048 ...

Row r of every sampled batch (prompts in order, each prompt's G rows together, as both libraries
lay them out) ends with EOS at token `lengths[r % len(lengths)]`. The sampler decodes every row
to the longest length with EOS never ending a row early, as Hugging Face's generate does for a
batch; the forced EOS replaces the token drawn there (its sampler log-prob is the drawn token's,
which moves only `sampler/logp_diff`). Everything after sampling is grpo's own code.
"""

from __future__ import annotations

import argparse
import sys

import torch


def force(lengths: list[int]) -> None:
    from grpo import sampling
    original = sampling.generate

    def generate(model, prompt_ids, prompt_mask, max_new_tokens, eos_token_id, pad_token_id, **kw):
        n = prompt_ids.shape[0] * kw.get("group_size", 1)
        want = torch.tensor([min(lengths[r % len(lengths)], max_new_tokens) for r in range(n)])
        tokens, logprobs = original(model, prompt_ids, prompt_mask, int(want.max()), -1, pad_token_id, **kw)
        eos = eos_token_id[0] if isinstance(eos_token_id, list) else eos_token_id
        before = torch.arange(tokens.shape[1])[None] < (want - 1)[:, None]
        tokens[before & (tokens == eos)] = eos + 1       # an EOS drawn early does not end the row
        tokens[torch.arange(n), want - 1] = eos
        after = torch.arange(tokens.shape[1])[None] >= want[:, None]
        return tokens.masked_fill(after, pad_token_id), logprobs.masked_fill(after, 0.0)
    sampling.generate = generate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", required=True, help="comma-separated completion lengths, by row")
    ap.add_argument("grpo_args", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    force([int(x) for x in args.lengths.split(",")])
    from grpo.cli import main as grpo_main
    rest = args.grpo_args[1:] if args.grpo_args[:1] == ["--"] else args.grpo_args
    sys.exit(grpo_main(rest))


if __name__ == "__main__":
    main()
