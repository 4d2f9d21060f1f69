"""The `Rollout`: everything one step samples and scores, with shapes spelled out.

Shape glossary:
    B  prompts in the step            (`prompts_per_step`)
    G  completions per prompt          (`group_size`)
    N  = B*G completions, one row each
    P  prompt tokens (left-padded)     T  completion tokens (right-padded, EOS included)

Groups are tracked by `group_ids`, not by position, so reordering or splitting rows cannot mix them.

A multi-turn episode (episodes.py) is the same structure: its "completion" is every token after
the prompt, the policy's turns and the tools' and environment's answers, in order, as one token
sequence. `completion_mask` marks the tokens the policy wrote (the loss, the KL, the entropy and
every aggregation see only those); `context_mask` marks every real token (what attention sees).
A single-turn completion has `context_mask` None: the two are the same.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace

import torch


PAD = "pad_token_id"   # a completion or prompt id column is padded with the tokenizer's pad id


def _f(kind: str, default=dataclasses.MISSING, *, pad=0, join: str = "always", factory=None):
    """A Rollout field, declared once: its `kind` says how `rows`, `trimmed`, `to` and `concat`
    treat it, `pad` what concat pads it with, `join` when concat keeps it.

    kinds:  text [N] list of str | row [N] tensor | prompt [N, P] tensor (left-padded) |
            token [N, T] tensor (right-padded; advantages may be [N]) | setting (one value for
            every row) | named {name: [N] list} | objects [N] list of objects, or None |
            episodes an Episodes (its fields [N] lists), or None
    join:   always | if_first (the first part has it) | if_all (every part has it) |
            if_any (any part has it; context_mask joins the parts' real_mask) | never (computed
            after a concat: pi_old, pi_ref, advantages and the loss mask)"""
    metadata = {"kind": kind, "pad": pad, "join": join}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Episodes:
    """A multi-turn rollout's bookkeeping (sampling/episodes.py), one entry per row in each field."""
    turns: list[int]                        # the policy's turns in the episode
    turn_ends: list[list[int]]              # each turn's last token: its position in the completion
    turn_rewards: list[list[float | None]]  # the environment's reward after each turn (None: none)
    env_reward: list[float | None]          # the episode's: their sum, None where it gave none
    tool_calls: list[int]
    tool_failures: list[int]                # tool calls that raised, overran or were malformed
    env_failures: list[int]                 # env.reset or env.step calls that failed
    spans: list[list]                       # [start, end, "policy" | "env"]: character offsets of
    #                                         the completion's runs, who wrote each

    def rows(self, positions: list[int]) -> "Episodes":
        return Episodes(**{f.name: [getattr(self, f.name)[i] for i in positions]
                           for f in dataclasses.fields(self)})

    @staticmethod
    def joined(parts: list["Episodes"]) -> "Episodes":
        """The parts' rows, in order, in one."""
        return Episodes(**{f.name: [v for p in parts for v in getattr(p, f.name)]
                           for f in dataclasses.fields(Episodes)})


