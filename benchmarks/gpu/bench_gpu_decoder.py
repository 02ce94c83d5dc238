"""The decoder on a GPU: ours vs transformers assisted generation at equal K, the implementation
efficiency at the measured verify cost, and a torch.profiler breakdown of a round.

    python benchmarks/gpu/bench_gpu_decoder.py --synthetic [--k 4] [--max-new-tokens 128] [--runs 3]
    python benchmarks/gpu/bench_gpu_decoder.py --target DIR --drafter DIR [--prompt-set DIR --domain math]
        [--label TEXT] [--json OUT.json] [--profile OUT.txt] [--no-append]

Batch 1, greedy, EOS ignored (every method emits exactly --max-new-tokens tokens). Times are wall clock
with torch.cuda.synchronize() at both ends; methods are interleaved per prompt and repeated, medians
reported. `--synthetic` builds a ~110M-parameter random Llama target (12 layers, hidden 768, vocab 32000)
whose deeper layers only nudge the residual stream, and a drafter made of its first layer (shared
embeddings, norm and head), so the drafter agrees often without training.

Efficiency: the analytic tokens/s of a fixed-K round is MAT / (t_verify(K+1) + (N_draft/N_target) * t_draft),
with t_verify and t_draft the bare models' cached forwards measured here (CUDA events, outside any
decoder: harness.timing.forward_time); measured tokens/s over it is what the decoder's own overhead (sampling, verification, host
round trips, cache rollback, Python) leaves. The same number in the cost model's terms:
analytic_speedup(a, K, c, v) with c = t_draft / t_target and v = t_verify / t_target.
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from specdraft.decoding.rounds import kv  # noqa: E402
from specdraft.decoding.autoregressive import generate_autoregressive  # noqa: E402
from specdraft.decoding.costs.model import acceptance_from_mat, analytic_speedup  # noqa: E402
from specdraft.decoding.metrics import aggregate  # noqa: E402
from specdraft.decoding.speculative import generate_with_drafter  # noqa: E402
from specdraft.decoding.rounds.sampling import SamplingConfig  # noqa: E402
from specdraft.decoding.timing import timed_call  # noqa: E402
from benchmarks.harness.models import DTYPES, ForwardCounter, early_exit_pair, hf_generate, load, load_prompts  # noqa: E402
from benchmarks.harness.timing import forward_time  # noqa: E402

GREEDY = SamplingConfig(0.0)


def synthetic_pair(device: str, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                      num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=2048,
                      initializer_range=0.05, tie_word_embeddings=True,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    target, drafter = early_exit_pair(LlamaForCausalLM(cfg).eval(), 0.1)
    return target.to(device, dtype), drafter.to(device, dtype)


def profile_rounds(target, drafter, prompt, n, k, path: pathlib.Path | None) -> dict:
    """torch.profiler over one speculative generation: host syncs, device-to-host copies and where the
    host time goes, per round. Phases are marked by wrapping the loop's pieces (no change to the loop)."""
    import specdraft.decoding.speculative as sp
    from torch.profiler import ProfilerActivity, profile, record_function

    def marked(name, fn):
        def wrapper(*a, **kw):
            with record_function(name):
                return fn(*a, **kw)
        return wrapper

    # the target's probs step is `probs_on_cpu` since the host-transfer fix, `probs` + .cpu() before it
    probs_name = "probs_on_cpu" if hasattr(sp, "probs_on_cpu") else "probs"
    saved = {name: getattr(sp, name) for name in ("verify", probs_name)}
    sp.verify = marked("round::verify", sp.verify)
    setattr(sp, probs_name, marked("round::target_probs", saved[probs_name]))
    from specdraft.decoding.speculators.drafter import DrafterSpeculator
    saved_propose = DrafterSpeculator.propose
    DrafterSpeculator.propose = marked("round::propose", saved_propose)
    saved_forward = kv.forward
    try:
        generate_with_drafter(target, drafter, prompt, n, k=k)  # warm-up
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            torch.cuda.synchronize()
            start = time.perf_counter()
            result = generate_with_drafter(target, drafter, prompt, n, k=k)
            torch.cuda.synchronize()
            wall = time.perf_counter() - start
    finally:
        sp.verify = saved["verify"]
        setattr(sp, probs_name, saved[probs_name])
        DrafterSpeculator.propose = saved_propose
        kv.forward = saved_forward
    rounds = result.metrics.n_rounds
    events = prof.key_averages()
    # host-side rows only (a record_function range also shows up as a GPU annotation row of the same name)
    by_name = {e.key: e for e in events if e.device_type == torch.autograd.DeviceType.CPU}

    counts: dict[str, int] = {}
    for e in events:  # launches and syncs are host rows, memcpys device rows: count both kinds
        counts[e.key] = max(counts.get(e.key, 0), e.count)

    def count(*names):
        return sum(counts.get(x, 0) for x in names)

    def cpu_ms(name):
        return by_name[name].cpu_time_total / 1e3 if name in by_name else 0.0

    kernel_us = sum(e.self_device_time_total for e in events)  # device time is only ever self time of kernels
    summary = {
        "rounds": rounds, "wall_ms": 1e3 * wall, "n_draft": result.metrics.n_draft,
        "syncs_per_round": count("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize") / rounds,
        "d2h_copies_per_round": count("Memcpy DtoH (Device -> Pageable)", "Memcpy DtoH (Device -> Pinned)") / rounds,
        "h2d_copies_per_round": count("Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD (Pinned -> Device)") / rounds,
        "item_calls_per_round": count("aten::_local_scalar_dense") / rounds,
        "cpu_argmax_ms_per_round": cpu_ms("aten::argmax") / rounds,
        "kernel_launches_per_round": count("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC") / rounds,
        "gpu_busy_fraction": kernel_us / 1e3 / (1e3 * wall),
        "propose_ms_per_round": cpu_ms("round::propose") / rounds,
        "target_probs_ms_per_round": cpu_ms("round::target_probs") / rounds,
        "verify_ms_per_round": cpu_ms("round::verify") / rounds,
        "sync_wait_ms_per_round": (cpu_ms("cudaStreamSynchronize") + cpu_ms("cudaMemcpyAsync")) / rounds,
    }
    if path is not None:
        path.write_text(json.dumps(summary, indent=1) + "\n\n"
                        + events.table(sort_by="cpu_time_total", row_limit=45, max_name_column_width=60))
    return summary


