"""Loading the policy, the reference model and the tokenizer; the one per-token log-prob function.

Any Hugging Face causal LM directory or hub name loads through `load_policy`. `build_tiny` makes a
small Llama-architecture model with a character-level tokenizer, written as an ordinary Hugging Face
model directory, so tests and the demo run with no download.
"""

from __future__ import annotations

import copy
import math
import string
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from grpo.models import decoder
from grpo import vision

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


class ModelError(ValueError):
    """A model directory or tokenizer that cannot be used; the message names the key and the path."""


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                   "vocab.txt", "spiece.model")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5")


def _looks_local(name: str) -> bool:
    """A path rather than a hub name (`org/name`): absolute, relative to `.` or `~`, deeper than
    one slash, or inside a directory that exists here (`runs/nothing` when `runs/` does)."""
    parent = Path(name).expanduser().parent
    return (name.startswith(("/", ".", "~")) or name.count("/") > 1
            or (str(parent) != "." and parent.is_dir()))


def _not_on_the_hub(name: str) -> str | None:
    """Why the hub cannot give `name`, found in seconds (a cached copy, else one request with a
    timeout), or None when it can: the hub library's own loading retries an unreachable hub for
    most of a minute, five times for each file, before it says so."""
    try:
        import huggingface_hub
        from huggingface_hub.utils import HfHubHTTPError
    except ImportError:
        return None
    if isinstance(huggingface_hub.try_to_load_from_cache(name, "config.json"), str):
        return None
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        return "it is not in the hub cache (HF_HUB_OFFLINE is set)"
    try:
        huggingface_hub.model_info(name, timeout=5)
    except huggingface_hub.errors.RepositoryNotFoundError:
        return "the hub has no model of that name (or it is private: log in with hf auth login)"
    except HfHubHTTPError:
        return None                     # another answer from the hub: let the loader say more
    except Exception as e:  # noqa: BLE001 - no network, no DNS, a timeout, a malformed name
        return f"the hub cannot be reached or refuses the name ({type(e).__name__})"
    return None


def model_source(key: str, name: str, runs: bool = True, adapters: bool = True,
                 depth: int = 0) -> tuple[str, str | None]:
    """Where `key=name` loads from, checked before transformers sees it: (path, a note or None).

    A directory must hold a model (config.json, weights, tokenizer files); a run directory (with
    `runs`) stands for its `final/`, said in the note; a LoRA adapter directory (with `adapters`)
    stands for its base with the adapter merged in (load_policy), its base checked as a model
    itself. Anything else is a ModelError naming the key, the path and what to give instead; a
    name that is no local path is left to the hub.
    """
    path = Path(name).expanduser()
    give = "give a Hugging Face model directory (a run's final/) or a hub name"

    def refuse(why: str) -> ModelError:
        return ModelError(f"config key '{key}': cannot load '{name}': {why}")

    if not path.exists():
        if _looks_local(name):
            raise refuse(f"no such directory; {give}")
        why = _not_on_the_hub(name)
        if why:
            raise refuse(f"no directory here, so it was read as a hub name, and {why}; {give}")
        return name, None
    if not path.is_dir():
        raise refuse(f"a file, not a model directory; {give}")
    files = sorted(p.name for p in path.iterdir())
    if "config.json" not in files:
        final = path / "final"
        if runs and final.is_dir():    # a run directory: its final/ is checked as a model itself
            loaded, _ = model_source(key, str(final), runs=False)
            return loaded, f"{key}={name} is a run directory: loading its final model, {final}"
        if runs and (path / "checkpoints").is_dir():
            raise refuse(f"a run directory without final/ (the run stopped before its end); give "
                         f"one of its checkpoints, {key}={path / 'checkpoints'}/step-N, or continue "
                         "the run with resume=auto")
        if "adapter_config.json" in files and adapters:
            return _adapter_source(key, name, path, files, depth)
        if "adapter_config.json" in files:
            raise refuse("a LoRA adapter, not a whole model; give its merged model (lora_merge=true "
                         "writes final/merged) or the base model")
        if not files:
            raise refuse(f"an empty directory; {give}")
        shown = ", ".join(files[:5]) + (", ..." if len(files) > 5 else "")
        raise refuse(f"not a model directory (no config.json; it holds {shown}); {give}")
    if not any(f.endswith(WEIGHT_SUFFIXES) for f in files):
        raise refuse("config.json but no weights (model.safetensors); write the directory with "
                     "save_pretrained, or give a run's final/")
    if not any(f in TOKENIZER_FILES for f in files):
        raise refuse("no tokenizer files (tokenizer.json, tokenizer_config.json); save the "
                     "tokenizer into it with save_pretrained, or copy them from the base model")
    return str(path), None


