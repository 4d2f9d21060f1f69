"""The tiny vision-language families of tests/vlm_families.py: each builds, batches and runs."""

import inspect

import pytest
import torch

from vlm_families import one_thread, FAMILIES, batch, build, images, messages  # noqa: F401 (one_thread: an autouse fixture)

CLASSES = {
    "llava": ("LlavaForConditionalGeneration", "LlavaProcessor"),
    "qwen2_5_vl": ("Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLProcessor"),
    "qwen3_vl": ("Qwen3VLForConditionalGeneration", "Qwen3VLProcessor"),
    "gemma3": ("Gemma3ForConditionalGeneration", "Gemma3Processor"),
    "idefics3": ("Idefics3ForConditionalGeneration", "Idefics3Processor"),
    "smolvlm": ("SmolVLMForConditionalGeneration", "SmolVLMProcessor"),
}

# What each family's processor returns besides input_ids, attention_mask and pixel_values.
EXTRA_KEYS = {
    "llava": set(),
    "qwen2_5_vl": {"image_grid_thw", "mm_token_type_ids"},
    "qwen3_vl": {"image_grid_thw", "mm_token_type_ids"},
    "gemma3": {"token_type_ids"},
    "idefics3": {"pixel_attention_mask"},
    "smolvlm": {"pixel_attention_mask"},
}

# Rows of different prompt lengths; two images in the first row, one in each of the others.
ROWS = [("how many?", 2, 0), ("hi", 1, 1), ("what colour is the top left corner?", 1, 2)]




def n_feature_tokens(pooler_output) -> int:
    """Feature vectors in get_image_features(...).pooler_output: a tensor [images, tokens, hidden]
    (Gemma3) or a list/tuple of [tokens, hidden] tensors, one an image (Llava, Qwen) or one a row
    (Idefics3, SmolVLM)."""
    return sum(f.reshape(-1, f.shape[-1]).shape[0] for f in pooler_output)


@pytest.mark.parametrize("family", FAMILIES)
def test_family_builds_batches_and_runs(family):
    model, processor = build(family)
    assert (type(model).__name__, type(processor).__name__) == CLASSES[family]
    assert not model.training and model.dtype == torch.float32
    vocab = model.config.get_text_config().vocab_size
    assert vocab >= len(processor.tokenizer)

    # The chat template writes one image placeholder per image part.
    text = processor.apply_chat_template(messages("how many?", 2), tokenize=False, add_generation_prompt=True)
    assert text.count(processor.image_token) == 2 and "how many?" in text

    rows = [(prompt, images(n, seed)) for prompt, n, seed in ROWS]
    inputs = batch(family, processor, rows)
    assert set(inputs) == {"input_ids", "attention_mask", "pixel_values"} | EXTRA_KEYS[family]
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    assert ids.shape[0] == len(rows) and mask.shape == ids.shape
    # Left-padded: every row ends on a real token; the shorter rows start with padding.
    assert mask[:, -1].all() and not mask[:, 0].all()
    assert (ids[mask == 0] == processor.tokenizer.pad_token_id).all()
    assert (ids < vocab).all()

    with torch.no_grad():
        logits = model(**inputs).logits
        wanted = inspect.signature(model.get_image_features).parameters
        features = model.get_image_features(**{k: v for k, v in inputs.items() if k in wanted})
    assert logits.shape == (*ids.shape, vocab)
    assert torch.isfinite(logits).all()

    image_tokens = (ids == model.config.image_token_id).sum(dim=1)
    assert (image_tokens > 0).all()
    assert image_tokens[0] > image_tokens[1]            # two images against one
    assert image_tokens.sum().item() == n_feature_tokens(features.pooler_output)


@pytest.mark.parametrize("family", FAMILIES)
def test_build_is_seeded(family):
    a, _ = build(family, seed=0)
    b, _ = build(family, seed=0)
    c, _ = build(family, seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)


def test_images_are_small_seeded_rgb_of_varying_sizes():
    first = images(6, seed=3)
    assert len(first) == 6 and all(im.mode == "RGB" for im in first)
    assert all(28 <= side <= 64 for im in first for side in im.size)
    assert len({im.size for im in first}) > 1
    again = images(6, seed=3)
    assert all(a.size == b.size and a.tobytes() == b.tobytes() for a, b in zip(first, again))
    assert images(1, seed=4)[0].tobytes() != first[0].tobytes()
