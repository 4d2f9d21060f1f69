"""What a documented Python example needs that this machine has not, stood in for before the
example runs (tests/test_doc_examples.py): a hub model is the tiny model, `openai/gsm8k` a few
rows in GSM8K's own format, and a run is cut to a few short steps. Everything else runs as the
example is written. Imported by the example's process first; the tiny model's directory is
GRPO_DOC_TINY."""

import os
from pathlib import Path

import datasets
import transformers

import grpo.config

TINY = os.environ["GRPO_DOC_TINY"]
SHORTER = {"steps": 2, "max_new_tokens": 8, "group_size": 4, "prompts_per_step": 4, "eval_size": 4}


def _tiny_for_hub_names(load):
    def loads(name, *args, **kwargs):
        return load(name if Path(str(name)).exists() else TINY, *args, **kwargs)
    return loads


for auto in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
    auto.from_pretrained = _tiny_for_hub_names(auto.from_pretrained)


def _gsm8k_rows(n: int, start: int) -> list[dict]:
    return [{"question": f"Tom has {a} apples and buys {a + 1} more. How many apples has he now?",
             "answer": f"He has {a} + {a + 1} = {2 * a + 1} apples.\n#### {2 * a + 1}"}
            for a in range(start, start + n)]


_load_dataset = datasets.load_dataset


def load_dataset(path, name=None, *args, **kwargs):
    if path == "openai/gsm8k" and name == "main":
        return datasets.DatasetDict({"train": datasets.Dataset.from_list(_gsm8k_rows(12, 1)),
                                     "test": datasets.Dataset.from_list(_gsm8k_rows(6, 50))})
    if "/" in path and not Path(path).exists():
        raise AssertionError(f"a documented example loads {path!r}, which has no stand-in here")
    return _load_dataset(path, name, *args, **kwargs)      # local files, as grpo reads them


datasets.load_dataset = load_dataset
_build_config = grpo.config.build_config


def build_config(values=None):
    values = dict(values or {})
    for key, most in SHORTER.items():
        if key in values and values[key]:
            values[key] = min(values[key], most)
    values.setdefault("steps", SHORTER["steps"])
    if values.get("eval_every"):
        values["eval_every"] = min(values["eval_every"], values["steps"])
    return _build_config(values)


grpo.config.build_config = build_config
