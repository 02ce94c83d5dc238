"""Speculative cascades on the demo world: quality vs relative latency as alpha sweeps (Faster Cascades via
Speculative Decoding, Figure 2 and Table 2).

For every test prompt of each scored domain (data/quality.py), at T = 1 and T = 0.5 with block size
gamma = 5, this decodes with the target alone, the drafter alone (the domain's drafter from the bundle), and
every cascade setting (decoding/cascades.py `sweep`: rule x alpha), all from the same seed per prompt
(common random numbers), interleaved prompt by prompt in a rotating order so load drift hits every method
alike. It records quality against the references, the process CPU time of each generation and the exact
counts (N_target, N_draft). Then it prints:
  1. the sweep: per method and alpha, quality and latency per generated token relative to the target
     alone (methods stop at EOS at different lengths), timed (CPU time, with the inter-quartile range of
     the per-prompt ratios) and counted (the SpecDec++ cost model t_draft N_draft + t_target N_target,
     fitted by least squares over all generations here)
  2. Table 2: per domain, the latency reduction when matching the target's quality, and the best quality
     reached without exceeding the target's latency (measured sweep points only, no interpolation)
  3. which method leads Table 2 per domain and temperature
and writes Figure 2 (quality vs relative latency, one panel per domain and temperature) as a PNG.

    python benchmarks/families/bench_cascades.py RUN_DIR [--prompts 8] [--tokens 48] [--temperatures 1 0.5]
        [--rules chow diff opt token_v3 lossy bild token_chow seq_chow] [--alphas opt=0,0.5,1 ...]
        [--figure benchmarks/families/cascades_figure2.png] [--json out.json] [--no-append]

RUN_DIR holds bundle/ and prompts/ (a finished `specdraft run`). Writes the tables as this script's section of RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

import torch  # noqa: E402

from specdraft.data.chat import row_messages  # noqa: E402
from specdraft.decoding.bundle.chat import format_prompt  # noqa: E402  # prompts as the pipeline serves them
from specdraft.data.prompts import load_prompt_sets  # noqa: E402
from specdraft.data.quality import PRIMARY_METRIC, SCORED_DOMAINS, score_set  # noqa: E402
from specdraft.decoding.autoregressive import generate_autoregressive  # noqa: E402
from specdraft.decoding.bundle.directory import load_bundle  # noqa: E402
from specdraft.decoding.cascades import DISPLAY_NAMES, canonical_rule, sweep  # noqa: E402
from specdraft.decoding.costs.model import fit_costs  # noqa: E402
from specdraft.decoding.rounds.sampling import SamplingConfig  # noqa: E402
from benchmarks.harness.timing import rotated  # noqa: E402
from benchmarks.harness.publish import publish  # noqa: E402

MAIN_RULES = ("seq_chow", "token_chow", "lossy", "bild", "chow", "diff", "opt", "token_v3")
TARGET, DRAFTER = "Target", "Drafter"


def parse_alphas(items: list[str]) -> dict:
    out = {}
    for item in items:
        rule, _, values = item.partition("=")
        out[canonical_rule(rule)] = tuple(float(v) for v in values.split(",") if v)
    return out


def drafter_for(bundle, domain: str) -> str:
    """The bundle's specialist for the domain, else a drafter trained on every domain, else the first."""
    for name, d in bundle.drafters.items():
        if d.domains == [domain]:
            return name
    return next((n for n, d in bundle.drafters.items() if domain in d.domains), next(iter(bundle.drafters)))


