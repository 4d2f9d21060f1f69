"""Tiny vision-language models of six families, with their real processors, built in-process.

Not a test module: tests import it. Nothing is downloaded (there is no hub here) and nothing needs
torchvision. Each `build(family)` returns a randomly initialised `...ForConditionalGeneration`
(float32, eval mode, eager attention: the same inputs give the same logits, run after run) and the
family's real transformers Processor, holding a character-level tokenizer with the family's special
tokens, the family's PIL image processor sized to the model's vision tower, and a chat template
that renders each {"type": "image"} part as the processor's image placeholder.

    model, processor = build("qwen2_5_vl")
    inputs = batch("qwen2_5_vl", processor, [("how many?", images(2, seed=0)), ("hi", images(1, 1))])
    logits = model(**inputs).logits

Image tokens per image (what the processor expands each placeholder to, and what the vision tower
gives per image): llava 16; qwen2_5_vl and qwen3_vl 1-4 for the sizes `images` makes (they follow
the image's size, at most 6); gemma3 4; idefics3 9; smolvlm 4. Idefics3 and SmolVLM have image
splitting off (each image becomes one square tile, with no row/column crops), so their count is
fixed too.

Forward keys beyond input_ids/attention_mask/pixel_values: Qwen image_grid_thw and
mm_token_type_ids; Gemma3 token_type_ids; Idefics3 and SmolVLM pixel_attention_mask (their
pixel_values are [rows, images, 3, H, W], padded with all-zero images); Llava none.
"""

from __future__ import annotations

import string

import numpy as np
import PIL.Image
import pytest
import torch

FAMILIES = ("llava", "qwen2_5_vl", "qwen3_vl", "gemma3", "idefics3", "smolvlm")

# Text model size shared by all families (the brief: hidden 32-64, 2 layers); the vision towers
# are 32 wide with 1-2 layers.
HIDDEN = 32
HEADS = 2
LAYERS = 2
VISION_HIDDEN = 32

# Printable ASCII (space and newline included, the odd whitespace left out): one token a character.
_CHARS = sorted(set(string.printable) - set("\t\r\x0b\x0c"))