def sync_time(fn, device: str) -> tuple[float, object]:
    """(wall seconds of fn(), its result), the device synchronised at both ends."""
    out, t = timed_call(fn, device)
    return t.wall, out


def forward_ms(model, n_tokens: int, device: str) -> float:
    """Median ms of the bare model's n-token cached forward (CUDA events, after a warm-up)."""
    return 1e3 * forward_time(model, n_tokens, device=device)


def bench(args) -> dict:
    device, dtype = "cuda", DTYPES[args.dtype]
    if args.synthetic:
        target, drafter = synthetic_pair(device, dtype)
    else:
        target, drafter = load(args.target, device, dtype), load(args.drafter, device, dtype)
    n_params = sum(p.numel() for p in target.parameters()), sum(p.numel() for p in drafter.parameters())
    counter = ForwardCounter(target)
    prompts = load_prompts(args, target.config.vocab_size, lengths=(16, 64), lowest_id=3)
    n = args.max_new_tokens
    out = {"label": args.label, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "dtype": args.dtype, "params": n_params, "n_prompts": len(prompts), "max_new_tokens": n,
           "runs": args.runs, "ks": {}}
    t1_target, t1_draft = forward_ms(target, 1, device), forward_ms(drafter, 1, device)
    out["t_target_1_ms"], out["t_draft_1_ms"] = t1_target, t1_draft
    for k in args.k:
        t_verify = forward_ms(target, k + 1, device)
        times = {m: [] for m in ("ours_ar", "ours_sd", "hf", "hf_assisted")}
        metrics, hf_calls, equal = [], [], True
        for prompt in prompts:
            for rep in range(args.runs + 1):  # the first repetition warms up; methods interleaved
                t_ar, r_ar = sync_time(lambda: generate_autoregressive(target, prompt, n), device)
                t_sd, r_sd = sync_time(lambda: generate_with_drafter(target, drafter, prompt, n, k=k), device)
                t_hf, (hf_tokens, _) = sync_time(lambda: hf_generate(target, drafter, counter, prompt, n, GREEDY, None),
                                                 device)
                t_as, (as_tokens, calls) = sync_time(lambda: hf_generate(target, drafter, counter, prompt, n, GREEDY, k),
                                                     device)
                if rep == 0:
                    metrics.append(r_sd.metrics)
                    hf_calls.append(calls)
                    equal &= r_sd.tokens == r_ar.tokens
                    continue
                for m, t in zip(times, (t_ar, t_sd, t_hf, t_as)):
                    times[m].append((t, n))
        med = {m: statistics.median(t for t, _ in v) for m, v in times.items()}
        tps = {m: n / med[m] for m in med}
        agg = aggregate(metrics)
        mat = agg.mat
        draft_fwd_per_round = agg.n_draft / agg.n_target
        analytic_round_ms = t_verify + draft_fwd_per_round * t1_draft
        analytic_tps = mat / (analytic_round_ms / 1e3)
        a = acceptance_from_mat(min(max(mat, 1.0), k + 1), k)
        c, v = t1_draft / t1_target, t_verify / t1_target
        out["ks"][k] = {
            "tps": tps, "spread": {m: [n / max(t for t, _ in vals), n / min(t for t, _ in vals)] for m, vals in times.items()},
            "mat": mat, "hf_assisted_mat": len(prompts) * n / sum(hf_calls), "t_verify_ms": t_verify,
            "draft_forwards_per_round": draft_fwd_per_round, "c": c, "v": v, "a": a,
            "analytic_tps": analytic_tps, "efficiency": tps["ours_sd"] / analytic_tps,
            "analytic_speedup_over_bare_target": analytic_speedup(a, k, c, v),
            "speedup_over_ours_ar": tps["ours_sd"] / tps["ours_ar"], "ours_over_hf_assisted": tps["ours_sd"] / tps["hf_assisted"],
            "greedy_equal_ar": equal,
            "time_split": {"draft": agg.time_draft / agg.time_total, "target": agg.time_target / agg.time_total},
        }
        if args.profile:
            out["ks"][k]["profile"] = profile_rounds(target, drafter, prompts[0], n, k,
                                                     pathlib.Path(f"{args.profile}.k{k}.txt"))
    return out


