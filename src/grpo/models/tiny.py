"""The tiny models for tests and the demo: a character-level tokenizer over printable ASCII plus
the R1 tags, a small randomly initialised Llama- or Qwen2-architecture model, and a small
LLaVA-architecture vision-language model (a CLIP vision tower, a two-layer projector and a Llama
language model with the same tokenizer, with its processor), each written as an ordinary Hugging
Face directory, so the demos and the tests run with no download.
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


IMAGE_TOKEN = "<image>"
# Image parts become the processor's placeholder; text parts are copied; roles are not shown.
CHAT_TEMPLATE = (
    "{%- for m in messages -%}{%- if m['content'] is string -%}{{ m['content'] }}"
    "{%- else -%}{%- for p in m['content'] -%}{%- if p['type'] == 'image' -%}" + IMAGE_TOKEN
    + "{%- elif p['type'] == 'text' -%}{{ p['text'] }}{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- endfor -%}")


def build_tiny_processor(image_size: int = 32, patch_size: int = 8):
    """LlavaProcessor over the character tokenizer (plus the image token) and CLIP's PIL image
    processor (no torchvision needed), resizing every image to `image_size` square."""
    from transformers import LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil


    tokenizer = build_tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tokenizer.chat_template = CHAT_TEMPLATE
    images = CLIPImageProcessorPil(size={"height": image_size, "width": image_size},
                                   do_center_crop=False, do_resize=True,
                                   image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    return LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=patch_size,
                          vision_feature_select_strategy="default", image_token=IMAGE_TOKEN,
                          num_additional_image_tokens=1, chat_template=CHAT_TEMPLATE)


def build_tiny_vlm(output_dir: str | Path | None = None, *, hidden_size: int = 128, layers: int = 4,
                   vision_hidden: int = 64, vision_layers: int = 2, image_size: int = 32,
                   patch_size: int = 8, seed: int = 0, feature_scale: float = 10.0):
    """A randomly initialised LLaVA model and its processor; written to `output_dir` (and the
    path returned) when given, else returned as (model, processor)."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    processor = build_tiny_processor(image_size, patch_size)
    tok = processor.tokenizer
    text = LlamaConfig(vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=hidden_size * 4,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                       max_position_embeddings=512, tie_word_embeddings=True,
                       pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                       bos_token_id=tok.bos_token_id)
    vision = CLIPVisionConfig(hidden_size=vision_hidden, intermediate_size=vision_hidden * 4,
                              num_hidden_layers=vision_layers, num_attention_heads=4,
                              image_size=image_size, patch_size=patch_size)
    config = LlavaConfig(vision_config=vision, text_config=text,
                         image_token_id=tok.convert_tokens_to_ids(IMAGE_TOKEN),
                         vision_feature_layer=-1, vision_feature_select_strategy="default",
                         tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    with torch.no_grad():     # image features an order of magnitude above the token embeddings'
        model.model.multi_modal_projector.linear_2.weight.mul_(feature_scale)  # scale, so a random-init
        #                       model's language layers notice them from the first steps
    if output_dir is None:
        return model, processor
    output_dir = Path(output_dir)
    model.save_pretrained(output_dir)
    processor.save_pretrained(output_dir)
    return output_dir