@dataclass
class Rollout:
    prompts: list[str] = _f("text")                 # [N] prompt text, repeated for each member of its group
    completions: list[str] = _f("text")             # [N] decoded completion text (EOS and padding stripped)
    group_ids: torch.Tensor = _f("row")             # [N] long; rows with the same id share a prompt
    prompt_ids: torch.Tensor = _f("prompt", pad=PAD)   # [N, P] left-padded
    prompt_mask: torch.Tensor = _f("prompt")        # [N, P] 1 on real prompt tokens
    completion_ids: torch.Tensor = _f("token", pad=PAD)   # [N, T] right-padded
    completion_mask: torch.Tensor = _f("token")     # [N, T] 1 on generated tokens up to and including EOS
    sampler_logprobs: torch.Tensor = _f("token", pad=0.0)   # [N, T] log-probs the sampler drew each token with
    truncated: torch.Tensor = _f("row")             # [N] bool; hit max_new_tokens before EOS
    temperature: float = _f("setting", 1.0)         # the sampler's; log-probs of pi are taken at this temperature
    top_p: float = _f("setting", 1.0)               # and with this nucleus (models.nucleus_)
    top_k: int = _f("setting", 0)                   # and this top-k (0: none), and
    min_p: float = _f("setting", 0.0)               # this min-p (0: none), cut as models.Cut says, after
    repetition_penalty: float = _f("setting", 1.0)  # this repetition penalty (1: none; models.Penalty)
    columns: dict[str, list] = _f("named", factory=dict)   # dataset columns, each [N]
    rewards: torch.Tensor | None = _f("row", None, join="if_first")   # [N] float; NaN where no function could score
    rewards_per_fn: dict[str, list] = _f("named", factory=dict)   # name -> [N] float | None
    advantages: torch.Tensor | None = _f("token", None, join="never")   # [N], or [N, T] per token (turn rewards, REINFORCE++)
    old_logprobs: torch.Tensor | None = _f("token", None, join="never")   # [N, T] pi_old, fixed for the mu updates
    ref_logprobs: torch.Tensor | None = _f("token", None, join="never")   # [N, T] pi_ref; None when beta = 0
    teacher_logprobs: torch.Tensor | None = _f("token", None, join="never")   # [N, T] the teacher's (distillation); None without one
    loss_mask: torch.Tensor | None = _f("token", None, join="never")   # [N, T] tokens that enter the loss; None = completion_mask
    context_mask: torch.Tensor | None = _f("token", None, join="if_any")   # [N, T] every real token after the prompt; None = completion_mask
    episodes: Episodes | None = _f("episodes", None, join="if_first")   # multi-turn bookkeeping; None: single-turn
    versions: torch.Tensor | None = _f("token", None, pad=-1, join="if_all")   # [N, T] long: the weight
    #                                              version (optimizer steps behind it) that drew each token; None: this step's
    visuals: list | None = _f("objects", None, join="if_any")   # [N] vision.Visual or None: the prompt's
    #                                              images as the processor made them, one object per group

    def __len__(self) -> int:
        return len(self.completions)

    def __setstate__(self, state: dict) -> None:
        """Unpickled: a Rollout pickled before Episodes (the groups queued in an older
        checkpoint's pipeline.pt) held its bookkeeping as a dict of lists, empty when single-turn."""
        episodes = state.get("episodes")
        if isinstance(episodes, dict):
            state = {**state, "episodes": Episodes(**episodes) if episodes else None}
        self.__dict__.update(state)

    @property
    def input_ids(self) -> torch.Tensor:       # [N, P+T]
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def real_mask(self) -> torch.Tensor:       # [N, T] tokens after the prompt that exist
        return self.completion_mask if self.context_mask is None else self.context_mask

    @property
    def attention_mask(self) -> torch.Tensor:  # [N, P+T]
        return torch.cat([self.prompt_mask, self.real_mask], dim=1)

    def rows(self, index: slice | list[int]) -> "Rollout":
        """Some rows (a slice for micro-batching, or a list of row numbers); lists and tensors alike."""
        positions = list(range(len(self)))[index] if isinstance(index, slice) else list(index)
        tensor_index = index if isinstance(index, slice) else torch.tensor(positions, dtype=torch.long)

        def cut(x):
            if x is None:
                return None
            if isinstance(x, list):
                return [x[i] for i in positions]
            return x[tensor_index]
        changes = {}
        for f, kind in _kinds():
            value = getattr(self, f)
            if kind == "named":
                changes[f] = {k: cut(v) for k, v in value.items()}
            elif kind == "episodes":
                changes[f] = None if value is None else value.rows(positions)
            elif kind != "setting":
                changes[f] = cut(value)
        return replace(self, **changes)

    def trimmed(self) -> "Rollout":
        """The same rows without the prompt columns that are padding in every row (on the left)
        and the completion columns past the longest completion (on the right)."""
        real_prompt = self.prompt_mask.any(0).nonzero()
        start = int(real_prompt[0]) if len(real_prompt) else self.prompt_mask.shape[1]
        end = max(1, int(self.real_mask.sum(-1).max())) if len(self) else 1

        def cut(x, left: bool):
            if x is None or x.dim() < 2:
                return x
            return x[:, start:] if left else x[:, :end]
        return replace(self, **{f: cut(getattr(self, f), kind == "prompt")
                                for f, kind in _kinds() if kind in ("prompt", "token")})

    def to(self, device) -> "Rollout":
        """The same rows with every tensor on `device` (the model's, for a forward pass)."""
        return replace(self, **{f: getattr(self, f).to(device) for f, kind in _kinds()
                                if kind in ("row", "prompt", "token")
                                and isinstance(getattr(self, f), torch.Tensor)})

    @property
    def tokens_in_loss(self) -> torch.Tensor:  # [N, T]
        return self.completion_mask if self.loss_mask is None else self.loss_mask

    @property
    def scored_tokens(self) -> torch.Tensor:  # [N, T]: tokens_in_loss of the rows with a reward
        return self.tokens_in_loss * (~torch.isnan(self.rewards)).long().unsqueeze(-1)


