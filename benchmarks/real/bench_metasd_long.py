"""MetaSD-UCB on long generations: the bandit's MAT against the best drafter chosen in hindsight (MetaSD Table 3).

The evaluate stage decodes 48 tokens a prompt to fit its time budget, too few rounds for a bandit to settle on a
drafter. MetaSD's claim is about long generations: over enough rounds, MetaSD-UCB (block-divergence reward) comes
close to the drafter that turns out best for the prompt. This script decodes each test prompt of a finished run
up to --tokens new tokens, greedily, once with every drafter of the bundle at fixed K and once with MetaSD-UCB
over the specialised drafters (N_max = K, the evaluate stage's bandit, seeded as it seeds it), all through the
one-prompt loop (`generate_speculative`), and prints per domain and pooled:
  - each drafter's MAT (tokens per target forward) and the bandit's;
  - the bandit's MAT as a fraction of the domain's best single drafter (chosen in hindsight, OFA included) and of
    each prompt's own best arm, with 90% bootstrap intervals over prompts (`decoding.timing.bootstrap_rate_ratio`);
  - the domain's own drafter's MAT as a fraction of the OFA drafter's (MetaSD Table 3's premise: specialists earn
    their place).
MAT is counted (a forward is a forward whatever the box's load), so the figures are exact for these prompts.
A real chat model's answers often end long before 256 tokens; with --ignore-eos every generation runs to
--tokens (the target writes on past its answer's end of turn). Every greedy decode of a prompt must give the same
tokens (each equals the target's greedy output); the table says how many prompts did. In bf16 the one-prompt loop has
no verify floor and decodes can part where a step's width rounds the target's logits otherwise: once every prompt
is decoded, each method's first divergence from the prompt's first decode is judged a near-tie or not
(decoding/near_ties.py, against an fp32 copy of the target), and the table counts them. Each finished prompt is
appended to RUN/bench_metasd_long.jsonl, so a killed run resumes with the next prompt; the section holds a table
for each EOS setting decoded for these prompts, and --render-only prints it from that file alone.

    python benchmarks/real/bench_metasd_long.py runs/real --config configs/real.yaml [--prompts 4] [--tokens 256] [--ignore-eos]

Writes the tables as this script's section of benchmarks/real/RESULTS.md (--no-append: print only; --section NAME: another
section, for another run than make real's).
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

import torch  # noqa: E402

from specdraft.core.devices import device_name  # noqa: E402
from specdraft.core.hashing import derive_seed  # noqa: E402
from specdraft.data.chat import chat_format  # noqa: E402
from specdraft.decoding.bandits.selectors import make_selector  # noqa: E402
from specdraft.decoding.bundle.chat import end_of_turn_ids  # noqa: E402
from specdraft.decoding.bundle.directory import load_bundle  # noqa: E402
from specdraft.decoding.near_ties import classify, fp32_copy  # noqa: E402
from specdraft.decoding.rounds.sampling import SamplingConfig  # noqa: E402
from specdraft.decoding.speculative import generate_speculative, generate_with_drafter  # noqa: E402
from specdraft.decoding.speculators.drafter import DrafterSpeculator  # noqa: E402
from specdraft.decoding.speculators.multi_drafter import Arm, MultiDrafterSpeculator  # noqa: E402
from specdraft.drafters.roles import drafter_roles  # noqa: E402
from specdraft.pipelines.config import load_config  # noqa: E402
from specdraft.decoding.timing import bootstrap_rate_ratio  # noqa: E402
from specdraft.pipelines.evaluate.load import load_prompts  # noqa: E402
from specdraft.pipelines.evaluate.plan import fixed_k_policy  # noqa: E402
from specdraft.pipelines.schema import BANDITS, EvaluateSection, RunConfig  # noqa: E402
from benchmarks.harness.publish import add_section_flags, publish_for  # noqa: E402

BANDIT = "ucb-bd"  # MetaSD-UCB with its block-divergence reward (evaluate's `ucb-bd`)
GREEDY = SamplingConfig(temperature=0.0)


def bandit(drafters: dict, arms: list[str], k: int, beta: float, seed: int) -> MultiDrafterSpeculator:
    """MetaSD-UCB over one fixed-K arm per drafter, as the evaluate stage builds it (`plan.make_bandit`)."""
    _, selector, reward = BANDITS[BANDIT]
    built = [Arm(n, DrafterSpeculator(drafters[n], fixed_k_policy(k)), drafter_key=n) for n in arms]
    return MultiDrafterSpeculator(built, make_selector(selector, len(built), seed=seed, beta=beta), reward=reward,
                                  n_max=k)


def decode_prompt(target, drafters: dict, arms: list[str], prompt, tokens: int, k: int, beta: float, seed: int,
                  eos) -> dict:
    """One row: every drafter at fixed K and the bandit on this prompt -> {method: (generated, target forwards)},
    and whether all of them gave the same tokens."""
    results = {n: generate_with_drafter(target, d, prompt.ids, tokens, GREEDY, k=k, eos_token_id=eos)
               for n, d in drafters.items()}
    results[BANDIT] = generate_speculative(target, bandit(drafters, arms, k, beta, derive_seed(seed, prompt.id, BANDIT)),
                                           prompt.ids, tokens, GREEDY, eos)
    counts = {n: (res.metrics.n_generated, res.metrics.n_target) for n, res in results.items()}
    outputs = {n: list(res.tokens) for n, res in results.items()}
    first = next(iter(outputs.values()))
    return {"domain": prompt.domain, "id": prompt.id, "counts": counts,
            "same_tokens": all(o == first for o in outputs.values()), "outputs": outputs}


def judge_divergences(target, row: dict, prompt_ids: list[int], k: int, reference) -> list[dict]:
    """Every method's first divergence from the row's first decode (in bf16 the one-prompt loop has no verify floor,
    so the target's greedy choice can flip with the step's width), judged a near-tie or not (decoding/near_ties.py):
    one list entry per method that differs."""
    first, *rest = row["outputs"].items()
    out = []
    for name, tokens in rest:
        d = classify(target, prompt_ids, tokens, first[1], k + 1, reference=reference)
        if d is not None:
            out.append({"method": name, "against": first[0], "position": d.position, "gap": round(d.gap, 4),
                        "delta": round(d.delta, 4), "near_tie": d.near_tie})
    return out


def same_tokens_cell(rows: list[dict]) -> str:
    """How many prompts decoded alike with every method, and how many divergences were judged near-ties."""
    cell = f"{sum(r['same_tokens'] for r in rows)}/{len(rows)}"
    if any("divergences" not in r for r in rows if not r["same_tokens"]):
        return cell + " (divergences not judged)"
    found = [d for r in rows for d in r.get("divergences", [])]
    return cell + (f"; {sum(d['near_tie'] for d in found)} of {len(found)} divergences near-ties" if found else "")


def counts_of(row: dict, method: str | dict) -> tuple[int, int]:
    """(generated, target forwards) of `method` on the row: a name, or domain -> name (each domain's pick)."""
    return tuple(row["counts"][method[row["domain"]] if isinstance(method, dict) else method])


def pooled_mat(rows: list[dict], method: str | dict) -> float:
    """Tokens over target forwards, summed over rows."""
    made, calls = (sum(c) for c in zip(*(counts_of(r, method) for r in rows)))
    return made / calls if calls else 0.0


def best_arm(row: dict, arms: list[str]) -> tuple[int, int]:
    """The counts of the prompt's own best arm (the ceiling a bandit over `arms` could reach on it)."""
    return max((counts_of(row, a) for a in arms), key=lambda c: c[0] / c[1] if c[1] else 0.0)


def best_single(rows: list[dict], drafters: list[str]) -> dict[str, str]:
    """Domain -> the drafter with the highest pooled MAT on that domain's rows (chosen in hindsight)."""
    domains = sorted({r["domain"] for r in rows})
    return {d: max(drafters, key=lambda n: pooled_mat([r for r in rows if r["domain"] == d], n)) for d in domains}


def ratio_cell(rows: list[dict], num, den) -> str:
    """Pooled MAT of `num` over that of `den` (each row -> its counts) with a 90% interval over prompts."""
    s = bootstrap_rate_ratio([(*num(r), *den(r)) for r in rows])
    return f"{s.median:.3f} [{s.lo:.3f}, {s.hi:.3f}]"


def domain_rows(rows: list[dict], drafters: list[str], arms: list[str], own: dict[str, str], ofa: str | None
                ) -> list[str]:
    """The table: per domain and pooled, each drafter's MAT, the bandit's and its two fractions, and the domain's
    own drafter over OFA (pooled: each prompt's own drafter)."""
    picks = best_single(rows, drafters)
    lines = ["| domain | prompts | mean tokens | " + " | ".join(f"{n} MAT" for n in drafters)
             + f" | {BANDIT} MAT | best single (hindsight) | bandit / best single [90%] | "
             "bandit / per-prompt best arm [90%] | own drafter / OFA [90%] | same tokens |",
             "| --- | ---: | ---: |" + " ---: |" * len(drafters) + " ---: | --- | ---: | ---: | ---: | ---: |"]
    for domain in sorted(picks) + ["all"]:
        rs = rows if domain == "all" else [r for r in rows if r["domain"] == domain]
        pick = picks if domain == "all" else picks[domain]
        vs_single = ratio_cell(rs, lambda r: counts_of(r, BANDIT), lambda r: counts_of(r, pick))
        vs_prompt = ratio_cell(rs, lambda r: counts_of(r, BANDIT), lambda r: best_arm(r, arms))
        mine = [r for r in rs if r["domain"] in own]
        vs_ofa = "-" if ofa is None or not mine else ratio_cell(mine, lambda r: counts_of(r, own),
                                                                 lambda r: counts_of(r, ofa))
        mean_tokens = sum(r["counts"][BANDIT][0] for r in rs) / len(rs)
        lines.append(f"| {domain} | {len(rs)} | {mean_tokens:.0f} | "
                     + " | ".join(f"{pooled_mat(rs, n):.3f}" for n in drafters)
                     + f" | {pooled_mat(rs, BANDIT):.3f} | {'per domain' if domain == 'all' else pick} | "
                     + f"{vs_single} | {vs_prompt} | {vs_ofa} | "
                     + f"{same_tokens_cell(rs)} |")
    return lines


def render(args, tables: dict[bool, list[dict]], drafters: list[str], arms: list[str], own: dict[str, str],
           ofa: str | None) -> str:
    """The section: one table per EOS setting whose rows are all decoded (ignore_eos -> rows)."""
    seconds = sum(r["seconds"] for rows in tables.values() for r in rows)
    lines = [f"## MetaSD-UCB on long generations ({datetime.date.today()}, {device_name('cpu')}, torch threads "
             f"{torch.get_num_threads()}, run {args.run})", "",
             f"`python benchmarks/real/bench_metasd_long.py {args.run} --config {args.config} --prompts {args.prompts} "
             f"--tokens {args.tokens} --k {args.k} [--ignore-eos]`: {args.prompts} test prompts per domain, greedy, up "
             f"to {args.tokens} new tokens, every drafter at K = {args.k} and MetaSD-UCB (BD reward, beta {args.beta}) "
             f"over {', '.join(arms)} with N_max = {args.k}; counted; {seconds:.0f} s of decoding in all.", ""]
    for ignore_eos, rows in tables.items():
        lines += [("EOS ignored: every generation runs to the token limit, past the answer's end of turn (the target "
                   "writes on), the long-generation regime MetaSD's claim is about:" if ignore_eos else
                   "Generations end at the end of turn, as the evaluate stage's do:"), "",
                  *domain_rows(rows, drafters, arms, own, ofa), ""]
    return "\n".join(lines)


def finished_rows(path: Path, setting: dict) -> dict[str, dict]:
    """Prompt id -> its row from earlier runs with the same setting (a killed run resumes after them)."""
    if not path.is_file():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["id"]: r for r in rows if r["setting"] == setting}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", help="a finished run directory with bundle/ and prompts/")
    ap.add_argument("--config", default="configs/real.yaml", help="the run's config (its prompt format)")
    ap.add_argument("--prompts", type=int, default=4, help="test prompts per domain")
    ap.add_argument("--tokens", type=int, default=256, help="max_new_tokens")
    ap.add_argument("--k", type=int, default=4, help="K of every arm and the bandit's N_max")
    ap.add_argument("--beta", type=float, default=EvaluateSection.beta, help="MetaSD-UCB exploration strength")
    ap.add_argument("--ignore-eos", action="store_true", help="generate to --tokens past the end of turn")
    ap.add_argument("--render-only", action="store_true", help="the table from RUN/bench_metasd_long.jsonl alone")
    add_section_flags(ap)  # --section: another run's section beside make real's (e.g. the real pair's)
    args = ap.parse_args()
    run = Path(args.run)
    cfg = load_config(RunConfig, args.config, [f"run.root={run}"])
    bundle = load_bundle(run / "bundle")
    tok = bundle.load_tokenizer()
    ecfg = EvaluateSection(sets=["test"], prompts_per_domain=args.prompts)
    prompts = load_prompts(run / "prompts", ecfg, tok, ecfg.max_prompt_tokens, [], chat_format(cfg.prompts))
    setting = {"tokens": args.tokens, "k": args.k, "beta": args.beta, "seed": cfg.run.seed,
               "ignore_eos": args.ignore_eos}
    store = run / "bench_metasd_long.jsonl"
    done = finished_rows(store, setting)
    todo = [p for p in prompts if p.id not in done]
    if todo and args.render_only:
        print(f"bench_metasd_long: {len(todo)} of {len(prompts)} prompts are not in {store}; run without --render-only",
              file=sys.stderr)
        raise SystemExit(2)
    roles = drafter_roles({d.name: d.domains for d in bundle.drafters.values()})
    arms = sorted(set(roles.own.values()))  # the bandit's arms as evaluate's `bandit_arms: specialists` picks them
    if todo:
        decode_all(bundle, tok, todo, arms, args, setting, store, cfg.run.seed)
    if not args.render_only:
        judge_store(lambda: bundle.load_target(device="cpu"), {p.id: list(p.ids) for p in prompts}, args.k, store,
                    setting)
    tables = {}
    for ignore_eos in (False, True):  # both settings' tables where both are decoded, the one just run at least
        rows = finished_rows(store, dict(setting, ignore_eos=ignore_eos))
        if all(p.id in rows for p in prompts):
            tables[ignore_eos] = [rows[p.id] for p in prompts]
    publish_for(render(args, tables, list(bundle.drafters), arms, roles.own, roles.ofa), not args.no_append, Path(__file__),
                args.section, args.page)


