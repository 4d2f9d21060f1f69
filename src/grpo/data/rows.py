"""Rows and their columns: loading a table from a file, a dataset directory, the hub or rows given
to train() in Python, reading its prompt, answer, test and image columns, the file kinds and
compressions read, and the fingerprint a checkpoint records of the rows it trained on.

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
        raise DataError(f"{path}: these rows were given in Python and are not saved with "
                        "the run; give them again (train(config, dataset=rows), or "
                        "grpo.train.evaluate(run_dir, dataset=rows) to evaluate) or set the key to a "
                        "file (grpo eval RUN_DIR eval_dataset=FILE)")
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


GIVEN = re.compile(r"\((\d+) rows given (?:in Python|to train\(\))\)")   # the latter: older runs'


def given_label(rows) -> str:
    """What the config records for rows given to train() or evaluate() in Python, in place of
    a path."""
    return f"({len(rows)} rows given in Python)"


def given_shape(value, key: str = "dataset", by: str = "train") -> None:
    """Rows given in Python are a list of dicts or one `datasets.Dataset`; else a DataError that
    names the call they were given to, `by(key=...)` (`train(dataset=...)`, `evaluate(...)`)."""
    call = f"{by}({key}=...)"
    try:
        import datasets
    except ImportError:     # a list of dicts needs no `datasets`
        datasets = None
    if datasets is not None and isinstance(value, datasets.DatasetDict):
        raise DataError(f"{call}: a DatasetDict holds the splits {list(value)}; give one of them, "
                        f"as {key}=d[{next(iter(value), 'train')!r}]")
    if datasets is not None and isinstance(value, datasets.Dataset):
        return
    if not isinstance(value, (list, tuple)):
        raise DataError(f"{call}: expected a list of row dicts or a datasets.Dataset, got "
                        f"{type(value).__name__}; for a file give its path in the config")
    if not value:
        raise DataError(f"{call}: the list has no rows")
    for number, row in enumerate(value, 1):
        if not isinstance(row, dict):
            raise DataError(f"{call}: row {number} is a {type(row).__name__}, not a dict of columns")


def given_rows(value, columns: Columns = Columns(), key: str = "dataset") -> list[dict]:
    """Rows given to train() in Python (`key` dataset or eval_dataset): a list of dicts or a
    `datasets.Dataset` (given_shape), read as a file's rows are; errors name them by
    `given_label`."""
    given_shape(value, key)
    if not isinstance(value, (list, tuple)):     # a datasets.Dataset
        return table_rows(value, value.column_names, columns, given_label(value))
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
