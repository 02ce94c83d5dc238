"""What a drafter's int8 weights buy on this CPU: the pair at batch 1, greedy, fixed K, the drafter in the target's
dtype against the same drafter with int8 weights (decoding/rounds/int8_linear.py, `decoding.draft_weights`).

    python benchmarks/cpu/bench_draft_weights.py --pair NAME=TARGET_DIR,DRAFTER_DIR,RUN_DIR [--pair ...]
        [--dtype bfloat16] [--k 4] [--per-domain 2] [--tokens 64] [--passes 1] [--threads 2] [--no-append]

Each pair: the target loaded as every stage loads it (`load_causal_lm`: packed linears in bf16 on a CPU with bf16
units), the drafter twice through `load_drafter`, with draft_weights `dtype` and `int8`. RUN_DIR/prompts holds
the run's prompt sets: the first --per-domain test prompts of each domain, in the target's chat template.

Times are this process's CPU time (every thread's summed: the robust figure on a shared box; with --threads 2 a
call's CPU time is about twice its wall time). Figures:
- one-token step, CPU ms: each model's one-token forward over a 64-token cache (median of 60), and c = drafter
  step over target step, per drafter format: the cost the drafter's weights change;
- the decodes: AR, fixed K with the dtype drafter and with the int8 drafter, taking turns prompt by prompt (the
  harness's `interleave`), --passes passes; per method the acceptance length (MAT: tokens per target forward,
  counted, exact), accepted / drafted, how many outputs equal AR's token for token, tokens per CPU second, and the
  speedup over AR with a 90% interval from resampling prompts (`decoding.timing.bootstrap_rate_ratio`, pooled
  tokens over pooled seconds, each prompt's methods paired), plus int8 over dtype the same way.
"""
from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from specdraft.core.errors import InputError  # noqa: E402
from specdraft.decoding.batched import generate_batch  # noqa: E402
from specdraft.decoding.bundle.chat import ChatFormat, end_of_turn_ids  # noqa: E402
from specdraft.decoding.bundle.loading import DTYPES, load_causal_lm, load_drafter, load_tokenizer  # noqa: E402
from specdraft.decoding.policies.stopping import FixedK  # noqa: E402
from specdraft.decoding.rounds.int8_linear import is_quantized  # noqa: E402
from specdraft.decoding.timing import bootstrap_rate_ratio  # noqa: E402
from benchmarks.engines.acceptance import test_prompts  # noqa: E402
from benchmarks.harness.machine import box_load, machine  # noqa: E402
from benchmarks.harness.publish import add_section_flags, publish_for  # noqa: E402
from benchmarks.harness.tables import interval, table  # noqa: E402
from benchmarks.harness.timing import forward_time, interleave  # noqa: E402

FORMATS = ("dtype", "int8")  # decoding.draft_weights, as load_drafter reads it


def parse_pair(text: str) -> tuple[str, Path, Path, Path]:
    name, _, dirs = text.partition("=")
    parts = dirs.split(",")
    if not name or len(parts) != 3:
        raise InputError(f"--pair {text!r}: write NAME=TARGET_DIR,DRAFTER_DIR,RUN_DIR")
    return (name, *(Path(p) for p in parts))


def decode(target, drafter, k: int, tokens: int, eos) -> callable:
    """fn(prompt ids, seed) -> (output tokens, generated, target forwards, drafted, accepted): greedy, batch 1."""
    def fn(ids, seed):
        result = generate_batch(target, [ids], tokens, drafter=drafter, policy=FixedK(k) if drafter else None,
                                eos_token_id=eos)[0]
        m = result.metrics
        return result.tokens, m.n_generated, m.n_target, m.n_draft, m.n_draft - m.n_discarded
    return fn


def describe(model) -> str:
    """"qwen2, 28 x 1536, 1777M parameters": what a model is, without the path it was read from."""
    c = model.config
    tied = "lm_head.weight" if c.tie_word_embeddings else None  # the input embedding's own tensor, counted once
    params = sum(p.numel() for n, p in model.state_dict().items() if n != tied)
    return f"{c.model_type}, {c.num_hidden_layers} x {c.hidden_size}, {params / 1e6:.0f}M parameters"


def command(args) -> str:
    """The run's command line, each pair's directories named by the pair (NAME_TARGET, NAME_DRAFTER, NAME_RUN)."""
    pairs = " ".join(f"--pair {n}={n.upper()}_TARGET,{n.upper()}_DRAFTER,{n.upper()}_RUN"
                     for n, *_ in map(parse_pair, args.pair))
    return (f"python benchmarks/cpu/bench_draft_weights.py {pairs} --dtype {args.dtype} --k {args.k} "
            f"--per-domain {args.per_domain} --tokens {args.tokens} --passes {args.passes} --threads {args.threads}")


