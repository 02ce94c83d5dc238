"""How well a drafter matches the target, measured teacher-forced on target responses (no generation).

Two numbers per (drafter, domain), over every response position of the dev sequences:
  acceptance   mean of 1 - TV(p_i, q_i) at temperature 1: the expected acceptance rate of one draft
               token under speculative sampling (SpecDec++ / MetaSD use this quantity)
  agreement    mean of 1{argmax p_i == argmax q_i}: the acceptance rate of greedy speculative decoding
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable

import numpy as np
import torch

from specdraft.decoding.timing import bootstrap_ratio
from specdraft.drafters.data import CausalLMCollator


def _device(model) -> torch.device:
    return model.get_input_embeddings().weight.device


@torch.no_grad()
def response_logits(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Logits at the positions that predict response tokens, (N, V) float32, in batch order. The LM head runs at
    those positions only (`logits_to_keep` as a mask: transformers returns them flattened in row-major order):
    with a large vocabulary the prompt positions' logits were a third of a real target's forward."""
    dev = _device(model)
    mask = batch["loss_mask"].to(dev).bool()
    return model(input_ids=batch["input_ids"].to(dev), attention_mask=batch["attention_mask"].to(dev),
                 use_cache=False, logits_to_keep=mask).logits.float().cpu()


@torch.no_grad()
def response_hidden(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Final hidden states (after the final norm: what the decoder's heads read) at the positions that
    *hold* response tokens (the loss mask shifted right by one), (N, H) float32 on CPU, in batch order. No
    logits are computed (an empty `logits_to_keep` mask)."""
    dev = _device(model)
    ids = batch["input_ids"].to(dev)
    out = model(input_ids=ids, attention_mask=batch["attention_mask"].to(dev), use_cache=False,
                output_hidden_states=True, logits_to_keep=torch.zeros(ids.shape, dtype=torch.bool, device=dev))
    holds = torch.nn.functional.pad(batch["loss_mask"].to(dev).bool(), (1, 0))[:, :-1]
    return out.hidden_states[-1][holds].float().cpu()


@torch.no_grad()
def position_acceptance(target, drafters: dict[str, torch.nn.Module], batch: dict[str, torch.Tensor]
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per response position and drafter: teacher-forced acceptance 1 - TV(p, q) = sum_v min(p, q) at T=1
    (the expected acceptance of one draft token under speculative sampling, Leviathan et al. Thm 3.5) and
    greedy agreement 1{argmax p == argmax q}; both (N, len(drafters)) float64. The target runs once."""
    return _against(response_logits(target, batch).softmax(-1), drafters, batch)


def _against(p: torch.Tensor, drafters: dict[str, torch.nn.Module], batch: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """position_acceptance given the target's distributions p (N, V) at the batch's response positions."""
    acc, agree = [], []
    for drafter in drafters.values():
        q = response_logits(drafter, batch).softmax(-1)
        acc.append(torch.minimum(p, q).sum(-1).double())
        agree.append((p.argmax(-1) == q.argmax(-1)).double())
    return torch.stack(acc, -1), torch.stack(agree, -1)


@torch.no_grad()
def alignment_by_domain(target, drafters: dict[str, Callable[[], torch.nn.Module]], rows: list[dict],
                        pad_token_id: int, batch_size: int = 32, max_length: int | None = None,
                        keep_bytes: int = 1 << 30) -> tuple[dict[str, dict[str, dict]], dict[str, np.ndarray]]:
    """rows: {"domain", "prompt_ids", "response_ids"}; drafters: name -> a function that loads it. One drafter is
    in memory at a time (loaded, measured on every row, dropped): a real pair's drafters are each a third of the
    target, so holding all of them beside it would need several targets' memory. The target's distributions are
    kept for every drafter after the first where they fit `keep_bytes` (the demo's dev responses over a small
    vocabulary: the target's forwards were five sixths of its alignment), else the target runs again for each
    drafter, the forwards traded for memory (a real pair's 152k vocabulary). Returns (drafter -> domain ->
    metrics, domain -> per-sequence sums (S, D, 3) of acceptance, agreement and positions, drafters in the order
    given): the second keeps what a paired comparison between drafters resamples (positions of one response are
    not independent; responses are)."""
    collate = CausalLMCollator(pad_token_id=pad_token_id, max_length=max_length)
    chunks = [rows[start:start + batch_size] for start in range(0, len(rows), batch_size)]
    sums = [torch.zeros(len(chunk), len(drafters), 3, dtype=torch.float64) for chunk in chunks]
    batches = [collate([{"prompt_ids": r["prompt_ids"], "response_ids": r["response_ids"]} for r in chunk])
               for chunk in chunks]
    positions = sum(int(b["loss_mask"].sum()) for b in batches)
    fits = positions * target.get_output_embeddings().weight.shape[0] * 4 <= keep_bytes
    kept: list[torch.Tensor] | None = [] if len(drafters) > 1 and fits else None
    for j, (name, load) in enumerate(drafters.items()):
        drafter = load()
        for c, (chunk, chunk_sums, batch) in enumerate(zip(chunks, sums, batches)):
            if kept is not None and c < len(kept):
                p = kept[c]
            else:
                p = response_logits(target, batch).softmax(-1)  # (N, V), N = response positions
                if kept is not None:
                    kept.append(p)
            acc, agree = _against(p, {name: drafter}, batch)  # (N, 1) each
            seq = torch.repeat_interleave(torch.arange(len(chunk)), batch["loss_mask"].sum(1))  # (N,) row of each
            chunk_sums[:, j, 0].index_add_(0, seq, acc[:, 0])
            chunk_sums[:, j, 1].index_add_(0, seq, agree[:, 0])
            chunk_sums[:, j, 2].index_add_(0, seq, torch.ones_like(acc[:, 0]))
        del drafter  # before the next one loads
    per_seq: dict[str, list[np.ndarray]] = defaultdict(list)
    for chunk, chunk_sums in zip(chunks, sums):
        for r, s in zip(chunk, chunk_sums.numpy()):
            per_seq[r["domain"]].append(s)
    by_domain = {d: np.stack(v) for d, v in sorted(per_seq.items())}
    table = {name: {d: {"acceptance": round(float(s[:, j, 0].sum() / s[:, j, 2].sum()), 4),
                        "agreement": round(float(s[:, j, 1].sum() / s[:, j, 2].sum()), 4),
                        "positions": int(s[:, j, 2].sum()), "sequences": int(s.shape[0])}
                    for d, s in by_domain.items()}
             for j, name in enumerate(drafters)}
    return table, by_domain


def specialist_margins(table: dict[str, dict[str, dict]], by_domain: dict[str, np.ndarray],
                       rivals: list[str], seed: int = 0) -> None:
    """For every domain with a drafter of its own name: that drafter's acceptance and agreement there over the
    best of `rivals` (every other serving drafter, the all-domain one included), a ratio of totals with a
    paired bootstrap 90% interval over the domain's dev responses. Written into the own drafter's row of
    `table` as <metric>_vs_best_other[_lo|_hi] (floats, so the bundle's alignment stays domain -> numbers)."""
    names = list(table)
    for d, sums in by_domain.items():
        if d not in table:
            continue
        own = names.index(d)
        for m, metric in enumerate(("acceptance", "agreement")):
            others = [r for r in rivals if r != d]
            if not others:
                continue
            best = names.index(max(others, key=lambda r: table[r][d][metric]))
            spread = bootstrap_ratio(list(zip(sums[:, own, m], sums[:, best, m])), seed=seed)
            table[d][d].update({f"{metric}_vs_best_other": round(spread.median, 4),
                                f"{metric}_vs_best_other_lo": round(spread.lo, 4),
                                f"{metric}_vs_best_other_hi": round(spread.hi, 4)})


def format_alignment(table: dict[str, dict[str, dict]], metric: str) -> str:
    domains = sorted({d for row in table.values() for d in row})
    lines = [f"{metric:<12}" + "".join(f"{d:>11}" for d in domains) + f"{'mean':>9}"]
    for name, row in table.items():
        vals = [row.get(d, {}).get(metric) for d in domains]
        mean = sum(v for v in vals if v is not None) / max(1, sum(v is not None for v in vals))
        lines.append(f"{name:<12}" + "".join(f"{v:>11.3f}" if v is not None else f"{'-':>11}" for v in vals)
                     + f"{mean:>9.3f}")
    return "\n".join(lines)
