"""distill-data's in-process backends on a real target, as the stage runs them: transformers' generate (hf) and the
project's batched decoder (decoder), each in every --dtypes, answering a run's prompts; answered tokens per second.

    python benchmarks/engines/bench_distill_real.py --config configs/real.yaml --target DIR --prompt-set DIR
        [--backends hf,decoder] [--dtypes float32,bfloat16] [--split train] [--n-prompts 32] [--batch 16]
        [--tokens 64] [--passes 2] [--threads 2] [--section S] [--page P] [--no-append]

Each (backend, dtype) is the stage's own path: `pipelines.distill_data.open_backend` under the run config with
distill_data.backend, target.dtype, distill_data.batch_size and max_new_tokens set from the flags (every other key as
the config has it: compile, top-k, the decoder's plan), timed by `answer_rate`, the measure the stage's speed is
(greedy, one seed per batch; wall seconds and this process's CPU seconds). The prompts are the first --n-prompts of
the set's --split, in the target's chat template, fitted to distill_data.max_prompt_tokens as the stage fits them. A pass opens each backend in turn (loading is not timed), the order turning each pass; each figure is
the median over passes, min-max beside it, and each speedup is taken within a pass over hf in float32 (the stage's
default backend and dtype). Beside the rates: how many greedy answers equal hf's in the same dtype token for token
(a difference is a near-tie argmax flipped by another summation order or step shape). Writes its section of
benchmarks/engines/RESULTS.md.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from specdraft.data.prompts import fit_prompt  # noqa: E402
from specdraft.decoding.bundle.loading import choose_dtype, load_tokenizer  # noqa: E402
from specdraft.pipelines.config import load_config  # noqa: E402
from specdraft.pipelines.distill_data import answer_rate, open_backend  # noqa: E402
from specdraft.pipelines.schema import RunConfig  # noqa: E402
from benchmarks.harness.machine import box_load, machine  # noqa: E402
from benchmarks.harness.models import load_prompts  # noqa: E402
from benchmarks.harness.publish import add_section_flags, publish_for  # noqa: E402
from benchmarks.harness.tables import table  # noqa: E402
from benchmarks.harness.timing import rotated  # noqa: E402

BACKENDS, DTYPES = ("hf", "decoder"), ("float32", "bfloat16", "auto")


def parse_list(text: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in items if s not in allowed]
    if not items or bad or len(set(items)) != len(items):
        raise argparse.ArgumentTypeError(f"{flag} {text!r}: each of {', '.join(allowed)} at most once")
    return items


def run_config(args, backend: str, dtype: str) -> RunConfig:
    return load_config(RunConfig, args.config, [f"distill_data.backend={backend}", f"target.dtype={dtype}",
                                                f"distill_data.batch_size={args.batch}",
                                                f"distill_data.max_new_tokens={args.tokens}"])


def measure(args, prompts: list[list[int]], tok) -> dict:
    """{(backend, dtype): [answer_rate result per pass]}, the configs opened in turn, the order turning each pass."""
    configs = [(b, d) for d in args.dtype_list for b in args.backend_list]
    out = {c: [] for c in configs}
    for p in range(args.passes):
        for backend, dtype in rotated(configs, p):
            cfg = run_config(args, backend, dtype)
            with open_backend(cfg, args.target, Path(args.work), tok) as generate:
                out[backend, dtype].append(answer_rate(generate, prompts, args.batch, 0.0, cfg.run.seed))
            print(f"[bench_distill_real] pass {p + 1}/{args.passes} {backend} {dtype}: "
                  f"{out[backend, dtype][-1]['tokens_per_s']:.1f} tokens/s", file=sys.stderr, flush=True)
    return out


def spread(xs: list[float], digits: int = 1) -> str:
    return f"{statistics.median(xs):.{digits}f} ({min(xs):.{digits}f}-{max(xs):.{digits}f})"


def render(args, results: dict, prompts: list[list[int]], argv: list[str], loads: list[str]) -> str:
    base = results.get(("hf", "float32"))
    rows = []
    for (backend, dtype), runs in results.items():
        ref = results.get(("hf", dtype))
        same = sum(a == b for a, b in zip(runs[0]["answers"], ref[0]["answers"])) if ref else None
        within = ([r["tokens_per_s"] / b["tokens_per_s"] for r, b in zip(runs, base)] if base else None)
        rows.append([backend, f"{dtype} ({choose_dtype(dtype, 'cpu').name})" if dtype == "auto" else dtype,
                     spread([r["tokens_per_s"] for r in runs]),
                     spread([r["answered_tokens"] / r["cpu_s"] for r in runs]),
                     spread(within, 2) if within else "-",
                     f"{runs[0]['answered_tokens']}", f"{same}/{len(prompts)}" if same is not None else "-"])
    lengths = sorted(map(len, prompts))
    lines = [f"### distill-data's backends on {Path(args.target).name} ({machine('cpu')}, {args.threads} thread(s))", "",
             f"`python benchmarks/engines/bench_distill_real.py {' '.join(argv)}`: {len(prompts)} prompts of the "
             f"{args.split} set ({lengths[0]}-{lengths[-1]} tokens in the chat template), greedy, up to {args.tokens} "
             f"new tokens, batches of {args.batch}; {args.passes} passes, the configs opened in turn (loading not "
             f"timed); {loads[0]} at the start, {loads[1]} at the end. x hf fp32: within each pass, over hf in "
             "float32 (the stage's default); equal to hf: greedy answers equal token for token to hf's in the same "
             "dtype.", ""]
    lines += table(["backend", "dtype", "answered tokens/s (wall)", "tokens per CPU second", "x hf fp32",
                    "answered tokens", "equal to hf"], rows, "llrrrrr")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="the run config whose distill_data the stage would run")
    ap.add_argument("--target", required=True, help="the target's model directory (a run's target/)")
    ap.add_argument("--prompt-set", required=True, help="a run's prompts/sets directory")
    ap.add_argument("--split", default="train")
    ap.add_argument("--domain", default=None, help="only this domain's prompts (default: every domain)")
    ap.add_argument("--backends", default="hf,decoder")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--n-prompts", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default="runs/bench_distill_real", help="where a backend may write logs")
    add_section_flags(ap)
    args = ap.parse_args(argv)
    try:
        args.backend_list = parse_list(args.backends, BACKENDS, "--backends")
        args.dtype_list = parse_list(args.dtypes, DTYPES, "--dtypes")
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    if min(args.n_prompts, args.batch, args.tokens, args.passes, args.threads) < 1:
        ap.error("--n-prompts, --batch, --tokens, --passes and --threads must each be at least 1")
    torch.set_num_threads(args.threads)
    cfg = run_config(args, "hf", "float32")
    tok = load_tokenizer(args.target)
    prompts = [fit_prompt(p, cfg.distill_data.max_prompt_tokens, cfg.distill_data.long_prompts, str(i))[0]
               for i, p in enumerate(load_prompts(args, tok.vocab_size))]
    loads = [box_load()]
    results = measure(args, prompts, tok)
    loads.append(box_load())
    publish_for(render(args, results, prompts, argv, loads), not args.no_append, Path(__file__), args.section, args.page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
