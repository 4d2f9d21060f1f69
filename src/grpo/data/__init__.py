"""Datasets and prompt formatting.

Rows are dicts with `prompt` (text, or a list of chat messages, before templating), `answer`, and
any other columns, which reach reward functions as keyword arguments. Files load through Hugging
Face `datasets` (JSONL, Parquet, CSV, each compressed or not, a dataset directory or a hub name with
its configuration and split); the public benchmarks' files work as they are published: GSM8K (`question`, `answer` ending
in `#### n`), MATH (`problem`, a worked `solution` whose last `\\boxed{}` is the gold), HumanEval,
MBPP, APPS, CodeContests and LiveCodeBench rows (their test columns are read by `code_tests`).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from grpo.vision.images import ImageError, image_column, row_images

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


class DataError(ValueError):
    """A dataset that cannot be used; the message names the file and the column."""


# Where the prompt and the answer are found when the configured column is absent, in this order:
# GSM8K/APPS `question`, HumanEval/TRL `prompt`, MATH `problem`, MBPP `text`, LiveCodeBench
# `question_content`, CodeContests `description`; MATH's worked `solution` holds the gold.
PROMPT_COLUMNS = ("prompt", "problem", "question", "text", "question_content", "description")
ANSWER_COLUMNS = ("answer", "solution")


@dataclass(frozen=True)
class Columns:
    """Which dataset column is which; each is renamed to the name on the left for the rewards."""
    prompt: str = ""          # empty: the one of PROMPT_COLUMNS the dataset has (prompt_column)
    answer: str = "answer"
    tests: str = "tests"
    entry_point: str = "entry_point"
    images: str = ""          # empty: `images` or `image` when the dataset has one


def first_line(error: Exception) -> str:
    """An error's message cut to its first line (a library's rest is advice about other setups),
    or its type's name when it has no message."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def fingerprint(source: str, rows: list[dict]) -> dict:
    """What identifies the rows a key loaded, for a checkpoint to record: `source` (the path, or
    the label of rows given to train()), how many rows, and the SHA-256 of every row's values in
    the file's order, so any changed, added or removed row or value changes it. Image paths count
    from the dataset's folder (a moved dataset keeps its fingerprint); image files are not read."""
    local = Path(source).expanduser()
    base = str(local.parent if local.is_file() else local) + "/"
    digest = hashlib.sha256()
    for row in rows:
        if isinstance(row.get("images"), list):
            row = {**row, "images": [i.removeprefix(base) if isinstance(i, str) else i
                                     for i in row["images"]]}
        digest.update(json.dumps(_hashable(row), sort_keys=True, default=_stated).encode())
        digest.update(b"\n")
    return {"source": source, "rows": len(rows), "sha256": digest.hexdigest()}


