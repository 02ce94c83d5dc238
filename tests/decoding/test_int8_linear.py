"""A drafter with int8 weights (decoding/rounds/int8_linear.py): its narrow calls read int8 weights and its wide
calls run the layer it wraps, a layer the kernel cannot take stays as it was, its state dict is a plain model's, greedy speculative output with it equals the target's AR output on every row, and the
loader takes int8 where `decoding.draft_weights` says so and refuses it where it cannot run."""
import copy

import pytest
import torch

from specdraft.core.errors import InputError
from specdraft.decoding.batched import generate_batch
from specdraft.decoding.bundle.loading import choose_draft_weights, load_causal_lm, load_drafter
from specdraft.decoding.defaults import DecodingDefaults
from specdraft.decoding.policies.stopping import FixedK
from specdraft.decoding.rounds.int8_linear import INT8_ROWS, Int8Linear, int8_rows, is_quantized, quantize_linears
from specdraft.decoding.rounds.packed_linear import PackedLinear, can_pack, pack_linears
from specdraft.decoding.compilation import compile_for_model
from tests.decoding.conftest import noisy_copy
from tests.decoding.test_near_ties import NEW, twin_target


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_narrow_calls_read_the_int8_weights_and_wide_calls_the_wrapped_layer(dtype):
    torch.manual_seed(0)
    plain = torch.nn.Linear(64, 48, bias=True).to(dtype)
    layer = Int8Linear(plain)
    q, scales = int8_rows(plain.weight)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127  # each row's largest weight maps to +-127
    dequant = q.float() * scales.float()[:, None]
    assert (dequant - plain.weight.float()).abs().max() <= scales.float().max() / 2 + 1e-6  # rounding, no more
    chunked = int8_rows(plain.weight, chunk=5)  # computed a few rows at a time: the same
    assert torch.equal(chunked[0], q) and torch.equal(chunked[1], scales)
    x = torch.randn(5, 64).to(dtype)
    want = x.float() @ dequant.t() + plain.bias.float()
    tol = 1e-4 if dtype == torch.float32 else 0.05
    for rows in range(1, INT8_ROWS + 1):  # through the int8 kernel
        got = layer(x[:rows].unsqueeze(0))
        assert got.shape == (1, rows, 48) and got.dtype == dtype
        assert torch.allclose(got.float()[0], want[:rows], atol=tol, rtol=tol), rows
    for rows in range(INT8_ROWS + 1, 6):  # through the wrapped layer, exactly
        assert torch.equal(layer(x[:rows].unsqueeze(0)), plain(x[:rows].unsqueeze(0))), rows
    assert layer.weight is plain.weight


def test_quantize_wraps_every_linear_the_kernel_takes_once_and_keeps_a_plain_state_dict(tmp_path):
    model = twin_target().float()
    keys = model.state_dict().keys()
    assert quantize_linears(model) == 7 * 2 + 1  # q, k, v, o, gate, up, down in two layers, and the LM head
    assert isinstance(model.lm_head, Int8Linear) and model.get_output_embeddings().weight.shape == (256, 64)
    assert pack_linears(model) == 0  # fp32: nothing to pack
    assert quantize_linears(model) == 0  # already wrapped: nothing twice
    assert model.state_dict().keys() == keys  # the wide layers' keys under their own names
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    model.save_pretrained(tmp_path, safe_serialization=True)
    again = load_causal_lm(tmp_path, "float32", "cpu")
    assert torch.equal(again(ids).logits, model(ids).logits)  # 5 rows: the wrapped layers, the saved weights
    odd = torch.nn.Sequential(torch.nn.Linear(20, 32))  # the kernel faults on input widths not a multiple of 16
    odd.get_input_embeddings = lambda: odd[0]
    assert quantize_linears(odd) == 0 and type(odd[0]) is torch.nn.Linear


