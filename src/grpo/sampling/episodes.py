"""Multi-turn episodes: the policy writes a turn, tools or an environment answer, and so on.

An episode is kept as token ids from the first prompt token to the last (token in, token out):
what the model generated and what tools and environments answered, each tokenized once and
appended, never re-tokenized from text. The result is an ordinary `Rollout` whose completion is
every token after the prompt, `completion_mask` on the policy's tokens and `context_mask` on all
(rollout.py), so every advantage estimator, loss and aggregation works on it unchanged.

A group's episodes advance together, turn by turn, on one KV cache (decoder.Decoder):

    prefill the prompts once per group                         decoder.start
    for each turn:
        decode one token per row until every row ended its turn  decoder.step
            (a row that ended waits: its slots are invisible and its position stays)
        each row: the turn's text -> tool calls (agents/tools.py) or env.step (agents/environments.py)
        rows whose episode is over leave the cache                decoder.keep
        the answers, right-padded, go into the cache at once      decoder.extend
            (a turn costs its new tokens, never a new prefill of the history)

A turn ends at EOS, at the call format's closing tag (`</call>`, `</tool_call>`), or at
`turn_tokens`, and is answered however it ended (a turn cut at `turn_tokens` goes to its calls or
the environment like any other); an episode ends when the environment says so, when a turn without
a call has no environment to answer it, after `max_turns`, or at `episode_tokens`. An episode cut by
a limit (`max_turns`, `episode_tokens`, or a turn cut at `turn_tokens` that nothing answers) is
`truncated`, handled like a truncated completion (`mask_truncated`, overlong shaping).

Longer than about 400 lines: multi-turn episodes on either engine: one state machine of turns, tool
calls and observations.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

import torch

from grpo.models import decoder
from grpo import vision
from grpo.agents.environments import (EnvironmentError_, as_step, checked_instance, label,
                                      method_tools, with_deadline)
from grpo.rollout import Episodes, Rollout
from grpo.sampling.interface import SharesThePolicy, eos_ids, vision_prompts
from grpo.sampling.own import draw, vision_turns
from grpo.agents.tools import FORMATS, IMAGE_MARK, CallFormat, Tool, run_call


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int = 4              # model turns per episode
    turn_tokens: int = 64           # tokens the model writes in one turn
    episode_tokens: int = 512       # every token after the prompt, model's and environment's
    observation_tokens: int = 256   # an answer longer than this is cut
    deadline_s: float = 5.0         # per tool call, env.reset and env.step


@dataclass
class Episode:
    row: dict
    env: Any
    tools: dict[str, Tool]
    ids: list[int] = field(default_factory=list)        # every token after the prompt
    policy: list[bool] = field(default_factory=list)    # which of them the policy wrote
    logprobs: list[float] = field(default_factory=list)
    turn_start: int = 0
    turn_ends: list[int] = field(default_factory=list)  # index of each turn's last policy token
    turn_rewards: list = field(default_factory=list)    # the environment's reward per turn, or None
                                                        # (one per entry of turn_ends)
    drawn: int = 0                                      # policy tokens drawn (index into uniforms)
    done: bool = False
    truncated: bool = False
    turn_cut: bool = False      # the last turn ended at turn_tokens, not by itself
    tool_calls: int = 0
    tool_failures: int = 0
    env_failures: int = 0
    visuals: list = field(default_factory=list)         # vision.Visual of each observation
    #                                                     image, in the order of its tokens

    def add(self, tokens: list[int], by_policy: bool, logprobs: list[float] | None = None) -> None:
        self.ids += tokens
        self.policy += [by_policy] * len(tokens)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(tokens)


def episode_tools(env, tools: dict[str, Tool], where: str = "") -> dict[str, Tool]:
    """The run's tools plus the environment's public methods, bound to this episode."""
    own = dict(tools)
    if env is not None:
        for name, tool in method_tools(env, where).items():
            if name in own:
                raise EnvironmentError_(f"environment '{where or type(env).__name__}': its method "
                                        f"'{name}' has the name of one of the run's tools; rename one")
            own[name] = tool
    return own


def shown_tools(make_env: Callable[[], Any] | None, tools: dict[str, Tool]) -> list[Tool]:
    """The tools every prompt describes, as the model can call them: the run's, then the
    environment's methods. Their schemas come from the class, not from an episode's state, so
    one environment made now (checked_instance: at start, an environment that cannot run stops
    the run, named) gives every episode's."""
    if make_env is None:
        return list(tools.values())
    return list(episode_tools(checked_instance(make_env), tools, label(make_env)).values())


