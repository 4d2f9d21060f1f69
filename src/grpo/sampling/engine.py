"""An engine with weights of its own (vLLM in this process, or a vLLM server), and the Sampler
that runs GRPO's step 1 on any such engine.

    trainer                                 engine (sampling/vllm.py: the only module that
    -------                                 knows vLLM's API; vllm_server.py: a server's HTTP)
    prompts -> token ids, one Request per row, each with its own seed
                        ---- generate(requests) ---->
                        <--- Generated: token ids, their log-probs, ended or cut
    a Rollout, masked and padded as grpo's own sampler makes it
    after each optimizer step:
                        ---- load_weights(named tensors, version) ---->   (between batches only)

Token ids go in, never text: a tokenizer that adds BOS to text would give the engine a prompt the
trainer never scores. Each row's seed comes from the draws the caller made for it (`uniforms`,
from the run's seed, the step and the row), so a row's completion does not depend on which rows
share its batch or its process, as far as the engine's arithmetic does not either.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Protocol, runtime_checkable

import torch

from grpo import vision
from grpo.rollout import Rollout
from grpo.sampling.interface import mask_from_lengths, vision_prompts


@dataclass(frozen=True)
class Request:
    """One completion to draw. `text` and `images` only for a prompt with images: the engine
    then expands the image placeholders itself, with the same processor."""
    prompt_ids: tuple[int, ...]
    max_tokens: int
    seed: int
    temperature: float              # 0: greedy
    top_p: float = 1.0
    stop: tuple[str, ...] = ()      # kept in the output when it ends it
    text: str | None = None
    images: tuple = ()
    banned: tuple[int, ...] = ()    # token ids never drawn (image placeholders)


@dataclass(frozen=True)
class Generated:
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]     # each drawn token's, after temperature and top-p
    cut: bool                       # ended at max_tokens, not at EOS or a stop string


class EngineError(RuntimeError):
    """The engine failed or cannot be reached; the message names it and what was being done."""


@runtime_checkable
class Engine(Protocol):
    """What the trainer asks of an engine with weights of its own."""
    name: str                       # for messages: "vLLM in this process", "the vLLM server at URL"
    version: int                    # the weight version it samples with (-1: the model's own)
    lora_rank: int                  # the largest LoRA adapter it takes (0: whole weights only)
    max_model_len: int | None       # prompt and completion tokens together, at most (None: unsaid)

    def generate(self, requests: list[Request]) -> list[Generated]:
        """One Generated per request, in order."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Sample with these weights (checkpoint names, the whole model) from now on."""

    def load_adapter(self, path: str, version: int) -> None:
        """Sample with the LoRA adapter saved in directory `path` (peft's files) on the base
        weights it holds, from now on (only when `lora_rank` > 0)."""

    def sleep(self) -> None:
        """Free the engine's device memory (weights and KV cache), where the platform can."""

    def wake(self) -> None:
        """Take back what `sleep` freed."""

    def health(self) -> str | None:
        """None when it can generate; else what is wrong, in words."""

    def close(self) -> None:
        """Stop the engine (and its processes); a server is left alone."""


def row_seeds(uniforms: torch.Tensor | None, n: int, base: int) -> list[int]:
    """A seed per row: from the row's first two draws when the caller made them (they come from
    the run's seed, the step and the row), else base, base + 1, ..."""
    if uniforms is None:
        return [base + i for i in range(n)]
    u = (uniforms[:, :2] * (1 << 24)).long().tolist()
    return [(row[0] << 24) | (row[-1]) for row in u]