def run_sweep(args) -> list[dict]:
    bundle = load_bundle(Path(args.run) / "bundle")
    sets = load_prompt_sets(Path(args.run) / "prompts")
    tok = bundle.load_tokenizer()
    target = bundle.load_target(device="cpu")
    drafters = {}
    plan = sweep(args.rules, parse_alphas(args.alphas), args.temperatures)
    rows = []
    test = sets["test"]
    n_configs = len(plan) + 2 * len(args.temperatures)
    start = time.perf_counter()
    for domain in args.domains:
        examples = [r for r in test if r["domain"] == domain][: args.prompts]
        name = drafter_for(bundle, domain)
        if name not in drafters:
            drafters[name] = bundle.load_drafter(name, device="cpu", target=target)
        drafter = drafters[name]
        for i, ex in enumerate(examples):
            ids = format_prompt(tok, row_messages(ex))
            configs = [(None, SamplingConfig(t), who) for t in args.temperatures for who in (TARGET, DRAFTER)]
            configs += [(m, s, m.name) for m, s in plan]
            # rotate the order prompt by prompt
            for method, sampling, label in rotated(configs, i * 7 + len(rows)):
                seed = args.seed * 100_003 + zlib.crc32(f"{domain}/{i}/{sampling.temperature}".encode()) % 100_000
                gen = torch.Generator().manual_seed(seed)
                c0 = time.process_time()
                if method is None:
                    model = target if label == TARGET else drafter
                    res = generate_autoregressive(model, ids, args.tokens, sampling, tok.eos_token_id, gen)
                    n_draft, n_target = (0, res.metrics.n_target) if label == TARGET else (res.metrics.n_target, 0)
                else:
                    res = method.generate(target, drafter, ids, args.tokens, sampling, args.gamma, tok.eos_token_id, gen)
                    n_draft, n_target = res.metrics.n_draft, res.metrics.n_target
                cpu = time.process_time() - c0
                rows.append({"domain": domain, "drafter": name, "prompt": i, "T": sampling.temperature, "method": label,
                             "rule": method.rule if method else label, "alpha": method.alpha if method else None,
                             "text": tok.decode(res.tokens, skip_special_tokens=True), "reference": ex["response"],
                             "N": res.metrics.n_generated, "N_target": n_target, "N_draft": n_draft,
                             "cpu_s": cpu, "wall_s": res.metrics.time_total})
        done = len(rows) / (n_configs * args.prompts * len(args.domains))
        print(f"[{time.perf_counter() - start:6.0f}s] {domain} done ({done:.0%})", file=sys.stderr)
    return rows


def summarise(rows: list[dict]) -> tuple[list[dict], object]:
    """One point per (T, domain, method, alpha): quality, timed and counted relative latency."""
    fit = fit_costs((r["N_draft"], r["N_target"], r["cpu_s"]) for r in rows)
    base = {(r["T"], r["domain"], r["prompt"]): r for r in rows if r["method"] == TARGET}
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["T"], r["domain"], r["method"], r["rule"], r["alpha"]), []).append(r)
    points = []
    for (t, domain, method, rule, alpha), rs in groups.items():
        bs = [base[(t, domain, r["prompt"])] for r in rs]
        q = score_set(domain, [r["text"] for r in rs], [r["reference"] for r in rs])
        # per generated token: methods stop at EOS at different lengths, and a longer output is not slower decoding
        per_tok = lambda r, v: v / max(1, r["N"])  # noqa: E731
        ratios = sorted(per_tok(r, r["cpu_s"]) / per_tok(b, b["cpu_s"]) for r, b in zip(rs, bs))
        n, n_base = sum(r["N"] for r in rs), sum(b["N"] for b in bs)
        counted = sum(fit.predict_total(r["N_draft"], r["N_target"]) for r in rs) / max(1, n)
        counted_base = sum(fit.predict_total(b["N_draft"], b["N_target"]) for b in bs) / max(1, n_base)
        timed = (sum(r["cpu_s"] for r in rs) / max(1, n)) / (sum(b["cpu_s"] for b in bs) / max(1, n_base))
        points.append({"T": t, "domain": domain, "method": method, "rule": rule, "alpha": alpha,
                       "quality": q[PRIMARY_METRIC[domain]], "scores": q,
                       "latency": timed,
                       "latency_iqr": (ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]),
                       "latency_counted": counted / counted_base,
                       "N": n, "N_target_per_token": sum(r["N_target"] for r in rs) / max(1, n),
                       "N_draft_per_token": sum(r["N_draft"] for r in rs) / max(1, n)})
    return points, fit


def method_order(points):
    names = [DISPLAY_NAMES[r] for r in DISPLAY_NAMES]
    return [TARGET, DRAFTER] + [n for n in names if any(p["method"] == n for p in points)]


