"""The cost of turns: a group of 4-turn episodes against single-turn completions of the same length.

    python benchmarks/turn_overhead.py [--hidden 128] [--layers 4] [--group 16] [--turn 32]
                                       [--turns 4] [--repeats 5]

Both sides write the same number of tokens per row, on the same tiny model and the same lean
decoder. The episode's policy writes `--turn` tokens per turn, ending in a calculator call (the
draws are made as usual, then replaced by that script so every row's turns have the same length);
the calculator's answer (`<result>2</result>`, 18 tokens) goes into the cache after each turn but
the last. The
single-turn side samples as many tokens in one completion (`turns * turn + (turns - 1) * 18`: the
last turn is not answered); a third side samples only
the policy's share, `turns * turn`, for scale. EOS is switched off on
both sides so lengths are exact. The difference is the turn overhead: parsing each turn, running
the tool, tokenizing its answer, putting it into the cache, and the per-token bookkeeping of
episodes. Prints one JSON line: median milliseconds per group on each side (side by side, the
repeats interleaved) and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

import grpo.sampling.episodes as episodes
import grpo.sampling.own as own
from grpo.models import build_tiny
from grpo.sampling import HFSampler
from grpo.agents.tools import resolve_tools

RESULT = "<result>2</result>"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--turn", type=int, default=32, help="policy tokens per turn")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = build_tiny(tempfile.mkdtemp(), hidden_size=args.hidden, layers=args.layers)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    call = "<call>calculator 1+1</call>"
    filler = args.turn - len(tokenizer(call, add_special_tokens=False).input_ids)
    if filler < 0:
        raise SystemExit(f"--turn must be at least {args.turn - filler} tokens (the call itself)")
    script = tokenizer("x" * filler + call, add_special_tokens=False).input_ids
    observation = len(tokenizer(RESULT, add_special_tokens=False).input_ids)
    total = args.turns * args.turn + (args.turns - 1) * observation   # the last turn gets no answer

    no_eos = torch.tensor([-1])
    own.eos_ids = episodes.eos_ids = lambda *a, **k: no_eos.to(a[1] if len(a) > 1 else None)
    draw, position = episodes.draw, [0]

    def scripted(scores, greedy, u):
        chosen, lse = draw(scores, greedy, u)
        chosen = torch.full_like(chosen, script[position[0] % len(script)])
        position[0] += 1
        return chosen, lse
    episodes.draw = scripted

    prompts = ["What is 1+1?"]
    limits = episodes.EpisodeLimits(max_turns=args.turns, turn_tokens=args.turn,
                                    episode_tokens=total, observation_tokens=64)
    multi = episodes.EpisodeSampler(model, tokenizer, limits=limits,
                                    tools=resolve_tools(["calculator"]), call_format="plain",
                                    make_env=None)
    single = HFSampler(model, tokenizer, max_new_tokens=total)
    policy_only = HFSampler(model, tokenizer, max_new_tokens=args.turns * args.turn)

    def run_multi():
        position[0] = 0
        return multi.sample(prompts, args.group)

    times: dict[str, list[float]] = {"single_turn": [], "episode": [], "single_turn_policy_tokens": []}
    check = None
    for _ in range(args.repeats + 1):          # the first round warms up and is not counted
        for name, fn in (("single_turn", lambda: single.sample(prompts, args.group)),
                         ("episode", run_multi),
                         ("single_turn_policy_tokens", lambda: policy_only.sample(prompts, args.group))):
            start = time.perf_counter()
            result = fn()
            times[name].append(time.perf_counter() - start)
            if name == "episode":
                check = result
    lengths = check.context_mask.sum(-1).tolist()
    assert all(n == total for n in lengths), f"episodes of {set(lengths)} tokens, not {total}"
    assert check.episodes.turns == [args.turns] * args.group
    ms = {k: round(1000 * statistics.median(v[1:]), 1) for k, v in times.items()}
    print(json.dumps({
        "hidden": args.hidden, "layers": args.layers, "group": args.group, "turns": args.turns,
        "policy_tokens_per_turn": args.turn, "env_tokens_per_turn": observation,
        "tokens_per_row": total, "ms_per_group": ms,
        "tokens_per_s": {k: round(args.group * total / (ms[k] / 1000), 1)
                         for k in ("single_turn", "episode")},
        "episode_over_single": round(ms["episode"] / ms["single_turn"], 2),
        "torch_threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