def _kinds() -> list[tuple[str, str]]:
    return _KINDS


def concat(parts: list[Rollout], pad_token_id: int) -> Rollout:
    """Rows of several sampled (and perhaps scored) rollouts in one: prompts re-padded on the left,
    completions on the right, group ids offset so groups from different parts never merge; each
    field as its declaration says (`join`: what was computed after sampling is left out)."""
    P = max(p.prompt_ids.shape[1] for p in parts)
    T = max(p.completion_ids.shape[1] for p in parts)
    values = {}
    for f in dataclasses.fields(Rollout):
        kind, join = f.metadata["kind"], f.metadata["join"]
        pad = pad_token_id if f.metadata["pad"] == PAD else f.metadata["pad"]
        have = [getattr(p, f.name) is not None for p in parts]
        if join == "never" or (join == "if_first" and not have[0]) or (join == "if_all" and not all(have)) \
                or (join == "if_any" and not any(have)):
            continue
        if kind == "text":
            values[f.name] = [x for p in parts for x in getattr(p, f.name)]
        elif kind == "setting":
            values[f.name] = getattr(parts[0], f.name)
        elif kind == "named":
            values[f.name] = {k: [v for p in parts for v in getattr(p, f.name)[k]]
                              for k in getattr(parts[0], f.name)}
        elif kind == "objects":
            values[f.name] = [v for p in parts for v in (getattr(p, f.name) or [None] * len(p))]
        elif kind == "episodes":
            values[f.name] = Episodes.joined([getattr(p, f.name) for p in parts])
        elif kind == "row":
            values[f.name] = torch.cat([getattr(p, f.name) for p in parts])
        else:
            width, side = (P, "left") if kind == "prompt" else (T, "right")
            # the context is every real token: a part without a context_mask has its completion_mask
            tensors = [p.real_mask if f.name == "context_mask" else getattr(p, f.name) for p in parts]
            values[f.name] = torch.cat([_padded(x, width, pad, side) for x in tensors])
    offset, group_ids = 0, []
    for p in parts:
        group_ids.append(p.group_ids + offset)
        offset += int(p.group_ids.max()) + 1 if len(p) else 0
    values["group_ids"] = torch.cat(group_ids)
    return Rollout(**values)


def _padded(x: torch.Tensor, width: int, value: float, side: str) -> torch.Tensor:
    extra = width - x.shape[1]
    return torch.nn.functional.pad(x, (extra, 0) if side == "left" else (0, extra), value=value)


_KINDS = [(f.name, f.metadata["kind"]) for f in dataclasses.fields(Rollout)]