def _tokenizer(specials: list[str], *, bos: str | None, eos: str, pad: str = "<pad>",
               unk: str = "<unk>", named: dict[str, str] | None = None, chat_template: str):
    """A character-level PreTrainedTokenizerFast whose first ids are `specials` (each matched whole,
    never split into characters), then one id per printable character. `named` are special tokens
    the processor reads as tokenizer attributes (Gemma3's `tokenizer.boi_token`, `image_token`...)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    base = [pad, unk, eos] + ([bos] if bos else [])
    symbols = list(dict.fromkeys(base + specials + list((named or {}).values())))
    vocab = {s: i for i, s in enumerate(symbols + _CHARS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unk))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    unnamed = [s for s in symbols if s not in base and s not in (named or {}).values()]
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=pad, unk_token=unk, eos_token=eos,
                                  bos_token=bos, extra_special_tokens=named or unnamed)
    if named and unnamed:
        # The specials that are not named have to be matched whole too (ids stay as in `vocab`).
        tok.add_tokens(unnamed, special_tokens=True)
    tok.padding_side = "left"
    tok.chat_template = chat_template
    assert len(tok) == len(vocab), "every special token is in the base vocabulary"
    return tok


def _template(turn_open: str, turn_close: str, image: str, *, prefix: str = "",
              generation: str, roles: str = "{{ message['role'] }}") -> str:
    """A Jinja chat template: `prefix`, then per message `turn_open` + role + content + `turn_close`,
    content being a string or a list of parts ({"type": "image"} -> `image`, {"type": "text"} -> its
    text, in order); `generation` after the last message when add_generation_prompt is set."""
    return (
        prefix
        + "{% for message in messages %}"
        + turn_open + roles
        + "{% if message['content'] is string %}{{ message['content'] }}"
          "{% else %}{% for part in message['content'] %}"
          "{% if part['type'] == 'image' %}{{ '" + image.replace("\n", "\\n") + "' }}"
          "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
          "{% endfor %}{% endif %}"
        + "{{ '" + turn_close.replace("\n", "\\n") + "' }}"
        + "{% endfor %}"
        + "{% if add_generation_prompt %}{{ '" + generation.replace("\n", "\\n") + "' }}{% endif %}"
    )


def _text_config(tok, **extra) -> dict:
    """The text model's config: the tokenizer's vocabulary and special ids, the shared tiny size."""
    return {**dict(vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                   num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                   max_position_embeddings=512, pad_token_id=tok.pad_token_id,
                   eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id), **extra}


def _with_checked_args_except_video(processor_class, **kwargs):
    """`processor_class(**kwargs)`, letting `video_processor` through unchecked.

    Qwen2.5-VL, Qwen3-VL and SmolVLM processors take a video processor, and every one of those
    (BaseVideoProcessor) needs torchvision. The video processor cannot even be left out: the
    processor's __init__ checks each sub-processor's class by looking up "VideoProcessorMixin" on
    the transformers package, which without torchvision has no such name and an AutoVideoProcessor
    mapping stub, so the check raises for any value, None included. So the check is skipped for
    that one argument on this one instance (an instance attribute shadowing the method during
    __init__, removed after); the processor is otherwise the real class, built the real way, and
    its image and text paths never touch the video processor."""
    processor = processor_class.__new__(processor_class)
    checked = processor_class.check_argument_for_proper_class

    def check(name, argument):
        if name == "video_processor":
            return None
        return checked(processor, name, argument)

    processor.check_argument_for_proper_class = check
    try:
        processor.__init__(**kwargs)
    finally:
        del processor.check_argument_for_proper_class
    return processor


class _NoVideoProcessor:
    """Stands in for SmolVLMVideoProcessor (torchvision): SmolVLMProcessor.apply_chat_template reads
    `video_processor.num_frames` and `.fps` even for image-only chats, so None will not do there.
    Both None: no frame sampling is asked for. Asked to process a video, it says why it cannot."""
    num_frames = None
    fps = None
    model_input_names: list[str] = []

    def __call__(self, *args, **kwargs):
        raise NotImplementedError("video processing needs torchvision, which is not installed")

    def __repr__(self):
        return "_NoVideoProcessor()"


def _llava():
    from transformers import (CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, LlavaProcessor)
    from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil

    # llava-1.5 style: "USER: <image>\nhow many?\nASSISTANT:"
    template = _template("", "\n", "<image>\n", roles="{{ message['role'].upper() + ': ' }}",
                         generation="ASSISTANT:")
    tok = _tokenizer(["<image>"], bos="<s>", eos="</s>", chat_template=template)
    # CLIP: 28 px images in 7 px patches -> 16 patches + CLS; "default" drops the CLS: 16 tokens.
    image_size, patch = 28, 7
    tokens = (image_size // patch) ** 2
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(hidden_size=VISION_HIDDEN, intermediate_size=2 * VISION_HIDDEN,
                                       num_hidden_layers=2, num_attention_heads=HEADS,
                                       image_size=image_size, patch_size=patch,
                                       projection_dim=VISION_HIDDEN),
        text_config=LlamaConfig(**_text_config(tok)),
        image_token_index=tok.convert_tokens_to_ids("<image>"), image_seq_length=tokens,
        vision_feature_select_strategy="default", vision_feature_layer=-2,
    )
    image_processor = LlavaImageProcessorPil(size={"shortest_edge": image_size},
                                             crop_size={"height": image_size, "width": image_size})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tok, patch_size=patch,
                               vision_feature_select_strategy="default", chat_template=template,
                               num_additional_image_tokens=1)
    return LlavaForConditionalGeneration, config, processor


_QWEN_SPECIALS = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>"]
# Qwen chat format: "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>how many?<|im_end|>\n"
_QWEN_TEMPLATE = _template("<|im_start|>", "<|im_end|>\n", "<|vision_start|><|image_pad|><|vision_end|>",
                           roles="{{ message['role'] + '\\n' }}", generation="<|im_start|>assistant\n")


def _qwen_ids(tok) -> dict:
    ids = tok.convert_tokens_to_ids
    return dict(image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
                vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"))


def _qwen2_5_vl():
    from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration,
                              Qwen2_5_VLProcessor)
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok = _tokenizer(_QWEN_SPECIALS, bos=None, eos="<|im_end|>", chat_template=_QWEN_TEMPLATE)
    # 14 px patches merged 2x2: one token per 28x28 px; images resized to 28x28 .. 56x84 px (1-6).
    patch, merge = 14, 2
    config = Qwen2_5_VLConfig(
        text_config=_text_config(tok, rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                       "mrope_section": [2, 3, 3]}),  # head_dim 16
        vision_config=dict(depth=2, hidden_size=VISION_HIDDEN, intermediate_size=2 * VISION_HIDDEN,
                           num_heads=HEADS, out_hidden_size=HIDDEN, patch_size=patch,
                           spatial_merge_size=merge, temporal_patch_size=2, window_size=112,
                           fullatt_block_indexes=[1]),
        **_qwen_ids(tok),
    )
    factor = patch * merge
    image_processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": factor * factor, "longest_edge": 6 * factor * factor},
        patch_size=patch, temporal_patch_size=2, merge_size=merge)
    # video_processor=None: see _with_checked_args_except_video.
    processor = _with_checked_args_except_video(
        Qwen2_5_VLProcessor, image_processor=image_processor, tokenizer=tok, video_processor=None,
        chat_template=_QWEN_TEMPLATE)
    return Qwen2_5_VLForConditionalGeneration, config, processor


def _qwen3_vl():
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok = _tokenizer(_QWEN_SPECIALS, bos=None, eos="<|im_end|>", chat_template=_QWEN_TEMPLATE)
    # 16 px patches merged 2x2: one token per 32x32 px; images resized to 32x32 .. 64x96 px (1-6).
    patch, merge = 16, 2
    config = Qwen3VLConfig(
        text_config=_text_config(tok, head_dim=HIDDEN // HEADS,
                                 rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                                                  "mrope_section": [4, 2, 2],
                                                  "mrope_interleaved": True}),
        vision_config=dict(depth=2, hidden_size=VISION_HIDDEN, intermediate_size=2 * VISION_HIDDEN,
                           num_heads=HEADS, out_hidden_size=HIDDEN, patch_size=patch,
                           spatial_merge_size=merge, temporal_patch_size=2,
                           num_position_embeddings=16, deepstack_visual_indexes=[0]),
        **_qwen_ids(tok),
    )
    factor = patch * merge
    image_processor = Qwen2VLImageProcessorPil(
        size={"shortest_edge": factor * factor, "longest_edge": 6 * factor * factor},
        patch_size=patch, temporal_patch_size=2, merge_size=merge,
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    # video_processor=None: see _with_checked_args_except_video.
    processor = _with_checked_args_except_video(
        Qwen3VLProcessor, image_processor=image_processor, tokenizer=tok, video_processor=None,
        chat_template=_QWEN_TEMPLATE)
    return Qwen3VLForConditionalGeneration, config, processor


def _gemma3():
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    # "<bos><start_of_turn>user\n<start_of_image>how many?<end_of_turn>\n<start_of_turn>model\n";
    # the processor expands <start_of_image> to "\n\n<start_of_image><image_soft_token>*4<end_of_image>\n\n".
    template = _template("<start_of_turn>", "<end_of_turn>\n", "<start_of_image>", prefix="{{ bos_token }}",
                         roles="{{ ('model' if message['role'] == 'assistant' else message['role']) + '\\n' }}",
                         generation="<start_of_turn>model\n")
    # eos is <end_of_turn>, where a chat turn ends (real Gemma3 keeps "<eos>" as eos_token and lists
    # <end_of_turn> among generation_config's eos ids), so a sampled answer stops at the turn's end.
    tok = _tokenizer(["<start_of_turn>", "<eos>"], bos="<bos>", eos="<end_of_turn>",
                     named={"image_token": "<image_soft_token>", "boi_token": "<start_of_image>",
                            "eoi_token": "<end_of_image>"}, chat_template=template)
    # SigLIP: 32 px in 8 px patches = 4x4, average-pooled to 2x2: 4 tokens an image.
    image_size, patch, tokens = 32, 8, 4
    head_dim = HIDDEN // HEADS
    config = Gemma3Config(
        text_config=_text_config(tok, num_key_value_heads=1, head_dim=head_dim,
                                 query_pre_attn_scalar=head_dim, sliding_window=64,
                                 layer_types=["sliding_attention", "full_attention"]),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=VISION_HIDDEN,
                           intermediate_size=2 * VISION_HIDDEN, num_hidden_layers=1,
                           num_attention_heads=HEADS, image_size=image_size, patch_size=patch,
                           vision_use_head=False),
        mm_tokens_per_image=tokens, image_token_index=tok.image_token_id,
        boi_token_index=tok.boi_token_id, eoi_token_index=tok.convert_tokens_to_ids("<end_of_image>"),
    )
    image_processor = Gemma3ImageProcessorPil(size={"height": image_size, "width": image_size})
    processor = Gemma3Processor(image_processor=image_processor, tokenizer=tok, chat_template=template,
                                image_seq_length=tokens)
    return Gemma3ForConditionalGeneration, config, processor


_IDEFICS_SPECIALS = (["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"]
                     + [f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)])


def _idefics_template(bos_token: str) -> str:
    # "<bos>User:<image>how many?<end_of_utterance>\nAssistant:"
    return _template("", "<end_of_utterance>\n", "<image>", prefix=bos_token,
                     roles="{{ message['role'] | capitalize }}"
                           "{% if message['content'] is not string and message['content'][0]['type'] == 'image' %}"
                           "{{ ':' }}{% else %}{{ ': ' }}{% endif %}",
                     generation="Assistant:")


def _idefics3():
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    template = _idefics_template("<|begin_of_text|>")
    tok = _tokenizer(_IDEFICS_SPECIALS, bos="<|begin_of_text|>", eos="<end_of_utterance>",
                     chat_template=template)
    # 48 px in 8 px patches = 6x6, pixel-shuffled by 2 to 3x3: 9 tokens an image.
    image_size, patch, scale = 48, 8, 2
    tokens = (image_size // patch // scale) ** 2
    config = Idefics3Config(
        vision_config=dict(hidden_size=VISION_HIDDEN, intermediate_size=2 * VISION_HIDDEN,
                           num_hidden_layers=1, num_attention_heads=HEADS, image_size=image_size,
                           patch_size=patch),
        text_config=dict(model_type="llama", **_text_config(tok)),
        scale_factor=scale, image_token_id=tok.convert_tokens_to_ids("<image>"),
        pad_token_id=tok.pad_token_id,
    )
    # No splitting: each image is resized to one image_size square (splitting would add up to
    # 36 crops of as many tokens each, and <row_i_col_j> tokens).
    image_processor = Idefics3ImageProcessorPil(size={"longest_edge": image_size},
                                                max_image_size={"longest_edge": image_size},
                                                do_image_splitting=False)
    processor = Idefics3Processor(image_processor=image_processor, tokenizer=tok, image_seq_len=tokens,
                                  chat_template=template)
    return Idefics3ForConditionalGeneration, config, processor


def _smolvlm():
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration, SmolVLMProcessor
    from transformers.models.smolvlm import processing_smolvlm
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

    if processing_smolvlm.num2words is None:
        # SmolVLMProcessor refuses to start without the `num2words` package, which it uses only to
        # spell a video's frame count in words ("sixteen frames"); images never reach it.
        processing_smolvlm.num2words = str
    template = _idefics_template("<|im_start|>")
    tok = _tokenizer(_IDEFICS_SPECIALS + ["<video>"], bos="<|im_start|>", eos="<end_of_utterance>",
                     chat_template=template)
    # 32 px in 8 px patches = 4x4, pixel-shuffled by 2 to 2x2: 4 tokens an image.
    image_size, patch, scale = 32, 8, 2
    tokens = (image_size // patch // scale) ** 2
    config = SmolVLMConfig(
        vision_config=dict(hidden_size=VISION_HIDDEN, intermediate_size=2 * VISION_HIDDEN,
                           num_hidden_layers=1, num_attention_heads=HEADS, image_size=image_size,
                           patch_size=patch),
        text_config=dict(model_type="llama", **_text_config(tok)),
        scale_factor=scale, image_token_id=tok.convert_tokens_to_ids("<image>"),
        pad_token_id=tok.pad_token_id,
    )
    image_processor = SmolVLMImageProcessorPil(size={"longest_edge": image_size},
                                               max_image_size={"longest_edge": image_size},
                                               do_image_splitting=False)
    # A stand-in video processor: see _NoVideoProcessor and _with_checked_args_except_video.
    processor = _with_checked_args_except_video(
        SmolVLMProcessor, image_processor=image_processor, tokenizer=tok,
        video_processor=_NoVideoProcessor(), image_seq_len=tokens, chat_template=template)
    return SmolVLMForConditionalGeneration, config, processor


_BUILDERS = {"llava": _llava, "qwen2_5_vl": _qwen2_5_vl, "qwen3_vl": _qwen3_vl, "gemma3": _gemma3,
             "idefics3": _idefics3, "smolvlm": _smolvlm}


def build(family: str, seed: int = 0):
    """(model, processor) of `family`: random weights from `seed`, float32, eager attention, eval."""
    if family not in _BUILDERS:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
    model_class, config, processor = _BUILDERS[family]()
    torch.manual_seed(seed)
    model = model_class._from_config(config, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    assert model.get_input_embeddings().num_embeddings >= len(processor.tokenizer)
    return model, processor


# Families whose processor wants images nested per row ([[row0 images], [row1 images]]); the
# others take one flat list, matched to the rows' placeholders in order.
_NESTED = {"gemma3", "idefics3", "smolvlm"}


def messages(text: str, n_images: int) -> list[dict]:
    """One user message: `n_images` image parts, then the text."""
    return [{"role": "user", "content": [{"type": "image"}] * n_images + [{"type": "text", "text": text}]}]


def batch(family: str, processor, texts_images: list[tuple[str, list[PIL.Image.Image]]]) -> dict:
    """The processor's output for the rows (text, images), each rendered through the chat template
    with a generation prompt, left-padded, as torch tensors: input_ids, attention_mask,
    pixel_values and the family's own keys."""
    texts = [processor.apply_chat_template(messages(text, len(imgs)), tokenize=False,
                                           add_generation_prompt=True)
             for text, imgs in texts_images]
    rows = [list(imgs) for _, imgs in texts_images]
    if not any(rows):
        image_input = None
    elif family in _NESTED:
        image_input = rows
    else:
        image_input = [image for row in rows for image in row]
    return processor(text=texts, images=image_input, padding=True, padding_side="left",
                     return_tensors="pt")


def images(n: int, seed: int = 0) -> list[PIL.Image.Image]:
    """`n` random RGB images, each 28 to 64 px a side (sizes vary; every family resizes)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        h, w = rng.integers(28, 65, size=2)
        out.append(PIL.Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8), "RGB"))
    return out


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Models this small run faster on one thread (and the CPU may be shared); a test module
    that imports this fixture gets it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