def weights_of(policy) -> list[tuple[str, torch.Tensor]]:
    """The policy's whole weights under its checkpoint's names, as an engine loads them: with
    LoRA, the adapter merged into the base (the caller unmerges: `merged`)."""
    model = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    state = model.state_dict()
    if vision.is_vision_model(model):   # the names its checkpoint has, which the engine reads
        state = checkpoint_names(model, state)
    # FSDP2 (parallel=fsdp): each DTensor gathered whole, on every process (all call this)
    return [(name.replace("base_layer.", ""), _whole(tensor).detach()) for name, tensor in state.items()
            if "lora_" not in name]


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def checkpoint_names(model, state: dict) -> dict:
    """A state dict under the names save_pretrained writes (transformers 5 renames some models'
    weights, LLaVA's and Qwen-VL's among them, between its modules and their checkpoints)."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:
        return state
    return revert_weight_conversion(model, dict(state))


class EngineSampler:
    """The `Sampler` protocol on an `Engine`."""
    top_k, min_p, repetition_penalty = 0, 0.0, 1.0   # grpo's own sampler's alone: never applied here

    def __init__(self, engine: Engine, tokenizer, *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int = 0, sleep: bool = False, agent=None):
        """`sleep`: free the engine's memory while the policy is updated. `agent` (build.Agent):
        sample multi-turn episodes, each turn a request whose prompt is the episode's token ids
        so far (the engine's prefix cache holds the history)."""
        self.engine, self.tokenizer = engine, tokenizer
        self.owns_engine = False    # made for this sampler (closed with it), not given to it
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.seed, self.sleep_between, self.agent = seed, sleep, agent
        self.call_format = None     # a tools.CallFormat set by the trainer (chat-template results)
        if agent is not None:
            self.max_new_tokens = agent.limits.episode_tokens
        self.asleep = False
        self.base_loaded = False    # LoRA on an engine that takes adapters: the base is there
        self.adapters = None        # the directory the adapters are saved in for the engine
        self.drawn = 0              # rows drawn without the caller's draws: the next base seed
        processor = getattr(tokenizer, "grpo_processor", None)      # a vision-language model's
        placeholder = getattr(processor, "image_token_id", None)
        if placeholder is None and getattr(processor, "image_token", None):
            placeholder = tokenizer.convert_tokens_to_ids(processor.image_token)
        self.placeholders = (placeholder,) if isinstance(placeholder, int) else ()

    # -- the engine's life around the update ---------------------------------------------------
    def close(self) -> None:
        """Close the engine when it was made for this sampler (a server's weights files go with
        it); a given engine is left open."""
        if self.owns_engine:
            self.owns_engine = False
            self.engine.close()
        self.drop_adapters()

    def drop_adapters(self) -> None:
        """Remove the adapter files written for the engine (LoRA; an engine closed elsewhere)."""
        if self.adapters is not None:
            import shutil
            shutil.rmtree(self.adapters, ignore_errors=True)
            self.adapters = None

    def sleep(self) -> None:
        if self.sleep_between and not self.asleep:
            self.engine.sleep()
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.engine.wake()
            self.asleep = False

    def sync(self, policy, version: int | None = None) -> None:
        """Load the policy's current weights into the engine. With LoRA, an engine that takes
        adapters gets the base weights once and then the adapter alone; any other gets the
        adapter merged into a copy of the whole weights."""
        self.wake()
        version = self.engine.version + 1 if version is None else version
        lora = hasattr(policy, "merge_adapter")
        if lora and self.engine.lora_rank:
            if not self.base_loaded:     # the base is fixed from the sampler's start on
                self.engine.load_weights(weights_of(policy), version)
                self.base_loaded = True
            sends = getattr(self.engine, "sends", True)      # under torchrun, process 0 alone
            self.engine.load_adapter(self._adapter_dir(policy, version) if sends else "", version)
            return
        if lora:
            policy.merge_adapter()
        try:
            self.engine.load_weights(weights_of(policy), version)
        finally:
            if lora:
                policy.unmerge_adapter()

    def _adapter_dir(self, policy, version: int) -> str:
        """The policy's adapter saved (peft's files) in a directory of its own for `version`,
        where the engine reads weights (a server: vllm_weights_dir, or /dev/shm; named as its
        weights folders are, so that a killed run's is swept); the previous version's is removed."""
        import os
        import shutil
        import socket
        import tempfile
        from pathlib import Path
        if self.adapters is None:
            self.adapters = Path(tempfile.mkdtemp(prefix=f"grpo-weights-{os.getpid()}@{socket.gethostname()}-",
                                                  dir=getattr(self.engine, "weights_parent", None)))
        for old in self.adapters.iterdir():
            shutil.rmtree(old, ignore_errors=True)
        path = self.adapters / f"v{version}"
        policy.save_pretrained(str(path), save_embedding_layers=False)
        return str(path)

    def device(self) -> None:
        """None: the engine draws with random generators of its own, seeded per row."""
        return None

    def health(self) -> str | None:
        return self.engine.health()

    # -- sampling -----------------------------------------------------------------------------
    def _seeds(self, uniforms, n: int) -> list[int]:
        seeds = row_seeds(uniforms, n, hash((self.seed, self.drawn)) & 0x7FFFFFFF)
        self.drawn += n if uniforms is None else 0
        return seeds

    @torch.no_grad()
    def sample(self, prompts: list[str], group_size: int, *, greedy: bool = False,
               uniforms: torch.Tensor | None = None, rows: list[dict] | None = None) -> Rollout:
        self.wake()
        tok = self.tokenizer
        temperature = 0.0 if greedy else self.temperature
        top_p = 1.0 if greedy else self.top_p
        seeds = self._seeds(uniforms, len(prompts) * group_size)
        if self.agent is not None:
            from grpo.sampling.episodes import sample_episodes_on_engine
            a = self.agent
            turn = [0]

            def turns(histories, room, stop, episodes):   # each turn of each episode: a seed
                turn[0] += 1
                return self._turns(histories, room, stop, temperature, top_p,
                                   [seeds[i] + 7919 * turn[0] for i in episodes])
            return sample_episodes_on_engine(
                turns, tok, prompts, rows if rows is not None else [{} for _ in prompts], group_size,
                make_env=a.make_env, tools=a.tools, call_format=self.call_format or a.call_format,
                limits=a.limits, temperature=1.0 if greedy else self.temperature, top_p=top_p)
        if rows is not None and any(r.get("images") for r in rows):
            ids, mask, visuals = vision_prompts(tok, prompts, rows)
            images = [tuple(vision.load_image(x) for x in r.get("images") or ()) for r in rows]
        else:
            enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
            ids, mask, visuals = enc.input_ids, enc.attention_mask, None
            images = [()] * len(prompts)
        requests = []
        for i in range(len(prompts) * group_size):
            p = i // group_size
            requests.append(Request(
                prompt_ids=tuple(ids[p][mask[p].bool()].tolist()), max_tokens=self.max_new_tokens,
                seed=seeds[i], temperature=temperature, top_p=top_p,
                text=prompts[p] if images[p] else None, images=images[p],
                banned=self.placeholders if images[p] else ()))
        generated = self.engine.generate(self._within_limit(requests))
        r = rollout_from_generated(prompts, generated, group_size, tok, (ids, mask, visuals),
                                   1.0 if greedy else self.temperature)
        r.top_p = top_p
        return r

    def _turns(self, histories: list[list[int]], room: list[int], stop: str, temperature: float,
               top_p: float, seeds: list[int]) -> list[tuple[list[int], list[float], bool]]:
        """One turn for each history: one request each, ending at EOS, at the call format's
        closing tag (kept in the output) or at its `room` of tokens, each with its seed."""
        requests = [Request(prompt_ids=tuple(h), max_tokens=max(1, n), seed=s,
                            temperature=temperature, top_p=top_p, stop=(stop,))
                    for h, n, s in zip(histories, room, seeds)]
        return [(list(g.token_ids), list(g.logprobs), g.cut)
                for g in self.engine.generate(self._within_limit(requests))]

    def _within_limit(self, requests: list[Request]) -> list[Request]:
        """Each request's max_tokens cut to what the engine's context has room for after its
        prompt (the completion then ends there, cut); a prompt with no room is an error."""
        limit = self.engine.max_model_len
        if limit is None:
            return requests
        longest = max((len(r.prompt_ids) for r in requests), default=0)
        if longest >= limit:
            raise EngineError(f"{self.engine.name} takes {limit} tokens of prompt and completion "
                              f"(its max_model_len), and a prompt has {longest}: shorten the prompts "
                              f"(long_prompts=skip leaves such rows out) or start the engine with a "
                              f"longer max_model_len")
        return [r if len(r.prompt_ids) + r.max_tokens <= limit else
                dataclasses.replace(r, max_tokens=limit - len(r.prompt_ids)) for r in requests]


def rollout_from_generated(prompts: list[str], generated: list[Generated], group_size: int, tok,
                           encoded, temperature: float) -> Rollout:
    """The engine's completions -> a Rollout with the same masks and padding grpo's own sampler
    makes. `encoded`: the prompts' (ids, mask, vision.Visual per prompt or None)."""
    ids, mask, visuals = encoded
    if len(generated) != len(prompts) * group_size:
        raise EngineError(f"the engine returned {len(generated)} completions for {len(prompts)} "
                          f"prompts x {group_size}")
    T = max(1, max(len(g.token_ids) for g in generated))
    completion_ids = torch.full((len(generated), T), tok.pad_token_id, dtype=torch.long)
    sampler_logprobs = torch.zeros(len(generated), T)
    for i, g in enumerate(generated):
        n = len(g.token_ids)
        if n:
            completion_ids[i, :n] = torch.tensor(g.token_ids, dtype=torch.long)
            sampler_logprobs[i, :len(g.logprobs)] = torch.tensor(g.logprobs[:n], dtype=torch.float32)
    # the engine stops at EOS (kept) or a stop string (kept): its tokens are the completion's
    lengths = torch.tensor([len(g.token_ids) for g in generated], dtype=torch.long)
    completion_mask = mask_from_lengths(lengths, T)
    truncated = torch.tensor([g.cut for g in generated])
    completion_ids = completion_ids.masked_fill(completion_mask == 0, tok.pad_token_id)
    texts = tok.batch_decode([ids_[:n] for ids_, n in zip(completion_ids, lengths)],
                             skip_special_tokens=True)
    return Rollout(
        prompts=[p for p in prompts for _ in range(group_size)],
        completions=texts,
        group_ids=torch.arange(len(prompts)).repeat_interleave(group_size),
        prompt_ids=ids.repeat_interleave(group_size, dim=0),
        prompt_mask=mask.repeat_interleave(group_size, dim=0),
        completion_ids=completion_ids, completion_mask=completion_mask,
        sampler_logprobs=sampler_logprobs.masked_fill(completion_mask == 0, 0.0),
        truncated=truncated, temperature=temperature,
        visuals=None if visuals is None else [v for v in visuals for _ in range(group_size)])
