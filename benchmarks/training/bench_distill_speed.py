"""distill-data's local backends side by side on a real target: transformers `generate` (hf) against the project's
batched decoder (decoder: eager, and compiled), and, given a drafter, the decoder speculative (lossless: the
target's own answers in fewer target forwards), each called as the stage calls it (pipelines/distill_data.py
`hf_backend` / `decoder_backend`).

    python benchmarks/training/bench_distill_speed.py --target DIR [--drafter DIR] [--prompt-set RUN/prompts/sets
        --domain code] [--n-prompts 16] [--batch 16] [--tokens 64] [--passes 2] [--dtype float32] [--threads 2]
        [--split test] [--no-compile] [--profile] [--section S] [--page P] [--no-append]

Every backend answers the same prompts, in batches of --batch, greedy, at most --tokens new tokens; batch by batch
the backends take turns (the order turning each batch and pass: benchmarks/harness/timing.py `interleave`), one
untimed warm-up call of each on each batch first (a compiled decoder builds its graphs there). Reported per
backend: answered tokens per second (the median over passes of the pass's total, min-max), its ratio to hf within
the same pass (median, min-max), and how many greedy answers equal hf's token for token (fp32: all should; bf16:
the step's shape changes the rounding, see decoding/near_ties.py). --profile adds where each backend's time goes:
one more call over the first batch under torch.profiler, its operators' self time summed as the products (the
linear layers and the LM head), attention, and the rest; hf's products bound what any backend running them at this
batch can gain. Writes its section of benchmarks/training/RESULTS.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from specdraft.decoding.compilation import StepCompiler  # noqa: E402
from specdraft.decoding.generate import Plan  # noqa: E402
from specdraft.decoding.policies.spec import PolicySpec, build_policy  # noqa: E402
from specdraft.pipelines.distill_data import decoder_backend, hf_backend  # noqa: E402
from specdraft.pipelines.schema import DistillDataSection  # noqa: E402
from benchmarks.harness.machine import box_load  # noqa: E402
from benchmarks.harness.models import DTYPES, add_device_flags, load, load_prompts  # noqa: E402
from benchmarks.harness.publish import add_section_flags, publish_for  # noqa: E402
from benchmarks.harness.timing import interleave  # noqa: E402


def backends(target, drafter, tok, dcfg, k: int, compiled: bool) -> dict:
    """{name: generate(prompts, temperature, batch_seed, request_seeds)} as distill-data opens them."""
    out = {"hf": hf_backend(target, tok, dcfg),
           "decoder eager": decoder_backend(target, tok, dcfg, Plan("target"), StepCompiler("none"))}
    if compiled:
        out["decoder compiled"] = decoder_backend(target, tok, dcfg, Plan("target"), StepCompiler("default"))
    if drafter is not None:
        spec = Plan("drafter", drafter, lambda: build_policy(PolicySpec("fixed", k=k)))
        out[f"decoder K={k} eager"] = decoder_backend(target, tok, dcfg, spec, StepCompiler("none"))
    return out


# operators whose self time is a matrix product: packed and plain linears, the LM head, int8 drafter weights
PRODUCTS = ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm", "aten::bmm", "aten::_weight_int8pack_mm")


def op_seconds(fn, unit) -> dict[str, float]:
    """Self CPU seconds of one call `fn(unit, 0)` under torch.profiler: products, attention, the rest."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(unit, 0)
    own = {e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages()}
    products = sum(v for k, v in own.items() if k in PRODUCTS)
    attention = sum(v for k, v in own.items() if "scaled_dot_product" in k)
    return {"products": products, "attention": attention, "rest": sum(own.values()) - products - attention}


