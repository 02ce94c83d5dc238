"""The alignment table (drafters/alignment.py) keeps the target's distributions for every drafter after the first
where they fit its memory budget: the same table, bit for bit, from one target forward per batch instead of one
per batch and drafter."""
import torch

from specdraft.drafters.alignment import alignment_by_domain
from specdraft.drafters.model import build_causal_lm, preset


def _model(seed):
    return build_causal_lm(preset("demo-tiny"), vocab_size=40, seed=seed).eval()


def test_kept_target_distributions_give_the_same_table_from_fewer_target_forwards():
    g = torch.Generator().manual_seed(0)
    rows = [{"domain": "ab"[i % 2], "prompt_ids": torch.randint(3, 40, (2 + i % 3,), generator=g).tolist(),
             "response_ids": torch.randint(3, 40, (3 + i % 4,), generator=g).tolist()} for i in range(7)]
    drafters = {"a": lambda: _model(1), "b": lambda: _model(2), "c": lambda: _model(3)}
    results = {}
    for keep in (0, 1 << 30):  # 0: nothing fits, the target runs again for each drafter
        target, calls = _model(0), []
        target.register_forward_pre_hook(lambda *_: calls.append(1))
        results[keep] = alignment_by_domain(target, drafters, rows, 0, batch_size=3, keep_bytes=keep), len(calls)
    (table_rerun, sums_rerun), forwards_rerun = results[0]
    (table_kept, sums_kept), forwards_kept = results[1 << 30]
    assert (forwards_rerun, forwards_kept) == (9, 3)  # 3 batches x 3 drafters against 3 batches
    assert table_kept == table_rerun
    assert all((sums_kept[d] == sums_rerun[d]).all() for d in sums_rerun)
