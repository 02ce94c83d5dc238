"""Per-round cost of the bandit in multi-drafter speculation, next to one draft forward.

Bandit overhead per round = select() + the round's reward (block divergence needs a (k, V) TV
computation; block efficiency and accepted length are arithmetic) + update(). It is compared with one
cached single-token forward of (a) the tiny random test drafter and (b) a MetaSD-sized drafter
(2-layer LLaMA, hidden 768, vocab 32000, random weights). A short end-to-end run also reports the
switching catch-up time against the total draft time.

    python benchmarks/adaptive/bench_bandits.py [--rounds 2000] [--no-append]

Prints a markdown table and makes it this script's section of benchmarks/adaptive/RESULTS.md, dated.
"""
from __future__ import annotations

import argparse
import datetime
import pathlib
import platform
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from specdraft.decoding.rounds import kv  # noqa: E402
from specdraft.decoding.speculators.multi_drafter import Arm, MultiDrafterSpeculator  # noqa: E402
from specdraft.decoding.rounds.sampling import SamplingConfig, probs  # noqa: E402
from specdraft.decoding.bandits.selectors import make_selector  # noqa: E402
from specdraft.decoding.speculative import generate_speculative  # noqa: E402
from specdraft.decoding.speculators.drafter import DrafterSpeculator  # noqa: E402
from specdraft.decoding.policies.stopping import FixedK  # noqa: E402
from benchmarks.harness.publish import publish  # noqa: E402

N_MAX = 5
N_ARMS = 4


def llama(seed: int, vocab: int, hidden: int, layers: int, heads: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=2048, initializer_range=0.2,
    )
    return LlamaForCausalLM(cfg).eval()


def bandit_round_us(selector: str, reward: str, vocab: int, rounds: int) -> float:
    """Mean microseconds of select + reward + update, with random p (k+1, V) and q (k, V)."""
    gen = torch.Generator().manual_seed(0)
    sampling = SamplingConfig(temperature=1.0)
    p = probs(torch.randn(N_MAX + 1, vocab, generator=gen), sampling)
    q = probs(torch.randn(N_MAX, vocab, generator=gen), sampling)
    params = {"max_len": N_MAX} if selector in ("ucbspec", "exp3spec") else {}
    spec = MultiDrafterSpeculator(
        [Arm(str(i), None) for i in range(N_ARMS)], make_selector(selector, N_ARMS, **params), reward, N_MAX
    )
    sel = spec.selector
    best = float("inf")
    for _ in range(3):
        sel.reset()
        t0 = time.perf_counter()
        for r in range(rounds):
            arm = sel.select()
            n = r % (N_MAX + 1)
            sel.update(arm, spec.round_reward(p, q, N_MAX, n))
        best = min(best, (time.perf_counter() - t0) / rounds * 1e6)
    return best


@torch.inference_mode()
def draft_forward_us(model: torch.nn.Module, context: int, repeats: int) -> float:
    """Mean microseconds of one cached single-token forward after a `context`-token prefill."""
    cache = kv.new_cache()
    kv.forward(model, cache, list(range(context)))
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        kv.forward(model, cache, [i % 50])
        times.append(time.perf_counter() - t0)
        kv.crop(cache, context)
    times.sort()
    return times[len(times) // 2] * 1e6


def switching(target, drafters, n_new: int = 96):
    arms = [Arm(f"d{i}", DrafterSpeculator(d, FixedK(4))) for i, d in enumerate(drafters)]
    prompt = list(range(1, 33))
    rows = []
    for name in ("fixed", "random", "ucb"):
        spec = MultiDrafterSpeculator(arms, make_selector(name, len(arms), seed=0), "bd", n_max=4)
        out = generate_speculative(target, spec, prompt, n_new, SamplingConfig(temperature=0.0))
        rows.append((name, out.metrics, spec))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)

    tiny = llama(0, vocab=96, hidden=32, layers=2, heads=4)
    metasd = llama(1, vocab=32000, hidden=768, layers=2, heads=12)
    fwd_tiny = draft_forward_us(tiny, 64, 200)
    fwd_metasd = draft_forward_us(metasd, 64, 30)

    lines = [
        f"## Multi-drafter bandit overhead per round ({datetime.date.today()}, 2-core CPU box, shared, "
        f"torch {torch.__version__}, 1 thread, {platform.machine()})",
        "",
        f"One round = select + reward + update, {N_ARMS} arms, {N_MAX} drafted positions; draft forward = one cached"
        f" single-token forward after a 64-token context: tiny test drafter {fwd_tiny:.0f} us, MetaSD-sized"
        f" drafter (2 layers, hidden 768, vocab 32000) {fwd_metasd:.0f} us.",
        "",
        "| selector | reward | V | us / round | vs tiny fwd | vs MetaSD-sized fwd |",
        "|---|---|---|---|---|---|",
    ]
    for selector, reward in (("ucb", "bd"), ("ucb", "be"), ("exp3", "bd"), ("sh", "bd"), ("ucbspec", "accepted"), ("exp3spec", "accepted")):
        for vocab in ((96, 32000) if reward == "bd" else (96,)):
            us = bandit_round_us(selector, reward, vocab, args.rounds if vocab < 1000 else args.rounds // 4)
            lines.append(
                f"| {selector} | {reward} | {vocab} | {us:.1f} | {us / fwd_tiny:.3f}x | {us / fwd_metasd:.3f}x |"
            )

    target = llama(2, vocab=96, hidden=64, layers=2, heads=4)
    drafters = [llama(10 + i, vocab=96, hidden=32, layers=1, heads=4) for i in range(3)]
    lines += [
        "",
        "Switching cost, 3 random 1-layer drafters, tiny 2-layer target, 32-token prompt, 96 new tokens, greedy:",
        "",
        "| selector | rounds | switch forwards | switch s | draft s | switch / draft |",
        "|---|---|---|---|---|---|",
    ]
    for name, m, spec in switching(target, drafters):
        lines.append(
            f"| {name} | {m.n_rounds} | {spec.switch_forwards} | {spec.switch_seconds:.4f} | {m.time_draft:.4f} |"
            f" {spec.switch_seconds / m.time_draft:.1%} |"
        )
    table = "\n".join(lines) + "\n"
    publish(table, write=not args.no_append)


if __name__ == "__main__":
    main()
