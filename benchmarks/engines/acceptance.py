"""Acceptance counted in specdraft's decoder on a run's test prompts, with intervals over prompts, and what every
cache of the engines' benchmarks is valid for.

bench_speculators.py and bench_vllm_real.py decode the same prompts (`test_prompts`) with the decoder's own
fixed-K chain (`decode_counts`) beside the target's plain greedy output (`greedy_reference`); a drafter's mean
acceptance length is pooled over prompts (`pooled_mal`) and two drafters are compared on the same prompts, resampled
jointly (`paired_difference`, `paired_ratio`).

Their caches (hidden states, datasets, trained drafters, decodes, servings) stay valid only for the run they were
made from: `run_key` names it by the target's and the distilled data's content hashes (their stage manifests),
and `ids_digest` the exact token ids a cached decode or hidden state was made for.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from specdraft.core.errors import InputError
from specdraft.decoding.bundle.loading import dtype_of
from specdraft.decoding.timing import bootstrap_rate_ratio, bootstrap_ratio


def run_key(run: Path) -> str:
    """The target's and the distilled data's content hashes (from their stage manifests), as one short key: a
    rerun of `make real` that changes either gives another key, so no cache of an earlier run is read."""
    from specdraft.pipelines.artifacts import read_manifest

    hashes = [read_manifest(run / name).content_hash for name in ("target", "distill_data")]
    return hashlib.sha256("\n".join(hashes).encode()).hexdigest()[:16]


def ids_digest(rows) -> str:
    """A digest of token-id sequences (prompts, rows): equal iff every sequence is equal, in order."""
    return hashlib.sha256(json.dumps([list(map(int, r)) for r in rows]).encode()).hexdigest()[:16]


def test_prompts(run: Path, tok, chat, per_domain: int, max_prompt: int = 384) -> list[tuple[str, list[int]]]:
    """The first `per_domain` test prompts of every domain, formatted as the bundle serves them."""
    from specdraft.data.chat import row_messages
    from specdraft.data.prompts import fit_prompt, load_prompt_sets
    from specdraft.decoding.bundle.chat import format_prompt

    taken: dict[str, int] = {}
    out = []
    for row in load_prompt_sets(run / "prompts")["test"]:
        if taken.get(row["domain"], 0) < per_domain:
            taken[row["domain"]] = taken.get(row["domain"], 0) + 1
            ids, _ = fit_prompt(format_prompt(tok, row_messages(row), chat), max_prompt, "truncate", row["id"])
            out.append((row["domain"], list(ids)))
    if not out:
        raise InputError(f"{run}/prompts has no test prompts")
    return out


@torch.inference_mode()
def decode_counts(target, drafter, prompts, ks: list[int], tokens: int, eos, reference: list[list[int]] | None = None
                  ) -> dict:
    """{K: {"tokens", "calls", "drafts", "accepted", "outputs"[, "equal"]}}, each a list over prompts: the
    decoder's own fixed-K chain (decode_batch, as evaluate and `specdraft generate` call it), greedy. tokens / calls:
    generated tokens and target forwards (the decoder's acceptance length); drafts / accepted: the rounds that
    drafted and the drafts accepted (vLLM's definition, 1 + accepted / drafts, taken on our rounds); equal: whether
    the output is `reference`'s (the target's plain greedy output), where one is given."""
    from specdraft.decoding.generate import Plan, decode_batch
    from specdraft.decoding.policies.spec import PolicySpec, build_policy
    from specdraft.decoding.rounds.sampling import SamplingConfig

    out = {}
    for k in ks:
        spec = PolicySpec("fixed", k=k)
        plan = Plan(f"K={k}", drafter, lambda spec=spec: build_policy(spec))
        rows = {"tokens": [], "calls": [], "drafts": [], "accepted": [], "outputs": []}
        for _, ids in prompts:
            res = decode_batch(target, [ids], tokens, plan, SamplingConfig(0.0), eos, seed=0)[0]
            rows["tokens"].append(res.metrics.n_generated)
            rows["calls"].append(res.metrics.n_target)
            rows["drafts"].append(sum(d > 0 for d in res.metrics.drafted))
            rows["accepted"].append(sum(res.metrics.accepted))
            rows["outputs"].append(res.tokens)
        if reference is not None:
            rows["equal"] = [a == b for a, b in zip(rows["outputs"], reference)]
        out[k] = rows
    if reference is not None and dtype_of(target) != "float32":
        judge_divergences(target, prompts, out, reference)
    return out


def judge_divergences(target, prompts, by_k: dict, reference: list[list[int]], wide: dict | None = None) -> None:
    """Adds "near_tie" to each K's rows of decode_counts: per prompt None where the output equals `reference`, else
    whether their first differing token is a near-tie of the target (decoding/near_ties.py: below fp32 a K + 1-row
    verify and a one-token step can round two close logits apart; a wrong draft accepted is no near-tie)."""
    from specdraft.decoding.near_ties import classify_all

    wide = {} if wide is None else wide
    for k, rows in by_k.items():
        judged = classify_all(target, [ids for _, ids in prompts], rows["outputs"], reference, k + 1, 1, wide)
        rows["near_tie"] = [None if d is None else bool(d.near_tie) for d in judged]


def vllm_tally(head: list[int], tokens: list[int], drafted: list[int], accepted: list[int], max_tokens: int,
               eos) -> dict:
    """A decode's rounds counted the way vLLM counts a request: its steps run until the output holds an end-of-turn
    token or `max_tokens` tokens, and a step's drafts count whole, even those accepted past the cap or past an
    end-of-turn token (vLLM verifies first and stops after). head: the tokens before the first round (vLLM's
    prefill token, where our decode started after it); tokens, drafted, accepted: the decode's output and its rounds,
    decoded with no end-of-turn stop and room for a whole last round. -> {"drafts", "accepted", "output"}."""
    eos = set(eos or ())
    out, drafts, taken, at = list(head), 0, 0, 0
    for d, a in zip(drafted, accepted):
        if len(out) >= max_tokens or eos & set(out):
            break
        out += tokens[at:at + a + 1]
        at += a + 1
        drafts += d > 0
        taken += a
    stop = next((i + 1 for i, t in enumerate(out) if t in eos), len(out))
    return {"drafts": drafts, "accepted": taken, "output": out[:min(stop, max_tokens)]}


def vllm_counts(target, drafter, prompts, k: int, tokens: int, eos, first: list[int]) -> dict:
    """{"drafts", "accepted", "outputs"}, each a list over prompts: specdraft's decoder at fixed K, greedy, on
    vLLM's rounds and counted as vLLM counts them (`vllm_tally`), so its acceptance length and vLLM's compare
    round for round. vLLM's prefill emits the first token and drafts nothing; a drafter LM's first round in our
    decoder drafts from the prompt, so it starts after that token (`first`: the target's greedy first token of each
    prompt); an EAGLE drafter's first round drafts nothing already (no target features yet), so it starts at the
    prompt. No end-of-turn stop and K more tokens of room: the drafter drafts past an end-of-turn token and the
    last round past the cap, as vLLM's do."""
    from specdraft.decoding.generate import Plan, decode_batch
    from specdraft.decoding.policies.spec import PolicySpec, build_policy
    from specdraft.decoding.rounds.sampling import SamplingConfig
    from specdraft.decoding.speculators.eagle_model import EagleDrafter

    spec = PolicySpec("fixed", k=k)
    plan = Plan(f"K={k}", drafter, lambda: build_policy(spec))
    rows = {"drafts": [], "accepted": [], "outputs": []}
    for (_, ids), y0 in zip(prompts, first, strict=True):
        head = [] if isinstance(drafter, EagleDrafter) else [y0]
        res = decode_batch(target, [list(ids) + head], tokens + k, plan, SamplingConfig(0.0), None, seed=0)[0]
        tally = vllm_tally(head, res.tokens, res.metrics.drafted, res.metrics.accepted, tokens, eos)
        rows["drafts"].append(tally["drafts"])
        rows["accepted"].append(tally["accepted"])
        rows["outputs"].append(tally["output"])
    return rows


@torch.inference_mode()
def greedy_reference(target, prompts, tokens: int, eos) -> list[list[int]]:
    """The target's plain greedy output (one token per forward) of every prompt."""
    from specdraft.decoding.autoregressive import generate_autoregressive
    from specdraft.decoding.rounds.sampling import SamplingConfig

    return [generate_autoregressive(target, ids, tokens, SamplingConfig(0.0), eos).tokens for _, ids in prompts]


def pooled_mal(tokens, calls, seed: int = 0, n_boot: int = 2000, level: float = 0.9) -> tuple[float, float, float]:
    """sum tokens / sum target forwards over prompts, with a percentile-bootstrap interval over prompts (the
    decoder's own pooled ratio, decoding/timing.py)."""
    spread = bootstrap_ratio(list(zip(tokens, calls)), seed, n_boot, level)
    return spread.median, spread.lo, spread.hi


def paired_ratio(a: dict, b: dict, seed: int = 0, n_boot: int = 2000, level: float = 0.9) -> tuple[float, float, float]:
    """MAL(a) / MAL(b), both pooled over the same prompts ({"tokens", "calls"} per prompt), with a bootstrap
    interval resampling prompts jointly (decoding.timing.bootstrap_rate_ratio)."""
    items = list(zip(a["tokens"], a["calls"], b["tokens"], b["calls"]))
    spread = bootstrap_rate_ratio(items, seed, n_boot, level)
    return spread.median, spread.lo, spread.hi


def paired_difference(a: dict, b: dict, seed: int = 0, n_boot: int = 2000, level: float = 0.9) -> tuple[float, float, float]:
    """MAL(a) - MAL(b), both pooled over the same prompts, with a bootstrap interval resampling prompts jointly
    (the same resamples `paired_ratio` draws at the same seed)."""
    ta, ca = np.asarray(a["tokens"], float), np.asarray(a["calls"], float)
    tb, cb = np.asarray(b["tokens"], float), np.asarray(b["calls"], float)
    point = float(ta.sum() / ca.sum() - tb.sum() / cb.sum())
    idx = np.random.default_rng(seed).integers(0, len(ta), size=(n_boot, len(ta)))
    stats = ta[idx].sum(1) / ca[idx].sum(1) - tb[idx].sum(1) / cb[idx].sum(1)
    tail = (1 - level) / 2
    return point, float(np.quantile(stats, tail)), float(np.quantile(stats, 1 - tail))
