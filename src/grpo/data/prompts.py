"""Prompt formatting: the text the model sees for a row (chat template, system prompt, images,
tools described in the template or in plain text), and the note on characters of the data that a
tokenizer has no token for."""

from __future__ import annotations

from grpo.data.rows import DataError


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
            raise DataError(f"the prompt is a list of chat messages, but {_untemplated(has_template)}")
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


def system_prompt_note(system_prompt: str, rows: list[dict], where: str) -> str | None:
    """The rows `system_prompt` is not put in front of (format_prompt): conversations that hold a
    system message of their own, which is kept. None when it is used everywhere, or unset."""
    if not system_prompt:
        return None
    own = [r for r in rows if isinstance(r.get("prompt"), (list, tuple))
           and any(isinstance(m, dict) and m.get("role") == "system" for m in r["prompt"])]
    if not own:
        return None
    first = min(r.get("_row", 0) for r in own) + 1
    return (f"system_prompt is not used for {len(own):,} of the {len(rows):,} rows of {where} (the "
            f"first: row {first}): their messages hold a system message of their own, which is "
            "kept; leave system_prompt out, or take the system message out of those rows")


def _untemplated(has_template: bool, rows: str = "") -> str:
    """Why messages cannot be rendered, `rows` (which rows hold them), and what to do."""
    if has_template:
        return (f"chat_template=none{rows}. Set chat_template=auto to use the tokenizer's own, or "
                "give the prompts as text. Messages are never turned into their Python text")
    return (f"the tokenizer has no chat template{rows}. Give one with chat_template=FILE (a Jinja "
            "file) or chat_template='{% for m in messages %}...' (its text), use a model whose "
            "tokenizer has one, or give the prompts as text. Messages are never turned into their "
            "Python text")


def check_messages_templated(tokenizer, rows: list[dict], chat_template: str, where: str) -> None:
    """Rows whose prompt is a list of chat messages need a chat template; without one (or with
    chat_template=none), one error for them all before any is formatted: the first in the file's
    order (not the shuffled one), how many there are, and what to do."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if has_template and chat_template != "none":
        return
    chat = sorted(r.get("_row", i) + 1 for i, r in enumerate(rows) if isinstance(r.get("prompt"), list))
    if not chat:
        return
    shown = ", ".join(map(str, chat[:5])) + (", ..." if len(chat) > 5 else "")
    raise DataError(f"{where} row {chat[0]}: the prompt is a list of chat messages, but "
                    + _untemplated(has_template, f" (rows {shown}: {len(chat)} of {len(rows)} "
                                                 "rows hold messages)"))


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
