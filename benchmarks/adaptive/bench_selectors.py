"""Per-round overhead of each arm selector (one select() + one update()), in microseconds.

For scale it also times one single-token forward of a MetaSD-sized drafter (2-layer LLaMA, hidden 768,
vocab 32000, random weights) on the same CPU, the cost a selector round is added to.

    python benchmarks/adaptive/bench_selectors.py [--rounds 20000] [--repeats 5] [--no-reference] [--no-append]

Prints a markdown table and makes it this script's section of benchmarks/adaptive/RESULTS.md, dated.
"""
from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import random
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from specdraft.decoding.bandits.selectors import SELECTORS, make_selector  # noqa: E402
from benchmarks.harness.publish import publish  # noqa: E402

MAX_LEN = 4  # L for the BanditSpec selectors
ARMS = range(2, 9)


def params_for(name: str) -> dict:
    return {"ucbspec": {"max_len": MAX_LEN}, "exp3spec": {"max_len": MAX_LEN}, "oracle": {"best_arm": 0}}.get(name, {})


def per_round_us(name: str, n_arms: int, rounds: int, repeats: int) -> float:
    """Best over repeats (least disturbed, as timeit advises) of the mean select() + update() time per round."""
    rng = random.Random(0)
    bounded = name in ("ucbspec", "exp3spec")
    rewards = [rng.randint(1, MAX_LEN + 1) if bounded else rng.random() for _ in range(rounds)]
    times = []
    for rep in range(repeats):
        sel = make_selector(name, n_arms, seed=rep, **params_for(name))
        start = time.perf_counter_ns()
        for r in rewards:
            arm = sel.select()
            sel.update(arm, r)
        times.append((time.perf_counter_ns() - start) / rounds / 1e3)
    return min(times)


def reference_forward_ms(repeats: int = 20) -> float:
    """Median time of one cached single-token forward of a 68M-parameter drafter on CPU."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    torch.set_num_threads(1)  # the box is shared: one thread is the steadiest measurement
    cfg = LlamaConfig(
        vocab_size=32000, hidden_size=768, intermediate_size=3072, num_hidden_layers=2,
        num_attention_heads=12, num_key_value_heads=12,
    )
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 32000, (1, 128))
    times = []
    with torch.inference_mode():
        out = model(ids, use_cache=True)
        past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        for _ in range(repeats):
            start = time.perf_counter()
            out = model(nxt, past_key_values=past, use_cache=True)
            times.append((time.perf_counter() - start) * 1e3)
            past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-reference", action="store_true", help="skip the drafter-forward reference")
    ap.add_argument("--no-append", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args()

    lines = [
        f"## Selector overhead per round ({datetime.date.today().isoformat()}, 2-core CPU box, shared)",
        "",
        f"`python benchmarks/adaptive/bench_selectors.py`: mean microseconds per select() + update(), best of "
        f"{args.repeats} runs of {args.rounds} rounds; pure Python, L = {MAX_LEN} for the BanditSpec selectors. "
        f"Load average at start: {os.getloadavg()[0]:.1f} (other jobs share the box; expect noise).",
        "",
        "| selector | " + " | ".join(f"K={k}" for k in ARMS) + " |",
        "| --- | " + " | ".join("---:" for _ in ARMS) + " |",
    ]
    worst = 0.0
    for name in SELECTORS:
        row = [per_round_us(name, k, args.rounds, args.repeats) for k in ARMS]
        worst = max(worst, *row)
        lines.append(f"| {name} | " + " | ".join(f"{us:.2f}" for us in row) + " |")
    lines.append("")
    if not args.no_reference:
        fwd_ms = reference_forward_ms()
        lines.append(
            f"For scale: one cached single-token forward of a MetaSD-sized drafter (2-layer LLaMA, hidden 768, "
            f"vocab 32000, 68M parameters, fp32, one torch CPU thread) takes {fwd_ms:.2f} ms here, "
            f"so the slowest selector round ({worst:.1f} us) is {100 * worst / (fwd_ms * 1e3):.3f}% of one draft-token forward."
        )
        lines.append("")
    text = "\n".join(lines)
    publish(text, write=not args.no_append)


if __name__ == "__main__":
    main()
