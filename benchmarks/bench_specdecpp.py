"""SpecDec++ before / after Algorithm 1 order, counted on real greedy decodes of a tiny pair.

    python benchmarks/bench_specdecpp.py [--before e23522e] [--prompts 16] [--max-new-tokens 48] [--c 0.2]
        [--no-append]

Runs the same measurement twice, in two subprocesses: once on `decoding/` and `heads/` of the commit
--before (extracted with `git archive` into a temp dir) and once on this checkout. Each run builds the
same seeded tiny pair (a 4-layer random Llama target and a noisy copy as drafter), decodes the same
prompts greedily with fixed K = 1..8, the hindsight oracle (Theorem 4.1) and SpecDec++ with the same
acceptance head (logistic regression on the drafter's final hidden states, fitted on teacher-forced
greedy agreement of half the prompts; the other half is decoded) at h in {0.1, 0.3, 0.5, 0.7, 0.9}.

Per policy: N_draft / N, MAT = N / N_target, the Lemma 3.1 gap N_draft + N_target - N - N_discarded,
and the Eq. 5.1 cost per generated token in target-forward units, (c N_draft + N_target) / N, against
the best fixed K and against the oracle; for SpecDec++ also the cost `heads/simulate.py` predicts for
that h on the decoded sequences (teacher-forced agreement as labels, the head's outputs at the same
positions), which is what train-heads uses to choose h. Counts are exact; nothing is timed.
The simulator drafts up to the end of a response (as at EOS) while these decodes stop at a length
limit, so simulated and decoded counts may differ by one round per sequence even when they agree.

    python benchmarks/bench_specdecpp.py --run runs/demo --label before [--no-append]

reads a finished run instead (heads/sweep.json and report/metrics.json) and prints its SpecDec++ rows:
per drafter, greedy test set, N_draft / N, MAT, the Lemma 3.1 gap and the Eq. 5.1 cost per token (c from
sweep.json) against the drafter's best fixed K and its hindsight oracle, and per drafter and label
transform the simulated cost of the chosen head against the best fixed K (what train-heads reports).
Run it on a copy of the run before and after `train-heads --force` and `evaluate --force`.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
THRESHOLDS = (0.1, 0.3, 0.5, 0.7, 0.9)


def measure(args) -> dict:
    """One run on whatever `decoding` / `heads` come first on sys.path; returns JSON-able rows."""
    import copy

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdraft.decoding.rounds import kv
    from specdraft.decoding.autoregressive import generate_autoregressive
    from specdraft.decoding.metrics import aggregate
    from specdraft.decoding.rounds.sampling import SamplingConfig
    from specdraft.decoding.speculative import hindsight_oracle, generate_with_drafter
    from specdraft.decoding.policies.stopping import SpecDecPP
    from specdraft.heads.simulate import simulate_specdecpp

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    target = LlamaForCausalLM(cfg).eval()
    drafter = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in drafter.parameters():
            if p.dim() > 1:
                p.add_(torch.randn(p.shape, generator=gen) * 0.03 * p.std())
    greedy = SamplingConfig(temperature=0.0)
    n = args.max_new_tokens
    prompts = [torch.randint(0, 96, (int(torch.randint(3, 12, (1,), generator=gen)),), generator=gen).tolist()
               for _ in range(args.prompts)]
    refs = [generate_autoregressive(target, p, n, greedy).tokens for p in prompts]

    def teacher_forced(prompt, ref):
        """Drafter hidden states at response tokens X_1..X_n and greedy agreement with them."""
        with torch.inference_mode():
            logits, states = kv.forward(drafter, kv.new_cache(), prompt + ref, last=n + 1, hidden=True)
        agree = (logits[:-1].argmax(-1) == torch.tensor(ref)).double()  # position i: drafter's guess for X_i
        return states[1:], agree  # e_i sits at X_i's input position

    half = len(prompts) // 2
    feats = [teacher_forced(p, r) for p, r in zip(prompts, refs)]
    x = torch.cat([f[0] for f in feats[:half]])
    y = torch.cat([f[1] for f in feats[:half]]).float()
    head = torch.nn.Linear(x.shape[-1], 1)
    opt = torch.optim.Adam(head.parameters(), lr=0.05)
    for _ in range(300):  # logistic regression: sigmoid(head(e_i)) ~ P(X_i accepted)
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(head(x).squeeze(-1), y)
        loss.backward()
        opt.step()
    head.requires_grad_(False)
    test = list(zip(prompts[half:], refs[half:], feats[half:]))

    def row(name, results):
        m = aggregate(r.metrics for r in results)
        assert all(r.tokens == ref for r, (_, ref, _) in zip(results, test)), name  # greedy equality
        return {"policy": name, "N": m.n_generated, "N_target": m.n_target, "N_draft": m.n_draft,
                "N_discarded": m.n_discarded}

    rows = [row(f"fixed K={k}", [generate_with_drafter(target, drafter, p, n, greedy, k=k) for p, _, _ in test])
            for k in range(1, 9)]
    rows.append(row("hindsight oracle", [hindsight_oracle(target, drafter, p, n) for p, _, _ in test]))
    accept = [f[1] for _, _, f in test]
    sigma = [torch.sigmoid(head(f[0]).squeeze(-1)).double() for _, _, f in test]
    sims = simulate_specdecpp(accept, sigma, args.c, THRESHOLDS)
    for h, sim in zip(THRESHOLDS, sims):
        r = row(f"SpecDec++ h={h}", [generate_with_drafter(target, drafter, p, n, greedy, stopping=SpecDecPP(head, h))
                                     for p, _, _ in test])
        r["simulated_cost"] = sim.cost
        rows.append(r)
    return {"rows": rows}


def run_child(code: pathlib.Path, args) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code)}
    cmd = [sys.executable, __file__, "--child", str(code), "--prompts", str(args.prompts),
           "--max-new-tokens", str(args.max_new_tokens), "--c", str(args.c)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=code)
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(label: str, rows: list[dict], c: float) -> list[str]:
    cost = {r["policy"]: (c * r["N_draft"] + r["N_target"]) / r["N"] for r in rows}
    fixed = min((p for p in cost if p.startswith("fixed")), key=cost.get)
    oracle = cost["hindsight oracle"]
    lines = [f"**{label}** (best fixed K: {fixed}, cost/token {cost[fixed]:.3f}; oracle {oracle:.3f})", "",
             "| policy | N_draft/N | MAT | Lemma 3.1 gap | cost/token (Eq. 5.1) | vs best fixed K | vs oracle "
             "| simulated cost/token | simulated - decoded |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if not (r["policy"].startswith("SpecDec++") or r["policy"] in (fixed, "hindsight oracle")):
            continue
        gap = r["N_draft"] + r["N_target"] - r["N"] - r["N_discarded"]
        sim = r.get("simulated_cost")
        sim_cols = (f"{sim / r['N']:.3f} | {(sim / r['N'] - cost[r['policy']]) / cost[r['policy']]:+.1%}"
                    if sim is not None else "- | -")
        lines.append(f"| {r['policy']} | {r['N_draft'] / r['N']:.3f} | {r['N'] / r['N_target']:.2f} | {gap} "
                     f"| {cost[r['policy']]:.3f} | {cost[r['policy']] / cost[fixed]:.3f} "
                     f"| {cost[r['policy']] / oracle:.3f} | {sim_cols} |")
    return lines


def run_tables(run: pathlib.Path, label: str, report: str = "report") -> str:
    """SpecDec++ rows of a finished run (see the module docstring). Rows carry method keys, not display
    names: the label comes from pipelines.evaluate.methods.label, as in report.md."""
    sys.path.insert(0, str(ROOT))
    from specdraft.pipelines.evaluate.methods import label as method_label

    sweep = json.loads((run / "heads" / "sweep.json").read_text())
    metrics = json.loads((run / report / "metrics.json").read_text())
    c = next(iter(next(iter(sweep.values())).values()))["cost"]["cost_ratio"]
    rows = [r for r in metrics["rows"] if r["mode"] == "greedy" and r["set"] == "test" and r["domain"] == "all"]
    lines = [f"**{label}: {run}**, evaluate (greedy, test set, all domains; c = {c:.3f} from sweep.json)", "",
             "| drafter | policy | N_draft/N | MAT | Lemma 3.1 gap | cost/token (Eq. 5.1) | vs best fixed K | vs oracle |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    cost = lambda r: (c * r["N_draft"] + r["N_target"]) / r["N"]  # noqa: E731
    for name in sorted({r["drafter"] for r in rows if r["family"] == "specdecpp"}):
        mine = [r for r in rows if r["drafter"] == name]
        fixed = [r for r in mine if r["family"] == "fixed"]
        oracle = next((r for r in mine if r["family"] == "oracle"), None)
        spec = next(r for r in mine if r["family"] == "specdecpp")
        best = min(fixed, key=cost) if fixed else None
        for r in (spec, best, oracle):
            if r is None:
                continue
            gap = r["N_draft"] + r["N_target"] - r["N"] - r["N_discarded"]
            vs_fixed = f"{cost(r) / cost(best):.3f}" if best else "-"
            vs_oracle = f"{cost(r) / cost(oracle):.3f}" if oracle else "-"
            lines.append(f"| {name} | {method_label(r)} | {r['N_draft'] / r['N']:.3f} | {r['N'] / r['N_target']:.2f} "
                         f"| {gap} | {cost(r):.3f} | {vs_fixed} | {vs_oracle} |")
    lines += ["", f"**{label}**, train-heads simulation on dev sequences (heads/sweep.json, chosen head and h):", "",
              "| drafter | labels | head | h | simulated cost | best fixed K | simulated vs fixed K | oracle ver. rate |",
              "| --- | --- | --- | ---: | ---: | --- | ---: | ---: |"]
    for name, by_tag in sorted(sweep.items()):
        for tag, s in sorted(by_tag.items()):
            head = next(h for h in s["heads"] if h["head"] == s["best_head"])
            sim = head["simulated"]
            fixed = s["best_fixed_k"]
            lines.append(f"| {name} | {tag} | {head['head']} | {head['threshold']:g} | {sim['cost']:.1f} "
                         f"| {fixed['cost']:.1f} ({fixed['policy']}) | {fixed['cost'] / sim['cost']:.3f}x "
                         f"| {s['oracle']['verification_rate']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="e23522e", help="git commit of the code before the change")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--c", type=float, default=0.2, help="cost ratio t_draft / t_target for Eq. 5.1")
    ap.add_argument("--no-append", action="store_true")
    ap.add_argument("--run", type=pathlib.Path, help="a finished run directory: print its SpecDec++ rows")
    ap.add_argument("--label", default="run", help="with --run: the label of its tables, e.g. before / after")
    ap.add_argument("--report", default="report", help="with --run: its evaluate output dir (evaluate.out)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from publish import publish

        publish(run_tables(args.run, args.label, args.report) + "\n", write=not args.no_append)
        return
    if args.child:
        sys.path.insert(0, args.child)
        print(json.dumps(measure(args)))
        return
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from publish import publish

    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before, "decoding", "heads"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        before = run_child(pathlib.Path(tmp), args)
    after = run_child(ROOT, args)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    text = "\n".join([
        f"## SpecDec++ in Algorithm 1 order: before ({args.before}) and after ({head})", "",
        f"`python benchmarks/bench_specdecpp.py --prompts {args.prompts} --max-new-tokens {args.max_new_tokens} "
        f"--c {args.c}`: greedy decodes of {args.prompts // 2} held-out prompts x {args.max_new_tokens} tokens, a "
        "seeded tiny pair (4-layer random Llama target, noisy copy drafter at 3% relative weight noise), one logistic-regression head. "
        "Exact counts, no timing; cost/token = (c N_draft + N_target) / N in target forwards. "
        "'simulated' is heads/simulate.py's cost for that h on the same sequences (what picks h).", "",
        *table("before", before["rows"], args.c), "", *table("after", after["rows"], args.c), ""])
    publish(text, write=not args.no_append)


if __name__ == "__main__":
    main()
