"""EAGLE-3's training-time test unrolls the drafter exactly as the decoder drafts with it (vLLM's layout and
eagle3-proj), and a short eagle3 run (vLLM's layout, a reduced draft vocabulary) through the shared trainer
raises accepted tokens per round."""
import pytest
import torch

from specdraft.decoding.rounds import kv
from specdraft.decoding.speculators.eagle_model import fused_features, new_eagle_drafter
from specdraft.drafters.data import CausalLMCollator, CausalLMDataModule
from specdraft.drafters.eagle import EagleModule, ttt_mask, ttt_predictions
from specdraft.training.trainer import TrainerConfig, WandbConfig, build_trainer, fit
from tests.decoding.eagle_fixtures import tiny_target
from tests.drafters.test_eagle_training import accepted_per_round, self_distilled_world


def test_ttt_mask_sees_the_real_prefix_and_its_own_chain():
    allowed = ttt_mask(torch.ones(1, 5, dtype=torch.long), 3)[0, 0].view(3, 5, 3, 5)
    assert allowed[0, 3, 0].tolist() == [True, True, True, True, False]  # step 0: causal
    assert allowed[1, 3, 0].tolist() == [True, True, True, False, False]  # real entries up to i - 1
    assert allowed[1, 3, 1].tolist() == [False, False, False, True, False]  # and itself
    assert allowed[2, 4, 0].tolist() == [True, True, True, False, False]  # real entries up to i - 2
    assert allowed[2, 4, 1, 3] and allowed[2, 4, 2, 4] and allowed[2, 4, 1].sum() == 1
    padded = ttt_mask(torch.tensor([[1, 1, 1, 0, 0]]), 2)[0, 0].view(2, 5, 2, 5)
    assert not padded[0, 4, 0, 3] and padded[0, 4, 0, 4]  # pad keys hidden; a pad query sees itself


@pytest.mark.parametrize("variant", ["eagle3", "eagle3-proj"])
def test_training_time_test_equals_cached_drafting(variant):
    torch.manual_seed(0)
    target = tiny_target("llama", 3, vocab=40, layers=3)
    drafter = new_eagle_drafter(target.config, variant=variant).attach_target(target).eval()
    ids = torch.randint(0, 40, (1, 9))
    with torch.no_grad():
        feats = fused_features(target(input_ids=ids, output_hidden_states=True).hidden_states, drafter.feature_layers)
        preds = ttt_predictions(drafter, feats[:, :-1], ids[:, 1:], torch.ones(1, 8, dtype=torch.long), 3)
        for s in range(3):
            for i in range(s, 8):
                cache = kv.new_cache()  # the decoder: real entries 0..i-s, then s draft steps on its own output
                pred, _ = kv.forward_eagle(drafter, cache, feats[0, : i - s + 1], ids[0, 1 : i - s + 2].tolist(),
                                           list(range(i - s + 1)))
                f = pred[-1]
                for r in range(1, s + 1):
                    pred, _ = kv.forward_eagle(drafter, cache, f[None], [int(ids[0, i - s + r + 1])], [i - s + r])
                    f = pred[-1]
                torch.testing.assert_close(preds[s][0, i], f, atol=1e-5, rtol=1e-4)


def test_eagle3_training_through_the_shared_trainer_raises_acceptance(tmp_path):
    target, prompts, examples = self_distilled_world(layers=3)
    torch.manual_seed(0)
    used = sorted({t for e in examples for t in e["response_ids"]})
    drafter = new_eagle_drafter(target.config, variant="eagle3", draft_ids=used).init_from_target(target)
    assert len(used) < target.config.vocab_size  # a reduced draft vocabulary, trained through d2t
    before = accepted_per_round(target, drafter.attach_target(target), prompts[:4])
    module = EagleModule(drafter, target, lr=5e-3, seed=0, ttt_steps=3)
    cfg = TrainerConfig(max_steps=300, batch_size=8, checkpoint_every_n_steps=0, log_every_n_steps=1,
                        wandb=WandbConfig(mode="disabled"), accelerator="cpu")
    data = CausalLMDataModule(examples, CausalLMCollator(pad_token_id=0), batch_size=8, seed=0)
    batch = CausalLMCollator(pad_token_id=0)(examples[:8])
    with torch.no_grad():
        loss_before = float(module.compute_loss(batch)[0])
    trainer = build_trainer(cfg, tmp_path)
    fit(trainer, module, data, cfg)
    drafter.eval()
    with torch.no_grad():
        loss_after, parts, _ = module.compute_loss(batch)
    assert float(loss_after) < 0.5 * loss_before, (loss_before, float(loss_after))
    assert set(parts) >= {"token_step0", "token_step1", "token_step2"} and "feature" not in parts  # token loss only
    after = accepted_per_round(target, drafter, prompts[:4])
    assert after > before + 0.5, (before, after)