def _adapter_source(key: str, name: str, path: Path, files: list[str], depth: int) -> tuple[str, str]:
    """model_source for a peft adapter directory: its weights there, its base a loadable model."""
    if not any(f.startswith("adapter_model.") for f in files):
        raise ModelError(f"config key '{key}': cannot load '{name}': adapter_config.json but no "
                         "adapter weights (adapter_model.safetensors); give the whole adapter "
                         "directory as peft's save_pretrained writes it")
    try:
        base = adapter_base(path)
    except ModelError as e:
        raise ModelError(f"config key '{key}': cannot load '{name}': {e}") from None
    if depth >= 8:
        raise ModelError(f"config key '{key}': cannot load '{name}': a chain of more than 8 LoRA "
                         "adapters, each naming the next as its base (base_model_name_or_path in "
                         "adapter_config.json); give a merged model (lora_merge=true writes final/merged)")
    try:
        model_source(key, base, runs=False, depth=depth + 1)
    except ModelError as e:
        why = str(e).split(": ", 2)[-1]
        raise ModelError(f"config key '{key}': cannot load '{name}', a LoRA adapter: its base model "
                         f"{base} (base_model_name_or_path in its adapter_config.json) cannot be "
                         f"loaded: {why}") from None
    return str(path), f"{key}={name} is a LoRA adapter: loading its base model, {base}, with it merged in"


def is_adapter_dir(name_or_path: str) -> bool:
    """A peft adapter directory (adapter_config.json, no config.json of a whole model)."""
    path = Path(name_or_path).expanduser()
    return (path / "adapter_config.json").is_file() and not (path / "config.json").is_file()