@pytest.mark.skipif(not can_pack(torch.bfloat16, "cpu"), reason="no native bf16 here: nothing is packed")
def test_the_loader_packs_an_int8_drafters_wrapped_layers_but_its_output_layer(tmp_path):
    twin_target().to(torch.bfloat16).save_pretrained(tmp_path, safe_serialization=True)
    model = load_drafter(tmp_path, "bfloat16", "cpu", "int8")
    wrapped = [m for m in model.modules() if isinstance(m, Int8Linear)]
    assert len(wrapped) == 7 * 2 + 1 and type(model.lm_head.wide) is torch.nn.Linear  # the head stays plain
    assert all(isinstance(m.wide, PackedLinear) for m in wrapped if m is not model.lm_head)
    x = torch.randn(INT8_ROWS + 3, 64).to(torch.bfloat16)
    layer = wrapped[0]
    narrow = torch.cat([layer(x[i:i + 1]) for i in range(len(x))])
    assert torch.allclose(narrow.float(), layer(x).float(), atol=0.05, rtol=0.05)


def test_greedy_speculative_with_an_int8_drafter_equals_ar_on_every_row():
    """fp32 target, int8 drafter: every row's greedy output, batched and alone, equals AR's; the drafter drafted
    through its int8 kernel (one-row steps) and its drafts were accepted."""
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (int(n),), generator=gen).tolist() for n in torch.randint(3, 30, (6,), generator=gen)]
    target = twin_target().float()
    drafter = noisy_copy(copy.deepcopy(target), 0.1, seed=1)
    quantize_linears(drafter)
    calls = {"int8": 0}
    hook = lambda mod, args: calls.__setitem__("int8", calls["int8"] + (args[0].reshape(-1, mod.in_features).shape[0] <= INT8_ROWS))
    handles = [m.register_forward_pre_hook(hook) for m in drafter.modules() if isinstance(m, Int8Linear)]
    ar = [generate_batch(target, [p], NEW)[0].tokens for p in prompts]
    alone = [generate_batch(target, [p], NEW, drafter=drafter, policy=FixedK(4))[0] for p in prompts]
    assert [r.tokens for r in alone] == ar
    assert calls["int8"] > 0 and sum(r.metrics.n_draft - r.metrics.n_discarded for r in alone) > 0
    assert [r.tokens for r in generate_batch(target, prompts, NEW, drafter=drafter, policy=FixedK(4))] == ar
    for h in handles:
        h.remove()


def test_compiling_an_int8_drafter_keeps_its_outputs():
    model = twin_target().float()
    quantize_linears(model)
    ids = torch.tensor([[1, 5]])
    with torch.inference_mode():  # as the decoder runs its steps: the int8 kernel has no backward
        eager = model(ids).logits
        step = compile_for_model(lambda x: model(x).logits, model, "default")
        assert torch.allclose(step(ids), eager, atol=1e-4)


def test_draft_weights_auto_takes_int8_where_bf16_runs_on_the_cpus_units_and_int8_is_refused_off_a_cpu(tmp_path):
    packs = can_pack(torch.bfloat16, "cpu")
    assert choose_draft_weights("auto", torch.bfloat16, "cpu") == ("int8" if packs else "dtype")
    assert choose_draft_weights("auto", torch.float32, "cpu") == "dtype"
    assert choose_draft_weights("int8", torch.float32, "cpu") == "int8"
    assert choose_draft_weights("dtype", torch.bfloat16, "cpu") == "dtype"
    with pytest.raises(InputError, match="draft_weights int8 runs on a CPU"):
        choose_draft_weights("int8", torch.bfloat16, "cuda")
    with pytest.raises(InputError, match="draft_weights 'int4' is not one of auto, int8, dtype"):
        choose_draft_weights("int4", torch.bfloat16, "cpu")
    with pytest.raises(InputError, match="decoding.draft_weights must be one of auto, int8, dtype"):
        DecodingDefaults(draft_weights="int4").check()
    twin_target().save_pretrained(tmp_path, safe_serialization=True)
    assert is_quantized(load_drafter(tmp_path, "float32", "cpu", "int8"))
    assert not is_quantized(load_drafter(tmp_path, "float32", "cpu", "auto"))
    assert is_quantized(load_drafter(tmp_path, "bfloat16", "cpu", "auto")) == packs
    assert not is_quantized(load_drafter(tmp_path, "bfloat16", "cpu", "dtype"))