def table(res: dict, argv: list[str]) -> str:
    p_t, p_d = res["params"]
    lines = [
        f"## Decoder on GPU: ours vs transformers assisted generation ({datetime.date.today()}, {res['device']}, "
        f"torch {res['torch']}, {res['dtype']}{', ' + res['label'] if res['label'] else ''})",
        "",
        f"`python benchmarks/gpu/bench_gpu_decoder.py {' '.join(argv)}`: target {p_t / 1e6:.0f}M params, drafter "
        f"{p_d / 1e6:.1f}M, {res['n_prompts']} prompts, batch 1, greedy, {res['max_new_tokens']} new tokens, "
        f"median of {res['runs']} interleaved runs after a warm-up (min-max tok/s in brackets). Bare cached "
        f"forwards: target {res['t_target_1_ms']:.2f} ms/token, drafter {res['t_draft_1_ms']:.2f} ms/token.",
        "",
        "| K | ours AR tok/s | ours SD tok/s | MAT | HF greedy tok/s | HF assisted K tok/s | HF MAT | ours/HF at K "
        "| verify fwd ms (v) | analytic tok/s | efficiency | draft/target time |",
        "| ---: " * 12 + "|",
    ]
    for k, r in res["ks"].items():
        t, s = r["tps"], r["spread"]
        lines.append(
            f"| {k} | {t['ours_ar']:.0f} [{s['ours_ar'][0]:.0f}-{s['ours_ar'][1]:.0f}] | {t['ours_sd']:.0f} "
            f"[{s['ours_sd'][0]:.0f}-{s['ours_sd'][1]:.0f}] | {r['mat']:.2f} | {t['hf']:.0f} | {t['hf_assisted']:.0f} "
            f"[{s['hf_assisted'][0]:.0f}-{s['hf_assisted'][1]:.0f}] | {r['hf_assisted_mat']:.2f} | "
            f"{r['ours_over_hf_assisted']:.2f} | {r['t_verify_ms']:.2f} ({r['v']:.2f}) | {r['analytic_tps']:.0f} | "
            f"{r['efficiency']:.2f} | {r['time_split']['draft']:.0%} / {r['time_split']['target']:.0%} |")
    prof = [(k, r["profile"]) for k, r in res["ks"].items() if "profile" in r]
    if prof:
        lines += ["", "Profile of one generation (torch.profiler, per round):", "",
                  "| K | rounds | wall ms | host syncs | D2H copies | H2D copies | .item() | kernel launches "
                  "| GPU busy | propose ms | target probs ms | verify ms |", "| ---: " * 12 + "|"]
        for k, p in prof:
            lines.append(
                f"| {k} | {p['rounds']} | {p['wall_ms']:.0f} | {p['syncs_per_round']:.1f} | {p['d2h_copies_per_round']:.1f} | "
                f"{p['h2d_copies_per_round']:.1f} | {p['item_calls_per_round']:.1f} | {p['kernel_launches_per_round']:.0f} | "
                f"{p['gpu_busy_fraction']:.0%} | {p['propose_ms_per_round']:.2f} | {p['target_probs_ms_per_round']:.2f} | "
                f"{p['verify_ms_per_round']:.2f} |")
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--synthetic", action="store_true")
    parser.add_argument("--target")
    parser.add_argument("--drafter")
    parser.add_argument("--prompt-set")
    parser.add_argument("--domain", default="math")
    parser.add_argument("--n-prompts", type=int, default=4)
    parser.add_argument("--k", type=int, nargs="+", default=[4])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--label", default="")
    parser.add_argument("--json")
    parser.add_argument("--profile", help="write the profiler tables to PREFIX.kK.txt")
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    if not args.synthetic and not (args.target and args.drafter):
        parser.error("give --synthetic, or --target and --drafter")
    res = bench(args)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(res, indent=1))
    from benchmarks.harness.publish import publish  # noqa: E402

    publish(table(res, argv), write=not args.no_append)
    return 0


if __name__ == "__main__":
    sys.exit(main())