def _hashable(value):
    """`value` with bytes and PIL images (a row's images) replaced by their contents' digests."""
    if isinstance(value, dict):
        return {str(k): _hashable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_hashable(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": hashlib.sha256(value).hexdigest()}
    if hasattr(value, "tobytes") and hasattr(value, "mode") and hasattr(value, "size"):   # PIL
        return {"image": [value.mode, list(value.size), hashlib.sha256(value.tobytes()).hexdigest()]}
    return value


def _stated(value):
    """What JSON cannot write, as a stable text: a NumPy value as its numbers, a date as ISO
    text, anything else by repr, but never a repr that holds a memory address."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    text = repr(value)
    return type(value).__name__ if " at 0x" in text else text


COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma", ".zst": "zstandard"}


def file_kind(path: str) -> tuple[str, str]:
    """The data format's suffix and the compression's, from a file name: `HumanEval.jsonl.gz` ->
    (".jsonl", ".gz"), `train.parquet` -> (".parquet", ""), `openai/gsm8k` -> ("", "")."""
    suffixes = [s.lower() for s in Path(path).suffixes]
    compression = suffixes.pop() if suffixes and suffixes[-1] in COMPRESSIONS else ""
    return (suffixes[-1] if suffixes else ""), compression


def load_table(path: str, config_name: str = "", split: str = "train"):
    """A local JSONL/JSON/Parquet/CSV file (compressed with gzip, bzip2, xz or zstd or not), or a
    dataset directory or hub name with an optional configuration (`dataset_config`) and split.
    A path that exists is always read as a local file; a name that looks like a file and does not
    exist, or a hub name when the hub cannot be reached, is an error at once, not after retries."""
    import datasets

    if GIVEN.fullmatch(path):
        raise DataError(f"{path}: these rows were given to train() in Python and are not saved with "
                        "the run; give them again (train(config, dataset=rows)) or set the key to a file")
    fmt, compression = file_kind(path)
    local = Path(path)
    if local.is_file():
        if fmt not in _FORMATS:
            raise DataError(f"{path}: cannot tell the file's format from its name; name it .jsonl, "
                            ".json, .parquet or .csv (compressed or not: .gz, .bz2, .xz, .zst)")
        if local.stat().st_size == 0:
            raise DataError(f"{path}: the file is empty")
        if compression == ".zst" and not _importable("zstandard"):
            raise DataError(f"{path}: reading a .zst file needs the zstandard package: "
                            "pip install zstandard")
        if fmt == ".jsonl":
            check_jsonl(path)
        try:
            return datasets.load_dataset(_FORMATS[fmt], data_files=path, split="train")
        except (ValueError, OSError, ImportError) as e:
            raise DataError(f"{path}: cannot read it as {fmt.lstrip('.')}: "
                            f"{first_line(e)}") from None
    if fmt in _FORMATS or compression:
        raise DataError(f"dataset file not found: {path}")
    if not local.is_dir() and (why := hub_unreachable()) is not None:
        raise DataError(f"{path} is neither a file nor a directory, and as a hub dataset it cannot "
                        f"be fetched: {why}. Give the path of a file, or (for a hub dataset already "
                        "in the local cache) set HF_HUB_OFFLINE=1")
    try:
        return datasets.load_dataset(path, name=config_name or None, split=split)
    except ValueError as e:
        message = str(e).splitlines()[0]
        if "config" in message.lower():
            raise DataError(f"{path}: configuration {config_name or '(none)'!r}: {message}; set "
                            "dataset_config=NAME") from None
        if "split" in message.lower():
            raise DataError(f"{path}: split {split!r}: {message}; set dataset_split=NAME "
                            "(or eval_split=NAME)") from None
        raise DataError(f"{path}: {message}") from None
    except FileNotFoundError as e:
        raise DataError(f"dataset not found: {path} ({str(e).splitlines()[0]})") from None
    except OSError as e:     # ConnectionError among them: offline, or the hub refused
        raise DataError(f"{path} is neither a file nor a directory, and as a hub dataset: "
                        f"{first_line(e)}") from None


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the dataset hub cannot be reached, or None when it can (or offline mode is on, where
    `datasets` answers from its cache at once). One TCP connection to the endpoint with a short
    timeout stands in for the hub client's own retries, which take 23 s with no network. Behind a
    proxy (HTTPS_PROXY, ALL_PROXY) the client is left to find out itself."""
    import os
    import socket
    from urllib.parse import urlparse

    import datasets
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or datasets.config.HF_HUB_OFFLINE:
        return None
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
    except OSError as e:
        return f"{url.hostname}:{port} cannot be reached ({e.strerror or type(e).__name__})"
    return None


def _importable(module: str) -> bool:
    import importlib.util
    import sys
    if module in sys.modules:
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


def load_rows(path: str, columns: Columns = Columns(), config_name: str = "",
              split: str = "train") -> list[dict]:
    """Rows with `prompt` and `answer` (and `tests`, `entry_point` when mapped) renamed from the
    given columns. A prompt that is a list of {"role", "content"} messages stays a list, for the
    chat template; any other prompt becomes text."""
    table = load_table(path, config_name, split)
    local = Path(path)
    base = local.parent if local.is_file() else (local if local.is_dir() else None)
    return table_rows(table, table.column_names, columns, path, base)


GIVEN = re.compile(r"\((\d+) rows given to train\(\)\)")


def given_label(rows) -> str:
    """What the config records for rows given to train() in Python, in place of a path."""
    return f"({len(rows)} rows given to train())"


def given_rows(value, columns: Columns = Columns(), key: str = "dataset") -> list[dict]:
    """Rows given to train() in Python (`key` dataset or eval_dataset): a list of dicts or a
    `datasets.Dataset`, read as a file's rows are; errors name them by `given_label`."""
    try:
        import datasets
    except ImportError:     # a list of dicts needs no `datasets`
        datasets = None

    call = f"train({key}=...)"
    if datasets is None:
        pass
    elif isinstance(value, datasets.DatasetDict):
        raise DataError(f"{call}: a DatasetDict holds the splits {list(value)}; give one of them, "
                        f"as {key}=d[{next(iter(value), 'train')!r}]")
    elif isinstance(value, datasets.Dataset):
        return table_rows(value, value.column_names, columns, given_label(value))
    if not isinstance(value, (list, tuple)):
        raise DataError(f"{call}: expected a list of row dicts or a datasets.Dataset, got "
                        f"{type(value).__name__}; for a file give its path in the config")
    if not value:
        raise DataError(f"{call}: the list has no rows")
    for number, row in enumerate(value, 1):
        if not isinstance(row, dict):
            raise DataError(f"{call}: row {number} is a {type(row).__name__}, not a dict of columns")
    names = list(dict.fromkeys(k for row in value for k in row))
    return table_rows([{n: row.get(n) for n in names} for row in value], names, columns,
                      given_label(value))


def table_rows(table, names: list[str], columns: Columns, path: str, base: Path | None = None
               ) -> list[dict]:
    """load_rows on a table already read: `table` yields one dict per row with the columns
    `names`; `path` names it in errors; `base` is where relative image paths start."""
    source_prompt = prompt_column_of(columns.prompt, names, path)
    source_answer = _pick(columns.answer, ANSWER_COLUMNS, names) if columns.answer == "answer" \
        else columns.answer
    if source_answer not in names and columns.answer != "answer":
        raise DataError(f"{path}: no answer column '{columns.answer}' (columns: {names}); "
                        "set answer_column=NAME")
    renames = {}
    for key, default in (("tests", "tests"), ("entry_point", "entry_point")):
        wanted = getattr(columns, key)
        if wanted != default:
            if wanted not in names:
                raise DataError(f"{path}: no column '{wanted}' for {key}_column (columns: {names})")
            renames[wanted] = key
    source_images = image_column(columns.images, names)
    if columns.images and source_images is None:
        raise DataError(f"{path}: no image column '{columns.images}' (columns: {names}); "
                        "set image_column=NAME")
    rows = []
    for number, record in enumerate(table):
        row = {k: v for k, v in record.items() if k not in (source_prompt, source_answer, source_images)}
        if source_images is not None:
            try:
                row["images"] = row_images(record[source_images], base,
                                           f"{path} row {number + 1}, column '{source_images}'")
            except ImageError as e:
                raise DataError(str(e)) from None
        for old, new in renames.items():
            row[new] = record[old]
        row["_row"] = number  # the file's row, for errors that name it
        row["prompt"] = prompt_value(record[source_prompt],
                                     f"{path} row {number + 1}, column '{source_prompt}'")
        row["answer"] = record.get(source_answer) if source_answer else None
        rows.append(row)
    if not rows:
        raise DataError(f"{path}: the dataset has no rows")
    return rows


def prompt_column_of(wanted: str, names: list[str], path: str) -> str:
    """The column that holds the prompts: `wanted` when given; else the one of PROMPT_COLUMNS the
    table has. Two of the usual ones (a TRL `prompt` of chat messages beside the source's own
    `question`, say) are an error: taking either silently would train on the other's text."""
    if wanted:
        if wanted not in names:
            raise DataError(f"{path}: no prompt column '{wanted}' (columns: {names}); "
                            "set prompt_column=NAME")
        return wanted
    found = [n for n in PROMPT_COLUMNS if n in names]
    usual = [n for n in found if n in PROMPT_COLUMNS[:3]]
    if len(usual) > 1:
        raise DataError(f"{path}: the columns {usual} could each hold the prompts; set "
                        f"prompt_column={usual[0]} (or another) to say which")
    if not found:
        raise DataError(f"{path}: no prompt column; none of {list(PROMPT_COLUMNS)} is among its "
                        f"columns {names}; set prompt_column=NAME")
    return found[0]


def _pick(wanted: str, fallbacks: tuple[str, ...], names: list[str]) -> str | None:
    if wanted in names:
        return wanted
    return next((n for n in fallbacks if n in names), None)


def prompt_value(value, where: str):
    """A prompt as text, or as a list of chat messages (each a dict with `role` and `content`).
    An empty or blank prompt is an error: a group sampled from nothing teaches nothing."""
    if isinstance(value, str):
        if not value.strip():
            raise DataError(f"{where}: the prompt is empty; fix the row or drop it")
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(m, dict) for m in value):
        for k, message in enumerate(value):
            if "role" not in message or "content" not in message:
                raise DataError(f"{where}: message {k} of the prompt has no 'role' and 'content' "
                                f"(keys: {sorted(message)})")
        return [{"role": str(m["role"]), "content": m["content"]} for m in value]
    if value is None:
        raise DataError(f"{where}: no prompt; set prompt_column=NAME")
    return str(value)


def demonstration_text(value, where: str) -> str | None:
    """A `completion` cell as the text a cold start imitates: text as it is; a conversational
    completion (TRL's one assistant message) as that message's text; None or empty: the row has
    no demonstration. Never a Python rendering of messages or of None."""
    if value is None or isinstance(value, str):
        return value or None
    if isinstance(value, (list, tuple)) and all(isinstance(m, dict) for m in value):
        if len(value) == 1 and value[0].get("role") == "assistant" \
                and isinstance(value[0].get("content"), str):
            return value[0]["content"] or None
        raise DataError(f"{where}: a completion of messages is imitated when it is one assistant "
                        f"message of text; this one has the roles {[m.get('role') for m in value]}; "
                        "give the text to imitate, or leave sft_steps out")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise DataError(f"{where}: a completion to imitate must be text or one assistant message, "
                    f"not {type(value).__name__}")


def open_text(path: str):
    """A text file for reading, decompressed by its suffix (.gz, .bz2, .xz, .zst)."""
    import io
    compression = file_kind(path)[1]
    if compression in (".gz", ".bz2", ".xz"):
        import importlib
        return importlib.import_module(COMPRESSIONS[compression]).open(path, "rt", encoding="utf-8")
    if compression == ".zst":
        import zstandard
        return io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(open(path, "rb"),
                                                                           closefd=True),
                                encoding="utf-8")
    return open(path, encoding="utf-8")


