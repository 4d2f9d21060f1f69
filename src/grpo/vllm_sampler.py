"""Step 1 on GPUs: vLLM generates the groups, colocated in the training process (`sampler=vllm`).

    pip install -e '.[vllm]'          # in a clone of grpo
    grpo train model=Qwen/Qwen2.5-0.5B-Instruct sampler=vllm vllm_gpu_memory_utilization=0.3 ...

The engine shares the GPU with training: it takes `vllm_gpu_memory_utilization` of the memory for
its weights and KV cache, sleeps (frees that memory) while the policy is updated, and wakes up
before the next step. After every optimizer step the policy's weights are copied into it (with
LoRA, the adapter merged into the base for the copy), so it always samples from the current
policy. It returns the log-probs it drew each token with, after temperature and top-p, for the
off-policy correction (`tis_cap`).

vLLM draws its own random numbers: the `uniforms` the HF sampler takes are ignored, so runs are
repeatable per seed only as far as vLLM's own seeding allows, and N processes do not reproduce one
bit for bit. Nothing here is imported unless `sampler=vllm`; the package and its tests do not need
vLLM.
"""

from __future__ import annotations

import torch

from grpo import vision
from grpo.rollout import Rollout
from grpo.sampling import completion_lengths, eos_ids, mask_from_lengths, vision_prompts


class VLLMUnavailable(RuntimeError):
    """vLLM is not installed or cannot start here; the message says what to do."""


class VLLMSampler:
    """The `Sampler` protocol on a colocated vLLM engine."""

    def __init__(self, model_path: str, tokenizer, *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, gpu_memory_utilization: float = 0.3, seed: int = 0,
                 dtype: str = "bfloat16", max_model_len: int | None = None, sleep: bool = True,
                 agent=None):
        """`agent` (build.Agent): sample multi-turn episodes, each turn a request whose prompt is
        the episode's token ids so far (vLLM's prefix cache holds the history)."""
        try:
            import vllm
        except ImportError:
            raise VLLMUnavailable("sampler=vllm needs vLLM: pip install 'vllm>=0.11' (GPU only; in "
                                  "a clone of grpo: pip install -e '.[vllm]'); or set sampler=hf") from None
        self.vllm, self.tokenizer = vllm, tokenizer
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.sleep_between = sleep
        self.agent = agent
        self.call_format = None     # a tools.CallFormat set by the trainer (chat-template results)
        if agent is not None:
            self.max_new_tokens = agent.limits.episode_tokens
        kwargs = dict(model=model_path, tokenizer=model_path, gpu_memory_utilization=gpu_memory_utilization,
                      seed=seed, dtype=dtype, enable_sleep_mode=sleep,
                      logprobs_mode="processed_logprobs")   # after temperature/top-p: what was drawn from
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        self.llm = vllm.LLM(**kwargs)
        self.asleep = False
        processor = getattr(tokenizer, "grpo_processor", None)      # a vision-language model's
        placeholder = getattr(processor, "image_token_id", None)
        if placeholder is None and getattr(processor, "image_token", None):
            placeholder = tokenizer.convert_tokens_to_ids(processor.image_token)
        self.placeholders = [placeholder] if isinstance(placeholder, int) else []

    # -- the engine's life around the update ---------------------------------------------------
    def sleep(self) -> None:
        """Free the engine's GPU memory (weights and KV cache) for the policy update."""
        if self.sleep_between and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def sync(self, policy) -> None:
        """Copy the policy's current weights into the engine (LoRA merged for the copy)."""
        self.wake()
        merged = hasattr(policy, "merge_adapter")
        if merged:
            policy.merge_adapter()
        try:
            model = policy.get_base_model() if merged else policy
            state = model.state_dict()
            if vision.is_vision_model(model):   # the names its checkpoint has, which vLLM reads
                state = checkpoint_names(model, state)
            prefix = "base_layer."
            weights = [(name.replace(prefix, ""), tensor.detach()) for name, tensor in state.items()
                       if "lora_" not in name]
            engine_model(self.llm).load_weights(weights)
        finally:
            if merged:
                policy.unmerge_adapter()
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()   # cached prompt keys came from the old weights

    # -- sampling -----------------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, prompts: list[str], group_size: int, *, greedy: bool = False,
               uniforms: torch.Tensor | None = None, rows: list[dict] | None = None) -> Rollout:
        self.wake()
        tok = self.tokenizer
        if self.agent is not None:
            from grpo.episodes import sample_episodes_on_engine
            a = self.agent
            return sample_episodes_on_engine(
                lambda histories, room, stop: self._turns(histories, room, stop, greedy), tok,
                prompts, rows if rows is not None else [{} for _ in prompts], group_size,
                make_env=a.make_env, tools=a.tools, call_format=self.call_format or a.call_format,
                limits=a.limits,
                temperature=1.0 if greedy else self.temperature,
                top_p=1.0 if greedy else self.top_p)
        extra = {}
        requests, encoded = prompts, None
        if rows is not None and any(r.get("images") for r in rows):
            # vLLM's multimodal input: the prompt text and its PIL images; the engine expands the
            # placeholders with the same processor, and the rollout's prompt ids are the processor's
            encoded = vision_prompts(tok, prompts, rows)
            requests = [{"prompt": p, "multi_modal_data": {"image": [vision.load_image(x) for x in r["images"]]}}
                        if r.get("images") else p for p, r in zip(prompts, rows)]
            # placeholders are never drawn (vision.placeholder_ids); vLLM caps a bias at -100
            extra["logit_bias"] = {i: -100.0 for i in self.placeholders}
        params = self.vllm.SamplingParams(
            n=group_size, temperature=0.0 if greedy else self.temperature,
            top_p=1.0 if greedy else self.top_p, max_tokens=self.max_new_tokens, logprobs=0,
            skip_special_tokens=True, **extra)
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        r = rollout_from_outputs(prompts, outputs, group_size, tok, self.max_new_tokens,
                                 1.0 if greedy else self.temperature, encoded=encoded)
        r.top_p = 1.0 if greedy else self.top_p
        return r


    def _turns(self, histories: list[list[int]], room: list[int], stop: str,
               greedy: bool) -> list[tuple[list[int], list[float], bool]]:
        """One turn for each history: one request each, ending at EOS, at the call format's
        closing tag (kept in the output) or at its `room` of tokens."""
        params = [self.vllm.SamplingParams(
            n=1, temperature=0.0 if greedy else self.temperature,
            top_p=1.0 if greedy else self.top_p, max_tokens=max(1, n), logprobs=0,
            stop=[stop], include_stop_str_in_output=True, skip_special_tokens=True)
            for n in room]
        outputs = self.llm.generate([{"prompt_token_ids": h} for h in histories], params,
                                    use_tqdm=False)
        turns = []
        for out in outputs:
            c = out.outputs[0]
            ids = list(c.token_ids)
            logprobs = [options[t].logprob for t, options in zip(ids, c.logprobs or [])]
            turns.append((ids, logprobs + [0.0] * (len(ids) - len(logprobs)),
                          c.finish_reason == "length"))
        return turns