def respond(ep: Episode, text: str, fmt: CallFormat, deadline_s: float) -> str | None:
    """What answers the turn `text`: the results of its tool calls, else the environment's step,
    else nothing (the episode ends). Sets ep.done and records the turn's reward."""
    calls = fmt.parse(text, ep.tools)
    if calls:
        results, images = [], []
        for call in calls:
            outcome = run_call(call, ep.tools, deadline_s)
            ep.tool_calls += 1
            ep.tool_failures += outcome.failed
            results.append(outcome.text)
            images += outcome.images
        ep.turn_rewards.append(None)
        return _with_images(fmt.answer_of(results), images)
    if ep.env is None:
        ep.turn_rewards.append(None)
        ep.done = True
        ep.truncated = ep.turn_cut      # a turn cut at turn_tokens that nothing answers: truncated
        return None
    value, error = with_deadline(ep.env.step, deadline_s, text)
    if error is None:
        try:
            step = as_step(value)
        except TypeError as e:
            error = str(e)
    if error is not None:
        ep.env_failures += 1
        ep.turn_rewards.append(None)
        return f"error: the environment failed ({error})"
    ep.turn_rewards.append(None if step.reward is None else float(step.reward))
    ep.done = bool(step.done)
    return step.observation or None


def sample_episodes(model, tokenizer, prompts: list[str], rows: list[dict], group_size: int, *,
                    make_env: Callable[[], Any] | None, tools: dict[str, Tool], call_format: str | CallFormat,
                    limits: EpisodeLimits, temperature: float = 1.0, top_p: float = 1.0,
                    greedy: bool = False, uniforms: torch.Tensor | None = None) -> Rollout:
    """`group_size` episodes for each prompt [B] (row i of the dataset with it): a Rollout of
    N = B * group_size rows. `uniforms` [N, >= episode_tokens] fix the draws, as for one turn."""
    if not decoder.supports(model):
        raise ValueError("multi-turn episodes run on the lean decoder (Llama, Qwen2 and Mistral "
                         "architectures without a sliding window); this model is not one")
    from transformers.generation.logits_process import TopPLogitsWarper
    fmt = call_format if isinstance(call_format, CallFormat) else FORMATS[call_format]
    device = next(model.parameters()).device
    eos = eos_ids(tokenizer.eos_token_id, device)
    top_p_warper = TopPLogitsWarper(top_p) if (top_p < 1.0 and not greedy) else None
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    G, N = group_size, len(prompts) * group_size
    episodes = [start_episode(rows[i // G], make_env, tools, limits) for i in range(N)]
    lean = decoder.Decoder(model)
    was_training = model.training
    model.eval()
    try:
        logits, state = lean.start(enc.input_ids.to(device), enc.attention_mask.to(device),
                                   limits.turn_tokens, repeat=G)
        batch = list(range(N))                      # cache row -> episode
        first = [answer_ids(tokenizer, ep.row.get("_observation"))[0] for ep in episodes]
        logits = _append(lean, state, logits, batch, episodes, first, tokenizer, limits)
        for turn in range(limits.max_turns):
            if not batch:
                break
            logits = _model_turn(lean, state, logits, batch, episodes, tokenizer, fmt, eos, limits,
                                 temperature, top_p_warper, greedy, uniforms)
            answers = _answer_turns([episodes[i] for i in batch], tokenizer, fmt, limits,
                                    last=turn + 1 == limits.max_turns)
            keep = [r for r, i in enumerate(batch) if not episodes[i].done]
            if len(keep) < len(batch):
                index = torch.tensor(keep, dtype=torch.long, device=device)
                lean.keep(state, index)
                logits = logits[index]
                answers = [answers[r] for r in keep]
                batch = [batch[r] for r in keep]
            tokens = [answer_ids(tokenizer, a)[0] for a in answers]
            logits = _append(lean, state, logits, batch, episodes, tokens, tokenizer, limits)
    finally:
        model.train(was_training)
    return _to_rollout(episodes, prompts, enc, G, tokenizer, temperature if not greedy else 1.0,
                       top_p if not greedy else 1.0)


def end_turn(ep: Episode, cut: bool) -> None:
    """The turn ends: by itself (EOS, a call's closing tag), or `cut` at `turn_tokens`. A cut turn is
    answered like any other (its calls' results, else the environment's step) and the episode goes
    on; only where nothing answers it does the episode end there, truncated (respond)."""
    ep.turn_ends.append(len(ep.ids) - 1)
    ep.turn_cut = cut


def cut_turn(ep: Episode) -> None:
    """End the episode in the middle of a turn, at `episode_tokens`: the turn is the last one, and it
    ends here. The environment never sees a cut turn, so its reward entry is None, like a turn
    answered by a tool; with `turn_rewards` the episode's outcome is credited to it, as to any
    final turn (step.turn_advantages). One reward entry per turn end, whatever ended the turn."""
    ep.turn_ends.append(len(ep.ids) - 1)
    ep.turn_rewards.append(None)
    ep.done = ep.truncated = True


def start_episode(row: dict, make_env, tools: dict[str, Tool], limits: EpisodeLimits) -> Episode:
    env = make_env() if make_env is not None else None
    row = dict(row)
    if env is not None:
        value, error = with_deadline(env.reset, limits.deadline_s, row)
        if error is not None:
            number = row.get("_row")
            where = f"row {number + 1}" if isinstance(number, int) else "a row"
            raise EnvironmentError_(f"environment {type(env).__name__}: reset failed on {where} "
                                    f"({error})")
        row["_observation"] = value if isinstance(value, str) or has_images(value) else None
    return Episode(row=row, env=env, tools=episode_tools(env, tools))


def _answer_turns(live: list[Episode], tokenizer, fmt: CallFormat, limits: EpisodeLimits,
                  last: bool) -> list[str | None]:
    """What answers each episode's last turn (None for episodes that are over); after the last
    allowed turn an episode that is not done is out of turns: truncated."""
    answers = []
    for ep in live:
        if ep.done:
            answers.append(None)
            continue
        text = tokenizer.decode(ep.ids[ep.turn_start:], skip_special_tokens=True)
        answers.append(respond(ep, text, fmt, limits.deadline_s))
        if last and not ep.done:
            ep.done = ep.truncated = True          # out of turns
    return answers


def _with_images(answer: str, images: list):
    """A tools' answer with its results' images where their marks are: text and images in order."""
    if not images:
        return answer
    pieces = answer.split(IMAGE_MARK)
    parts: list = []
    for k, piece in enumerate(pieces):
        parts += [piece] + ([images[k]] if k < len(images) else [])
    return [p for p in parts if not isinstance(p, str) or p]


def has_images(value) -> bool:
    """An observation that holds pictures: a PIL image, or a list of text and PIL images."""
    items = value if isinstance(value, (list, tuple)) else [value]
    return any(hasattr(x, "convert") and hasattr(x, "size") and not isinstance(x, str) for x in items)


def answer_ids(tokenizer, answer) -> tuple[list[int], list]:
    """An answer's token ids and the vision.Visual of each image in it. Text is tokenized; an
    image (an environment's observation may be a PIL image or a list of text and images) goes
    through the model's processor once, which writes its image tokens; a text-only model is
    refused with the reason, never handed the image as text."""
    if not answer:
        return [], []
    if not has_images(answer):
        return tokenizer(str(answer), add_special_tokens=False).input_ids, []
    processor = getattr(tokenizer, "grpo_processor", None)
    if processor is None:
        raise EnvironmentError_("an observation holds an image, but the model is text-only (it has "
                                "no image processor); use a vision-language model")
    ids, visuals = [], []
    for part in (answer if isinstance(answer, (list, tuple)) else [answer]):
        if isinstance(part, str):
            ids += tokenizer(part, add_special_tokens=False).input_ids
        elif has_images(part):
            tokens, mask, (visual,) = vision.encode(processor, [vision.image_placeholder(processor)],
                                                     [[vision.load_image(part, "an observation")]])
            ids += tokens[0][mask[0].bool()].tolist()
            visuals.append(visual)
        elif part is not None:
            ids += tokenizer(str(part), add_special_tokens=False).input_ids
    return ids, visuals


def _add_answer(ep: Episode, ids: list[int], limits: EpisodeLimits, visuals: list | None = None) -> list[int]:
    """Append an answer's tokens, cut to `observation_tokens` and to the episode's budget (which,
    when it runs out, truncates the episode); return what was appended. An answer with images is
    never cut through them: if it does not fit whole, nothing of it is appended and the episode
    is truncated."""
    left = limits.episode_tokens - len(ep.ids)
    if visuals and len(ids) > min(limits.observation_tokens, max(0, left)):
        ep.done = ep.truncated = True
        ep.turn_start = len(ep.ids)
        return []
    ep.visuals += list(visuals or [])
    cut = ids[:min(limits.observation_tokens, max(0, left))]
    ep.add(cut, by_policy=False)
    if ids and len(ep.ids) >= limits.episode_tokens:
        ep.done = ep.truncated = True            # the budget is spent: the model has no room left
    ep.turn_start = len(ep.ids)
    return cut


def sample_episodes_on_engine(generate_turns: Callable, tokenizer, prompts: list[str],
                              rows: list[dict], group_size: int, *, make_env, tools: dict[str, Tool],
                              call_format: str | CallFormat, limits: EpisodeLimits,
                              temperature: float, top_p: float = 1.0, encoded=None) -> Rollout:
    """Episodes on an engine that keeps its own cache (vLLM, whose prefix cache makes each turn
    cost its new tokens): `generate_turns(histories, max_tokens, stop, episodes=)` gets every live
    episode's token ids so far (prompt included) and its index among the N episodes, and returns,
    per episode, (new token ids, their log-probs, whether the turn was cut at max_tokens). Everything else is what the lean-decoder path does.

    `encoded` (prompt ids, mask [B, P] and vision.Visual per prompt, from vision.encode) are
    prompts with images; `generate_turns` then also gets `visuals=`, each history's images in
    order (its prompt's, then its observations'), and the rollout's rows carry them."""
    fmt = call_format if isinstance(call_format, CallFormat) else FORMATS[call_format]
    eos = set(eos_ids(tokenizer.eos_token_id).tolist())
    if encoded is None:
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        prompt_ids = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
        prompt_visuals = None
    else:
        ids, mask, prompt_visuals = encoded
        enc = SimpleNamespace(input_ids=ids, attention_mask=mask)
        prompt_ids = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    G, N = group_size, len(prompts) * group_size
    episodes = [start_episode(rows[i // G], make_env, tools, limits) for i in range(N)]

    def parts(i: int) -> tuple:
        ep, first = episodes[i], prompt_visuals[i // G] if prompt_visuals is not None else None
        return tuple(v for v in [first, *ep.visuals] if v is not None)
    for ep in episodes:
        ids, visuals = answer_ids(tokenizer, ep.row.get("_observation"))
        _add_answer(ep, ids, limits, visuals)
    for turn in range(limits.max_turns):
        for ep in episodes:
            if not ep.done and len(ep.ids) >= limits.episode_tokens:
                ep.done = ep.truncated = True       # the answers spent the budget
        live = [i for i in range(N) if not episodes[i].done]
        if not live:
            break
        room = [min(limits.turn_tokens, limits.episode_tokens - len(episodes[i].ids)) for i in live]
        histories = [prompt_ids[i // G] + episodes[i].ids for i in live]
        outputs = (generate_turns(histories, room, fmt.stop, episodes=live) if encoded is None else
                   generate_turns(histories, room, fmt.stop, episodes=live,
                                  visuals=[parts(i) for i in live]))
        for i, (ids, logprobs, cut) in zip(live, outputs):
            ep = episodes[i]
            ep.add(list(ids), by_policy=True, logprobs=list(logprobs))
            ep.drawn += len(ids)
            if cut and not (ids and ids[-1] in eos) and len(ep.ids) >= limits.episode_tokens:
                cut_turn(ep)                        # the episode's budget is spent: truncated
            else:                                   # a turn cut at turn_tokens ends; the episode goes on
                end_turn(ep, cut=bool(cut and not (ids and ids[-1] in eos)))
        answers = _answer_turns([episodes[i] for i in live], tokenizer, fmt, limits,
                                last=turn + 1 == limits.max_turns)
        for i, answer in zip(live, answers):
            if not episodes[i].done:
                ids, visuals = answer_ids(tokenizer, answer)
                _add_answer(episodes[i], ids, limits, visuals)
    rollout = _to_rollout(episodes, prompts, enc, G, tokenizer, temperature, top_p)
    if encoded is not None:
        # a row without observation images keeps its group's shared Visual (one tower pass, one
        # prompt pass per group); one with them holds its images in order, prompt's first
        rollout.visuals = [parts(i) if episodes[i].visuals else prompt_visuals[i // G] for i in range(N)]
    return rollout


def _append(lean, state, logits, batch, episodes, tokens: list[list[int]], tokenizer,
            limits: EpisodeLimits) -> torch.Tensor:
    """Put each row's answer tokens (cut to fit) into the episode and the cache at once; rows
    that get none keep their logits."""
    room = [_add_answer(episodes[i], ids, limits) for i, ids in zip(batch, tokens)]
    width = max((len(t) for t in room), default=0)
    if width == 0:
        return logits
    device = logits.device
    ids = torch.full((len(batch), width), tokenizer.pad_token_id, dtype=torch.long, device=device)
    valid = torch.zeros(len(batch), width, dtype=torch.bool, device=device)
    for r, t in enumerate(room):
        ids[r, :len(t)] = torch.tensor(t, dtype=torch.long)
        valid[r, :len(t)] = True
    new = lean.extend(ids, valid, state)
    has = valid.any(-1)
    return torch.where(has[:, None], new, logits)


_ENDERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # tokenizer -> {stop: ids}


def _enders(tokenizer, stop: str) -> frozenset:
    """Ids of the tokens whose text ends with the stop string's last character: only after one of
    them can a turn's text end with the stop string, so only then is the tail decoded."""
    known = _ENDERS.setdefault(tokenizer, {})
    if stop not in known:
        pieces = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
        known[stop] = frozenset(i for i, p in enumerate(pieces) if p.endswith(stop[-1]))
    return known[stop]


def _model_turn(lean, state, logits, batch, episodes, tokenizer, fmt: CallFormat, eos, limits,
                temperature, top_p_warper, greedy, uniforms) -> torch.Tensor:
    """Decode one turn for every row in the batch; rows that end early wait for the others."""
    device = logits.device
    n = len(batch)
    in_turn = torch.tensor([not episodes[i].done for i in batch], device=device)
    stop_len = len(tokenizer(fmt.stop, add_special_tokens=False).input_ids) + 4
    enders = _enders(tokenizer, fmt.stop)
    while bool(in_turn.any()):
        scores = logits.float()
        if not greedy and temperature != 1.0:
            scores = scores / temperature
        if top_p_warper is not None:
            scores = top_p_warper(None, scores)
        u = None
        if uniforms is not None and not greedy:
            index = torch.tensor([min(episodes[i].drawn, uniforms.shape[1] - 1) for i in batch])
            u = uniforms[torch.tensor(batch), index, None].to(device)
        chosen, lse = draw(scores, greedy, u)
        chosen_logp = (scores.gather(-1, chosen[:, None]) - lse).squeeze(-1)
        chosen = chosen.masked_fill(~in_turn, tokenizer.pad_token_id)
        ended = torch.zeros(n, dtype=torch.bool, device=device)
        for r, i in enumerate(batch):
            if not in_turn[r]:
                continue
            ep = episodes[i]
            token = int(chosen[r])
            ep.add([token], by_policy=True, logprobs=[float(chosen_logp[r])])
            ep.drawn += 1
            turn = ep.ids[ep.turn_start:]
            if bool(torch.isin(chosen[r:r + 1], eos)) or (token in enders and tokenizer.decode(
                    turn[-stop_len:], skip_special_tokens=True).endswith(fmt.stop)):
                ended[r] = True
                end_turn(ep, cut=False)
            elif len(ep.ids) >= limits.episode_tokens:
                ended[r] = True
                cut_turn(ep)                        # the episode's budget is spent: truncated
            elif len(turn) >= limits.turn_tokens:
                ended[r] = True
                end_turn(ep, cut=True)              # the turn ends; the episode goes on
        valid = in_turn.clone()
        in_turn = in_turn & ~ended
        logits = lean.step(chosen, state, valid=valid)
    return logits


def _to_rollout(episodes: list[Episode], prompts: list[str], enc, G: int, tokenizer,
                temperature: float, top_p: float = 1.0) -> Rollout:
    N = len(episodes)
    T = max(1, max(len(ep.ids) for ep in episodes))
    pad = tokenizer.pad_token_id
    completion_ids = torch.full((N, T), pad, dtype=torch.long)
    completion_mask = torch.zeros(N, T, dtype=torch.long)
    context_mask = torch.zeros(N, T, dtype=torch.long)
    sampler_logprobs = torch.zeros(N, T)
    for i, ep in enumerate(episodes):
        n = len(ep.ids)
        completion_ids[i, :n] = torch.tensor(ep.ids, dtype=torch.long)
        completion_mask[i, :n] = torch.tensor(ep.policy, dtype=torch.long)
        context_mask[i, :n] = 1
        sampler_logprobs[i, :n] = torch.tensor(ep.logprobs)
    texts, spans = [], []
    for ep in episodes:     # the text, run by run, with [start, end, "policy" | "env"] offsets
        text, marks, start = "", [], 0
        for end in range(1, len(ep.ids) + 1):
            if end == len(ep.ids) or ep.policy[end] != ep.policy[start]:
                piece = tokenizer.decode(ep.ids[start:end], skip_special_tokens=True)
                marks.append([len(text), len(text) + len(piece), "policy" if ep.policy[start] else "env"])
                text += piece
                start = end
        texts.append(text)
        spans.append(marks)
    rewards = [[r for r in ep.turn_rewards if r is not None] for ep in episodes]
    return Rollout(
        prompts=[p for p in prompts for _ in range(G)], completions=texts,
        group_ids=torch.arange(len(prompts)).repeat_interleave(G),
        prompt_ids=enc.input_ids.repeat_interleave(G, dim=0),
        prompt_mask=enc.attention_mask.repeat_interleave(G, dim=0),
        completion_ids=completion_ids, completion_mask=completion_mask,
        sampler_logprobs=sampler_logprobs * completion_mask,
        truncated=torch.tensor([ep.truncated for ep in episodes]),
        temperature=temperature, top_p=top_p, context_mask=context_mask,
        episodes=Episodes(
            turns=[len(ep.turn_ends) for ep in episodes],
            turn_ends=[list(ep.turn_ends) for ep in episodes],
            turn_rewards=[list(ep.turn_rewards) for ep in episodes],
            env_reward=[sum(r) if r else None for r in rewards],
            tool_calls=[ep.tool_calls for ep in episodes],
            tool_failures=[ep.tool_failures for ep in episodes],
            env_failures=[ep.env_failures for ep in episodes],
            spans=spans,
        ))


class EpisodeSampler(SharesThePolicy):
    """The `Sampler` of multi-turn runs: HFSampler's interface, with the rows for the
    environments and the episode's limits, tools and call format."""
    top_k, min_p, repetition_penalty = 0, 0.0, 1.0   # single-turn only: never applied here

    def __init__(self, model, tokenizer, *, limits: EpisodeLimits, tools: dict[str, Tool],
                 call_format: str | CallFormat, make_env: Callable[[], Any] | None, temperature: float = 1.0,
                 top_p: float = 1.0):
        self.model, self.tokenizer, self.limits = model, tokenizer, limits
        self.tools, self.call_format, self.make_env = tools, call_format, make_env
        self.temperature, self.top_p = temperature, top_p
        self.max_new_tokens = limits.episode_tokens

    def sample(self, prompts: list[str], group_size: int, *, greedy: bool = False,
               uniforms: torch.Tensor | None = None, rows: list[dict] | None = None) -> Rollout:
        rows = rows if rows is not None else [{} for _ in prompts]
        if vision.is_vision_model(self.model):
            return self._vision_episodes(prompts, group_size, greedy, rows)
        return sample_episodes(self.model, self.tokenizer, prompts, rows, group_size,
                               make_env=self.make_env, tools=self.tools,
                               call_format=self.call_format, limits=self.limits,
                               temperature=self.temperature, top_p=self.top_p, greedy=greedy,
                               uniforms=uniforms)

    def _vision_episodes(self, prompts: list[str], group_size: int, greedy: bool, rows: list[dict]):
        """Episodes of a vision-language model: each turn prefills the history with its images
        (own.vision_turns); images in observations are appended as image tokens."""
        model, tok = self.model, self.tokenizer
        temperature, top_p = (1.0, 1.0) if greedy else (self.temperature, self.top_p)
        was_training = model.training
        model.eval()
        try:
            return sample_episodes_on_engine(
                lambda histories, room, stop, visuals, episodes=None: vision_turns(
                    model, tok, histories, room, stop, visuals=visuals, temperature=temperature,
                    top_p=top_p, greedy=greedy),
                tok, prompts, rows, group_size, make_env=self.make_env, tools=self.tools,
                call_format=self.call_format, limits=self.limits, temperature=temperature,
                top_p=top_p, encoded=vision_prompts(tok, prompts, rows))
        finally:
            model.train(was_training)
