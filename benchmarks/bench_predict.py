"""`specdraft predict`'s model against measurement: predicted tokens/s (decoding/throughput.py, priced with
the cost table profiled here) beside the batched decoder's measured tokens/s, per batch size, for AR and
fixed K, on the demo-shaped random pair (bench_batch_decoder.demo_shaped_pair).

    python benchmarks/bench_predict.py [--batch-sizes 1,4,16] [--ks 2,4] [--max-new-tokens 48] [--runs 3]
        [--compile none] [--rounds 400] [--seed 0]

The acceptance side is what greedy decoding of these prompts really meets: for each prompt the target's
greedy continuation, and at each of its positions whether the drafter's greedy token (teacher-forced on the
target's prefix) agrees (P_i in {0, 1}, SPEC.md section 2's oracle indicators). The measured side decodes
the first B prompts together with `generate_batch`, the methods interleaved, `--runs` passes after a
warm-up, median process CPU time (`decoding.timing`). Error = predicted / measured - 1.

The prediction simulates static batches as `generate_batch` runs them (rows finish at different rounds,
finished rows cost compute until the eager decoder drops them) and prices the loop's own work per round
and per draft step from the table's calibration (`cost_profile.calibrate_loop`); it leaves out the
prefills and the run's setup, which shows here as error.
"""
from __future__ import annotations

import argparse
import datetime
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from specdraft.decoding.batched import generate_batch  # noqa: E402
from specdraft.decoding.cost_profile import cached_cost_table  # noqa: E402
from specdraft.decoding.policies.stopping import FixedK  # noqa: E402
from specdraft.decoding.throughput import predict_throughput, summarize_acceptance, summary_prior  # noqa: E402
from bench_batch_decoder import demo_shaped_pair  # noqa: E402
from bench_decoder import interleaved  # noqa: E402
from publish import publish  # noqa: E402


@torch.inference_mode()
def greedy_agreement(target, drafter, prompts: list[list[int]], n: int) -> list[torch.Tensor]:
    """Per prompt, (n,) float: 1 where the drafter's greedy token on the target's greedy prefix is the target's."""
    out = []
    for p, r in zip(prompts, generate_batch(target, prompts, n)):
        ids = torch.tensor([p + r.tokens])
        guess = drafter(ids).logits[0, len(p) - 1:-1].argmax(-1)
        out.append((guess == torch.tensor(r.tokens)).double())
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-sizes", default="1,4,16")
    ap.add_argument("--ks", default="2,4")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--prompt-length", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--compile", default="none")
    ap.add_argument("--rounds", type=int, default=40, help="static batches simulated per (method, B)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-append", action="store_true", help="print only; leave RESULTS.md as it is")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    ks = [int(x) for x in args.ks.split(",")]
    target, drafter = demo_shaped_pair(2048, 0.05, "cpu", torch.float32)
    gen = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(3, 2048, (args.prompt_length,), generator=gen).tolist() for _ in range(max(sizes))]
    n = args.max_new_tokens
    agree = greedy_agreement(target, drafter, prompts, n)
    table, path, hit = cached_cost_table(target, drafter, sizes, max(8, max(ks)) + 1, args.compile, seed=args.seed,
                                         calibrate=True)
    lines = [f"## Predicted vs measured throughput ({datetime.date.today()}, {table.device}, torch {torch.__version__})", "",
             f"`python benchmarks/bench_predict.py {' '.join(argv if argv is not None else sys.argv[1:])}`; random "
             f"demo-shaped pair; mean greedy agreement {float(torch.cat(agree).mean()):.3f}; {args.runs} interleaved runs, "
             f"{n} new tokens, prompts of {args.prompt_length}, compile {args.compile}, {args.threads} thread(s); "
             f"cost table {'read from the cache' if hit else 'profiled in this run'}.", "",
             "```", table.render(), "```", "",
             "| method | B | predicted tok/s | measured tok/s | predicted / measured - 1 | predicted MAT | measured MAT |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    worst: dict[str, float] = {}
    for b in sizes:
        batch = prompts[:b]
        # the acceptance of exactly the prompts decoded at this B; static batches of n new tokens, as
        # generate_batch decodes them (rounds = batches simulated)
        summary = summarize_acceptance(agree[:b], agree[:b], k_max=max(ks))
        # sigma = the measured agreement itself: a calibrated head (odds 1)
        pred = predict_throughput(summary, table, [b], summary_prior(summary, 1.0), k_max=max(ks), rounds=args.rounds,
                                  seed=args.seed, new_tokens=n)
        predicted = {r["method"]: r for r in pred["predictions"]}
        fns = {"AR": lambda: generate_batch(target, batch, n, compile=args.compile)}
        for k in ks:
            fns[f"K={k}"] = lambda k=k: generate_batch(target, batch, n, drafter=drafter, policy=FixedK(k),
                                                       compile=args.compile)
        for name, (t, _, out) in interleaved(fns, args.runs, "cpu").items():
            measured = sum(r.metrics.n_generated for r in out) / t
            mat = sum(r.metrics.n_generated for r in out) / sum(r.metrics.n_target for r in out)
            err = predicted[name]["tokens_per_s"] / measured - 1
            worst[name] = max(worst.get(name, 0.0), abs(err))
            lines.append(f"| {name} | {b} | {predicted[name]['tokens_per_s']:.1f} | {measured:.1f} | {err:+.1%} | "
                         f"{predicted[name]['mat']:.2f} | {mat:.2f} |")
    lines += ["", "Worst |error| per method: " + ", ".join(f"{m} {e:.1%}" for m, e in worst.items()) + "."]
    publish("\n".join(lines), write=not args.no_append)
    return 0


if __name__ == "__main__":
    sys.exit(main())