def measure_pair(name: str, target_dir: Path, drafter_dir: Path, run: Path, args) -> dict:
    tok = load_tokenizer(target_dir)
    target = load_causal_lm(target_dir, args.dtype, "cpu")
    drafters = {f: load_drafter(drafter_dir, args.dtype, "cpu", f) for f in FORMATS}
    if not is_quantized(drafters["int8"]) or is_quantized(drafters["dtype"]):
        raise InputError("the drafters did not load as asked (int8 and the dtype's)")
    prompts = [ids for _, ids in test_prompts(run, tok, ChatFormat(), args.per_domain)]
    with torch.inference_mode():
        step_ms = {"target": forward_time(target, 1) * 1e3,
                   **{f"drafter {f}": forward_time(drafters[f], 1) * 1e3 for f in FORMATS}}
    eos = end_of_turn_ids(tok, target)
    fns = {"AR": decode(target, None, args.k, args.tokens, eos),
           **{f"K = {args.k}, drafter {f}": decode(target, drafters[f], args.k, args.tokens, eos) for f in FORMATS}}
    start = time.perf_counter()
    times, out = interleave(fns, prompts, args.passes, "cpu")
    return {"name": name, "target": describe(target), "drafter": describe(drafters["dtype"]), "prompts": len(prompts),
            "step_ms": step_ms, "times": times, "out": out, "wall_s": time.perf_counter() - start}


def per_prompt(r: dict) -> tuple[dict, dict]:
    """({method: seconds per prompt}, {method: tokens per prompt}), each summed over the passes (greedy: every
    pass decodes the same tokens, so the first pass's count times the passes)."""
    secs = {m: [sum(p[i] for p in ts) for i in range(r["prompts"])] for m, ts in r["times"].items()}
    gen = {m: [o[1] * len(r["times"][m]) for o in r["out"][m][0]] for m in r["times"]}
    return secs, gen


def pair_rows(r: dict) -> list[list]:
    methods = list(r["times"])
    secs, gen = per_prompt(r)
    first = {m: r["out"][m][0] for m in methods}
    rows = []
    for m in methods:
        toks, calls = sum(o[1] for o in first[m]), sum(o[2] for o in first[m])
        drafted, accepted = sum(o[3] for o in first[m]), sum(o[4] for o in first[m])
        equal = sum(o[0] == a[0] for o, a in zip(first[m], first["AR"]))
        vs_ar = bootstrap_rate_ratio([(gen[m][i], secs[m][i], gen["AR"][i], secs["AR"][i])
                                      for i in range(r["prompts"])])
        rows.append([m, f"{toks / calls:.3f}", f"{accepted / drafted:.3f}" if drafted else "-",
                     f"{equal}/{r['prompts']}", f"{sum(gen[m]) / sum(secs[m]):.2f}",
                     interval((vs_ar.median, vs_ar.lo, vs_ar.hi))])
    return rows


def render(results: list[dict], args) -> str:
    lines = [f"## A drafter's weights: the dtype's against int8 ({datetime.date.today()})", "",
             f"{machine('cpu', args.dtype)}; torch threads {args.threads}; box load at the end: {box_load()}. "
             f"Greedy, batch 1, fixed K = {args.k}, {args.tokens} tokens a prompt, {args.passes} pass(es), the "
             "methods taking turns prompt by prompt. Times: this process's CPU time, every thread's summed. Speedups: "
             "tokens per CPU second over AR's, pooled over the prompts, 90% interval from resampling prompts.", "", f"`{command(args)}`", ""]
    for r in results:
        ms = r["step_ms"]
        lines += [f"### {r['name']}: target {r['target']}; drafter {r['drafter']}; {r['prompts']} test prompts", "",
                  "One-token step over a 64-token cache (CPU ms) and c = drafter step / target step: " + "; ".join(
                      [f"target {ms['target']:.1f}"] + [f"drafter {f} {ms[f'drafter {f}']:.1f} (c = "
                                                         f"{ms[f'drafter {f}'] / ms['target']:.3f})" for f in FORMATS])
                  + ".", ""]
        lines += table(["method", "MAT", "accepted / drafted", "equal to AR", "tokens per CPU s", "speedup over AR"],
                       pair_rows(r), "lrrrrr")
        methods = list(r["times"])
        secs, gen = per_prompt(r)
        a, b = methods[2], methods[1]
        ratio = bootstrap_rate_ratio([(gen[a][i], secs[a][i], gen[b][i], secs[b][i]) for i in range(r["prompts"])])
        lines += ["", f"int8 drafter over the dtype's drafter, tokens per CPU second: "
                  f"{interval((ratio.median, ratio.lo, ratio.hi))} (the decodes took {r['wall_s']:.0f} s of wall time).",
                  ""]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pair", action="append", required=True, help="NAME=TARGET_DIR,DRAFTER_DIR,RUN_DIR (repeatable)")
    p.add_argument("--dtype", default="bfloat16", choices=tuple(DTYPES))
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--per-domain", type=int, default=2)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--passes", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    add_section_flags(p)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        pairs = [parse_pair(t) for t in args.pair]
        for _, *dirs in pairs:
            for d in dirs:
                if not d.is_dir():
                    raise InputError(f"{d} is not a directory; --pair takes NAME=TARGET_DIR,DRAFTER_DIR,RUN_DIR")
        torch.set_num_threads(args.threads)
        results = [measure_pair(*p, args) for p in pairs]
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    publish_for(render(results, args), not args.no_append, Path(__file__), args.section, args.page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
