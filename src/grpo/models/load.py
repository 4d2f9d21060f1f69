"""Loading any Hugging Face model by directory or hub name: where a `model` key loads from
(model_source: run directories, LoRA adapters and their bases), the policy, its tokenizer and
processor, ModelError, and the reference model (frozen_copy, update_reference).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from grpo import vision


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