def check_jsonl(path: str) -> None:
    """Every non-blank line of a JSONL file is a JSON object; the error names the first that is not."""
    import json
    import lzma
    number = 0
    try:
        with open_text(path) as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except ValueError as e:
                    raise DataError(f"{path} line {number}: not valid JSON ({e.msg} at column "
                                    f"{e.colno})") from None
                if not isinstance(value, dict):
                    raise DataError(f"{path} line {number}: expected a JSON object, got "
                                    f"{type(value).__name__}")
    except (OSError, EOFError, lzma.LZMAError, UnicodeDecodeError) as e:
        # not what its suffix says (a .gz that is not gzip), cut short, or not UTF-8 text
        raise DataError(f"{path}: cannot be read after line {number}: {type(e).__name__}: "
                        f"{(str(e).strip().splitlines() or [''])[0]}") from None


def format_prompt(tokenizer, prompt, chat_template: str, system_prompt: str = "", tools=None,
                  call_format: str = "plain", images: int = 0) -> str:
    """The text the model sees: the chat template when there is one and it is wanted, else the
    prompt. A conversational prompt (a list of messages, system and earlier turns included) always
    goes through the chat template; `system_prompt` is put first unless it has a system message.
    `tools` (tools.Tool) are rendered by the chat template when it supports tools, else described
    in plain text before the prompt (tool_description).

    A prompt with `images` always goes through the chat template: a text prompt becomes one user
    message of that many image parts and its text; a conversational prompt must hold exactly that
    many {"type": "image"} parts, which the template renders as the processor's placeholders."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if images:
        if not has_template or chat_template == "none":
            raise DataError(f"the row has {images} image(s), which enter the prompt through the chat "
                            "template, but " + ("chat_template=none" if has_template else
                                                "the model's processor and tokenizer have no chat template"))
        if isinstance(prompt, list):
            parts = sum(1 for m in prompt if isinstance(m.get("content"), list)
                        for part in m["content"] if isinstance(part, dict) and part.get("type") == "image")
            if parts != images:
                raise DataError(f"the row has {images} image(s) but its messages hold {parts} "
                                '{"type": "image"} part(s); they must match, in order')
        else:
            prompt = [{"role": "user", "content": [{"type": "image"}] * images
                       + [{"type": "text", "text": prompt}]}]
    if isinstance(prompt, list):
        if not has_template or chat_template == "none":
            raise DataError("the prompt is a list of chat messages, but "
                            + ("chat_template=none" if has_template else "the tokenizer has no "
                               "chat template") + "; use a model with a chat template, or a "
                            "dataset whose prompt column is text. Messages are never turned into "
                            "their Python text")
        messages = list(prompt)
        if system_prompt and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": system_prompt})
        return _render(tokenizer, messages, tools, call_format)
    if chat_template != "none" and has_template:   # auto, required, or a template of its own
        messages = ([{"role": "system", "content": system_prompt}] if system_prompt else [])
        messages.append({"role": "user", "content": prompt})
        return _render(tokenizer, messages, tools, call_format)
    text = f"{system_prompt}\n{prompt}" if system_prompt else prompt
    return tool_description(tools, call_format) + text if tools else text


def _render(tokenizer, messages: list[dict], tools, call_format: str) -> str:
    """The chat template, given the tools' schemas when it renders them; otherwise the tools are
    described in plain text at the start of the first message."""
    plain = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not tools:
        return plain
    schemas = [t.schema for t in tools]
    with_tools = tokenizer.apply_chat_template(messages, tools=schemas, tokenize=False,
                                               add_generation_prompt=True)
    if with_tools != plain:
        return with_tools
    described = [dict(m) for m in messages]
    described[0]["content"] = tool_description(tools, call_format) + str(described[0]["content"])
    return tokenizer.apply_chat_template(described, tokenize=False, add_generation_prompt=True)


def tool_description(tools, call_format: str) -> str:
    """The tools in plain text. `plain`: one short line, `<tools>name(param, ...) ...</tools>`;
    `hermes`: the JSON schemas and how to call one."""
    import json
    if call_format == "hermes":
        body = "\n".join(json.dumps(t.schema) for t in tools)
        return (f"<tools>\n{body}\n</tools>\nTo call a tool, write <tool_call>{{\"name\": ..., "
                f"\"arguments\": {{...}}}}</tool_call>.\n")
    return "<tools>" + " ".join(f"{t.name}({', '.join(t.parameters)})" for t in tools) + "</tools>\n"


def _fallback_ids(tokenizer) -> set[int]:
    """The ids a tokenizer writes for text it has no token for: its unknown token, and the one its
    model falls back to (the tiny tokenizer's `<pad>`); none for byte-level tokenizers."""
    ids = {tokenizer.unk_token_id} if getattr(tokenizer, "unk_token_id", None) is not None else set()
    model = getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)
    fallback = getattr(model, "unk_token", None)
    if fallback:
        found = tokenizer.convert_tokens_to_ids(fallback)
        if isinstance(found, int):
            ids.add(found)
    return ids


