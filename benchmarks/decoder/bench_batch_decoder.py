"""The batched, static-cache decoder (`decoding.batched.generate_batch`): batch 1 against
transformers, and tokens/s over batch sizes.

    python benchmarks/decoder/bench_batch_decoder.py [--target DIR --drafter DIR [--head DIR --h 0.7]]
        [--batch-sizes 1,2,4,8,16,32] [--max-new-tokens 48] [--runs 3] [--compile none,default]
        [--device cuda --dtype bfloat16] [--shape demo|1b] [--section NAME] [--no-append]

Without --target/--drafter it builds a random pair shaped like the demo pair (16 x 128 target, a
one-layer drafter made of the target's first layer with the deeper layers damped, `harness.models.
early_exit_pair`): its acceptance reflects that construction, not a trained drafter; only the cost
side (forwards, overheads, batching) carries over. `--shape 1b` builds the same construction at a ~1B target's
shape (TinyLlama-1.1B's; bandwidth-bound on a GPU, gpu_check.py). Prompts are random token ids unless --prompt-set.

Three parts, each in its own module here:
(a) batch1.py: batch 1, ours against transformers' generate and assisted generation at equal K, and the decoder's
    efficiency at the measured verify cost.
(b) batch_curve.py: every method's tokens/s over batch sizes, the adaptive ones paired with the best fixed K.
(c) deciding_cost.py: what deciding costs a round at batch 1, on fixed K's rounds.
--compile none,default measures both in one run (one RESULTS.md section); a compiled mode reports its
compile time (the first call of each method) apart from decode time, and runs part (b) at
--compiled-batch-sizes / --compiled-ks only (each batch size and width compiles its own graphs).
"""
from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from specdraft.decoding.compilation import StepCompiler, fail_past_recompile_limit  # noqa: E402
from specdraft.decoding.costs.throughput import ACCEPTANCE_FILE, AcceptanceSummary, summary_prior  # noqa: E402
from specdraft.decoding.policies.batch_aware import Prior  # noqa: E402
from benchmarks.decoder.batch1 import batch1_table  # noqa: E402
from benchmarks.decoder.batch_curve import batch_curve_table  # noqa: E402
from benchmarks.decoder.deciding_cost import deciding_cost_table  # noqa: E402
from benchmarks.harness.machine import machine  # noqa: E402
from benchmarks.harness.models import (DTYPES, RANDOM_SHAPES, add_device_flags, add_pair_flags,  # noqa: E402
                                       demo_shaped_pair, load, load_prompts)
from benchmarks.harness.publish import add_section_flags, publish_for  # noqa: E402


def bench_prior(constant: float | None, head_dir: pathlib.Path, head_config: dict) -> Prior:
    """The batch-aware rules' prior for a train-heads head directory: the drafter's dev acceptance curve from
    the summary train-heads wrote beside it (or `constant` for every position) and the head's w_rej / w_acc."""
    odds = head_config["w_rej"] / head_config.get("w_acc", 1.0)
    if constant is not None:
        return Prior((constant,), odds)
    return summary_prior(AcceptanceSummary.load(head_dir.parent / ACCEPTANCE_FILE), odds)


def untrained_head(hidden: int, device: str) -> torch.nn.Module:
    """A random linear head with sigmoid around 0.8: SpecDec++ rounds of a few tokens that vary by
    context. It predicts nothing; a trained head (--head) is what SpecDec++ is about."""
    torch.manual_seed(1)
    head = torch.nn.Linear(hidden, 1)
    with torch.no_grad():
        head.bias.fill_(1.4)
    return head.to(device)


def check_goal_ks(parser: argparse.ArgumentParser, args) -> None:
    """Part (b) pairs its adaptive methods with the best fixed K of --goal-ks: each compile mode must measure one."""
    if "b" in args.skip.split(","):
        return
    for mode in args.compile.split(","):
        flag, ks = ("--ks", args.ks) if mode == "none" else ("--compiled-ks", [int(k) for k in args.compiled_ks.split(",")])
        if not set(ks) & set(args.goal_ks):
            parser.error(f"part (b) pairs its adaptive methods with the best of --goal-ks {args.goal_ks}, and {flag} "
                         f"{ks} measures none of them: add one to {flag} or change --goal-ks")


