"""A dataset of chat messages with a tokenizer that has no chat template: one error that names the
first such row in the file's order, counts them, and says how to give a template."""

import json

import pytest

from grpo.assembly import fit_prompts, load_data
from grpo.config import build_config
from grpo.data import DataError
from grpo.data.prompts import check_messages_templated
from grpo.models import build_tiny_tokenizer

TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"


def untemplated():
    tok = build_tiny_tokenizer()
    tok.chat_template = None
    return tok


def test_the_error_names_the_first_row_counts_them_and_gives_the_fix():
    message = [{"role": "user", "content": "2+2?"}]
    rows = [{"prompt": message, "_row": 10}, {"prompt": "3+3?", "_row": 0},
            {"prompt": message, "_row": 3}]
    with pytest.raises(DataError) as e:
        check_messages_templated(untemplated(), rows, "auto", "chat.jsonl")
    assert str(e.value) == (
        "chat.jsonl row 4: the prompt is a list of chat messages, but the tokenizer has no chat "
        "template (rows 4, 11: 2 of 3 rows hold messages). Give one with chat_template=FILE (a "
        "Jinja file) or chat_template='{% for m in messages %}...' (its text), use a model whose "
        "tokenizer has one, or give the prompts as text. Messages are never turned into their "
        "Python text")
    # chat_template=none turns the tokenizer's own off: the fix is to turn it back on
    tok = untemplated()
    tok.chat_template = TEMPLATE
    with pytest.raises(DataError, match=r"^chat.jsonl row 4: .* but chat_template=none \(rows 4, "
                                        r"11: 2 of 3 rows hold messages\)\. Set chat_template=auto"):
        check_messages_templated(tok, rows, "none", "chat.jsonl")
    check_messages_templated(tok, rows, "auto", "chat.jsonl")          # a template: nothing said
    check_messages_templated(untemplated(), rows[1:2], "auto", "chat.jsonl")   # text: nothing


def test_a_run_names_the_files_first_row_not_the_first_shuffled_one(tmp_path):
    # before: "chat.jsonl row 11: ..." (the first row in the seed's shuffled order), no count, no fix
    f = tmp_path / "chat.jsonl"
    f.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"{i}+1?"}],
                                     "answer": str(i + 1)}) + "\n" for i in range(12)))
    config = build_config({"dataset": str(f)})
    data = load_data(config, check_golds_now=False)
    assert data.train_rows[0]["_row"] != 0                  # shuffled: row 1 is not first
    with pytest.raises(DataError, match=rf"^{f} row 1: the prompt is a list of chat messages, but "
                                        r"the tokenizer has no chat template \(rows 1, 2, 3, 4, 5, "
                                        r"\.\.\.: 12 of 12 rows hold messages\)\. Give one with "
                                        r"chat_template=FILE"):
        fit_prompts(config, untemplated(), 512, data, log=lambda line: None)