def checkpoint_names(model, state: dict) -> dict:
    """A state dict under the names save_pretrained writes (transformers 5 renames some models'
    weights, LLaVA's and Qwen-VL's among them, between its modules and their checkpoints)."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:
        return state
    return revert_weight_conversion(model, dict(state))


def engine_model(llm):
    """The torch module inside a colocated engine (its place differs between vLLM versions)."""
    executor = llm.llm_engine.model_executor
    worker = executor.driver_worker
    worker = getattr(worker, "worker", worker)
    return worker.model_runner.model


def rollout_from_outputs(prompts: list[str], outputs, group_size: int, tok, max_new_tokens: int,
                         temperature: float, encoded=None) -> Rollout:
    """vLLM's RequestOutputs -> a Rollout with the same masks and padding the HF sampler makes.
    `encoded` (ids, mask, vision.Visual per prompt; sampling.vision_prompts) for prompts with images."""
    if encoded is None:
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        ids, mask, visuals = enc.input_ids, enc.attention_mask, None
    else:
        ids, mask, visuals = encoded
    prompt_ids = ids.repeat_interleave(group_size, dim=0)
    prompt_mask = mask.repeat_interleave(group_size, dim=0)
    completions = [c for out in outputs for c in out.outputs]
    if len(completions) != len(prompts) * group_size:
        raise RuntimeError(f"vLLM returned {len(completions)} completions for {len(prompts)} prompts "
                           f"x {group_size}")
    T = max(1, max(len(c.token_ids) for c in completions))
    completion_ids = torch.full((len(completions), T), tok.pad_token_id, dtype=torch.long)
    sampler_logprobs = torch.zeros(len(completions), T)
    for i, c in enumerate(completions):
        ids = list(c.token_ids)
        completion_ids[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        for t, (token, options) in enumerate(zip(ids, c.logprobs or [])):
            sampler_logprobs[i, t] = options[token].logprob
    lengths = completion_lengths(completion_ids, tok.eos_token_id)
    completion_mask = mask_from_lengths(lengths, T)
    truncated = ~torch.isin(completion_ids, eos_ids(tok.eos_token_id)).any(-1)
    return Rollout(
        prompts=[p for p in prompts for _ in range(group_size)],
        completions=[c.text for c in completions],
        group_ids=torch.arange(len(prompts)).repeat_interleave(group_size),
        prompt_ids=prompt_ids, prompt_mask=prompt_mask,
        completion_ids=completion_ids.masked_fill(completion_mask == 0, tok.pad_token_id),
        completion_mask=completion_mask,
        sampler_logprobs=sampler_logprobs.masked_fill(completion_mask == 0, 0.0),
        truncated=truncated, temperature=temperature,
        visuals=None if visuals is None else [v for v in visuals for _ in range(group_size)])