def ratio_cell(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f}x ({min(xs):.2f}-{max(xs):.2f})"


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True, help="the target's model directory (e.g. a run's target/)")
    ap.add_argument("--drafter", help="a drafter's model directory: adds the speculative decoder backend")
    ap.add_argument("--k", type=int, default=4, help="the speculative backend's fixed draft length")
    ap.add_argument("--prompt-set", help="a run's prompts/sets dir: its test prompts of --domain")
    ap.add_argument("--prompts", help="text file, one prompt per line")
    ap.add_argument("--domain", default="code")
    ap.add_argument("--split", default="test", help="which set of --prompt-set (train holds the most prompts)")
    ap.add_argument("--n-prompts", type=int, default=16)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--no-compile", action="store_true", help="leave out the compiled decoder (its compile takes minutes)")
    ap.add_argument("--profile", action="store_true", help="add where each backend's time goes over the first batch")
    add_section_flags(ap)
    add_device_flags(ap)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    dtype = DTYPES[args.dtype]
    target = load(args.target, args.device, dtype)
    drafter = load(args.drafter, args.device, dtype) if args.drafter else None
    tok = AutoTokenizer.from_pretrained(args.target, trust_remote_code=False)
    prompts = load_prompts(args, target.config.vocab_size, lengths=(16, 49), lowest_id=3)
    dcfg = DistillDataSection(max_new_tokens=args.tokens, batch_size=args.batch, top_k=0, top_p=1.0)
    fns = {name: (lambda unit, seed, g=g: g(unit, 0.0, seed, list(range(len(unit)))))
           for name, g in backends(target, drafter, tok, dcfg, args.k, not args.no_compile).items()}
    units = [prompts[b:b + args.batch] for b in range(0, len(prompts), args.batch)]
    load_before = box_load()
    times, outs = interleave(fns, units, args.passes, args.device)
    answers = {name: [a for unit in per_pass[0] for a, _ in unit] for name, per_pass in outs.items()}
    tokens = {name: sum(map(len, a)) for name, a in answers.items()}
    rate = {name: [tokens[name] / sum(ts) for ts in per_pass] for name, per_pass in times.items()}
    lines = [
        f"## distill-data's local backends on {'/'.join(Path(args.target).resolve().parts[-2:])} ({args.dtype})", "",
        f"{len(prompts)} prompts ({f'{args.domain}, {args.split} set' if args.prompt_set else 'given' if args.prompts else 'random ids'}), "
        f"batches of {args.batch}, greedy, at most {args.tokens} new tokens; {args.passes} passes, the backends taking "
        f"turns batch by batch; {args.threads} torch thread(s); {platform.machine()} CPU, {os.cpu_count()} cores; "
        f"{load_before} at the start, {box_load()} at the end.", "",
        "| backend | answered tokens | tokens/s median (min-max) | x hf, within a pass | greedy answers equal to hf's |",
        "|---|---|---|---|---|",
    ]
    for name in fns:
        ratios = [r / h for r, h in zip(rate[name], rate["hf"])]
        same = sum(a == b for a, b in zip(answers[name], answers["hf"]))
        lines.append(f"| {name} | {tokens[name]} | {statistics.median(rate[name]):.1f} ({min(rate[name]):.1f}-"
                     f"{max(rate[name]):.1f}) | {ratio_cell(ratios)} | {same}/{len(prompts)} |")
    if args.profile:
        lines += ["", "Where the time goes: one more call of each over the first batch under torch.profiler, operators' "
                  "self time (s); the unprofiled call's time is the median over passes.", "",
                  "| backend | unprofiled call s | products s | attention s | the rest s |", "|---|---|---|---|---|"]
        for name, fn in fns.items():
            ops, alone = op_seconds(fn, units[0]), statistics.median(ts[0] for ts in times[name])
            lines.append(f"| {name} | {alone:.2f} | {ops['products']:.2f} | {ops['attention']:.2f} | {ops['rest']:.2f} |")
            if name == "hf":
                bound = alone / ops["products"]
        lines += ["", f"A backend running hf's products at this batch takes at least their time: at most {bound:.1f}x "
                  "hf's rate on the first batch."]
    text = "\n".join(lines)
    publish_for(text, not args.no_append, Path(__file__), args.section, args.page)
    return text


if __name__ == "__main__":
    main()
