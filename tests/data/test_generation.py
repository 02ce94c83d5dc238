"""Generation stops where the served model stops: at any of its end-of-turn ids, not only the tokenizer's
EOS (chat models end a turn on their own token: Gemma's <end_of_turn>, Llama-3's <|eot_id|>)."""
from types import SimpleNamespace

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdraft.data.generation import generate_responses
from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.decoding.bundle.chat import end_of_turn_ids
from specdraft.decoding.rounds.sampling import SamplingConfig


def test_a_turn_ends_at_any_end_of_turn_id():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, max_position_embeddings=64, eos_token_id=2)).eval()
    prompt = [5, 9, 11, 3]
    free = generate_responses(model, [prompt], 0, [39], 0.0, 0, 1.0, 12, 0)[0][0]  # 39: never emitted here
    turn_end = free[3]  # make the 4th greedy token the model's end of turn
    assert turn_end not in free[:3] and turn_end != 2
    model.generation_config.eos_token_id = [2, turn_end]
    tok = SimpleNamespace(eos_token_id=2)
    stops = end_of_turn_ids(tok, model)
    assert stops == sorted({2, turn_end})
    assert generate_responses(model, [prompt], 0, stops, 0.0, 0, 1.0, 12, 0) == [(free[:4], "eos")]
    assert generate_autoregressive(model, prompt, 12, SamplingConfig(0.0), stops).tokens == free[:4]
    assert end_of_turn_ids(tok) == [2]  # no model: the tokenizer's EOS alone
