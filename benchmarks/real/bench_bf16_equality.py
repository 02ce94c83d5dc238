"""Lossless in bf16 on held-out prompts, counted: greedy speculative decoding at fixed K against greedy AR, both in
bf16, on a real target and drafter; how many prompts decode equal, and whether every divergence is a numerical
near-tie of the target (decoding/near_ties.py).

In bf16 the target's own greedy output depends on the step's shape (a (K + 1)-row verify rounds differently from a
one-row step). At batch 1 the batched decoder runs every bf16 target forward on a CPU at least `verify_floor` (4)
positions wide, where the CPU's kernels compute every width alike, so that equality holds by construction (in a batch
the floor counts rows: 1 position a row from batch 4 on); this benchmark checks
that premise on the machine (the target's width classes: which widths compute a position's logits bit for bit
alike, `decoding.near_ties.width_classes`) and the consequence (the goal: equal on at least 95% of prompts at 64
tokens), and wherever a decode still differs, whether the first differing token is a near-tie: its fp32 gap to the
top within twice the rounding bf16 puts on that row's logits. A divergence that fails that test is a decoder bug.
With --floor-cost N it also times what the floor costs: greedy AR decodes of the first 4 prompts with the floor and
without it (one position a step), interleaved prompt by prompt over N passes, as tokens/s and their paired ratio.
Each prompt is decoded alone (B = 1) and, with --batch B, also in batches of B (every row against its AR alone).
Counted, not timed: the figures do not depend on the box's load. Writes its section of benchmarks/real/RESULTS.md.

    python benchmarks/real/bench_bf16_equality.py --target RUN/target --drafter RUN/drafters/sibling \
        --prompt-set RUN/prompts/sets --split ood --n-prompts 20
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from specdraft.decoding.batched import generate_batch  # noqa: E402
import specdraft.decoding.batched as batched  # noqa: E402
from specdraft.decoding.bundle.loading import load_drafter  # noqa: E402
from specdraft.decoding.rounds.packed_linear import is_packed  # noqa: E402
from specdraft.decoding.speculators.eagle_model import is_eagle_dir, load_eagle, target_dir_hash  # noqa: E402
from specdraft.decoding.near_ties import classify_all, width_classes  # noqa: E402
from specdraft.decoding.policies.stopping import FixedK  # noqa: E402
from specdraft.decoding.rounds.shapes import verify_floor  # noqa: E402
from benchmarks.harness.machine import box_load, cpu_flags, machine  # noqa: E402
from benchmarks.harness.models import load, load_prompts  # noqa: E402
from benchmarks.harness.publish import add_section_flags, publish_for  # noqa: E402
from benchmarks.harness.tables import table  # noqa: E402
from benchmarks.harness.timing import fastest_total, interleave  # noqa: E402
from specdraft.decoding.timing import bootstrap_rate_ratio  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True, help="the target's model directory (e.g. a run's target/)")
    ap.add_argument("--drafter", required=True, help="the drafter's model directory, or an EAGLE drafter's (a bundle's "
                                                     "eagle/NAME: it drafts a chain from the target's features)")
    ap.add_argument("--prompt-set", required=True, help="a run's prompts/sets directory")
    ap.add_argument("--split", default="ood", help="which set (held-out: ood; or test, perturbed)")
    ap.add_argument("--domain", help="only this domain's prompts (default: every domain of the set)")
    ap.add_argument("--n-prompts", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=64, help="new tokens a decode (no end-of-turn stop: every decode "
                                                           "runs the whole length, so every position is compared)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1, help="also decode in batches of this many (1: alone only)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layout", choices=("packed", "plain"), default="packed",
                    help="the bf16 linears' weight layout: packed into oneDNN's (on a CPU with bf16 units: "
                         "decoding/rounds/packed_linear.py) or plain: torch's own")
    ap.add_argument("--draft-weights", choices=("dtype", "int8"), default="dtype",
                    help="the drafter's weights: bf16 as --layout says, or int8 as the stages and the decoder load a "
                         "drafter where decoding.draft_weights: auto picks it (decoding.bundle.loading.load_drafter)")
    ap.add_argument("--floor-cost", type=int, default=0, metavar="PASSES",
                    help="also time AR with and without the verify floor over this many interleaved passes (0: not)")
    add_section_flags(ap)
    return ap


def main(argv=None) -> str:
    ap = build_parser()
    args = ap.parse_args(argv)
    eagle = is_eagle_dir(args.drafter)
    if eagle and args.draft_weights == "int8":
        ap.error("an EAGLE drafter runs in the target's dtype: leave out --draft-weights int8")
    torch.set_num_threads(args.threads)
    target = load(args.target, "cpu", torch.bfloat16, packed=args.layout == "packed")
    if eagle:  # reads the target's features and shares its embedding and LM head; refuses another target's drafter
        drafter = load_eagle(args.drafter, target, target_dir_hash(args.target), "cpu")
    else:
        drafter = (load_drafter(args.drafter, "bfloat16", "cpu", "int8") if args.draft_weights == "int8"
                   else load(args.drafter, "cpu", torch.bfloat16, packed=args.layout == "packed"))
    wide = {}  # the near-tie judge's fp32 copy of the target (its bf16 weights, widened), made when needed
    prompts = load_prompts(args, target.config.vocab_size)
    domain = args.domain or "every domain"

    ar = [generate_batch(target, [p], args.tokens)[0].tokens for p in prompts]  # the reference: AR alone
    # the premise, on this machine: which widths compute a position alike (the first prompt's AR, its last 16 tokens)
    classes = width_classes(target, prompts[0] + ar[0], range(1, args.k + 2), positions=min(16, args.tokens))
    runs = {"B = 1": [generate_batch(target, [p], args.tokens, drafter=drafter, policy=FixedK(args.k))[0]
                      for p in prompts]}
    if args.batch > 1:
        runs[f"B = {args.batch}"] = [r for b in range(0, len(prompts), args.batch)
                                     for r in generate_batch(target, prompts[b:b + args.batch], args.tokens,
                                                             drafter=drafter, policy=FixedK(args.k))]
    rows, found, ok = [], [], True
    for name, results in runs.items():
        width = 1 if name == "B = 1" else args.batch
        judged = classify_all(target, prompts, [r.tokens for r in results], ar, args.k + 1, width, wide)
        diverged = [(i, d) for i, d in enumerate(judged) if d is not None]
        near = sum(d.near_tie for _, d in diverged)
        equal = len(prompts) - len(diverged)
        mat = sum(r.metrics.n_generated for r in results) / sum(r.metrics.n_target for r in results)
        rows.append([name, len(prompts), f"{equal} ({equal / len(prompts):.0%})", near, len(diverged) - near,
                     f"{mat:.2f}"])
        found += [[name, domain, i, d.position, d.speculative, d.autoregressive, f"{d.gap:.3f}", f"{d.delta:.3f}",
                   "yes" if d.near_tie else "**no**"] for i, d in diverged]
        ok &= equal >= 0.95 * len(prompts) and near == len(diverged)
    layout = "linears packed" if is_packed(target) else "torch's weight layout"
    target_name = "/".join(Path(args.target).resolve().parts[-2:])
    drafter_name = "/".join(Path(args.drafter).resolve().parts[-2:])
    lines = [f"## bf16 greedy: fixed K = {args.k} against AR on {args.split} prompts ({machine('cpu', 'bfloat16')})", "",
             f"`python benchmarks/real/bench_bf16_equality.py --target {target_name} --drafter {drafter_name} "
             f"--prompt-set {'/'.join(Path(args.prompt_set).resolve().parts[-3:])} --split {args.split}{f' --domain {args.domain}' if args.domain else ''} --n-prompts {args.n_prompts} --tokens {args.tokens} --k {args.k} --batch {args.batch} --layout {args.layout}{' --draft-weights int8' if args.draft_weights == 'int8' else ''}`"
             f": {len(prompts)} prompts ({domain}) x {args.tokens} tokens, greedy, "
             f"bf16 ({layout}{'; the drafter int8' if args.draft_weights == 'int8' else ''}{'; an EAGLE drafter, chain' if eagle else ''}), no end-of-turn stop; every speculative decode against the target's AR decode alone; "
             f"{args.threads} thread(s), {platform.machine()}, bf16 units: "
             f"{', '.join(sorted(cpu_flags() & {'avx512_bf16', 'amx_bf16'})) or 'none'}; {box_load()}. Counted: the load does not move it.", ""]
    lines += table(["decode", "prompts", "equal to AR", "near-tie divergences", "other divergences",
                    "MAT (tokens a target forward)"], rows, "lrrrrr")
    if found:
        lines += ["", "Each divergence at its first differing token (gap: the fp32 top logit minus the lower of the "
                  "two chosen tokens'; delta: bf16's largest rounding of that row's logits over the decode's shapes; "
                  "a near-tie when gap <= 2 delta):", ""]
        lines += table(["decode", "domain", "prompt", "token", "speculative", "AR", "gap", "delta", "near-tie"],
                       found, "llrrrrrrl")
    floor = verify_floor("bfloat16", "cpu")
    lines += ["", f"Width classes of the target here (each width -> the narrowest computing a position's logits alike, "
              f"bit for bit): {', '.join(f'{w}: {c}' for w, c in classes.items())}; the decoder's floor at batch 1: {floor} positions "
              f"({'every width from it alike' if len({classes[w] for w in classes if w >= floor}) == 1 else '**widths from it differ**'})."]
    if args.floor_cost:
        lines += floor_cost(target, prompts[:4], args.tokens, args.floor_cost)
    positions = [int(f[3]) for f in found]
    lines += ["", f"Goal (equal on at least 95% of prompts, every divergence a near-tie): {'met' if ok else 'not met'}"
              + (f"; divergences at token {statistics.median(positions):.0f} (median) of {args.tokens}"
                 if positions else "") + "."]
    text = "\n".join(lines) + "\n"
    publish_for(text, not args.no_append, Path(__file__), args.section, args.page)
    return text


def floor_cost(target, prompts: list[list[int]], tokens: int, passes: int) -> list[str]:
    """AR decodes with the floor (the decoder as it runs) and without it, interleaved prompt by prompt: tokens/s of
    each (the fastest pass per prompt, summed) and the ratio with its bootstrap interval over (pass, prompt) pairs."""
    floor = batched.model_floor

    def decode(unit, seed, padded):
        batched.model_floor = floor if padded else (lambda model, rows=1: 1)
        try:
            return generate_batch(target, [unit], tokens)[0].tokens
        finally:
            batched.model_floor = floor
    times, out = interleave({"floor": lambda u, s: decode(u, s, True), "one": lambda u, s: decode(u, s, False)},
                            prompts, passes, "cpu")
    rate = {name: len(prompts) * tokens / fastest_total(ts) for name, ts in times.items()}
    pairs = [(tokens, a, tokens, b) for pa, pb in zip(times["floor"], times["one"]) for a, b in zip(pa, pb)]
    ratio = bootstrap_rate_ratio(pairs)
    same = sum(a == b for a, b in zip(out["floor"][0], out["one"][0]))
    return ["", f"The floor's cost, greedy AR at batch 1 ({len(prompts)} prompts x {tokens} tokens, {passes} interleaved "
            f"passes, process CPU time): {rate['floor']:.2f} tokens/s with the floor, {rate['one']:.2f} one position a step; "
            f"floor / one {ratio.median:.3f} [{ratio.lo:.3f}, {ratio.hi:.3f}] (90% bootstrap over pass x prompt); "
            f"the two AR outputs equal on {same} of {len(prompts)} prompts."]


if __name__ == "__main__":
    main()
