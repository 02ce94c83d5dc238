"""What compiling costs the decoder under dynamo's automatic dynamic shapes (the StepCompiler's default) against one
graph per size (`dynamic_shapes=False`, its earlier form): the graphs each (batch size, method) adds and the wall
seconds of its first decode, from a cold inductor cache, and whether both give the same tokens.

    python benchmarks/decoder/bench_compile_shapes.py [--batch-sizes 1,4,8] [--ks 4] [--max-new-tokens 24] [--no-append]

Each shape mode runs in a process of its own with an empty inductor cache (a lent GPU machine starts with one),
the two side by side, one thread each (a 2-core box: each shares the machine with the other). On the demo-shaped
random pair, compile "default", greedy, prompts of 20-32 tokens; methods AR and fixed K. Graphs are dynamo's
unique graphs (counted, exact); seconds are wall time, compile included, so they carry the other process's load.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

MODES = ("dynamic", "static")


def one_mode(args) -> dict:
    """In this process (cold cache set by the caller): {"rows": [(B, method, new graphs, seconds)], "tokens": ...}."""
    import torch
    import torch._dynamo.utils as dynamo_utils

    from benchmarks.harness.models import demo_shaped_pair
    from specdraft.decoding.batched import generate_batch
    from specdraft.decoding.compilation import StepCompiler
    from specdraft.decoding.policies.stopping import FixedK

    torch.set_num_threads(1)
    target, drafter = demo_shaped_pair(None, 0.05, "cpu", torch.float32)
    compiler = StepCompiler("default", dynamic_shapes=args.mode == "dynamic")
    gen = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(0, target.config.vocab_size, (20 + 3 * (i % 5),), generator=gen).tolist()
               for i in range(max(args.batch_sizes))]
    rows, tokens = [], {}
    for b in args.batch_sizes:
        for k in [0, *args.ks]:
            before, start = dynamo_utils.counters["stats"]["unique_graphs"], time.perf_counter()
            out = generate_batch(target, prompts[:b], args.max_new_tokens, drafter=drafter if k else None,
                                 policy=FixedK(k) if k else None, compile=compiler)
            rows.append((b, f"K={k}" if k else "AR", dynamo_utils.counters["stats"]["unique_graphs"] - before,
                         time.perf_counter() - start))
            tokens[f"{b} {k}"] = [r.tokens for r in out]
    return {"rows": rows, "tokens": tokens}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-sizes", default="1,4,8")
    ap.add_argument("--ks", default="4", help="fixed K methods beside AR")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # a child: one mode, JSON on stdout
    ap.add_argument("--no-append", action="store_true", help="print only; leave RESULTS.md as it is")
    args = ap.parse_args(argv)
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    args.ks = [int(k) for k in args.ks.split(",")]
    if args.mode:
        print(json.dumps(one_mode(args)))
        return 0
    began = time.perf_counter()
    children = {}
    with tempfile.TemporaryDirectory() as scratch:
        for mode in MODES:  # side by side, each with a cache of its own that starts empty
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=f"{scratch}/{mode}", TORCHINDUCTOR_COMPILE_THREADS="1")
            children[mode] = subprocess.Popen([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]),
                                               "--mode", mode], env=env, stdout=subprocess.PIPE, text=True)
        results = {}
        for mode, child in children.items():
            out, _ = child.communicate()
            if child.returncode:
                print(f"bench_compile_shapes.py: the {mode} run failed (exit {child.returncode})", file=sys.stderr)
                return 1
            results[mode] = json.loads(out.strip().splitlines()[-1])
    import torch

    from benchmarks.harness.publish import publish  # noqa: E402
    same = results["dynamic"]["tokens"] == results["static"]["tokens"]
    lines = [f"## Compiling: automatic dynamic shapes against one graph per size ({time.strftime('%Y-%m-%d')}, "
             f"CPU, torch {torch.__version__})", "",
             f"`python benchmarks/decoder/bench_compile_shapes.py {' '.join(argv if argv is not None else sys.argv[1:])}`: "
             f"demo-shaped random pair, compile default, {args.max_new_tokens} new tokens, each mode in its own "
             f"process from an empty inductor cache, the two side by side ({time.perf_counter() - began:.0f} s in "
             "all). New graphs: dynamo's unique graphs the decode added (exact); seconds: its wall time, compile "
             "included.", "",
             "| B | method | dynamic: new graphs | dynamic: s | static: new graphs | static: s |",
             "| ---: | --- | ---: | ---: | ---: | ---: |"]
    for (b, name, g_dyn, s_dyn), (_, _, g_st, s_st) in zip(results["dynamic"]["rows"], results["static"]["rows"]):
        lines.append(f"| {b} | {name} | {g_dyn} | {s_dyn:.1f} | {g_st} | {s_st:.1f} |")
    total = {m: (sum(r[2] for r in results[m]["rows"]), sum(r[3] for r in results[m]["rows"])) for m in MODES}
    lines += [f"| all | | {total['dynamic'][0]} | {total['dynamic'][1]:.0f} | {total['static'][0]} | "
              f"{total['static'][1]:.0f} |", "",
              f"Tokens: {'the same' if same else 'DIFFERENT'} in every decode of the two modes.", ""]
    publish("\n".join(lines), write=not args.no_append)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
