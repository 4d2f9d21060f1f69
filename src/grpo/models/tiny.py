"""The tiny models for tests and the demo: a character-level tokenizer over printable ASCII plus
the R1 tags, and a small randomly initialised Llama- or Qwen2-architecture model written as an
ordinary Hugging Face model directory, so nothing is downloaded.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch

# The R1 template's tags are single tokens in the tiny tokenizer so a small model can emit them.
TAG_TOKENS = ["<think>", "</think>", "<answer>", "</answer>"]
SPECIAL_TOKENS = {"pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>"}


def build_tiny_tokenizer(vocab_size: int | None = None):
    """A character-level tokenizer over printable ASCII plus the R1 tags; no file, no download.

    `vocab_size` pads the vocabulary with tokens that text never encodes to ("<unused123>"), for
    models whose output head should have a real model's width (151,936 for Qwen2.5).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    symbols = list(SPECIAL_TOKENS.values()) + sorted(set(string.printable) - set("\t\n\r\x0b\x0c"))
    symbols += ["\n"]
    vocab = {s: i for i, s in enumerate(symbols)}
    if vocab_size:
        for i in range(len(vocab), vocab_size - len(TAG_TOKENS)):
            vocab[f"<unused{i}>"] = i
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, **SPECIAL_TOKENS)
    tokenizer.add_tokens(TAG_TOKENS)
    return tokenizer


def build_tiny(output_dir: str | Path, *, hidden_size: int = 128, layers: int = 4, heads: int = 4,
               seed: int = 0, architecture: str = "llama", vocab_size: int | None = None,
               max_positions: int = 512) -> Path:
    """Write a randomly initialised small model ("llama" or "qwen2") and its character tokenizer
    to `output_dir`; return the path. The MLP is 4x the hidden size; embeddings are tied.
    `max_positions` is the context length the config declares."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    tokenizer = build_tiny_tokenizer(vocab_size)
    config_class = {"llama": LlamaConfig, "qwen2": Qwen2Config}[architecture]
    config = config_class(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=hidden_size * 4,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=max_positions, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    output_dir = Path(output_dir)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return output_dir
