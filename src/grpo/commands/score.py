"""`grpo score`: given completions scored with the reward functions, no model.

    grpo score dataset=outputs.jsonl rewards=[math_accuracy] eval_k=[1,4]
    grpo score dataset=HumanEval.jsonl rewards=[code_tests] --completions canonical_solution

Each row of the file has the dataset's columns (prompt, answer, tests, ...: read as training reads
them, `prompt_column` and the rest included) plus its completions: one text, or a list of texts.
Every completion is scored by the run's reward functions (their weighted sum, as in training) and
the rows' scores go through the same estimators as `grpo eval` (passk.py): pass@1 (the mean),
pass@k for each k in `eval_k` (a completion counts as correct when its reward is 1) and, for
answers that can be extracted, maj@k; those two only when every reward is 0 or 1 (a weighted sum
or a graded reward gets pass@1 alone). Rewards see each prompt as the file writes it, with no chat
template: there is no model, so no tokenizer to apply one.
"""

from __future__ import annotations

from pathlib import Path

from grpo import assembly
from grpo.config import ConfigError, load_config, load_yaml, parse_overrides
from grpo.data import DataError, columns_of, load_table
from grpo.evaluate import beside, say_replacing, write_rows
from grpo.algorithm.passk import summarize
from grpo.rewards import extract_answer, reward_name, score

COMPLETION_COLUMNS = ("completion", "completions")


def score_file(args: list[str], column: str | None = None, out: str | None = None) -> dict:
    """`grpo score [CONFIG.yaml] dataset=FILE [key=value ...]`: score every row's completions in
    `column` (any column, as the file names it); write the per-row results (`out` or
    eval_output; OUTPUT_DIR/score.jsonl when output_dir is given; else FILE-score.jsonl beside
    the file) and return the metrics with the results' path."""
    path, overrides = (args[0], args[1:]) if args and "=" not in args[0] else (None, args)
    given = {**(load_yaml(path) if path else {}), **parse_overrides(overrides)}
    extra = []
    if given.get("eval_k") and "eval_samples" not in given:   # k is checked against the rows below
        ks = given["eval_k"] if isinstance(given["eval_k"], list) else [given["eval_k"]]
        extra = [f"eval_samples={max(int(k) for k in ks)}"]
    config = load_config(path, extra + list(overrides))
    if not config.data.dataset:
        raise ConfigError("config key 'dataset': grpo score needs the file of completions, "
                          "dataset=FILE (rows with the dataset's columns and a completion each)")
    data = assembly.load_data(config)
    rows = sorted(data.train_rows, key=lambda r: r["_row"])     # as in the file
    d = config.data
    # the columns as the file names them (load_rows renames the prompt's and the answer's)
    table = load_table(d.dataset, d.dataset_config, d.dataset_split)
    column = column or next((c for c in COMPLETION_COLUMNS if c in table.column_names), None)
    if column is None or column not in table.column_names:
        wanted = " or ".join(repr(c) for c in ([column] if column else COMPLETION_COLUMNS))
        raise DataError(f"{d.dataset}: no completion column {wanted} (columns: "
                        f"{sorted(table.column_names)}); name it with --completions COLUMN")
    texts = table[column]
    per_row = [completions_of({**row, column: texts[row["_row"]]}, column, d.dataset)
               for row in rows]
    fewest = min(len(c) for c in per_row)
    too_large = [k for k in config.eval.eval_k if k > fewest]
    if too_large:
        raise ConfigError(f"config key 'eval_k': {too_large} above the fewest completions a row "
                          f"has ({fewest}); each k must be at most that")
    ks = list(config.eval.eval_k) or sorted({1, fewest})
    with_votes = len(data.reward_fns) == 1 and reward_name(data.reward_fns[0]) != "code_tests"
    names, results = _score_rows(config, data, rows, per_row, column, with_votes)
    metrics = {k.removeprefix("eval/"): v for k, v in summarize(results, ks, with_votes).items()}
    metrics["rows"] = len(results)
    metrics["completions"] = sum(len(c) for c in per_row)
    for name in names:
        values = [v for r in results for v in r["rewards"][name] if v is not None]
        metrics[f"reward/{name}/mean"] = sum(values) / len(values) if values else None
    if out or config.eval.eval_output:
        rows_file = Path(out or config.eval.eval_output)
    elif "output_dir" in given:
        rows_file = Path(config.run.output_dir) / "score.jsonl"
    else:
        rows_file = beside(Path(d.dataset), "score")
    say_replacing(rows_file)
    write_rows(rows_file, results)
    return {**metrics, "rows_file": str(rows_file)}


def completions_of(row: dict, column: str, where: str) -> list[str]:
    """A row's completions: one text, or a non-empty list of texts."""
    value = row.get(column)
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise DataError(f"{where} row {row['_row'] + 1}: column '{column}' holds "
                    f"{type(value).__name__} {str(value)[:60]!r}; expected a completion's text or "
                    "a non-empty list of texts")


def _prompt_text(prompt) -> str:
    """A prompt as rewards see it here: its text, or a conversation's messages one per line."""
    if isinstance(prompt, list):
        return "\n".join(str(m["content"]) for m in prompt)
    return prompt


def _score_rows(config, data: assembly.Data, rows: list[dict], per_row: list[list[str]],
                column: str, with_votes: bool) -> tuple[list[str], list[dict]]:
    """Every completion's reward (the weighted sum) and each function's, row by row as results
    for passk.summarize and the JSONL file; with votes, each completion's extracted answer."""
    # the completions' own column is no keyword of the rewards (prompt and answer stay theirs)
    kept = [{k: v for k, v in r.items() if k != column or k in ("prompt", "answer")}
            for r in rows]
    prompts, completions, columns = [], [], {}
    for row, comps in zip(kept, per_row):
        prompts += [_prompt_text(row["prompt"])] * len(comps)
        completions += comps
        for key, values in columns_of([row], len(comps)).items():
            columns.setdefault(key, []).extend(values)
    totals, per_fn = score(data.reward_fns, data.reward_weights, prompts, completions, columns,
                           on_error=config.reward.reward_on_error, unscorable=config.reward.unscorable)
    results, start = [], 0
    for row, comps in zip(rows, per_row):
        span = slice(start, start + len(comps))
        start += len(comps)
        results.append({"row": row["_row"] + 1, "prompt": row["prompt"], "answer": row.get("answer"),
                        "completions": comps, "scores": totals[span],
                        "rewards": {name: values[span] for name, values in per_fn.items()},
                        "answers": [extract_answer(c) if with_votes else None for c in comps]})
    return list(per_fn), results
