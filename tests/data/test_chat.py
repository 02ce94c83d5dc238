"""Prompt records as chat messages (prompt / OpenAI messages / ShareGPT conversations) and their
formatting for the target: its chat template when it has one, plain text otherwise."""
import json

import datasets
import pytest

from specdraft.data.chat import chat_format, row_messages
from specdraft.data.prompts import load_user_prompts, user_prompt_sets
from specdraft.data.demo_tokenizer import DEMO_CHAT_TEMPLATE, encode_document, train_bpe
from specdraft.decoding.bundle.chat import ChatFormat, format_prompt, user_turn
from specdraft.core.errors import InputError
from specdraft.pipelines.schema import PromptsSection


@pytest.fixture(scope="module")
def tok():
    return train_bpe(["Question: what is two plus two? Answer: four. <think>hmm</think>"] * 40, vocab_size=300)


def test_prompt_messages_and_sharegpt_records(tmp_path):
    f = tmp_path / "chats.jsonl"
    lines = [
        {"prompt": "plain", "response": "ref"},
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q1"},
                      {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"},
                      {"role": "assistant", "content": "a2"}]},
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
        {"conversations": [{"role": "user", "content": "open question"}]},
    ]
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    rows = load_user_prompts(f)
    assert [r["prompt"] for r in rows] == ["plain", "q2", "hi", "open question"]
    assert [r["response"] for r in rows] == ["ref", "a2", "hello", ""]  # the last assistant turn is distilled
    assert rows[0]["messages"] == rows[2]["messages"] == rows[3]["messages"] == ""  # a single user turn
    assert [m["content"] for m in row_messages(rows[1])] == ["be brief", "q1", "a1", "q2"]
    assert row_messages(rows[0]) == user_turn("plain")
    # a datasets directory holding list columns reads the same way
    d = tmp_path / "ds"
    datasets.Dataset.from_list([{"messages": lines[1]["messages"], "domain": "x"}]).save_to_disk(str(d))
    sets = user_prompt_sets([d])
    (row,) = [r for s in sets.values() for r in s]
    assert row["response"] == "a2" and len(row_messages(row)) == 4


@pytest.mark.parametrize("record, message", [
    ({"messages": []}, "chats.jsonl:1: 'messages' must be a non-empty list"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "chats.jsonl:1: messages\\[0\\] has role 'robot'"),
    ({"conversations": [{"from": "alien", "value": "x"}]}, "chats.jsonl:1: conversations\\[0\\] has speaker 'alien'"),
    ({"messages": [{"role": "user", "content": 3}]}, "no text content"),
    ({"messages": [{"role": "assistant", "content": "a"}]}, "must end with a user turn"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "s"},
                   {"role": "user", "content": "b"}]}, "system turn may only come first"),
])
def test_malformed_records_name_file_and_line(tmp_path, record, message):
    f = tmp_path / "chats.jsonl"
    f.write_text(json.dumps(record) + "\n")
    with pytest.raises(InputError, match=message) as e:
        load_user_prompts(f)
    assert "\n" not in str(e.value)


def test_template_formats_like_apply_chat_template(tok):
    """With a template: exactly apply_chat_template(add_generation_prompt=True) as text, BOS once."""
    msgs = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "<think>hmm</think>a1"},
            {"role": "user", "content": "q2"}]
    ids = format_prompt(tok, msgs)
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert ids == tok(text, add_special_tokens=False)["input_ids"]
    assert ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id
    assert tok.convert_ids_to_tokens(ids[-1]) == "<|assistant|>"
    stripped = format_prompt(tok, msgs, ChatFormat(reasoning="strip"))
    assert tok.decode(stripped).count("hmm") == 0 and tok.decode(ids).count("hmm") == 1
    with_system = format_prompt(tok, msgs, ChatFormat(system_prompt="be brief"))
    assert tok.convert_ids_to_tokens(with_system[1]) == "<|system|>"
    # plain: the tokenizer's own encoding of the text, as before chat templates
    assert format_prompt(tok, user_turn("q1"), ChatFormat(plain=True)) == tok("q1")["input_ids"]
    other = "{{ bos_token }}{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    assert tok.decode(format_prompt(tok, user_turn("q1"), ChatFormat(template=other))) == "<s>[q1]"


def test_tokenizer_without_template_uses_plain_text(tok):
    tok2 = train_bpe(["hello there"] * 20, vocab_size=280)
    tok2.chat_template = None
    assert format_prompt(tok2, user_turn("hello")) == tok2("hello")["input_ids"]
    two = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    assert format_prompt(tok2, two) == tok2("a\n\nb\n\nc")["input_ids"]


def test_pretraining_documents_carry_the_served_prompt(tok):
    """The demo target is pretrained on documents whose prompt part is token for token the served prompt."""
    doc = encode_document(tok, "Question: two?", " four")
    prompt = format_prompt(tok, user_turn("Question: two?"))
    assert doc[:len(prompt)] == prompt and doc[-1] == tok.eos_token_id
    assert tok.chat_template == DEMO_CHAT_TEMPLATE


def test_chat_format_from_config(tmp_path):
    assert chat_format(PromptsSection()) == ChatFormat()
    assert chat_format(PromptsSection(chat_template="none")).plain
    f = tmp_path / "t.jinja"
    f.write_text("{{ messages[0]['content'] }}")
    assert chat_format(PromptsSection(chat_template=str(f), system_prompt="s")).template == f.read_text()
    for bad in ("chatml", str(tmp_path / "missing.jinja")):
        with pytest.raises(InputError, match="chat_template"):
            chat_format(PromptsSection(chat_template=bad))
    fmt = ChatFormat(template="{{ x }}", system_prompt="s", reasoning="strip", template_kwargs={"enable_thinking": False})
    assert ChatFormat.from_dict(json.loads(json.dumps(fmt.to_dict()))) == fmt
