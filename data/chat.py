"""Prompt records in the formats users already have, as chat messages; the prompt-set row's messages.

A record (a JSONL line or a `datasets` row) holds one of:
  prompt         a string: one user turn (optional `response`: its reference answer)
  messages       OpenAI style: [{"role": "system" | "user" | "assistant", "content": str}, ...]
  conversations  ShareGPT style: [{"from": "system" | "human" | "gpt", "value": str}, ...]
                 (role/content entries are accepted here too, as SpecForge and speculators read them)

A conversation that ends with an assistant turn is the question "answer the last user turn given the
earlier ones": distill-data generates that last assistant turn, and its text becomes the reference
`response`. One that ends with a user turn has no reference. The formatting itself (chat template or
plain text) is decoding.bundle.chat.format_prompt.
"""
from __future__ import annotations

import json
from typing import Any

from specdraft.decoding.bundle.chat import ChatFormat, user_turn
from specdraft.core.errors import InputError

# ShareGPT speaker names -> OpenAI roles (the names ShareGPT dumps, SpecForge and FastChat use)
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "model": "assistant"}
ROLES = ("system", "user", "assistant")


def _turns(raw: Any, key: str, where: str) -> list[dict[str, str]]:
    if not isinstance(raw, list) or not raw:
        raise InputError(f"{where}: '{key}' must be a non-empty list of turns; give at least the user turn")
    turns = []
    for i, t in enumerate(raw):
        if not isinstance(t, dict):
            raise InputError(f"{where}: {key}[{i}] is not an object; write each turn like {{\"role\": \"user\", \"content\": \"...\"}}")
        if "from" in t or "value" in t:  # ShareGPT
            role, content = SHAREGPT_ROLES.get(str(t.get("from", "")).lower()), t.get("value")
            if role is None:
                raise InputError(f"{where}: {key}[{i}] has speaker {t.get('from')!r}; use one of "
                                 f"{', '.join(sorted(SHAREGPT_ROLES))}")
        else:
            role, content = t.get("role"), t.get("content")
            if role not in ROLES:
                raise InputError(f"{where}: {key}[{i}] has role {role!r}; use system, user or assistant")
        if not isinstance(content, str):
            raise InputError(f"{where}: {key}[{i}] has no text content; give its text as a string")
        turns.append({"role": role, "content": content})
    return turns


def record_messages(record: dict, where: str) -> tuple[list[dict[str, str]], str]:
    """(messages ending with the user turn to answer, reference response or "") of one record; `where`
    ("file:line" or "dir record n") names it in the one-line error a malformed record gets."""
    given = [k for k in ("prompt", "messages", "conversations", "response") if record.get(k) is not None]
    # two spellings of the question (or an answer beside a conversation) would leave one of them unread
    if len(set(given) - {"response"}) > 1 or (given and given[0] != "prompt" and "response" in given):
        raise InputError(f"{where} holds {' and '.join(repr(k) for k in given)}; give one of 'prompt' (with an "
                         "optional 'response'), 'messages' or 'conversations' (the answer as its last assistant turn)")
    for key in ("messages", "conversations"):
        if record.get(key) is not None:
            turns = _turns(record[key], key, where)
            break
    else:
        prompt = record.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise InputError(f"{where} has no non-empty 'prompt' string, 'messages' or 'conversations' list; "
                             "every record needs one")
        response = record.get("response")
        if response is not None and not isinstance(response, str):  # str() would invent a reference answer
            raise InputError(f"{where} has response {str(response)[:40]!r} ({type(response).__name__}); give "
                             "the reference answer as a string or leave 'response' out")
        return user_turn(prompt), response or ""
    response = ""
    if turns[-1]["role"] == "assistant":
        response = turns.pop()["content"]
    if not turns or turns[-1]["role"] != "user":
        raise InputError(f"{where}: the conversation must end with a user turn (optionally followed by the "
                         "assistant's answer to distill); end it with the user turn to answer")
    if any(t["role"] == "system" for t in turns[1:]):
        raise InputError(f"{where}: a system turn may only come first; move it to the start or drop it")
    return turns, response


def encode_messages(messages: list[dict[str, str]]) -> str:
    """The prompt-set column: "" for a single user turn (its text is the `prompt` column), else JSON."""
    return "" if messages == user_turn(messages[-1]["content"]) else json.dumps(messages)


def row_messages(row: dict) -> list[dict[str, str]]:
    """The messages of a prompt-set row (the inverse of encode_messages)."""
    encoded = row.get("messages") or ""
    return json.loads(encoded) if encoded else user_turn(row["prompt"])


def chat_format(prompts_cfg) -> ChatFormat:
    """The ChatFormat of a run's `prompts` section: chat_template null (the tokenizer's), "none" (plain
    text), a path to a .jinja file, or a template string."""
    from pathlib import Path

    name = prompts_cfg.chat_template
    template, plain = None, False
    if name == "none":
        plain = True
    elif name is not None:
        path = Path(name).expanduser()
        if "{" not in name and path.suffix in (".jinja", ".j2", ".txt", ".jinja2"):
            if not path.is_file():
                raise InputError(f"prompts.chat_template file '{name}' does not exist; give a Jinja file, a template "
                                 "string, none, or null for the tokenizer's own")
            template = path.read_text()
        elif "{%" in name or "{{" in name:
            template = name
        else:
            raise InputError(f"prompts.chat_template {name!r} is neither a Jinja template, a .jinja file, none "
                             "nor null (the tokenizer's own)")
    return ChatFormat(template=template, plain=plain, system_prompt=prompts_cfg.system_prompt,
                      reasoning=prompts_cfg.reasoning, template_kwargs=dict(prompts_cfg.chat_template_kwargs))
