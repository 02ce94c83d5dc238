"""A prompt as the target is served it: its chat template, or plain text when it has none.

Every stage that turns a prompt into token ids (distill-data, train-router, evaluate, `specdraft
generate`, the demo target's pretraining documents) calls `format_prompt` with the same `ChatFormat`,
so the target answers distillation prompts, the acceptance data is labelled, and the bundle is
evaluated and served on exactly the token sequence an instruct model sees in production. A mismatch
there (raw text in training, a chat template in serving) is the main source of poor acceptance that
users of SpecForge and vLLM's speculators report.

Messages are OpenAI-style `{"role": "system" | "user" | "assistant", "content": str}` dicts whose last
entry is the user turn to answer.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from specdraft.core.errors import InputError

# Reasoning sections of earlier assistant turns (DeepSeek-R1 / Qwen3 style). Chat templates of
# reasoning models drop them from the history themselves; `reasoning: strip` does it for any template.
REASONING = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


@dataclass(frozen=True)
class ChatFormat:
    template: str | None = None  # a Jinja chat template; None: the tokenizer's own (plain text if it has none)
    plain: bool = False  # True: plain prompt text even when the tokenizer has a template
    system_prompt: str | None = None  # prepended as a system turn to prompts that carry none
    reasoning: str = "keep"  # keep | strip: <think>...</think> sections of earlier assistant turns
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # extra template variables (enable_thinking...)

    def __post_init__(self):
        if self.reasoning not in ("keep", "strip"):
            raise InputError(f"chat reasoning must be keep or strip, got {self.reasoning!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "ChatFormat":
        d = dict(d or {})
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise InputError(f"chat format has unknown keys {sorted(unknown)}; re-export the bundle")
        return cls(**{**d, "template_kwargs": dict(d.get("template_kwargs") or {})})


def user_turn(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def strip_reasoning(text: str) -> str:
    return REASONING.sub("", text)


def template_of(tok, fmt: ChatFormat) -> str | None:
    """The template prompts are formatted with, or None for plain text."""
    if fmt.plain:
        return None
    return fmt.template or getattr(tok, "chat_template", None) or None


def plain_text(messages: list[dict[str, str]]) -> str:
    """Without a chat template: a single user turn is its text as is; a conversation is its turns'
    texts joined by blank lines (no role markers: a base model has none to recognise)."""
    return "\n\n".join(m["content"] for m in messages)


def format_prompt(tok, messages: list[dict[str, str]], fmt: ChatFormat = ChatFormat()) -> list[int]:
    """Token ids of `messages` ready for the target to answer the last user turn.

    With a template: apply_chat_template(add_generation_prompt=True) as text, then tokenized without
    adding special tokens again (templates write their own BOS). Without: the tokenizer's usual
    encoding of the plain text (BOS included where the tokenizer adds one)."""
    if not messages or messages[-1].get("role") != "user":
        raise InputError("a prompt must end with a user turn; the assistant answers it")
    turns = [dict(m) for m in messages]
    if fmt.reasoning == "strip":
        turns = [dict(m, content=strip_reasoning(m["content"])) if m["role"] == "assistant" else m for m in turns]
    if fmt.system_prompt and turns[0]["role"] != "system":
        turns.insert(0, {"role": "system", "content": fmt.system_prompt})
    template = template_of(tok, fmt)
    if template is None:
        return tok(plain_text(turns))["input_ids"]
    try:
        text = tok.apply_chat_template(turns, chat_template=template, add_generation_prompt=True, tokenize=False,
                                       **fmt.template_kwargs)
    except Exception as e:  # jinja2 raises TemplateError subclasses (and templates raise_exception(...))
        raise InputError(f"the chat template failed on a prompt ({type(e).__name__}: {str(e)[:160]}); "
                         "check prompts.chat_template / prompts.system_prompt") from None
    return tok(text, add_special_tokens=False)["input_ids"]


def end_of_turn_ids(tok, model=None) -> list[int]:
    """Every token that ends the target's answer: the tokenizer's EOS and the ids the model's generation
    config lists (chat models end a turn on their own token: Gemma's <end_of_turn>, Llama-3's <|eot_id|>
    beside <|end_of_text|>), so generation stops where the served model stops."""
    ids = {tok.eos_token_id}
    listed = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(listed if isinstance(listed, (list, tuple)) else [listed])
    return sorted(i for i in ids if i is not None)