def build_parser() -> argparse.ArgumentParser:
    """The command line (the module docstring says what each part measures)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_pair_flags(parser)
    parser.add_argument("--head", help="acceptance head dir (train-heads output) for the SpecDec++ column")
    parser.add_argument("--h", type=float, default=0.7)
    parser.add_argument("--cost-ratio", type=float, default=0.2,
                        help="c = t_draft / t_target for the UCBSpec throughput reward when part (a) is skipped")
    parser.add_argument("--k-max", type=int, default=8)
    parser.add_argument("--prior", type=float, default=None,
                        help="the batch-aware rule's prior, one acceptance for every position (default: with --head "
                             "the acceptance curve of train-heads' summary beside it, else 0.7)")
    parser.add_argument("--shape", default="demo", choices=sorted(RANDOM_SHAPES),
                        help="the random pair's shape without --target: the demo's 16 x 128, or a ~1B target (GPU)")
    parser.add_argument("--vocab", type=int, default=None, help="vocabulary of the random pair (default: its shape's)")
    parser.add_argument("--nudge", type=float, default=0.05, help="damping of the random pair's deeper layers")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--ks", default="2,4,8")
    parser.add_argument("--goal-ks", default="1,2,4,8",
                        help="the fixed K part (b) pairs the adaptive methods with: the best of them at each B")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--eos", action="store_true",
                        help="every method stops a row at the target's EOS, as served (default: every row decodes "
                             "--max-new-tokens, past EOS: equal work for the transformers comparison)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.7, help="part (a)'s sampled rows")
    parser.add_argument("--curve-temperature", type=float, default=0.0,
                        help="part (b)'s sampling (0: greedy); --head must be a head trained for it")
    parser.add_argument("--compile", default="none",
                        help="comma list of modes, each measured in turn: none, default, reduce-overhead")
    parser.add_argument("--compiled-batch-sizes", default="1,4,16",
                        help="batch sizes of part (b) under a compile mode (each B compiles its own graphs)")
    parser.add_argument("--compiled-ks", default="4", help="fixed K columns of part (b) under a compile mode")
    parser.add_argument("--skip", default="", help="comma list of parts to skip: a, b, c")
    parser.add_argument("--table-rules", action=argparse.BooleanOptionalAction, default=True,
                        help="part (b)'s rules that read a cost table profiled here (the batch-aware rule, the global "
                             "verify budget); --no-table-rules leaves them and the profile out")
    parser.add_argument("--methods", default="all", choices=["all", "core"],
                        help="part (b)'s methods: all, or core: AR, fixed K, SpecDec++, the batch-aware rule and the "
                             "global verify budget (without SpecDec++ lockstep, UCBSpec and the batch-aware rule's "
                             "own-rate form: fewer graphs to compile where a cold compile is dear, as on a lent GPU)")
    parser.add_argument("--profile-each-batch", action="store_true",
                        help="part (b): profile the table rules' cost table at B right before each B's decodes "
                             "(a compiled run on a GPU then prints B = 1's row before building B = 64's graphs)")
    parser.add_argument("--compiled-skip", default="",
                        help="parts to skip under a compile mode only (e.g. b, c: a large target's compiled batch-1 "
                             "row without compiling every policy at every B)")
    add_device_flags(parser)
    add_section_flags(parser)
    return parser


def check_args(parser: argparse.ArgumentParser, args) -> tuple[list[str], set[str]]:
    """The comma lists as ints, checked before any model loads: -> (the compile modes, the parts to skip;
    args.compiled_skip becomes the set skipped under a compile mode besides)."""
    args.ks = [int(k) for k in args.ks.split(",")]
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    args.goal_ks = [int(k) for k in args.goal_ks.split(",")]
    check_goal_ks(parser, args)
    modes = args.compile.split(",")
    if any(mode not in ("none", "default", "reduce-overhead") for mode in modes):
        parser.error(f"--compile takes none, default, reduce-overhead (comma separated), got {args.compile!r}")
    args.compiled_skip = set(filter(None, args.compiled_skip.split(",")))
    return modes, set(filter(None, args.skip.split(",")))


def load_models(args) -> tuple:
    """(target, drafter, head, what the pair is): --target/--drafter or the random demo-shaped pair; the head
    from --head or an untrained one; sets args.prior, the batch-aware rules' prior."""
    dtype = DTYPES[args.dtype]
    if args.target and args.drafter:
        target, drafter = load(args.target, args.device, dtype), load(args.drafter, args.device, dtype)
        pair = f"target {args.target}, drafter {args.drafter}"
    else:
        target, drafter = demo_shaped_pair(args.vocab, args.nudge, args.device, dtype, args.shape)
        cfg = target.config
        pair = (f"random {args.shape}-shaped pair ({cfg.num_hidden_layers} x {cfg.hidden_size} target of "
                f"{target.num_parameters() / 1e6:.0f}M parameters, its first layer as drafter, deeper layers damped by "
                f"{args.nudge}): acceptance reflects that construction, not a trained drafter")
    if args.head:
        from specdraft.decoding.policies.acceptance_head import load_head

        head, head_config = load_head(args.head, expected_hidden_size=drafter.config.hidden_size)
        head = head.to(args.device)
        args.prior = bench_prior(args.prior, pathlib.Path(args.head), head_config)
    else:
        head = untrained_head(drafter.config.hidden_size, args.device)
        args.prior = Prior((0.7 if args.prior is None else args.prior,))
    return target, drafter, head, pair


