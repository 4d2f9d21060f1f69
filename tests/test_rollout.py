"""The Rollout's fields are declared once (kind, padding, when concat keeps them); rows, trimmed,
to and concat are derived from the declarations, so a new field cannot be forgotten in one of them."""

import dataclasses

import torch

from grpo.models import build_tiny_tokenizer
from grpo.rollout import Episodes, Rollout, concat
from helpers import make_rollout

KINDS = {"text", "row", "prompt", "token", "setting", "named", "objects", "episodes"}
JOINS = {"always", "if_first", "if_all", "if_any", "never"}


def full_rollout():
    tok = build_tiny_tokenizer()
    r = make_rollout(tok)
    n, t = r.completion_ids.shape
    r.rewards = torch.tensor([1.0, 0.0, float("nan"), 2.0, 0.5, -1.0])
    r.rewards_per_fn = {"f": [1.0, 0.0, None, 2.0, 0.5, -1.0]}
    r.columns = {"answer": list("abcdef")}
    r.episodes = Episodes(turns=[1, 2, 1, 3, 1, 2], turn_ends=[[i] for i in range(n)],
                          turn_rewards=[[0.5]] * n, env_reward=[0.5, None, 1.0, 2.0, None, 0.0],
                          tool_calls=list(range(n)), tool_failures=[0] * n, env_failures=[1] * n,
                          spans=[[[0, i, "policy"]] for i in range(n)])
    r.versions = torch.arange(n * t).view(n, t)
    r.context_mask = r.completion_mask.clone()
    r.visuals = [object() for _ in range(n)]
    r.advantages = torch.arange(n, dtype=torch.float)
    return r, tok.pad_token_id


def test_every_field_is_declared_with_a_kind_and_a_join():
    for f in dataclasses.fields(Rollout):
        assert f.metadata.get("kind") in KINDS and f.metadata.get("join") in JOINS, f.name


def test_rows_then_concat_gives_back_every_field_it_joins():
    r, pad = full_rollout()
    back = concat([r.rows([0, 1, 2]), r.rows([3, 4, 5])], pad)
    for f in dataclasses.fields(Rollout):
        got, want = getattr(back, f.name), getattr(r, f.name)
        if f.metadata["join"] == "never":
            assert got is None, f.name            # computed after sampling, never carried over
        elif f.name == "group_ids":
            assert got.tolist() == [0, 0, 0, 2, 2, 2]   # the second part's groups offset by the first's
        elif isinstance(want, torch.Tensor):
            torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True, msg=f.name)
        else:
            assert got == want, f.name


def test_a_concat_pads_each_field_as_declared_and_rows_and_trimmed_cut_every_field():
    r, pad = full_rollout()
    short = r.rows([1]).trimmed()          # completion of 2 tokens: every token field cut to 2
    for f in dataclasses.fields(Rollout):
        value = getattr(short, f.name)
        if f.metadata["kind"] == "token" and isinstance(value, torch.Tensor) and value.dim() == 2:
            assert value.shape == (1, 2), f.name
        elif f.metadata["kind"] in ("text", "objects", "row"):
            assert len(value) == 1, f.name
    long = r.rows([0])
    joined = concat([short, long], pad)
    assert joined.completion_ids[0, 2:].tolist() == [pad] * 3 and joined.versions[0, 2:].tolist() == [-1] * 3
    assert joined.sampler_logprobs[0, 2:].tolist() == [0.0] * 3 and joined.completion_mask[0, 2:].sum() == 0
    assert joined.visuals[0] is r.visuals[1] and joined.visuals[1] is r.visuals[0]


def test_a_rollout_pickled_with_its_episodes_as_a_dict_loads_with_episodes(tmp_path):
    # The groups queued in an async_steps checkpoint (pipeline.pt) are pickled Rollouts; those an
    # earlier version wrote hold the episodes' bookkeeping as a dict of lists ({} single-turn).
    r, _ = full_rollout()
    fields = {f.name: getattr(r.episodes, f.name) for f in dataclasses.fields(Episodes)}
    old_agent, old_single = r.rows([0, 1, 2]), r.rows([3, 4])
    old_agent.__dict__["episodes"] = {k: v[:3] for k, v in fields.items()}   # as it was pickled
    old_single.__dict__["episodes"] = {}
    torch.save([{"queued": {4: [{"step": 4, "rollout": old_agent}, {"step": 4, "rollout": old_single}]}}],
               tmp_path / "pipeline.pt")
    (state,) = torch.load(tmp_path / "pipeline.pt", weights_only=False)
    agent, single = (p["rollout"] for p in state["queued"][4])
    assert agent.episodes == r.rows([0, 1, 2]).episodes and single.episodes is None
    assert concat([agent, agent], 0).episodes.turns == [1, 2, 1] * 2
