"""The EAGLE drafter learns the target's features through the shared trainer, and what it learns shows
up as accepted tokens in EAGLE decoding; its checkpoint has only the EAGLE layer."""
import pytest
import torch

from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.decoding.speculators.eagle import EagleSpeculator
from specdraft.decoding.speculators.eagle_model import EagleDrafter
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.speculative import generate_speculative
from specdraft.decoding.policies.stopping import FixedK
from specdraft.drafters.data import CausalLMCollator, CausalLMDataModule
from specdraft.drafters.eagle import EagleModule, eagle_loss
from specdraft.training.trainer import TrainerConfig, WandbConfig, build_trainer, fit
from tests.decoding.eagle_fixtures import tiny_target

GREEDY = SamplingConfig(temperature=0.0)


def test_eagle_loss_is_zero_only_for_a_perfect_prediction():
    f = torch.randn(5, 8)
    logits = torch.randn(5, 11)
    perfect, parts = eagle_loss(f, f, logits, logits)
    assert float(perfect) == pytest.approx(0.0, abs=1e-6) and float(parts["agreement"]) == 1.0
    worse, _ = eagle_loss(f + 0.5, f, logits.flip(-1), logits)
    assert float(worse) > 0.1


def accepted_per_round(target, drafter, prompts) -> float:
    acc = rounds = 0
    for prompt in prompts:
        m = generate_speculative(target, EagleSpeculator(drafter, FixedK(4)), prompt, 24, GREEDY).metrics
        acc, rounds = acc + sum(m.accepted), rounds + m.n_target
    return acc / rounds


def self_distilled_world(layers: int = 2):
    """A tiny target, 24 prompts and its own greedy continuations of them (the self-distilled rows)."""
    torch.set_num_threads(1)
    target = tiny_target("llama", 0, vocab=48, layers=layers)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 48, (4,), generator=gen).tolist() for _ in range(24)]
    examples = [{"prompt_ids": p, "response_ids": generate_autoregressive(target, p, 24, GREEDY).tokens}
                for p in prompts]
    return target, prompts, examples


def test_training_through_the_shared_trainer_raises_acceptance(tmp_path):
    target, prompts, examples = self_distilled_world()
    drafter = EagleDrafter(target.config)
    before = accepted_per_round(target, drafter, prompts[:4])
    module = EagleModule(drafter, target, lr=5e-3, seed=0)
    cfg = TrainerConfig(max_steps=200, batch_size=8, checkpoint_every_n_steps=0, log_every_n_steps=1,
                        wandb=WandbConfig(mode="disabled"), accelerator="cpu")
    data = CausalLMDataModule(examples, CausalLMCollator(pad_token_id=0), batch_size=8, seed=0)
    fit(build_trainer(cfg, tmp_path), module, data, cfg)
    drafter.eval()
    after = accepted_per_round(target, drafter, prompts[:4])
    assert after > before + 0.5, (before, after)
    assert not any("lm_head" in k or "embed" in k and k.startswith("model.") for k in module.state_dict())
    assert all(k.startswith("drafter.") for k in module.state_dict())
