"""Loading the policy, the reference model and the tokenizer; the one per-token log-prob function.

Any Hugging Face causal LM directory or hub name loads through `load_policy`. `build_tiny` makes a
small Llama-architecture model with a character-level tokenizer, written as an ordinary Hugging Face
model directory, so tests and the demo run with no download.
"""

from __future__ import annotations

import copy
import string
from pathlib import Path

import torch
import torch.nn.functional as F

# The R1 template's tags are single tokens in the tiny tokenizer so a small model can emit them.
TAG_TOKENS = ["<think>", "</think>", "<answer>", "</answer>"]
SPECIAL_TOKENS = {"pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>"}


def build_tiny_tokenizer():
    """A character-level tokenizer over printable ASCII plus the R1 tags; no file, no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    symbols = list(SPECIAL_TOKENS.values()) + sorted(set(string.printable) - set("\t\n\r\x0b\x0c"))
    symbols += ["\n"]
    vocab = {s: i for i, s in enumerate(symbols)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, **SPECIAL_TOKENS)
    tokenizer.add_tokens(TAG_TOKENS)
    return tokenizer


def build_tiny(output_dir: str | Path, *, hidden_size: int = 128, layers: int = 4, heads: int = 4,
               seed: int = 0) -> Path:
    """Write a randomly initialised tiny Llama and its tokenizer to `output_dir`; return the path."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=hidden_size * 4,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=512, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    output_dir = Path(output_dir)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return output_dir


def load_tokenizer(name_or_path: str, chat_template: str = "auto"):
    """Load a tokenizer; pad on the left for generation; `chat_template=none` drops any template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if chat_template == "none":
        tokenizer.chat_template = None
    elif chat_template != "auto":
        raise ValueError(f"chat_template must be 'auto' or 'none', got {chat_template!r}")
    return tokenizer


def load_policy(name_or_path: str, dtype: str = "float32"):
    """Load any causal LM by directory or hub name, in train mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=getattr(torch, dtype))
    model.train()
    # Dropout would make pi_theta differ from pi_old at ratio 1; GRPO's ratio assumes it does not.
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def frozen_copy(model):
    """The reference model: a copy of the policy that takes no gradients."""
    ref = copy.deepcopy(model)
    ref.eval()
    ref.requires_grad_(False)
    return ref


@torch.no_grad()
def update_reference(ref, policy, rate: float = 1.0) -> None:
    """ref <- rate * policy + (1 - rate) * ref; rate 1 is a hard reset (iterative GRPO)."""
    for ref_param, param in zip(ref.parameters(), policy.parameters()):
        if rate >= 1.0:
            ref_param.copy_(param)
        else:
            ref_param.lerp_(param, rate)


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   completion_len: int, with_entropy: bool = False, temperature: float = 1.0):
    """Log-probabilities of the last `completion_len` tokens of `input_ids` under `model`.

    input_ids, attention_mask: [N, P+T], prompts left-padded, completions right-padded.
    `temperature` divides the logits, so the policy trained is the one that sampled.
    Returns logp [N, T] and, if asked, the entropy of each next-token distribution [N, T].
    """
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=position_ids, use_cache=False).logits
    logits = logits[:, -completion_len - 1:-1, :].float()  # [N, T, V], logits that predict each token
    if temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, -completion_len:]
    logp_all = F.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return logp, None
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy
