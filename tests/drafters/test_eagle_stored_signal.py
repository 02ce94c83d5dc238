"""EAGLE drafters trained on the target's stored signal (features + top-k, stage teacher-data) get the loss and
gradients the live target gives on the same batch (fp32, k = the vocabulary), never run the target, and log a dev
curve that survives a resume."""
import pytest
import torch

from specdraft.core.errors import InputError
from specdraft.decoding.speculators.eagle_model import new_eagle_drafter
from specdraft.drafters.data import CausalLMCollator, CausalLMDataModule
from specdraft.drafters.eagle import DevCurve, EagleModule, FrozenParts, TopK, in_draft_vocab, token_terms
from specdraft.drafters.teacher_signal import StoredExamples
from specdraft.training.trainer import TrainerConfig, WandbConfig, build_trainer, fit
from tests.decoding.eagle_fixtures import tiny_target
from tests.drafters.test_teacher_signal import V, rows, stored_dataset


def drafter_for(target, variant: str):
    torch.manual_seed(1)
    draft_ids = list(range(0, V, 2)) if variant == "eagle3" else None  # a reduced draft vocabulary
    drafter = new_eagle_drafter(target.config, variant=variant, draft_ids=draft_ids)
    if variant == "eagle3":
        drafter.init_from_target(target)
    return drafter


def stored_batch(target, drafter, row_list, k=V):
    data, fmt = stored_dataset(target, row_list, k=k, layers=drafter.feature_layers)
    stored = StoredExamples(data, range(len(data)), fmt, features=True)
    plain = [{"prompt_ids": r["prompt_ids"], "response_ids": r["response_ids"]} for r in data]
    collate = CausalLMCollator(pad_token_id=0, max_length=16)
    return collate(plain), collate([stored[i] for i in range(len(stored))])


@pytest.mark.parametrize("variant", ["eagle3", "eagle3-proj", "eagle1"])
def test_the_loss_from_stored_states_equals_the_loss_with_the_live_target(variant):
    target = tiny_target("llama", 0, vocab=V, layers=3)
    drafter = drafter_for(target, variant)
    live_batch, stored = stored_batch(target, drafter, rows())
    live = EagleModule(drafter, target, ttt_steps=3, seed=0)
    want, want_parts, n = live.compute_loss(live_batch, noise=False)
    want.backward()
    want_grads = {k: p.grad.clone() for k, p in drafter.named_parameters() if p.grad is not None}
    drafter.zero_grad()
    from_store = EagleModule(drafter, FrozenParts(target), ttt_steps=3, seed=0)
    got, parts, m = from_store.compute_loss(stored, noise=False)
    got.backward()
    assert n == m > 0 and set(parts) == set(want_parts)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for key in want_parts:
        torch.testing.assert_close(parts[key], want_parts[key], atol=1e-5, rtol=1e-5)
    assert want_grads and all(torch.allclose(p.grad, want_grads[k], atol=1e-5, rtol=1e-4)
                              for k, p in drafter.named_parameters() if k in want_grads)
    if variant != "eagle1":
        assert {"agreement_step0", "agreement_step2", "acceptance"} <= set(parts)
    with pytest.raises(InputError, match="stored signal"):  # the embedding and head alone cannot run the target
        from_store.compute_loss(live_batch)


def test_a_topk_outside_the_draft_vocabulary_adds_no_loss_and_counts_as_a_miss():
    logits = torch.randn(3, 4)
    draft_ids = torch.tensor([1, 3, 5, 7])  # target ids of the draft vocabulary's 4 entries
    target = TopK(torch.tensor([[3, 0], [2, 4], [7, 5]]), torch.tensor([[-0.1, -2.0], [-0.2, -1.0], [-0.5, -0.9]]))
    inside = in_draft_vocab(target, draft_ids, vocab_size=8)
    assert inside.ids[0, 0] == 1 and inside.logprobs[0, 1] == float("-inf") and torch.isinf(inside.logprobs[1]).all()
    loss, parts = token_terms(logits.requires_grad_(), inside)
    assert torch.isfinite(loss) and torch.isfinite(parts["acceptance"])
    loss.backward()
    assert not logits.grad[1].any()  # row 1 has no entry in the draft vocabulary
    hits = [int(logits[0].argmax() == 1), 0, int(logits[2].argmax() == 3)]
    assert parts["agreement"] == pytest.approx(sum(hits) / 3)


def test_training_on_the_stored_signal_logs_a_dev_curve_that_a_resume_keeps(tmp_path):
    target = tiny_target("llama", 0, vocab=V, layers=3)
    drafter = drafter_for(target, "eagle3").to(torch.float32)
    data, fmt = stored_dataset(target, rows(12), k=8, layers=drafter.feature_layers)
    train = StoredExamples(data, range(8), fmt, features=True)
    dev = StoredExamples(data, range(8, 12), fmt, features=True)
    collate = CausalLMCollator(pad_token_id=0, max_length=16)
    cfg = TrainerConfig(max_epochs=3, batch_size=4, checkpoint_every_n_steps=1, wandb=WandbConfig(mode="disabled"),
                        accelerator="cpu", resume=True)
    curve = DevCurve([collate([dev[i] for i in range(4)])], every=2)
    module = EagleModule(drafter, FrozenParts(target), lr=1e-2, ttt_steps=2)
    fit(build_trainer(cfg, tmp_path, callbacks=[curve]), module, CausalLMDataModule(train, collate, batch_size=4), cfg)
    assert [p["step"] for p in curve.points] == [2, 4, 6]  # 2 batches an epoch, 3 epochs; the end is step 6
    assert {"agreement", "acceptance", "agreement_step0", "agreement_step1"} <= set(curve.points[0])
    assert all(0 <= p["acceptance"] <= 1 for p in curve.points)
    longer = TrainerConfig(**{**cfg.__dict__, "max_epochs": 4})
    resumed = DevCurve(curve.batches, every=2)
    fit(build_trainer(longer, tmp_path, callbacks=[resumed]), module, CausalLMDataModule(train, collate, batch_size=4),
        longer)
    assert [p["step"] for p in resumed.points] == [2, 4, 6, 8]  # the checkpoint's points, then the new one
    assert resumed.points[:3] == curve.points
