"""bench_batch_decoder.py part (a), batch 1: ours against transformers' generate and assisted generation at equal K.

Per prompt the methods are interleaved and repeated (`harness.timing.interleaved`: one warm-up, then --runs passes;
median per prompt): ours autoregressive, ours fixed K, transformers greedy `generate`, transformers assisted
generation with num_assistant_tokens=K (constant schedule, no confidence stop), greedy and T = --temperature.
Efficiency = measured (ours K / ours AR) over the analytic fixed-K speedup at the acceptance implied by our MAT and
c = t_draft / t_target from ours-AR per-token times of each model; v, the target's (K+1)-token forward over its
1-token one, is measured alone, under transformers and as the decoder's own step.
"""
from __future__ import annotations

import torch

from specdraft.decoding.batched import forward_step
from specdraft.decoding.compilation import StepCompiler
from specdraft.decoding.costs.model import acceptance_from_mat, analytic_speedup, implementation_efficiency
from specdraft.decoding.policies.stopping import FixedK
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.rounds.static_cache import forward_rows
from benchmarks.harness.models import ForwardCounter, hf_generate, ours
from benchmarks.harness.timing import compile_times, forward_time, interleaved, median_times


@torch.inference_mode()
def step_v(target, width: int, compile: StepCompiler, device: str, context: int = 64, reps: int = 60, warmup: int = 5) -> float:
    """The decoder's own verify step alone (no round around it): median robust seconds of one `width`-token
    forward over its static cache after `context` tokens over the median of a 1-token one, in `compile` mode
    (compiled in the untimed warm-up). The two widths alternate call by call, so a load phase or a clock
    change hits both alike (timed in blocks, one after the other, the ratio moved 1.13-1.47 between runs)."""
    cache = compile.cache(target, 1, 128)
    step = forward_step(compile, target)
    forward_rows(target, cache, torch.randint(3, target.config.vocab_size, (1, context), device=device))
    at_context = torch.full((1,), context, device=device)
    ids = {w: torch.randint(3, target.config.vocab_size, (1, w), device=device) for w in (1, width)}
    times = median_times({w: (lambda w=w: step(cache, ids[w])) for w in (1, width)},
                         lambda: cache.rollback(at_context), reps, device, warmup)
    return times[width] / times[1]


def batch1_table(args, target, drafter, prompts) -> list[str]:
    n, k, dev = args.max_new_tokens, args.k, args.device
    counter = ForwardCounter(target)
    # the target alone, outside any decoder: its (K+1)-token cached forward in units of its 1-token forward,
    # under transformers (dynamic cache, eager) and as the decoder's own step (static cache, this compile mode)
    v = forward_time(target, k + 1, device=dev) / forward_time(target, 1, device=dev)
    v_step = step_v(target, k + 1, args.compiler, dev)
    rows = []
    compile_s = {}
    costs = {}
    for mode, sampling in (("greedy", SamplingConfig(0.0)), (f"T={args.temperature}", SamplingConfig(args.temperature))):
        sums = {key: [0.0, 0] for key in ("ar", "ar_d", "spec", "hf", "hf_k")}
        mats = {key: [0, 0] for key in ("spec", "hf_k")}
        for i, prompt in enumerate(prompts):
            fns = {
                "ar": lambda: ours(target, [prompt], n, sampling, i, args.compiler, eos=args.eos),
                "ar_d": lambda: ours(drafter, [prompt], n, sampling, i, args.compiler, eos=args.eos),
                "spec": lambda: ours(target, [prompt], n, sampling, i, args.compiler, drafter, FixedK(k), eos=args.eos),
                "hf": lambda: hf_generate(target, drafter, counter, prompt, n, sampling, None, i, args.eos),
                "hf_k": lambda: hf_generate(target, drafter, counter, prompt, n, sampling, k, i, args.eos),
            }
            if args.compile != "none" and not compile_s:
                compile_s = compile_times({key: fns[key] for key in ("ar", "ar_d", "spec")}, dev)
            res = interleaved(fns, args.runs, dev)
            for key in ("ar", "ar_d", "spec"):
                m = res[key][2][0].metrics
                sums[key][0] += res[key][0]
                sums[key][1] += m.n_generated
                if key == "spec":
                    mats["spec"][0] += m.n_generated
                    mats["spec"][1] += m.n_target
            for key in ("hf", "hf_k"):
                toks, calls = len(res[key][2][0]), res[key][2][1]
                sums[key][0] += res[key][0]
                sums[key][1] += toks
                if key == "hf_k":
                    mats["hf_k"][0] += toks
                    mats["hf_k"][1] += calls
        tps = {key: tok / t for key, (t, tok) in sums.items()}
        mat = {key: a / b for key, (a, b) in mats.items()}
        c = tps["ar"] / tps["ar_d"]
        costs[mode] = c
        a = acceptance_from_mat(min(max(mat["spec"], 1.0), k + 1), k)
        speedup = tps["spec"] / tps["ar"]
        rows.append(f"| {mode} | {tps['ar']:.1f} | {tps['hf']:.1f} | {tps['ar'] / tps['hf']:.2f} | {tps['spec']:.1f} | "
                    f"{mat['spec']:.2f} | {tps['hf_k']:.1f} | {mat['hf_k']:.2f} | {tps['spec'] / tps['hf_k']:.2f} | "
                    f"{c:.3f} | {a:.3f} | {speedup:.2f} | {analytic_speedup(a, k, c):.2f} | "
                    f"{implementation_efficiency(speedup, a, k, c):.2f} | {v:.2f} | {v_step:.2f} | "
                    f"{implementation_efficiency(speedup, a, k, c, v_step):.2f} |")
    lines = [
        f"#### (a) Batch 1: ours vs transformers, K = {k}, {len(prompts)} prompts x {n} tokens{' (up to, stopping at EOS)' if args.eos is not None else ''}, median of {args.runs} "
        "interleaved runs per prompt",
        "",
        "| mode | ours AR tok/s | HF greedy/sample tok/s | ours AR / HF | ours K tok/s | ours MAT | HF assisted K tok/s "
        "| HF MAT | ours K / HF assisted | c | a | speedup | analytic | efficiency | HF v | step v | efficiency at step v |",
        "| --- " + "| ---: " * 16 + "|",
        *rows,
        "",
        "c = t_draft / t_target from ours-AR per-token times; a = the per-token acceptance whose fixed-K expected "
        "round equals our MAT; speedup = ours K / ours AR; efficiency = speedup / analytic (analytic assumes a "
        "(K+1)-token verify costs one 1-token forward); v = the target alone, no decoder around it: median (K+1)-token "
        "cached forward / median 1-token cached forward, under transformers (HF v: eager, dynamic cache) and as the "
        "decoder's own step (step v: its static cache, in this compile mode); 'efficiency at step v' puts step v in "
        "place of 1, leaving only the cost of the rounds around the model's forwards.",
    ]
    if compile_s:
        lines += ["", "Compile (first call, wall s, not in the times above): "
                  + ", ".join(f"{key} {s:.1f}" for key, s in compile_s.items())]
    args.cost_ratio = costs["greedy"]  # the length bandit's throughput reward in (b) uses the measured c
    return lines + [""]

