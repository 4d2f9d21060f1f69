"""Run a grpo command with every sampled completion forced to a given length, so that grpo and
TRL (benchmarks/trl_driver.py --lengths) do the same work on a model with random weights.

    python benchmarks/forced_lengths.py --lengths 64,2048,... -- bench model=DIR max_new_tokens=2048 ...

Row r of every sampled batch (prompts in order, each prompt's G rows together, as both libraries
lay them out) ends with EOS at token `lengths[r % len(lengths)]`: while sampling, the token drawn
at that step is replaced by EOS and an EOS drawn earlier by another token, as trl_driver.py's
logits processor does for TRL. The forced token's log-prob is the sampler's for that token. Rows
end where they are forced to, so grpo's sampler drops them from its batch as it would a real
policy's ragged completions. Everything else is grpo's own code.
"""

from __future__ import annotations

import argparse
import sys

import torch


def force(lengths: list[int]) -> None:
    from grpo.sampling import own
    original_generate, original_draw, original_keep = (own.generate_with_lengths, own.draw,
                                                        own._Cache.keep)

    def generate(model, prompt_ids, prompt_mask, max_new_tokens, eos_token_id, pad_token_id, **kw):
        n = prompt_ids.shape[0] * kw.get("group_size", 1)
        want = torch.tensor([min(lengths[r % len(lengths)], max_new_tokens) for r in range(n)])
        eos = eos_token_id[0] if isinstance(eos_token_id, list) else eos_token_id
        ends = own.eos_ids(eos_token_id)
        live = {"rows": torch.arange(n), "t": 0}      # original rows still in the batch; the step

        def draw(scores, greedy=False, u=None):
            chosen, lse = original_draw(scores, greedy, u)
            last = want[live["rows"]].to(chosen.device) - 1
            early = (last > live["t"]) & torch.isin(chosen, ends.to(chosen.device))
            chosen = torch.where(early, (chosen + 1) % scores.shape[-1], chosen)
            chosen = torch.where(last == live["t"], torch.full_like(chosen, eos), chosen)
            live["t"] += 1
            return chosen, lse

        def keep(cache, rows):
            live["rows"] = live["rows"][rows.cpu()]
            original_keep(cache, rows)

        own.draw, own._Cache.keep = draw, keep
        try:
            return original_generate(model, prompt_ids, prompt_mask, int(want.max()), eos_token_id,
                                     pad_token_id, **kw)
        finally:
            own.draw, own._Cache.keep = original_draw, original_keep
    own.generate_with_lengths = generate      # what the sampler (and generate) calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", required=True, help="comma-separated completion lengths, by row")
    ap.add_argument("grpo_args", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    force([int(x) for x in args.lengths.split(",")])
    from grpo.commands.cli import main as grpo_main
    rest = args.grpo_args[1:] if args.grpo_args[:1] == ["--"] else args.grpo_args
    sys.exit(grpo_main(rest))


if __name__ == "__main__":
    main()