def sweep_table(points, t: float) -> list[str]:
    domains = [d for d in SCORED_DOMAINS if any(p["domain"] == d for p in points)]
    lines = [f"T = {t:g}: quality (metric) / relative latency timed [IQR of per-prompt ratios] / counted",
             "", "| method | alpha | " + " | ".join(f"{d} ({PRIMARY_METRIC[d]})" for d in domains) + " |",
             "| --- | ---: |" + " --- |" * len(domains)]
    for method in method_order(points):
        alphas = sorted({p["alpha"] for p in points if p["method"] == method and p["T"] == t},
                        key=lambda a: -1e9 if a is None else a)
        for a in alphas:
            cells = []
            for d in domains:
                p = next(x for x in points if x["T"] == t and x["domain"] == d and x["method"] == method
                         and x["alpha"] == a)
                lo, hi = p["latency_iqr"]
                cells.append(f"{p['quality']:.1f} / {p['latency']:.2f} [{lo:.2f}-{hi:.2f}] / {p['latency_counted']:.2f}")
            lines.append(f"| {method} | {'-' if a is None else f'{a:g}'} | " + " | ".join(cells) + " |")
    return lines


def table2(points, t: float, key: str = "latency") -> tuple[list[str], dict]:
    """Paper Table 2 at temperature t: speed-up (1 / relative latency) of the fastest point whose quality
    reaches the target's, and the best quality at relative latency <= 1."""
    domains = [d for d in SCORED_DOMAINS if any(p["domain"] == d for p in points)]
    methods = [m for m in method_order(points) if m not in (TARGET, DRAFTER)]
    lines = ["| method | " + " | ".join(f"speed-up at target quality: {d}" for d in domains) + " | "
             + " | ".join(f"best quality at latency <= 1: {d}" for d in domains) + " |",
             "| --- |" + " ---: |" * (2 * len(domains))]
    target_q = {d: next(p["quality"] for p in points if p["T"] == t and p["domain"] == d and p["method"] == TARGET)
                for d in domains}
    result = {}
    for m in methods:
        speed, best = [], []
        for d in domains:
            pts = [p for p in points if p["T"] == t and p["domain"] == d and p["method"] == m]
            ok = [p[key] for p in pts if p["quality"] >= target_q[d]]
            under = [p["quality"] for p in pts if p[key] <= 1.0]
            s = 1.0 / min(ok) if ok else None
            b = max(under) if under else None
            result[(m, d)] = (s, b)
            speed.append("-" if s is None else f"{s:.2f}x")
            best.append("-" if b is None else f"{b:.1f}")
        lines.append(f"| {m} | " + " | ".join(speed) + " | " + " | ".join(best) + " |")
    lines.append("| (target quality) | " + " | ".join("" for _ in domains) + " | "
                 + " | ".join(f"{target_q[d]:.1f}" for d in domains) + " |")
    return lines, result


def leaders(result: dict, domains) -> list[str]:
    """Per domain: the methods ranked by speed-up at the target's quality, ties broken by best quality."""
    out = []
    for d in domains:
        ranked = sorted({m for m, dd in result if dd == d},
                        key=lambda m: (-(result[(m, d)][0] or 0.0), -(result[(m, d)][1] or -1.0)))
        top = [f"{m} ({'-' if result[(m, d)][0] is None else f'{result[(m, d)][0]:.2f}x'}, "
               f"{'-' if result[(m, d)][1] is None else f'{result[(m, d)][1]:.1f}'})" for m in ranked[:3]]
        out.append(f"- {d}: " + " > ".join(top))
    return out


