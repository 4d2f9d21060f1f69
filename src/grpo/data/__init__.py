"""Datasets and prompt formatting. This face re-exports what other packages use from `rows`
(loading tables and rows, their columns, file kinds, the fingerprint), `prompts` (the text the
model sees, tokenizer coverage) and `stream` (the prompt stream); `tasks/` holds the built-in tasks.
"""

from __future__ import annotations

from grpo.data.prompts import (check_messages_templated, coverage_note, format_prompt,
                               system_prompt_note, tool_description, uncovered_characters)
from grpo.data.rows import (ANSWER_COLUMNS, COMPRESSIONS, GIVEN, PROMPT_COLUMNS, Columns, DataError,
                            check_jsonl, demonstration_text, file_kind, fingerprint, first_line,
                            given_label, given_rows, given_shape, hub_unreachable, load_rows, load_table,
                            open_text, prompt_column_of, prompt_value, table_rows)
from grpo.data.stream import RAW_PROMPTS, PromptStream, columns_of

__all__ = ["ANSWER_COLUMNS", "COMPRESSIONS", "GIVEN", "PROMPT_COLUMNS", "Columns", "DataError",
           "PromptStream", "RAW_PROMPTS", "check_jsonl", "check_messages_templated", "columns_of", "coverage_note", "demonstration_text",
           "file_kind", "fingerprint", "first_line", "format_prompt", "given_label", "given_rows", "given_shape",
           "hub_unreachable", "load_rows", "load_table", "open_text", "prompt_column_of",
           "prompt_value", "system_prompt_note", "table_rows", "tool_description",
           "uncovered_characters"]
