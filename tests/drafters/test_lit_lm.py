import lightning as L
import pytest
import torch
import torch.nn.functional as F

from specdraft.core.errors import InputError
from specdraft.drafters.data import TEACHER_LOGITS, CausalLMCollator, CausalLMDataModule
from specdraft.drafters.lit_lm import CausalLMModule, teacher_logits_per_example
from specdraft.drafters.losses import topk_of
from specdraft.drafters.model import build_causal_lm

V = 48


def _examples(n=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(3, V, (4,), generator=g).tolist()
        start = int(torch.randint(3, V - 8, (1,), generator=g))
        out.append({"prompt_ids": prompt, "response_ids": list(range(start, start + 6))})  # learnable: +1 steps
    return out


def _trainer(steps):
    return L.Trainer(
        max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, use_distributed_sampler=False, accelerator="cpu", num_sanity_val_steps=0,
    )


def test_ce_loss_is_next_token_ce_on_response_tokens_only():
    module = CausalLMModule(build_causal_lm("demo-tiny", V, seed=0))
    batch = CausalLMCollator(pad_token_id=0)(_examples(3))
    loss, n = module.compute_loss(batch)
    logits = module.model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    terms = []
    for b, ex in enumerate(_examples(3)):
        p = len(ex["prompt_ids"])
        for j, tok in enumerate(ex["response_ids"]):
            terms.append(F.cross_entropy(logits[b, p + j - 1], torch.tensor(tok)))
    assert n == len(terms) == 18
    assert loss.item() == pytest.approx(torch.stack(terms).mean().item(), rel=1e-5)


def test_a_few_training_steps_lower_the_loss():
    module = CausalLMModule(build_causal_lm("demo-tiny", V, seed=0), lr=3e-2, warmup_ratio=0.0)
    batch = CausalLMCollator(pad_token_id=0)(_examples())
    before = module.compute_loss(batch)[0].item()
    dm = CausalLMDataModule(_examples(), CausalLMCollator(pad_token_id=0), batch_size=8, seed=0)
    _trainer(30).fit(module, dm)
    after = module.compute_loss(batch)[0].item()
    assert after < before - 0.5, (before, after)


def test_tvd_distillation_moves_the_draft_towards_the_teacher():
    teacher = build_causal_lm("demo-tiny", V, seed=1)
    module = CausalLMModule(build_causal_lm("demo-tiny", V, seed=0), loss="tvd", lr=3e-2, warmup_ratio=0.0, teacher=teacher)
    batch = CausalLMCollator(pad_token_id=0)(_examples())
    before = module.compute_loss(batch)[0].item()
    _trainer(20).fit(module, CausalLMDataModule(_examples(), CausalLMCollator(pad_token_id=0), batch_size=8))
    after = module.compute_loss(batch)[0].item()
    assert after < before * 0.8, (before, after)
    assert "_teacher" not in str(list(module.state_dict()))  # the teacher is not checkpointed


@pytest.mark.parametrize("loss", ["fkl", "tvd"])
def test_cached_topk_gives_the_same_loss_as_the_live_teacher(loss):
    teacher = build_causal_lm("demo-tiny", V, seed=1)
    student = build_causal_lm("demo-tiny", V, seed=0)
    k = 5
    live = CausalLMModule(student, loss=loss, teacher=teacher, teacher_topk=k)
    examples = _examples(4)
    batch = CausalLMCollator(pad_token_id=0)(examples)
    # build the cache the way a data stage would: one top-k row per response token
    with torch.no_grad():
        t_logits = teacher(batch["input_ids"]).logits
    cached = []
    for b, ex in enumerate(examples):
        p, r = len(ex["prompt_ids"]), len(ex["response_ids"])
        ids, lp = topk_of(t_logits[b, p - 1 : p + r - 1], k)
        cached.append({**ex, "teacher_topk_ids": ids.tolist(), "teacher_topk_logprobs": lp.tolist()})
    cached_batch = CausalLMCollator(pad_token_id=0)(cached)
    from_cache = CausalLMModule(student, loss=loss).compute_loss(cached_batch)[0]
    assert from_cache.item() == pytest.approx(live.compute_loss(batch)[0].item(), rel=1e-5)


def _ragged(n=16, seed=0):
    """Prompts and responses of different lengths, so batches pad and some examples are cut."""
    g = torch.Generator().manual_seed(seed)
    def ids(lo, hi):
        return torch.randint(3, V, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()
    return [{"prompt_ids": ids(1, 7), "response_ids": ids(1, 9)} for _ in range(n)]


@pytest.mark.parametrize("loss", ["fkl", "tvd"])
def test_cached_teacher_logits_train_the_same_drafter_as_the_live_teacher(loss):
    teacher = build_causal_lm("demo-tiny", V, seed=1).eval()
    collate = CausalLMCollator(pad_token_id=0, max_length=10)
    examples = _ragged()
    # cached in batches of 5 (length-sorted) while training draws shuffled batches of 4: other batch-mates
    logits = teacher_logits_per_example(teacher, examples, collate, batch_size=5)
    assert [len(x) for x in logits] == [collate.positions(ex) for ex in examples]
    cached = [{**ex, TEACHER_LOGITS: x} for ex, x in zip(examples, logits)]
    trained = []
    for data, live in ((examples, teacher), (cached, None)):
        module = CausalLMModule(build_causal_lm("demo-tiny", V, seed=0), loss=loss, lr=1e-2, warmup_ratio=0.0,
                                teacher=live)
        _trainer(8).fit(module, CausalLMDataModule(data, collate, batch_size=4, seed=0))
        trained.append(module.model.state_dict())
    moved = max((trained[0][k] - build_causal_lm("demo-tiny", V, seed=0).state_dict()[k]).abs().max() for k in trained[0])
    assert moved > 1e-3  # the steps did train
    for k in trained[0]:
        assert torch.allclose(trained[0][k], trained[1][k], atol=1e-5), k


def test_cached_teacher_logits_must_match_the_trained_on_positions():
    ex = {"prompt_ids": [3, 4], "response_ids": [5, 6, 7], TEACHER_LOGITS: torch.zeros(2, V)}  # 3 positions
    with pytest.raises(InputError, match="cached teacher logit rows"):
        CausalLMCollator(pad_token_id=0)([ex])


def test_distillation_without_a_teacher_or_cache_is_refused():
    module = CausalLMModule(build_causal_lm("demo-tiny", V, seed=0), loss="fkl")
    with pytest.raises(InputError, match="teacher"):
        module.compute_loss(CausalLMCollator(pad_token_id=0)(_examples(2)))


def test_bad_options_are_refused():
    m = build_causal_lm("demo-tiny", V, seed=0)
    with pytest.raises(InputError, match="unknown loss"):
        CausalLMModule(m, loss="rkl")
    with pytest.raises(InputError, match="vocab size"):
        CausalLMModule(m, loss="fkl", teacher=build_causal_lm("demo-tiny", V + 1, seed=0))


def test_gradient_checkpointing_gives_the_same_gradients():
    batch = CausalLMCollator(pad_token_id=0)(_examples(4))
    grads = []
    for ckpt in (False, True):
        module = CausalLMModule(build_causal_lm("demo-tiny", V, seed=0), grad_checkpointing=ckpt)
        module.train()
        module.compute_loss(batch)[0].backward()
        grads.append(module.model.model.embed_tokens.weight.grad)
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_adamw8bit_option_trains():
    pytest.importorskip("bitsandbytes")
    module = CausalLMModule(build_causal_lm("demo-tiny", V, seed=0), lr=3e-2, warmup_ratio=0.0, optimizer="adamw8bit")
    batch = CausalLMCollator(pad_token_id=0)(_examples())
    before = module.compute_loss(batch)[0].item()
    trainer = _trainer(10)
    trainer.fit(module, CausalLMDataModule(_examples(), CausalLMCollator(pad_token_id=0), batch_size=8))
    assert type(trainer.optimizers[0]).__name__ == "AdamW8bit"
    assert module.compute_loss(batch)[0].item() < before