def _texts(row: dict) -> list[str]:
    """What of a row the model reads or imitates: its prompt (each message's content) and the
    completion a cold start imitates."""
    prompt = row.get("prompt")
    texts = [str(m.get("content", "")) for m in prompt] if isinstance(prompt, list) else [str(prompt)]
    if isinstance(row.get("completion"), str):
        texts.append(row["completion"])
    return texts


def uncovered_characters(tokenizer, rows: list[dict]) -> tuple[list[str], int]:
    """The characters of the rows' prompts and completions that the tokenizer has no token for
    (each is encoded alone), and how many rows hold at least one."""
    fallback = _fallback_ids(tokenizer)
    if not fallback or not rows:
        return [], 0
    texts = [_texts(r) for r in rows]
    seen = sorted({ch for row in texts for text in row for ch in text})
    encoded = tokenizer(seen, add_special_tokens=False).input_ids if seen else []
    missing = [ch for ch, ids in zip(seen, encoded) if fallback.intersection(ids)]
    if not missing:
        return [], 0
    lost = set(missing)
    return missing, sum(any(lost.intersection(text) for text in row) for row in texts)


def coverage_note(tokenizer, parts: dict[str, list[dict]], who: str) -> str | None:
    """A line for the start of a run when `who`'s tokenizer cannot represent some characters of
    the data (they reach the model as its unknown token), with the share of rows each part loses;
    None when it represents them all."""
    found = {name: uncovered_characters(tokenizer, rows) for name, rows in parts.items()}
    missing = sorted({ch for chars, _ in found.values() for ch in chars})
    if not missing:
        return None
    token = tokenizer.convert_ids_to_tokens(sorted(_fallback_ids(tokenizer))[0])
    shown = ", ".join(f"{ch!r} (U+{ord(ch):04X})" for ch in missing[:12])
    more = f" and {len(missing) - 12} more" if len(missing) > 12 else ""
    shares = "; ".join(f"{n} of {len(parts[name])} {name} rows ({n / len(parts[name]):.1%})"
                       for name, (_, n) in found.items() if n)
    return (f"warning: the tokenizer of {who} has no token for {len(missing)} character"
            f"{'s' if len(missing) > 1 else ''} of the data: {shown}{more}; each reaches the model "
            f"as {token}. Rows holding one: {shares}. Replace them in the data, or use a model "
            "whose tokenizer covers them")


class PromptStream:
    """Endless batches of rows: shuffled by `seed`, reshuffled each pass."""

    def __init__(self, rows: list[dict], seed: int):
        self.rows, self.rng = list(rows), random.Random(seed)
        self.order: list[int] = []

    def state_dict(self) -> dict:
        """Where the stream is: the rows left in this pass and the shuffler's state."""
        return {"order": list(self.order), "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        self.order = list(state["order"])
        self.rng.setstate(state["rng"])

    def next_batch(self, size: int) -> list[dict]:
        batch = []
        while len(batch) < size:
            if not self.order:
                self.order = list(range(len(self.rows)))
                self.rng.shuffle(self.order)
            batch.append(self.rows[self.order.pop()])
        return batch


def columns_of(rows: list[dict], repeat: int) -> dict[str, list]:
    """Every column but `prompt`, each value repeated for the `repeat` members of its group."""
    keys = [k for k in rows[0] if k not in ("prompt", "_row")]
    return {k: [row.get(k) for row in rows for _ in range(repeat)] for k in keys}
