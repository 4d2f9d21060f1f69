"""Loading the policy, the reference model and the tokenizer; the one per-token log-prob function.

Any Hugging Face causal LM directory or hub name loads through `load_policy` (models/load.py).
`build_tiny` makes a small Llama-architecture model with a character-level tokenizer, written as an
ordinary Hugging Face model directory, so tests and the demo run with no download (models/tiny.py).
`token_logprobs` is in models/logprobs.py (padding-free passes: models/packed.py), the samplers'
cuts and repetition penalty in models/cuts.py, the static decoding cache in models/slots.py.
This face only re-exports the names other packages use.
"""

from grpo.models.cuts import Cut, Penalty, nucleus_, penalize_
from grpo.models.load import (TOKENIZER_FILES, WEIGHT_SUFFIXES, ModelError, adapter_base,
                              chat_template_text, frozen_copy, is_adapter_dir, is_vision_config,
                              load_policy, load_processor, load_tokenizer, merge_adapter, model_source,
                              prepare_tokenizer, ready_for_training, update_reference, whole_model)
from grpo.models.logprobs import LOGIT_CHUNK_ELEMENTS, selected_logprobs, token_logprobs
from grpo.models.tiny import SPECIAL_TOKENS, TAG_TOKENS, build_tiny, build_tiny_tokenizer

__all__ = [
    "Cut", "Penalty", "nucleus_", "penalize_",
    "TOKENIZER_FILES", "WEIGHT_SUFFIXES", "ModelError", "adapter_base", "chat_template_text",
    "frozen_copy", "is_adapter_dir", "is_vision_config", "load_policy", "load_processor",
    "load_tokenizer", "merge_adapter", "model_source", "prepare_tokenizer", "ready_for_training",
    "update_reference", "whole_model",
    "LOGIT_CHUNK_ELEMENTS", "selected_logprobs", "token_logprobs",
    "SPECIAL_TOKENS", "TAG_TOKENS", "build_tiny", "build_tiny_tokenizer",
]
