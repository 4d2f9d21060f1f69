"""Vision-language policies: images in prompts, through the model's own processor, once per group.

    dataset row ──images.of_row──> PIL images ──inputs.encode──> prompt ids + one `Visual` per prompt
                                                                   (the processor's pixel tensors)
    sampling:  prefill each prompt once with its images ──> KV cache copied to its G rows
    training:  inputs.encoder_outputs: the vision encoder runs once per distinct prompt in a pass;
               its features are indexed out to the pass's rows and handed to the model's forward
               as `mm_encoder_outputs`, so the tower never sees a prompt twice in one pass.

A `Visual` is shared by reference between the rows of a group (`Rollout.visuals`), so a group's
pixels are held once however large G is. The language model's forward is Hugging Face's own, so
each family's image-token merging, multimodal RoPE (Qwen), bidirectional image attention
(Gemma 3) and deepstack features (Qwen3-VL) are what the model defines, not a re-implementation.
"""

from grpo.vision.images import ImageError, image_column, load_image, row_images, thumbnail
from grpo.vision.inputs import (TOWERS, Visual, cache_argument, encode, encoder_outputs, forward_inputs, freeze_tower,
                                image_placeholder, parts_of, placeholder_ids, prompt_positions, shared_prompt_hidden, BANNED_LOGIT,
                                is_vision_model, tower_of)

__all__ = ["TOWERS", "ImageError", "Visual", "cache_argument", "encode", "encoder_outputs", "forward_inputs", "freeze_tower",
           "image_placeholder", "parts_of", "placeholder_ids", "prompt_positions", "shared_prompt_hidden", "BANNED_LOGIT",
           "image_column", "is_vision_model", "load_image", "row_images", "thumbnail", "tower_of"]
