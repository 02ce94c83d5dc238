"""bench_batch_decoder.py part (c), the cost of deciding at batch 1.

SpecDec++ and the batch-aware rule are made to take fixed K = 4's decisions (an h that never fires; a table where
every draft pays), so that their rounds equal fixed K's and the time beyond them is the head's forward and the
rule's own work per round; the methods take turns prompt by prompt.
"""
from __future__ import annotations

import statistics

import torch

from specdraft.decoding.costs.model import CostTable
from specdraft.decoding.policies.batch_aware import LockstepBatchAwareSpecDec, Prior
from specdraft.decoding.policies.stopping import FixedK, SpecDecPP
from specdraft.decoding.rounds.sampling import SamplingConfig
from benchmarks.harness.models import ours
from benchmarks.harness.timing import interleave


def deciding_cost_table(args, target, drafter, head, prompts, k: int = 4) -> list[str]:
    """(c) The cost of deciding at batch 1: rules made to take fixed K's decisions (SpecDec++ at an h that
    never fires; the batch-aware rule over a table where every draft pays and a prior of 1), so that every
    method drafts and verifies exactly what FixedK(k) does, round for round; what their rounds cost beyond
    fixed K's is the head's forward on each draft and the rule's own work."""
    n, dev, greedy = args.max_new_tokens, args.device, SamplingConfig(0.0)
    widths = tuple(range(1, k + 2))
    always = CostTable(batch_sizes=(1, 4096), widths=widths, verify=((1.0,) * len(widths),) * 2, draft=(1e-6,) * 2,
                       catchup=(1e-6,) * 2, device="forced", torch_version=torch.__version__, compile=args.compile,
                       target_id="-", drafter_id="-")
    policies = {f"K={k}": lambda: FixedK(k), "SpecDec++ (h = 1 - 1e-9)": lambda: SpecDecPP(head, 1 - 1e-9, k_max=k),
                "batch-aware lockstep": lambda: LockstepBatchAwareSpecDec(head, always, Prior((1.0,)), k)}
    calls = {name: (lambda p, seed, make=make: ours(target, [p], n, greedy, seed, args.compiler, drafter, make(),
                                                   eos=args.eos)[0])
             for name, make in policies.items()}
    unit_times, out = interleave(calls, prompts, args.runs, dev)  # prompt by prompt
    times = {name: [sum(ts) for ts in per_pass] for name, per_pass in unit_times.items()}
    rounds = {name: [r.metrics.drafted for r in res[-1]] for name, res in out.items()}
    same = all(rounds[name] == rounds[f"K={k}"] for name in rounds)
    n_rounds = sum(len(d) for d in rounds[f"K={k}"])
    base = statistics.median(times[f"K={k}"])
    lines = [f"#### (c) Cost of deciding: batch 1, {len(prompts)} prompts x {n} tokens{' (up to EOS)' if args.eos is not None else ''}, every method fixed K = {k}'s "
             f"rounds ({'identical, checked' if same else 'NOT identical: the rows below do not isolate the rule'}), "
             f"median of {args.runs} runs interleaved prompt by prompt (spread: min-max)", "",
             "| method | ms per round | over fixed K |", "| --- | ---: | ---: |"]
    for name, ts in times.items():
        per = [t / n_rounds * 1e3 for t in ts]
        lines.append(f"| {name} | {statistics.median(per):.3f} ({min(per):.3f}-{max(per):.3f}) | "
                     f"{statistics.median(ts) / base - 1:+.1%} |")
        print(lines[-1], flush=True)
    return lines + [""]