def adapter_base(adapter_dir: str | Path) -> str:
    """The base model a peft adapter directory names (`base_model_name_or_path`). A local path
    that is not there (a run directory moved, or a path relative to where the run was started) is
    looked for by its last part in the adapter's directory and the three above it, where a run
    keeps base_model/, cold_start/ and final/ beside its checkpoints/step-N/."""
    import json
    adapter = Path(adapter_dir).expanduser()
    try:
        recorded = json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError) as e:
        raise ModelError(f"a LoRA adapter whose adapter_config.json cannot be read: "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if not recorded:
        raise ModelError("a LoRA adapter whose adapter_config.json names no base model "
                         "(base_model_name_or_path); set it to the base model's directory or hub name")
    path = Path(recorded).expanduser()
    if path.exists() or not _looks_local(recorded):
        return recorded
    for above in [adapter.resolve(), *list(adapter.resolve().parents)[:3]]:
        if (above / path.name).is_dir() and above / path.name != adapter.resolve():
            return str(above / path.name)
    return recorded               # model_source says it is missing


def whole_model(name_or_path: str) -> str:
    """The whole model at the bottom of a chain of adapters (the directory or hub name whose
    config and architecture they share); any other name is itself."""
    for _ in range(8):
        if not is_adapter_dir(name_or_path):
            break
        name_or_path = adapter_base(name_or_path)
    return name_or_path


def merge_adapter(model, adapter_dir: str | Path):
    """`model` with the peft adapter in `adapter_dir` merged into its weights: a plain model
    again, every weight trainable, named after the adapter directory (so an adapter trained on it
    records that directory as its base, and loading that one merges this one first)."""
    try:
        from peft import PeftModel
    except ImportError:
        raise ModelError(f"config key 'model': {adapter_dir} is a LoRA adapter; loading it needs "
                         "peft (pip install peft)") from None
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    merged.requires_grad_(True)   # peft froze the base for the adapter's sake
    merged.name_or_path = str(Path(adapter_dir).resolve())
    return merged


def is_vision_config(name_or_path: str) -> bool:
    """True for a model transformers loads as image-text-to-text (LLaVA, Qwen-VL, Gemma 3, ...)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    try:
        config = AutoConfig.from_pretrained(whole_model(name_or_path))
    except (OSError, ValueError, KeyError):
        return False
    return config.model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES and hasattr(config, "vision_config")


def load_processor(name_or_path: str):
    """The processor of a vision-language model (it turns images into image tokens and pixels);
    None for a text-only model."""
    if not is_vision_config(name_or_path):
        return None
    from transformers import AutoProcessor
    try:
        return AutoProcessor.from_pretrained(whole_model(name_or_path))
    except ImportError as e:
        raise ModelError(f"config key 'model': the processor of {name_or_path} needs a package that is "
                         f"missing: {str(e).splitlines()[0]} (Qwen-VL's processors need torchvision, "
                         "matching your torch build; see docs/guides/vision.md)") from None


def load_tokenizer(name_or_path: str, chat_template: str = "auto"):
    """Load a tokenizer; pad on the left for generation; `chat_template=none` drops any template.

    With no pad token, EOS pads (masks come from generated lengths, never from the pad id); with
    neither, or with `chat_template=required` and no template, a ModelError says what is missing.
    """
    from transformers import AutoTokenizer

    processor = load_processor(name_or_path)
    if is_adapter_dir(name_or_path) and not any((Path(name_or_path) / f).is_file() for f in TOKENIZER_FILES):
        name_or_path = whole_model(name_or_path)      # an adapter saved without its tokenizer
    tokenizer = processor.tokenizer if processor is not None else AutoTokenizer.from_pretrained(name_or_path)
    if processor is not None:
        tokenizer.grpo_processor = processor      # prompts with images go through it (vision.encode)
        if getattr(processor, "chat_template", None) and not getattr(tokenizer, "chat_template", None):
            tokenizer.chat_template = processor.chat_template
    return prepare_tokenizer(tokenizer, name_or_path, chat_template)


def prepare_tokenizer(tokenizer, name_or_path: str, chat_template: str = "auto"):
    """A loaded tokenizer made ready for generation, in place (load_tokenizer's rules): EOS
    required, EOS pads when there is no pad token, padding on the left, `chat_template` applied."""
    if tokenizer.eos_token is None:
        raise ModelError(f"config key 'model': the tokenizer of {name_or_path} has no EOS token, so "
                         "completions cannot end; use a tokenizer that defines eos_token")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if chat_template == "none":
        tokenizer.chat_template = None
    elif chat_template == "required" and not getattr(tokenizer, "chat_template", None):
        raise ModelError(f"config key 'chat_template' is required, but the tokenizer of "
                         f"{name_or_path} has no chat template; set chat_template=auto or none, or "
                         "use an instruct model's tokenizer")
    elif chat_template not in ("auto", "required"):
        tokenizer.chat_template = chat_template_text(chat_template)
    return tokenizer


def chat_template_text(value: str) -> str:
    """The Jinja template a `chat_template` key gives: the text itself when it holds `{`, else
    the contents of the file it names."""
    if "{" in value:
        return value
    path = Path(value)
    if not path.is_file():
        raise ModelError(f"config key 'chat_template': {value!r} is not auto, required or none, "
                         "not a Jinja template, and no such file")
    return path.read_text(encoding="utf-8")


def load_policy(name_or_path: str, dtype: str = "float32"):
    """Load any causal LM, or image-text-to-text model, by directory or hub name, in train mode;
    a LoRA adapter directory loads as its base with the adapter merged in (merge_adapter)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    if is_adapter_dir(name_or_path):
        return merge_adapter(load_policy(adapter_base(name_or_path), dtype), name_or_path)

    auto = AutoModelForImageTextToText if is_vision_config(name_or_path) else AutoModelForCausalLM
    return ready_for_training(auto.from_pretrained(name_or_path, dtype=getattr(torch, dtype)))


def ready_for_training(model):
    """A loaded model in train mode with dropout off, in place."""
    model.train()
    # Dropout would make pi_theta differ from pi_old at ratio 1; GRPO's ratio assumes it does not.
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def frozen_copy(model, share_tower: bool = True):
    """The reference model: a copy of the policy that takes no gradients. A frozen image encoder
    is shared, not copied (unless `share_tower` is False): the two models' features are the same."""
    tower = vision.tower_of(model)
    shared = share_tower and tower is not None and not any(p.requires_grad for p in tower.parameters())
    ref = copy.deepcopy(model, {id(tower): tower} if shared else None)
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


LOGIT_CHUNK_ELEMENTS = 1 << 24  # logits held at once by the chunked head: 16M floats, 64 MiB


class _SelectedLogprobs(torch.autograd.Function):
    """log softmax(h W^T + b)[target] for M rows of hidden states, never holding [M, V] logits.

    Forward and backward walk the rows in chunks of `chunk` and recompute each chunk's logits, so
    memory is O(chunk * V) whatever M is. Also returns each row's entropy (no gradient).
    d logp / d logits = onehot(target) - softmax(logits), scaled by 1/temperature.
    Each pass works in two [chunk, V] buffers allocated once and reused, in place: allocating
    and freeing large blocks chunk after chunk fragments the C allocator's heap (measured: a
    12 GiB peak for a 151,936-token vocabulary, against 0.6 GiB with reuse).
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, inv_temp: float, chunk: int, top_p: float = 1.0,
                top_k: int = 0, min_p: float = 0.0, penalty: "Penalty | None" = None):
        cut = Cut(top_p, top_k, min_p)
        M = hidden.shape[0]
        logp, lse, entropy = (hidden.new_empty(M, dtype=torch.float32) for _ in range(3))
        buffers = _Buffers(min(chunk, M), weight.shape[0], hidden.device)
        # float32 hidden states and a bfloat16 head (FSDP2's mixed precision gathers the weights
        # in bfloat16): the head in float32, as the backward computes it
        w = weight.float() if hidden.dtype == torch.float32 else weight
        for start in range(0, M, chunk):
            rows = slice(start, start + chunk)
            shifted = buffers.logits(hidden[rows], w, bias, inv_temp)
            if penalty is not None:
                shifted.mul_(penalty.scale(shifted, rows))          # repeats penalized as sampled
            if cut.active:
                cut.apply_(shifted, targets[rows])           # -inf outside what the sampler drew from
            top = shifted.amax(-1, keepdim=True)
            shifted.sub_(top)                                      # logits - max
            probs = torch.exp(shifted, out=buffers.second(len(shifted)))
            total = probs.sum(-1, keepdim=True)
            log_total = total.log()
            logp[rows] = (shifted.gather(-1, targets[rows, None]) - log_total).squeeze(-1)
            lse[rows] = (top + log_total).squeeze(-1)
            if cut.active:
                shifted.clamp_(min=torch.finfo(torch.float32).min)  # 0 * -inf would be NaN
            # entropy = log Z - sum p * (logits - max) / Z, with Z = sum exp(logits - max)
            entropy[rows] = (log_total - probs.mul_(shifted).sum(-1, keepdim=True) / total).squeeze(-1)
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.inv_temp, ctx.chunk, ctx.cut, ctx.penalty = inv_temp, chunk, cut, penalty
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) \
            if bias is not None and ctx.needs_input_grad[2] else None
        buffers = _Buffers(min(ctx.chunk, hidden.shape[0]), weight.shape[0], hidden.device)
        w = weight.float()
        for start in range(0, hidden.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            h = hidden[rows]
            d_logits = buffers.logits(h, w if h.dtype == torch.float32 else weight, bias, ctx.inv_temp)
            scale = None
            if ctx.penalty is not None:
                scale = ctx.penalty.scale(d_logits, rows)
                d_logits.mul_(scale)
            if ctx.cut.active:
                ctx.cut.apply_(d_logits, targets[rows])       # the same cut: exp -> 0 outside it
            g = grad_logp[rows].float()
            d_logits.sub_(lse[rows, None]).exp_().mul_(-g[:, None])   # -g * softmax
            d_logits.scatter_add_(-1, targets[rows, None], g[:, None])  # + g at the target
            if scale is not None:                                     # d penalized / d logit
                d_logits.mul_(scale)
            if ctx.inv_temp != 1.0:
                d_logits.mul_(ctx.inv_temp)
            if grad_hidden is not None:
                grad_hidden[rows] = (d_logits @ w).to(hidden.dtype)
            if grad_weight is not None:
                grad_weight.addmm_(d_logits.T, h.float())
            if grad_bias is not None:
                grad_bias += d_logits.sum(0)
        return (grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype),
                None if grad_bias is None else grad_bias.to(bias.dtype), None, None, None, None, None,
                None, None)


def nucleus_(logits: torch.Tensor, top_p: float, targets: torch.Tensor | None = None) -> torch.Tensor:
    """Top-p in place on [rows, V] logits (already divided by the temperature): -inf outside the
    smallest set of most likely tokens whose probability reaches top_p, the rule of transformers'
    TopPLogitsWarper that the samplers draw with. A row's target is always kept: it was drawn, so
    it was in the sampler's nucleus (float noise between two computations can put it at the edge)."""
    ascending, order = torch.sort(logits, dim=-1)
    drop_sorted = ascending.softmax(-1).cumsum_(-1) <= (1 - top_p)
    drop_sorted[..., -1] = False                     # the most likely token always stays
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    if targets is not None:
        drop.scatter_(-1, targets[:, None], False)
    return logits.masked_fill_(drop, float("-inf"))


@dataclass(frozen=True)
class Cut:
    """What the samplers cut from a next-token distribution after the temperature, in the order
    transformers' warpers apply them: top-k (the k largest logits; ties with the k-th kept), top-p
    (nucleus_), min-p (tokens whose probability is below min_p times the largest one's). The
    training log-probs cut the same, so the policy trained is the distribution that sampled.
    0 (top_k, min_p) and 1 (top_p) mean no cut."""
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0

    @property
    def active(self) -> bool:
        return self.top_p < 1.0 or self.top_k > 0 or self.min_p > 0.0

    def apply_(self, logits: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """In place on [rows, V] logits (already divided by the temperature): -inf outside the
        cut. A row's target is always kept: it was drawn, so it was inside the sampler's cut
        (float noise between two computations can put it at the edge)."""
        if self.top_k > 0 and self.top_k < logits.shape[-1]:
            kth = logits.topk(self.top_k, dim=-1).values[..., -1:]
            drop = logits < kth
            if targets is not None:
                drop.scatter_(-1, targets[:, None], False)
            logits.masked_fill_(drop, float("-inf"))
        if self.top_p < 1.0:
            nucleus_(logits, self.top_p, targets)
        if self.min_p > 0.0:
            # p_i < min_p * p_max  <=>  logit_i < max logit + log(min_p): no softmax needed
            drop = logits < logits.amax(-1, keepdim=True) + math.log(self.min_p)
            if targets is not None:
                drop.scatter_(-1, targets[:, None], False)
            logits.masked_fill_(drop, float("-inf"))
        return logits


class Penalty:
    """The repetition penalty (Keskar et al. 2019, CTRL, section 4.1) as transformers' and vLLM's
    samplers apply it: the logit of every token already in the prompt or in the completion so far
    is divided by `factor` where it is positive and multiplied by it where it is negative (a
    factor above 1 makes repeats less likely). The training log-probs penalize the same tokens at
    each position, so the policy trained is the distribution that sampled.

    `first` [N, V] holds, per row, the completion position from which each token is penalized:
    0 for a prompt token, j + 1 for a token first drawn at position j, never (T + 1) otherwise;
    `row` and `position` [M] say which row and position each of the M selected positions is."""

    def __init__(self, factor: float, first: torch.Tensor, row: torch.Tensor, position: torch.Tensor):
        self.factor, self.first, self.row, self.position = factor, first, row, position

    @staticmethod
    def of(factor: float, prompt_ids, prompt_mask, completion_ids, completion_mask,
           vocab: int) -> "Penalty | None":
        """The penalty for completions [N, T] (right-padded, `completion_mask` on their tokens)
        after prompts [N, P] (`prompt_mask` on real tokens, padding never penalized); None for
        factor 1 (no penalty)."""
        if factor == 1.0:
            return None
        N, T = completion_ids.shape
        never = T + 1
        first = torch.full((N, vocab), never, dtype=torch.int32, device=completion_ids.device)
        drawn = torch.arange(1, T + 1, dtype=torch.int32, device=first.device).expand(N, T)
        first.scatter_reduce_(1, completion_ids, torch.where(completion_mask.bool(), drawn, never),
                              reduce="amin")
        first.scatter_reduce_(1, prompt_ids, torch.where(prompt_mask.bool(), 0, never).int(),
                              reduce="amin")
        row, position = completion_mask.bool().nonzero(as_tuple=True)
        return Penalty(factor, first, row, position)

    def scale(self, logits: torch.Tensor, rows: slice | None = None) -> torch.Tensor:
        """The factor [n, V] each of `logits` [n, V] (the selected positions `rows`) is
        multiplied by: 1 / factor on a penalized positive logit, factor on a negative one, 1 on
        the rest. It is also d penalized / d logit."""
        picked = slice(None) if rows is None else rows
        penalized = self.first[self.row[picked]] <= self.position[picked, None]
        return torch.where(penalized, torch.where(logits < 0, self.factor, 1.0 / self.factor),
                           1.0).to(logits.dtype)


def penalize_(scores: torch.Tensor, seen: torch.Tensor, factor: float) -> torch.Tensor:
    """The sampler's repetition penalty in place on [n, V] scores, `seen` [n, V] marking the
    tokens of each row's prompt and completion so far (Penalty says the rule)."""
    return scores.mul_(torch.where(seen, torch.where(scores < 0, factor, 1.0 / factor), 1.0))


class _Buffers:
    """Two float32 [rows, V] work buffers for the chunked head, reused chunk after chunk."""

    def __init__(self, rows: int, vocab: int, device):
        self.first = torch.empty(rows, vocab, device=device)
        self._second = None

    def logits(self, h, weight, bias, inv_temp: float) -> torch.Tensor:
        out = self.first[: len(h)]
        if weight.dtype == torch.float32 and h.dtype == torch.float32:
            torch.matmul(h, weight.T, out=out)
        else:
            out.copy_(h @ weight.T)
        if bias is not None:
            out.add_(bias.float())
        if inv_temp != 1.0:
            out.mul_(inv_temp)
        return out

    def second(self, rows: int) -> torch.Tensor:
        if self._second is None:
            self._second = torch.empty_like(self.first)
        return self._second[:rows]


def selected_logprobs(hidden: torch.Tensor, head: torch.nn.Linear, targets: torch.Tensor,
                      temperature: float = 1.0, top_p: float = 1.0, banned: list[int] | None = None,
                      top_k: int = 0, min_p: float = 0.0, penalty: Penalty | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs [M] of `targets` [M] and entropies [M] from final hidden states [M, H] and the
    output head, in chunks of about LOGIT_CHUNK_ELEMENTS logits (see `_SelectedLogprobs`); with
    top_p < 1, of the truncated, renormalized distribution the sampler drew from (`nucleus_`),
    in chunks a quarter as large (the sort needs room); top_k and min_p cut as `Cut` says, after
    the repetition `penalty` (for the M positions in order)."""
    chunk = max(1, LOGIT_CHUNK_ELEMENTS // head.weight.shape[0]
                // (4 if Cut(top_p, top_k, min_p).active or penalty is not None else 1))
    bias = head.bias
    if banned:      # tokens the sampler never draws (vision.placeholder_ids): the same distribution
        ban = torch.zeros(head.weight.shape[0], device=hidden.device)
        ban[list(banned)] = vision.BANNED_LOGIT
        bias = ban if bias is None else bias + ban
    return _SelectedLogprobs.apply(hidden, head.weight, bias, targets, 1.0 / temperature, chunk,
                                   top_p, top_k, min_p, penalty)


def _head_is_plain(model) -> bool:
    """True when logits are exactly lm_head(backbone output): no soft-capping or logit scaling."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    head = model.get_output_embeddings()
    return (isinstance(head, torch.nn.Linear) and hasattr(model, model.base_model_prefix)
            and not getattr(config, "final_logit_softcapping", None)
            and getattr(config, "logit_scale", 1.0) in (None, 1.0))


def _lean_hidden(lean, input_ids, attention_mask, position_ids, T: int) -> torch.Tensor:
    """Hidden states [N, T, H] that predict the last T tokens, by the lean decoder; completions
    of one prompt (a group) share the prompt's forward pass when they are right-padded."""
    P = input_ids.shape[1] - T
    prompts, prompt_of = torch.unique(torch.cat([input_ids[:, :P], attention_mask[:, :P]], 1),
                                      dim=0, return_inverse=True)
    completion_attention = attention_mask[:, P:]
    right_padded = bool((completion_attention[:, 1:] <= completion_attention[:, :-1]).all())
    if len(prompts) < len(input_ids) and right_padded:
        return lean.completion_hidden(prompts[:, :P], prompts[:, P:], prompt_of, input_ids[:, P:])
    return lean.hidden(input_ids, attention_mask, position_ids)[:, -T - 1:-1]


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   completion_len: int, with_entropy: bool = False, temperature: float = 1.0,
                   completion_mask: torch.Tensor | None = None, top_p: float = 1.0,
                   visuals: list | None = None, top_k: int = 0, min_p: float = 0.0,
                   repetition_penalty: float = 1.0):
    """Log-probabilities of the last `completion_len` tokens of `input_ids` under `model`.

    input_ids, attention_mask: [N, P+T], prompts left-padded, completions right-padded.
    `temperature` divides the logits, `repetition_penalty` penalizes the tokens already in the
    prompt or the completion (`Penalty`), and `top_p`, `top_k` and `min_p` cut them as the sampler
    did (`Cut`), so the policy trained is the distribution that sampled.
    Returns logp [N, T] (0 where `completion_mask`, default the last T of `attention_mask`, is 0)
    and, if asked, the entropy of each next-token distribution [N, T] (0 there too, no gradient).

    Only the masked completion positions go through the output head, in chunks, so neither the
    prompt positions, nor padding, nor the full [N, T, V] logits tensor ever cost time or memory.
    `visuals` [N] (vision.Visual or None) are the rows' prompt images: the image encoder runs once
    per distinct prompt (vision.encoder_outputs) and the model's own forward merges the features.
    """
    T = completion_len
    if hasattr(model, "get_base_model"):  # a peft model: its adapters live inside the base model
        model = model.get_base_model()
    compute = getattr(model, "grpo_autocast", None)
    if compute is not None and not decoder.sharded(model):   # FSDP2 casts by its own policy
        with torch.autocast(input_ids.device.type, dtype=compute):
            hidden_or_logp = _token_logprobs(model, input_ids, attention_mask, T, with_entropy,
                                             temperature, completion_mask, top_p, head_in_fp32=True,
                                             visuals=visuals, top_k=top_k, min_p=min_p,
                                             repetition_penalty=repetition_penalty)
        return hidden_or_logp
    return _token_logprobs(model, input_ids, attention_mask, T, with_entropy, temperature,
                           completion_mask, top_p, visuals=visuals, top_k=top_k, min_p=min_p,
                           repetition_penalty=repetition_penalty)


def _token_logprobs(model, input_ids, attention_mask, T: int, with_entropy: bool, temperature: float,
                    completion_mask, top_p: float, head_in_fp32: bool = False, visuals=None,
                    top_k: int = 0, min_p: float = 0.0, repetition_penalty: float = 1.0):
    cut = Cut(top_p, top_k, min_p)
    mask = (attention_mask[:, -T:] if completion_mask is None else completion_mask).bool()
    mask = mask.to(input_ids.device)
    P = input_ids.shape[1] - T
    penalty = None if repetition_penalty == 1.0 else Penalty.of(
        repetition_penalty, input_ids[:, :P], attention_mask[:, :P], input_ids[:, P:], mask,
        model.get_output_embeddings().weight.shape[0])
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    targets = input_ids[:, -T:]
    with_images = vision.is_vision_model(model)
    visuals = visuals if visuals is not None else [None] * len(input_ids)

    def inputs() -> dict:         # one forward over every row (a VLM's: its images merged in)
        if with_images:
            return vision.forward_inputs(model, input_ids, attention_mask, visuals)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
    if not _head_is_plain(model) or decoder.sharded(model):
        # A head that is more than a linear layer, or FSDP2 shards (gathered by the root's forward)
        logits = model(**inputs(), use_cache=False).logits[:, -T - 1:-1].float()
        banned = vision.placeholder_ids(model) if with_images else []
        if banned:
            logits = logits.index_fill(-1, torch.tensor(banned, device=logits.device), vision.BANNED_LOGIT)
        # (under autocast the head ran in bfloat16 here: only a head that is not a plain linear
        # layer, or FSDP2, takes this path)
        logits = logits / temperature
        if penalty is not None:
            scale = penalty.scale(logits.detach().reshape(-1, logits.shape[-1])[mask.reshape(-1)])
            logits = logits.masked_scatter(mask[..., None], logits[mask] * scale)
        if cut.active:
            flat = logits.detach().reshape(-1, logits.shape[-1]).clone()
            keep = cut.apply_(flat, targets.reshape(-1)).view_as(logits).isfinite()
            logits = logits.masked_fill(~keep, float("-inf"))
        logp_all = F.log_softmax(logits, dim=-1)
        logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1) * mask
        entropy = (-(logp_all.exp() * logp_all.clamp(min=torch.finfo(logp_all.dtype).min)).sum(-1)
                   * mask).detach()
        return logp, entropy if with_entropy else None
    banned = vision.placeholder_ids(model) if with_images else None
    if with_images:               # a vision-language model: its own forward merges the images
        backbone = getattr(model, model.base_model_prefix)
        hidden = vision.shared_prompt_hidden(model, backbone, input_ids, attention_mask, visuals, T)
        if hidden is None:
            hidden = backbone(**inputs(), use_cache=False).last_hidden_state[:, -T - 1:-1]
    elif decoder.supports(model):
        hidden = _lean_hidden(decoder.Decoder(model), input_ids, attention_mask, position_ids, T)
    else:
        backbone = getattr(model, model.base_model_prefix)
        hidden = backbone(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids, use_cache=False).last_hidden_state[:, -T - 1:-1]
    if head_in_fp32:      # the output head in float32, whatever the compute dtype
        with torch.autocast(input_ids.device.type, enabled=False):
            logp_sel, entropy_sel = selected_logprobs(hidden[mask].float(), model.get_output_embeddings(),
                                                      targets[mask], temperature, top_p, banned,
                                                      top_k, min_p, penalty)
    else:
        logp_sel, entropy_sel = selected_logprobs(hidden[mask], model.get_output_embeddings(),
                                                  targets[mask], temperature, top_p, banned,
                                                  top_k, min_p, penalty)    # [M]
    logp = logp_sel.new_zeros(mask.shape).masked_scatter(mask, logp_sel)
    if not with_entropy:
        return logp, None
    return logp, entropy_sel.new_zeros(mask.shape).masked_scatter(mask, entropy_sel)