def bench_prompts(parser: argparse.ArgumentParser, args, target) -> list[list[int]]:
    """Enough prompts for the largest batch (part (a) and (c) take the first --n-prompts); sets args.n_batch1,
    args.n_prompts and args.eos (the target's EOS id with --eos, else None)."""
    args.n_batch1 = args.n_prompts
    args.n_prompts = max(args.n_prompts, max(args.batch_sizes))
    eos = getattr(target.generation_config, "eos_token_id", None) if args.eos else None
    if args.eos and not isinstance(eos, int):
        parser.error(f"--eos needs a target with one EOS token id in its generation config, got {eos!r}")
    args.eos = eos
    prompts = load_prompts(args, target.config.vocab_size)
    if len(prompts) < args.n_prompts:  # a set smaller than the largest batch: its prompts again, in order
        print(f"note: {len(prompts)} prompts for batches of up to {args.n_prompts}: the batch repeats them", flush=True)
        prompts = (prompts * -(-args.n_prompts // len(prompts)))[:args.n_prompts]
    return prompts


def header_lines(args, argv_text: str, pair: str) -> list[str]:
    """The section's title (date, machine), command line and what the times are."""
    # a GPU's figures name the GPU and the CUDA torch was built with
    return [
        f"## Batched static-cache decoder ({datetime.date.today()}, {machine(args.device, args.dtype)})",
        "",
        f"`python benchmarks/decoder/bench_batch_decoder.py {argv_text}`; {pair}. Times: this process's "
        f"{'CUDA events' if args.device.startswith('cuda') else 'CPU time'}.",
        "",
    ]


def mode_tables(args, skip: set[str], target, drafter, head, prompts) -> list[str]:
    """One compile mode's parts (a), (b) and (c), those not skipped."""
    lines = [f"### compile: {args.compile}", ""]
    if "a" not in skip:
        lines += batch1_table(args, target, drafter, prompts[:args.n_batch1])
    if "b" not in skip:
        lines += batch_curve_table(args, target, drafter, head, prompts)
    if "c" not in skip:
        lines += deciding_cost_table(args, target, drafter, head, prompts[:args.n_batch1])
    return lines


def main(argv=None, owner: pathlib.Path | None = None) -> int:
    """The benchmark; its section is the one of the script `owner` (default: this one), for a wrapper that runs it
    on another pair (bench_real_pair.py)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    fail_past_recompile_limit()  # a shape run eagerly past dynamo's limit would be timed as compiled
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    modes, skip = check_args(parser, args)
    if args.threads:
        torch.set_num_threads(args.threads)
    target, drafter, head, pair = load_models(args)
    eager_sizes, eager_ks = args.batch_sizes, args.ks
    prompts = bench_prompts(parser, args, target)
    start = time.time()
    lines = header_lines(args, argv_text, pair)
    for mode in modes:
        args.compile = mode
        args.compiler = StepCompiler(mode)  # one per mode for the whole run: each graph compiles once
        compiled = mode != "none"
        args.batch_sizes = [int(b) for b in args.compiled_batch_sizes.split(",")] if compiled else eager_sizes
        args.ks = [int(k) for k in args.compiled_ks.split(",")] if compiled else eager_ks
        lines += mode_tables(args, skip | (args.compiled_skip if compiled else set()), target, drafter, head, prompts)
    lines += [f"Run time {time.time() - start:.0f} s; load average at the end {os.getloadavg()[0]:.1f}.", ""]
    publish_for("\n".join(lines), not args.no_append, owner or pathlib.Path(__file__), args.section, args.page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
