import pytest

from specdraft.core.errors import InputError
from specdraft.drafters.data import (
    CausalLMCollator,
    ResumableBatchSampler,
    ResumableDataLoader,
    fit_to_length,
)
from specdraft.drafters.losses import gather_positions, next_token_targets


def test_loss_mask_selects_exactly_the_response_tokens_as_targets():
    ex = [
        {"prompt_ids": [1, 2, 3], "response_ids": [10, 11]},
        {"prompt_ids": [4], "response_ids": [12, 13, 14, 15]},
    ]
    batch = CausalLMCollator(pad_token_id=0)(ex)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 10, 11], [4, 12, 13, 14, 15]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 1]]
    # position t predicts token t+1: the last prompt token predicts the first response token
    assert batch["loss_mask"].tolist() == [[0, 0, 1, 1, 0], [1, 1, 1, 1, 0]]
    targets = gather_positions(next_token_targets(batch["input_ids"]), batch["loss_mask"])
    assert targets.tolist() == [10, 11, 12, 13, 14, 15]


def test_right_padding_is_never_in_the_loss():
    batch = CausalLMCollator(pad_token_id=99)(
        [{"prompt_ids": [1], "response_ids": [2]}, {"prompt_ids": [1, 1, 1], "response_ids": [2, 3, 4]}]
    )
    assert batch["input_ids"][0].tolist() == [1, 2, 99, 99, 99, 99]
    assert batch["attention_mask"][0].tolist() == [1, 1, 0, 0, 0, 0]
    assert batch["loss_mask"][0].tolist() == [1, 0, 0, 0, 0, 0]


def test_plain_lm_examples_train_on_every_next_token():
    batch = CausalLMCollator(pad_token_id=0, max_length=4)([{"input_ids": [5, 6, 7, 8, 9]}, {"input_ids": [5, 6]}])
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8], [5, 6, 0, 0]]
    assert batch["loss_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]


def test_long_prompts_lose_tokens_from_the_left():
    prompt, response, dropped = fit_to_length(list(range(10)), [100, 101], max_length=5)
    assert (prompt, response, dropped) == ([7, 8, 9], [100, 101], 7)
    batch = CausalLMCollator(pad_token_id=0, max_length=5)([{"prompt_ids": list(range(10)), "response_ids": [100, 101]}])
    assert batch["input_ids"].tolist() == [[7, 8, 9, 100, 101]]
    assert gather_positions(next_token_targets(batch["input_ids"]), batch["loss_mask"]).tolist() == [100, 101]


def test_overlong_response_keeps_one_prompt_token_and_is_cut_on_the_right():
    prompt, response, dropped = fit_to_length([1, 2, 3], list(range(10, 20)), max_length=4)
    assert (prompt, response, dropped) == ([3], [10, 11, 12], 2)


def test_cached_topk_rows_land_on_the_loss_positions():
    ex = {
        "prompt_ids": [1, 2],
        "response_ids": [7, 8],
        "teacher_topk_ids": [[7, 3], [8, 4]],
        "teacher_topk_logprobs": [[-0.1, -2.0], [-0.2, -3.0]],
    }
    batch = CausalLMCollator(pad_token_id=0)([ex])
    ids = gather_positions(batch["teacher_topk_ids"], batch["loss_mask"])
    assert ids.tolist() == [[7, 3], [8, 4]]
    with pytest.raises(InputError, match="top-k rows"):
        CausalLMCollator(pad_token_id=0)([{**ex, "teacher_topk_ids": [[7, 3]], "teacher_topk_logprobs": [[0.0, 0.0]]}])


def test_example_without_known_fields_is_refused():
    with pytest.raises(InputError, match="prompt_ids"):
        CausalLMCollator(pad_token_id=0)([{"text": "hi"}])


def test_sampler_is_seeded_and_shards_ranks_disjointly():
    a = list(ResumableBatchSampler(10, 3, seed=1))
    assert a == list(ResumableBatchSampler(10, 3, seed=1))
    assert a != list(ResumableBatchSampler(10, 3, seed=2))
    assert sorted(i for b in a for i in b) == list(range(10))
    s = ResumableBatchSampler(10, 3, seed=1)
    s.set_epoch(1)
    assert list(s) != a  # a new order each epoch
    r0 = [i for b in ResumableBatchSampler(10, 2, seed=1, rank=0, world_size=2) for i in b]
    r1 = [i for b in ResumableBatchSampler(10, 2, seed=1, rank=1, world_size=2) for i in b]
    assert len(r0) == len(r1) == 5 and sorted(r0 + r1) == list(range(10))


def test_loader_state_resumes_at_the_next_batch():
    data = [{"input_ids": [i, i + 1]} for i in range(10)]
    make = lambda: ResumableDataLoader(data, ResumableBatchSampler(10, 2, seed=3), collate_fn=CausalLMCollator(0))
    full = [b["input_ids"][:, 0].tolist() for b in make()]
    loader = make()
    it = iter(loader)
    seen = [next(it)["input_ids"][:, 0].tolist() for _ in range(2)]
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    rest = [b["input_ids"][:, 0].tolist() for b in resumed]
    assert seen + rest == full and len(resumed) == len(full)
