"""The demo target's tokenizer: byte-level BPE trained with `tokenizers`, saved as an HF fast tokenizer.

Byte-level BPE needs no unknown token and round-trips any text, including code indentation. The
result is a `PreTrainedTokenizerFast` saved with `save_pretrained`, so `AutoTokenizer.from_pretrained`
loads it like any hub tokenizer.

It carries a small chat template with one special token per role, so the demo run takes the exact
path an instruct target takes (decoding/bundle/chat.py): every prompt is formatted by the template, and the
pretraining documents are formatted the same way, so the target has seen the markers it is served with.
"""
from __future__ import annotations

from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from specdraft.decoding.bundle.chat import ChatFormat, format_prompt, user_turn

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
# BOS, then each turn as its role token + text (an assistant turn closed by EOS, as it was generated);
# the generation prompt is the assistant role token. Two tokens more than the plain prompt per turn.
DEMO_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[PAD, BOS, EOS, *ROLE_TOKENS],  # ids 0, 1, 2, then the role markers
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    # Every encoded text starts with BOS (prompts and training documents alike); EOS is appended by
    # the data code where a document ends, never by the tokenizer, so prompts stay open-ended.
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, bos_id)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, padding_side="left",
        model_max_length=1_000_000, additional_special_tokens=list(ROLE_TOKENS),
    )
    fast.chat_template = DEMO_CHAT_TEMPLATE
    return fast


def encode_document(tok, prompt: str, response: str, chat: ChatFormat = ChatFormat()) -> list[int]:
    """The formatted prompt (decoding.bundle.chat.format_prompt) + response + EOS, prompt and response
    tokenized separately, exactly as generation sees them."""
    return (format_prompt(tok, user_turn(prompt), chat) + tok(response, add_special_tokens=False)["input_ids"]
            + [tok.eos_token_id])


def pack(docs: list[list[int]], seq_len: int) -> list[list[int]]:
    """Concatenate documents and cut into full blocks of seq_len tokens (the ragged tail is dropped)."""
    stream = [t for d in docs for t in d]
    return [stream[i : i + seq_len] for i in range(0, len(stream) - seq_len + 1, seq_len)]