def decode_all(bundle, tok, prompts: list, arms: list[str], args, setting: dict, store: Path, seed: int) -> None:
    """Decode `prompts`, appending each finished one's row (with `setting`) to `store`."""
    target = bundle.load_target(device="cpu")
    drafters = {n: bundle.load_drafter(n, device="cpu", target=target) for n in bundle.drafters}
    eos = None if setting["ignore_eos"] else end_of_turn_ids(tok, target)  # as the evaluate stage ends one
    start = time.perf_counter()
    for i, p in enumerate(prompts):
        t0 = time.perf_counter()
        row = decode_prompt(target, drafters, arms, p, args.tokens, args.k, args.beta, seed, eos)
        row.update(setting=setting, seconds=round(time.perf_counter() - t0, 1))
        with store.open("a") as out:
            out.write(json.dumps(row) + "\n")
        print(f"[{time.perf_counter() - start:6.0f}s] {i + 1}/{len(prompts)} {p.domain} {p.id}: "
              f"{row['counts'][BANDIT][0]} tokens", file=sys.stderr)


def judge_store(load_target, prompt_ids: dict[str, list[int]], k: int, store: Path, setting: dict) -> None:
    """Judge the divergences of every row of `store` with `setting` decoded with its outputs and not yet judged
    (a resumed run's too), then rewrite the store atomically (a killed judgement leaves the decodes as they were).
    The target is loaded (`load_target()`) only when a row waits, alone: its fp32 copy (7 GB for the pair's 1.5B)
    takes the drafters' place."""
    rows = [json.loads(line) for line in store.read_text().splitlines() if line.strip()] if store.is_file() else []
    todo = [r for r in rows if r["setting"] == setting and r["id"] in prompt_ids and "outputs" in r
            and "divergences" not in r]
    if not todo:
        return
    target = load_target()
    reference = fp32_copy(target) if any(not r["same_tokens"] for r in todo) else None
    for r in todo:
        r["divergences"] = [] if r["same_tokens"] else judge_divergences(target, r, prompt_ids[r["id"]], k, reference)
    tmp = store.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(store)


if __name__ == "__main__":
    main()
