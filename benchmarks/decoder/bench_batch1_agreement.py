"""Why bench_batch_decoder's parts (a) and (b) disagree at batch 1: the same decodes, timed both ways, in one run.

Part (a) times each prompt alone, `runs` passes in a row, and sums the per-prompt medians; part (b) times whole
passes over every prompt and takes the median pass; and the two parts run minutes apart, (b) with eleven methods
in its rotation, (a) with three of ours and two of transformers'. This script decodes batch-1 AR and fixed
K = 4 (our batched decoder, greedy, `--compile` mode) on the same prompts and reports both statistics from one
block of passes, in three blocks one after another: AR and K = 4 alone, the same two among part (b)'s other
fixed-K and SpecDec++ methods, and alone again. If the statistic or the company explained the gap, the columns
or the middle block would move together; if the blocks move apart with neither, it is the box's load phases,
and only ratios taken within one block (AR / K = 4) are comparable across parts.

    python benchmarks/decoder/bench_batch1_agreement.py --target runs/demo/target --drafter runs/demo/drafters/math \
        --head runs/demo/heads/math/greedy/D4_w3 --prompt-set runs/demo/prompts/sets --domain math --eos \
        --compile default
"""
from __future__ import annotations

import argparse
import datetime
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness
from specdraft.decoding.compilation import StepCompiler, fail_past_recompile_limit  # noqa: E402
from specdraft.decoding.policies.stopping import FixedK, LockstepSpecDecPP, SpecDecPP  # noqa: E402
from specdraft.decoding.rounds.sampling import SamplingConfig  # noqa: E402
from specdraft.decoding.timing import timed_call  # noqa: E402
from benchmarks.harness.machine import machine  # noqa: E402
from benchmarks.harness.models import add_pair_flags, load, load_prompts, ours  # noqa: E402
from benchmarks.harness.publish import publish  # noqa: E402

CORE = ("AR", "K=4")


def block(decode, methods: dict, n_prompts: int, runs: int, device: str) -> dict:
    """One block: a warm-up decode of every (method, prompt), then part (a)'s shape (per prompt, `runs` passes
    over the methods in a row) and part (b)'s (`runs` passes, each over every prompt per method). Returns
    {method: (a-shape seconds, b-shape pass seconds list, tokens)} for the CORE methods."""
    for i in range(n_prompts):
        for make in methods.values():
            decode(i, make)
    a_shape = {m: 0.0 for m in CORE}
    tokens = {m: 0 for m in CORE}
    for i in range(n_prompts):
        times = {m: [] for m in methods}
        for _ in range(runs):
            for m, make in methods.items():
                out, t = timed_call(lambda: decode(i, make), device)
                times[m].append(t.time)
                if m in CORE and len(times[m]) == 1:
                    tokens[m] += out[0].metrics.n_generated
        for m in CORE:
            a_shape[m] += statistics.median(times[m])
    passes = {m: [] for m in methods}
    for _ in range(runs):
        for m, make in methods.items():
            passes[m].append(sum(timed_call(lambda i=i: decode(i, make), device)[1].time for i in range(n_prompts)))
    return {m: (a_shape[m], passes[m], tokens[m]) for m in CORE}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_pair_flags(parser, required=True)
    parser.add_argument("--head", help="acceptance head dir: SpecDec++ (h = 0.7, K_max = 8) joins the middle block")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--eos", action="store_true", help="stop each row at the target's EOS, as served")
    parser.add_argument("--compile", default="default", choices=["none", "default"])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args(argv)
    fail_past_recompile_limit()  # a shape run eagerly past dynamo's limit would be timed as compiled
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target, drafter = load(args.target, args.device, torch.float32), load(args.drafter, args.device, torch.float32)
    eos = getattr(target.generation_config, "eos_token_id", None) if args.eos else None
    prompts = load_prompts(args, target.config.vocab_size)[:args.n_prompts]
    compiler, greedy = StepCompiler(args.compile), SamplingConfig(0.0)

    def decode(i, make):
        return ours(target, [prompts[i]], args.max_new_tokens, greedy, i, compiler,
                    drafter if make else None, make() if make else None, eos=eos)

    core = {"AR": None, "K=4": lambda: FixedK(4)}
    others = {f"K={k}": (lambda k=k: FixedK(k)) for k in (1, 2, 8)}
    if args.head:
        from specdraft.decoding.policies.acceptance_head import load_head

        head = load_head(args.head, expected_hidden_size=drafter.config.hidden_size)[0].to(args.device)
        others.update({"SpecDec++": lambda: SpecDecPP(head, 0.7, 8), "SpecDec++ lockstep": lambda: LockstepSpecDecPP(head, 0.7, 8)})
    start = time.time()
    rows = []
    with torch.inference_mode():
        for name, methods in (("alone", core), (f"among {', '.join(others)}", {**core, **others}), ("alone again", core)):
            res = block(decode, methods, len(prompts), args.runs, args.device)
            rate = {}
            for m, (a, passes, tokens) in res.items():
                b = [tokens / t for t in passes]
                rate[m] = (tokens / a, statistics.median(b))
                rows.append(f"| {name} | {m} | {tokens / a:.0f} | {statistics.median(b):.0f} ({min(b):.0f}-{max(b):.0f}) |")
                print(rows[-1], flush=True)
            rows.append(f"| {name} | K=4 / AR | {rate['K=4'][0] / rate['AR'][0]:.2f} | {rate['K=4'][1] / rate['AR'][1]:.2f} |")
            print(rows[-1], flush=True)
    lines = [f"## Batch 1 measured as parts (a) and (b) measure it ({datetime.date.today()}, {machine()}, compile {args.compile})",
             "", f"`python benchmarks/decoder/bench_batch1_agreement.py {argv_text}`: {len(prompts)} prompts x "
             f"{args.max_new_tokens} tokens{' (up to EOS)' if eos is not None else ''}, greedy, batch 1, {args.runs} passes per "
             "shape; tokens/s from process CPU time. (a)-shape: per prompt, passes in a row, per-prompt medians summed "
             "(bench_batch_decoder part (a)); (b)-shape: whole passes over the prompts, median pass (spread: min-max; "
             "part (b)). The three blocks run one after another.", "",
             "| block | method | (a)-shape tok/s | (b)-shape tok/s |", "| --- | --- | ---: | ---: |", *rows, "",
             f"Run time {time.time() - start:.0f} s.", ""]
    publish("\n".join(lines), write=not args.no_append)
    return 0


if __name__ == "__main__":
    sys.exit(main())
