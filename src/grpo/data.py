"""Datasets and prompt formatting.

Rows are dicts with `prompt` (text before templating), `answer`, and any other columns, which reach
reward functions as keyword arguments. Files load through Hugging Face `datasets` (JSONL, Parquet,
CSV, or a hub name); GSM8K rows (`question`, `answer` ending in `#### n`) work as they are.
"""

from __future__ import annotations

import random
from pathlib import Path

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


class DataError(ValueError):
    """A dataset that cannot be used; the message names the file and the column."""


def load_rows(path: str, prompt_column: str, answer_column: str, split: str = "train") -> list[dict]:
    """Rows of a local file or hub dataset, with `prompt` and `answer` renamed from the given columns."""
    import datasets

    suffix = Path(path).suffix.lower()
    if suffix in _FORMATS:
        if not Path(path).is_file():
            raise DataError(f"dataset file not found: {path}")
        if Path(path).stat().st_size == 0:
            raise DataError(f"{path}: the file is empty")
        if suffix == ".jsonl":
            check_jsonl(path)
        table = datasets.load_dataset(_FORMATS[suffix], data_files=path, split="train")
    else:
        table = datasets.load_dataset(path, split=split)
    columns = table.column_names
    source_prompt = prompt_column if prompt_column in columns else (
        "prompt" if "prompt" in columns else None)
    if source_prompt is None:
        raise DataError(f"{path}: no prompt column '{prompt_column}' (columns: {columns}); "
                        "set prompt_column=NAME")
    if answer_column not in columns and answer_column != "answer":
        raise DataError(f"{path}: no answer column '{answer_column}' (columns: {columns}); "
                        "set answer_column=NAME")
    rows = []
    for number, record in enumerate(table):
        row = {k: v for k, v in record.items() if k not in (source_prompt, answer_column)}
        row["_row"] = number  # the file's row, for errors that name it
        row["prompt"] = str(record[source_prompt])
        row["answer"] = record.get(answer_column)
        rows.append(row)
    if not rows:
        raise DataError(f"{path}: the dataset has no rows")
    return rows


def check_jsonl(path: str) -> None:
    """Every non-blank line of a JSONL file is a JSON object; the error names the first that is not."""
    import json
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError as e:
                raise DataError(f"{path} line {number}: not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(value, dict):
                raise DataError(f"{path} line {number}: expected a JSON object, got {type(value).__name__}")


def format_prompt(tokenizer, prompt: str, chat_template: str, system_prompt: str = "") -> str:
    """The text the model sees: the chat template when there is one and it is wanted, else the prompt."""
    if chat_template in ("auto", "required") and getattr(tokenizer, "chat_template", None):
        messages = ([{"role": "system", "content": system_prompt}] if system_prompt else [])
        messages.append({"role": "user", "content": prompt})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{system_prompt}\n{prompt}" if system_prompt else prompt


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
