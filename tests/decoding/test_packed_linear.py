"""bf16 linears packed in oneDNN's layout (decoding/rounds/packed_linear.py): the weights survive packing bit for
bit, a packed model decodes greedy speculative output equal to its own AR output on every row, alone and batched
(the twin-token target of test_near_ties, whose steps nearly all hold a near-tie), and the code that widens,
copies or compiles a model gets plain layers back. Where this CPU's oneDNN has no native bf16 (`can_pack` false)
the loader must leave the model plain, which the loader test checks instead."""
import copy

import pytest
import torch

from specdraft.decoding.batched import generate_batch
from specdraft.decoding.bundle.loading import load_causal_lm
from specdraft.decoding.rounds.packed_linear import PackedLinear, can_pack, is_packed, pack_linears, unpack_linears
from specdraft.decoding.compilation import compile_for_model
from specdraft.decoding.near_ties import fp32_copy, width_classes
from specdraft.drafters.model import num_parameters
from specdraft.decoding.policies.stopping import FixedK
from specdraft.decoding.rounds.shapes import verify_floor
from tests.decoding.conftest import noisy_copy
from tests.decoding.test_near_ties import NEW, K, twin_target

needs_packing = pytest.mark.skipif(not can_pack(torch.bfloat16, "cpu"),
                                   reason="this CPU's oneDNN computes bf16 by conversion: nothing is packed here")


def packed_copy(model):
    model = copy.deepcopy(model)
    pack_linears(model)
    return model


@pytest.fixture(scope="module")
def plain():
    return twin_target().to(torch.bfloat16)


@needs_packing
def test_packing_keeps_every_weight_and_refuses_a_wider_input(plain):
    packed = packed_copy(plain)
    layers = [m for m in packed.modules() if isinstance(m, PackedLinear)]
    assert len(layers) == 7 * plain.config.num_hidden_layers  # q, k, v, o, gate, up, down
    assert type(packed.lm_head) is torch.nn.Linear  # the output layer stays plain: code reads its weight
    with pytest.raises(TypeError, match="unpack_linears"):
        layers[0](torch.zeros(1, plain.config.hidden_size))
    again = copy.deepcopy(packed)  # oneDNN's tensors have no storage copy can reach: repacked
    assert is_packed(again) and unpack_linears(again) == len(layers)
    want = plain.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in again.state_dict().items()) and again.state_dict().keys() == want.keys()
    wide = fp32_copy(packed)
    assert not is_packed(wide) and all(torch.equal(v, want[k].float()) for k, v in wide.state_dict().items())
    assert is_packed(packed)  # the copies left the original packed
    assert num_parameters(packed) == num_parameters(plain)  # a packed layer's weight counts (export's pricing rule)


def test_the_loader_packs_bf16_on_a_cpu_that_computes_it_unless_told_not_to_and_nothing_else(plain, tmp_path):
    plain.save_pretrained(tmp_path)
    assert is_packed(load_causal_lm(tmp_path, "bfloat16", "cpu")) == can_pack(torch.bfloat16, "cpu")  # the default
    assert not is_packed(load_causal_lm(tmp_path, "bfloat16", "cpu", pack=False))
    assert not is_packed(load_causal_lm(tmp_path, "float32", "cpu"))


@needs_packing
def test_a_packed_model_saves_and_loads_its_plain_weights(plain, tmp_path):
    """Its state dict is the plain model's, bit for bit: save_pretrained of a packed model once wrote no linear
    weight at all, and each load of the saved drafter initialised them at random."""
    packed = packed_copy(plain)
    want = plain.state_dict()
    got = packed.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    packed.save_pretrained(tmp_path, safe_serialization=True)
    again = load_causal_lm(tmp_path, "bfloat16", "cpu", pack=False)
    assert all(torch.equal(v, want[k]) for k, v in again.state_dict().items())
    other = packed_copy(noisy_copy(copy.deepcopy(plain).float(), 0.3, seed=2).to(torch.bfloat16))
    other.load_state_dict(want)  # loading into packed layers repacks the given weights
    ids = torch.tensor([[1, 5, 9, 3]])
    assert torch.equal(other(ids).logits, packed(ids).logits)
    missing = {k: v for k, v in want.items() if k != "model.layers.0.mlp.up_proj.weight"}
    assert other.load_state_dict(missing, strict=False).missing_keys == ["model.layers.0.mlp.up_proj.weight"]
    wrong = {**want, "model.layers.0.mlp.up_proj.weight": want["model.layers.0.mlp.up_proj.weight"][:-1]}
    with pytest.raises(RuntimeError, match="size mismatch for model.layers.0.mlp.up_proj.weight"):
        other.load_state_dict(wrong)


@needs_packing
def test_compiling_a_packed_model_unpacks_it_first(plain):
    packed = packed_copy(plain)
    compile_for_model(lambda ids: packed(ids).logits, packed, "default")  # inductor cannot trace oneDNN's tensors
    assert not is_packed(packed)


@needs_packing
def test_packed_greedy_equals_ar_alone_and_batched(plain):
    """Every row's greedy output, speculative at K = 1 and 4 or AR, alone or in a batch of 8, equals the packed
    target's AR alone, token for token; the premise (widths >= the verify floor compute alike) checked first."""
    from tests.decoding.test_near_ties import ROWS_BATCH
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (int(n),), generator=gen).tolist()
               for n in torch.randint(3, 30, (ROWS_BATCH,), generator=gen)]
    target = packed_copy(plain)
    drafter = packed_copy(noisy_copy(twin_target(), 0.3, seed=1).to(torch.bfloat16))
    floor = verify_floor("bfloat16", "cpu")
    ar = [generate_batch(target, [p], NEW)[0].tokens for p in prompts]
    for p, tokens in list(zip(prompts, ar))[:3]:
        classes = width_classes(target, p + tokens, range(1, 10), positions=NEW)
        assert len({classes[w] for w in range(floor, 10)}) == 1, f"widths >= {floor} compute alike: {classes}"
    assert [r.tokens for r in generate_batch(target, prompts, NEW)] == ar
    for k in (1, K):
        assert [r.tokens for r in generate_batch(target, prompts, NEW, drafter=drafter, policy=FixedK(k))] == ar, k
        assert [generate_batch(target, [p], NEW, drafter=drafter, policy=FixedK(k))[0].tokens for p in prompts] == ar, k