def figure(points, temperatures, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    domains = [d for d in SCORED_DOMAINS if any(p["domain"] == d for p in points)]
    fig, axes = plt.subplots(len(temperatures), len(domains), figsize=(4.2 * len(domains), 3.6 * len(temperatures)),
                             squeeze=False)
    methods = method_order(points)
    for i, t in enumerate(temperatures):
        for j, d in enumerate(domains):
            ax = axes[i][j]
            for m in methods:
                pts = sorted((p for p in points if p["T"] == t and p["domain"] == d and p["method"] == m),
                             key=lambda p: p["latency"])
                if not pts:
                    continue
                xs, ys = [p["latency"] for p in pts], [p["quality"] for p in pts]
                if m == TARGET:
                    ax.axhline(ys[0], ls=":", color="k", label="Target quality")
                    continue
                style = dict(marker="*", ms=10, ls="") if m == DRAFTER else dict(marker="o", ms=3)
                ax.plot(xs, ys, label=m, **style)
            ax.set_title(f"{d}, T = {t:g}, gamma = 5")
            ax.set_xlabel("latency relative to the target alone (CPU time)")
            ax.set_ylabel(PRIMARY_METRIC[d])
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", help="a finished run directory with bundle/ and prompts/")
    ap.add_argument("--prompts", type=int, default=8, help="test prompts per domain")
    ap.add_argument("--tokens", type=int, default=48, help="max new tokens per prompt")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.5])
    ap.add_argument("--gamma", type=int, default=5, help="block size of the speculative methods (paper: 5)")
    ap.add_argument("--rules", nargs="+", default=list(MAIN_RULES))
    ap.add_argument("--alphas", nargs="*", default=[], help="per rule: RULE=a,b,c (default decoding.cascades.DEFAULT_ALPHAS)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--figure", default=str(Path(__file__).resolve().parent / "cascades_figure2.png"))
    ap.add_argument("--json", default=None, help="also write every generation and point here")
    ap.add_argument("--domains", nargs="+", default=list(SCORED_DOMAINS), choices=SCORED_DOMAINS)
    ap.add_argument("--from-json", nargs="+", default=None,
                    help="summarise the rows of earlier --json files (e.g. one process per domain) instead of decoding")
    ap.add_argument("--note", default="", help="a sentence for the published section (e.g. what the drafter is)")
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # one core per process on a shared box; CPU time then tracks the work done
    if args.from_json:
        rows = [r for path in args.from_json for r in json.loads(Path(path).read_text())["rows"]]
    else:
        rows = run_sweep(args)
    points, fit = summarise(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "points": points}, indent=1))
    figure(points, args.temperatures, Path(args.figure))
    domains = [d for d in SCORED_DOMAINS if any(p["domain"] == d for p in points)]
    swept: dict = {}  # from the rows themselves, so --from-json reports what was run
    for r in rows:
        if r["alpha"] is not None:
            swept.setdefault(r["method"], set()).add(r["alpha"])
    per_domain = {d: len({r["prompt"] for r in rows if r["domain"] == d}) for d in domains}
    out = [f"## Speculative cascades: quality vs latency ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
           f"{platform.machine()}, {torch.get_num_threads()} thread)", "",
           f"`python benchmarks/families/bench_cascades.py {' '.join(sys.argv[1:]) if argv is None else ' '.join(argv)}`. "
           "Test prompts per domain: " + ", ".join(f"{d} {n}" for d, n in per_domain.items())
           + f"; up to {args.tokens} new tokens; gamma = {args.gamma}; drafters: "
           + ", ".join(sorted({f"{r['domain']} -> {r['drafter']}" for r in rows})) + "; alphas: "
           + "; ".join(f"{m} {','.join(f'{a:g}' for a in sorted(v))}" for m, v in swept.items())
           + ". SeqCascade uses the per-token geometric-mean confidence. Latency = process CPU time per generated "
           f"token relative to the target alone on the same prompts and seeds; counted = the cost model "
           f"t_draft N_draft + t_target N_target fitted here (t_draft = {fit.t_draft * 1e3:.2f} ms, "
           f"t_target = {fit.t_target * 1e3:.2f} ms, R^2 = {fit.r2:.2f}, {fit.n_rows} generations). " + args.note, ""]
    for t in args.temperatures:
        out += sweep_table(points, t) + [""]
    for t in args.temperatures:
        for key, what in (("latency", "timed"), ("latency_counted", "counted")):
            lines, result = table2(points, t, key)
            out += [f"Table 2 at T = {t:g} ({what} latency):", ""] + lines + [""]
            out += [f"Ranking at T = {t:g} ({what}; speed-up at target quality, then best quality):"] + \
                leaders(result, domains) + [""]
    out.append(f"Figure 2 shape: `{Path(args.figure).name}` (quality vs relative latency per domain and T).")
    publish("\n".join(out) + "\n", write=not args.no_append)
    return 0


if __name__ == "__main__":
    sys.exit(main())
