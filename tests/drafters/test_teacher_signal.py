"""The target's stored signal (drafters/teacher_signal.py): what one teacher-forced pass stores is what the live
target gives a training step, bit for bit in fp32, and the independent drafters' fkl / tvd / ce read from it equal
the losses with the live target on the same batch."""
import datasets
import pytest
import torch

from specdraft.core.errors import InputError
from specdraft.decoding.speculators.eagle_model import fused_features
from specdraft.drafters.alignment import response_logits
from specdraft.drafters.data import CE_TARGETS, TEACHER_FEATURES, TOPK_IDS, CausalLMCollator
from specdraft.drafters.lit_lm import CausalLMModule
from specdraft.drafters.model import build_causal_lm
from specdraft.drafters.teacher_signal import (ROW_FEATURES, StoredExamples, from_bytes, score_rows, signal_format,
                                               to_bytes)
from tests.decoding.eagle_fixtures import tiny_target

V = 48


def rows(n: int = 7, seed: int = 0, source: str = "distilled") -> list[dict]:
    """Rows of varied prompt and response lengths (so batches pad), one of them longer than the context."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p, r = 2 + i % 4, 3 + (5 * i) % 9
        out.append({"id": f"{source}-{i}", "prompt_id": f"p{i}", "domain": "ab"[i % 2], "source": source,
                    "prompt_ids": torch.randint(1, V, (p,), generator=g).tolist(),
                    "response_ids": torch.randint(1, V, (r,), generator=g).tolist()})
    out[0]["prompt_ids"] = out[0]["prompt_ids"] * 10  # past max_length 16: fitted from the left
    return out


def stored_dataset(target, row_list, k=V, layers=(0, 1, 2), dtype="float32", batch_size=3, max_length=16):
    fmt = signal_format(target.config, k, max_length, layers, dtype, "float32" if dtype == "float32" else "float16")
    return datasets.Dataset.from_list(score_rows(target, row_list, fmt, 0, batch_size), features=ROW_FEATURES), fmt


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int16])
def test_bytes_round_trip(dtype):
    x = torch.tensor([[0.5, -3.25, 60000.0], [1e-3, 2.0, -0.0]]) if dtype.is_floating_point else \
        torch.tensor([[0, 1, 40000], [65535, 7, 32768]])
    back = from_bytes(to_bytes(x, dtype), dtype, 3)
    assert back.shape == (2, 3)
    assert torch.equal(back.float(), x.to(dtype).float()) if dtype.is_floating_point else torch.equal(back, x)


def test_one_pass_stores_the_live_targets_topk_and_features_at_every_position():
    torch.manual_seed(0)
    target = tiny_target("llama", 0, vocab=V, layers=3)
    data, fmt = stored_dataset(target, rows(), k=5)
    alone, _ = stored_dataset(target, rows(), k=5, batch_size=1)
    # batch-mates do not matter: the same top-k, its values and the features equal up to fp32's rounding (a BLAS may
    # sum a padded batch's products in another order: 4.5e-6 of 6.4 on an AMD EPYC, bit-equal on a Xeon)
    assert data["topk_ids"] == alone["topk_ids"]
    for column, width in (("topk_logprobs", 5), ("features", fmt.feature_width)):
        for a, b in zip(data[column], alone[column]):
            torch.testing.assert_close(from_bytes(a, torch.float32, width), from_bytes(b, torch.float32, width),
                                       rtol=1e-5, atol=1e-5)
    collate = CausalLMCollator(pad_token_id=0, max_length=16)
    fitted = [{"prompt_ids": r["prompt_ids"], "response_ids": r["response_ids"]} for r in data]
    assert len(fitted[0]["prompt_ids"]) + len(fitted[0]["response_ids"]) == 16 and data[0]["prompt_dropped"] > 0
    assert collate(fitted)["input_ids"].tolist() == collate(rows())["input_ids"].tolist()  # fitted as the collator fits
    batch = collate(fitted)
    with torch.no_grad():
        live = target(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
    logprobs, ids = response_logits(target, batch).log_softmax(-1).topk(5, -1)
    stored = StoredExamples(data, range(len(data)), fmt, features=True)
    got = collate([stored[i] for i in range(len(data))])
    mask = batch["loss_mask"].bool()
    assert torch.equal(got[TOPK_IDS][mask], ids)
    torch.testing.assert_close(got["teacher_topk_logprobs"][mask], logprobs)
    feats = fused_features(live.hidden_states, (0, 1, 2))
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(got[TEACHER_FEATURES][real], feats[real])
    assert not got[TEACHER_FEATURES][~real].any()
    assert torch.equal(got[CE_TARGETS][mask], batch["input_ids"][:, 1:][mask[:, :-1]])  # the answers' next tokens


def test_bf16_features_take_two_bytes_a_value():
    target = tiny_target("llama", 0, vocab=V, layers=3)
    data, fmt = stored_dataset(target, rows(3), k=4, dtype="bfloat16")
    tokens = sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in data)
    assert sum(len(b) for b in data["features"]) == tokens * 3 * 32 * 2
    assert sum(len(b) for b in data["topk_ids"]) == sum(len(r["response_ids"]) for r in data) * 4 * 2  # uint16 ids
    assert StoredExamples(data, [0], fmt, features=True)[0][TEACHER_FEATURES].dtype == torch.bfloat16


@pytest.mark.parametrize("loss", ["fkl", "tvd"])
@pytest.mark.parametrize("k", [6, V])
def test_fkl_and_tvd_from_the_stored_topk_equal_the_live_target(loss, k):
    torch.manual_seed(0)
    teacher = tiny_target("llama", 1, vocab=V, layers=2)
    data, fmt = stored_dataset(teacher, rows(), k=k, layers=None)
    stored = StoredExamples(data, range(len(data)), fmt)
    collate = CausalLMCollator(pad_token_id=0, max_length=16)
    student = build_causal_lm("demo-tiny", V, seed=0)
    live = CausalLMModule(student, loss=loss, teacher=teacher, teacher_topk=None if k == V else k)
    from_store = CausalLMModule(student, loss=loss)  # no teacher: it must read the batch
    plain = [{"prompt_ids": r["prompt_ids"], "response_ids": r["response_ids"]} for r in data]
    want, n = live.compute_loss(collate(plain))
    got, m = from_store.compute_loss(collate([stored[i] for i in range(len(stored))]))
    assert n == m > 0
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_ce_reads_the_answers_next_tokens_and_the_targets_greedy_token_on_text_it_did_not_write():
    teacher = tiny_target("llama", 1, vocab=V, layers=2)
    mixed = rows(4) + rows(3, seed=1, source="reference")
    data, fmt = stored_dataset(teacher, mixed, k=3, layers=None)
    collate = CausalLMCollator(pad_token_id=0, max_length=16)
    student = build_causal_lm("demo-tiny", V, seed=0)
    ce = CausalLMModule(student, loss="ce")
    plain = [{"prompt_ids": r["prompt_ids"], "response_ids": r["response_ids"]} for r in data]
    stored = StoredExamples(data, range(len(data)), fmt, topk=False)
    batch = collate([stored[i] for i in range(len(stored))])
    assert TOPK_IDS not in batch
    answers = collate(plain[:4])
    torch.testing.assert_close(ce.compute_loss(collate([stored[i] for i in range(4)]))[0], ce.compute_loss(answers)[0])
    mask = batch["loss_mask"].bool()
    greedy = response_logits(teacher, collate(plain[4:])).argmax(-1)
    assert torch.equal(batch[CE_TARGETS][4:][mask[4:]], greedy)
    assert not torch.equal(greedy, collate(plain[4:])["input_ids"][:, 1:][mask[4:, :-1]])  # not the text's tokens


def test_a_row_without_a_prompt_and_features_never_stored_are_refused():
    target = tiny_target("llama", 0, vocab=V, layers=3)
    bad = rows(2)
    bad[1]["prompt_ids"] = []
    with pytest.raises(InputError, match="empty prompt"):
        stored_dataset(target, bad)
    data, fmt = stored_dataset(target, rows(2), layers=None)
    with pytest.raises(InputError, match="no hidden states"):
        StoredExamples(data, [0], fmt, features=True)
    with pytest.raises(InputError, match="top_k"):
        signal_format(target.config, V + 1, 16, None)


def test_a_selection_of_the_stored_rows_reads_the_selected_rows():
    """A select()ed dataset (bench_data_scaling's scales: some rows of each domain) keeps the whole Arrow table
    beside a mapping; the examples are the selection's rows, not the table's first ones."""
    target = tiny_target("llama", 0, vocab=V, layers=3)
    data, fmt = stored_dataset(target, rows(7), k=4)
    keep = [1, 4, 6]
    picked = StoredExamples(data.select(keep), range(3), fmt, features=True)
    whole = StoredExamples(data, keep, fmt, features=True)
    for j in range(3):
        assert picked[j]["response_ids"] == data[keep[j]]["response_ids"]
        assert all(torch.equal(torch.as_tensor(picked[j][key]), torch.as_tensor(whole[j][key]))
                   for key in picked[j] if key not in ("prompt_ids", "response_ids"))
