"""BanditSpec Table 1 and Table 2 on the demo world: model-free arms (prompt lookup, REST, suffix
decoding) beside the best drafter, alone and under UCBSpec / EXP3Spec.

    python benchmarks/families/bench_model_free.py /work/runs/demo-base [--bundle DIR] [--prompts 6] [--tokens 64]
        [--repeats 3] [--drafter ofa] [--no-append]

Per domain of the test prompt set (greedy, K = N_max = the bundle's k):
  Table 1  MAT (tokens per target call, exact), tokens/s timed (median over --repeats interleaved passes,
           with the min-max spread) and counted (tokens / (N_target t_T + N_draft t_D), t_T and t_D the
           median seconds of one target / drafter forward measured here), and the stopping-time regret of
           each bandit (BanditSpec §4: its target calls minus those of the prompt's best single arm).
  Table 2  per arm, memory and bytes read per generated token, counted from the sizes of what the arm
           keeps resident (target and drafter weights, their KV caches at the longest context, the
           datastore) and what it reads (weights per forward, KV per forward, suffix-array bytes the
           retrieval touched), normalised to the parametric drafter arm as BanditSpec Table 2 does.
The bandits use the throughput reward with each arm's measured cost per drafted token (BanditSpec §6.2;
decoding.speculators.multi_drafter), and UCBSpec also with the accepted length Y (BanditSpec Table 1's reward).

The datastore comes from the bundle (export ships it); a bundle exported without one is given one built
here from the run's distill_data (the build time is printed). Writes the tables as this script's section of benchmarks/families/RESULTS.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from specdraft.data.chat import row_messages  # noqa: E402
from specdraft.decoding.bundle.chat import format_prompt  # noqa: E402  # prompts as the pipeline serves them
from specdraft.decoding.speculators.arms import ArmResources, build_arms  # noqa: E402
from specdraft.decoding.autoregressive import generate_autoregressive  # noqa: E402
from specdraft.decoding.bundle.directory import load_bundle  # noqa: E402
from specdraft.decoding.speculators.datastore import SuffixIndex, build_datastore  # noqa: E402
from specdraft.decoding.defaults import DEFAULTS  # noqa: E402
from specdraft.decoding.speculators.multi_drafter import MultiDrafterSpeculator  # noqa: E402
from specdraft.decoding.rounds.sampling import SamplingConfig  # noqa: E402
from specdraft.decoding.bandits.selectors import make_selector  # noqa: E402
from specdraft.decoding.speculative import generate_speculative  # noqa: E402
from specdraft.decoding.speculators.suffix import SuffixSpeculator  # noqa: E402
from benchmarks.harness.timing import rotated  # noqa: E402
from benchmarks.harness.publish import publish  # noqa: E402

GREEDY = SamplingConfig(temperature=0.0)
SINGLE = ("lookup", "rest", "suffix")
BANDITS = (("UCBSpec (throughput)", "ucbspec", "throughput"), ("EXP3Spec (throughput)", "exp3spec", "throughput"),
           ("UCBSpec (accepted Y)", "ucbspec", "accepted"))


COPY_MARK = "Repeat after me"  # the demo chat domain's copying prompts, reported as their own group


def load_prompts(root: Path, tok, set_name: str, per_domain: int, max_prompt: int):
    """The first per_domain prompts of each domain; chat's repeat-after-me prompts form the group
    "chat-repeat" (up to per_domain of them, from all of the set's sets if need be)."""
    from specdraft.data.prompts import load_prompt_sets
    from specdraft.data.prompts import fit_prompt

    sets = load_prompt_sets(root / "prompts")
    rows, taken = [], {}
    for name in [set_name] + [s for s in sets if s != set_name]:
        for row in sets[name]:
            domain = row["domain"]
            if domain == "chat" and COPY_MARK in row["prompt"]:
                domain = "chat-repeat"
            elif name != set_name:
                continue  # other sets only top up the copying group
            if taken.get(domain, 0) < per_domain:
                taken[domain] = taken.get(domain, 0) + 1
                ids, _ = fit_prompt(format_prompt(tok, row_messages(row)), max_prompt, "truncate", row["id"])
                rows.append((domain, row["id"], row["prompt"], ids))
    return rows


def distill_greedy(target, tok, root: Path, per_domain: int, max_new_tokens: int) -> list[list[int]]:
    """The distill-data recipe at T = 0 on the first per_domain train prompts of each domain (for a run
    whose distill_data is gone): the target's own greedy responses, batched as the stage does."""
    from specdraft.data.prompts import load_prompt_sets
    from specdraft.data.prompts import fit_prompt
    from specdraft.data.generation import generate_responses

    taken, prompts = {}, []
    for row in load_prompt_sets(root / "prompts")["train"]:
        if taken.get(row["domain"], 0) < per_domain:
            taken[row["domain"]] = taken.get(row["domain"], 0) + 1
            prompts.append(fit_prompt(format_prompt(tok, row_messages(row)), 384, "truncate", row["id"])[0])
    out = []
    for b in range(0, len(prompts), 16):
        out += [resp for resp, _ in generate_responses(target, prompts[b:b + 16], tok.pad_token_id, tok.eos_token_id,
                                                    0.0, 0, 1.0, max_new_tokens, 0)]
    return out


def get_datastore(bundle, root: Path, target=None, tok=None, per_domain: int = 20,
                  max_new_tokens: int = 64) -> tuple[SuffixIndex, str]:
    index = bundle.load_datastore() if bundle is not None else None
    if index is not None:
        m = bundle.meta["datastore"]
        return index, f"shipped in the bundle ({m['tokens']} tokens, {m['sequences']} responses)"
    if not (root / "distill_data").is_dir():
        t0 = time.perf_counter()
        responses = distill_greedy(target, tok, root, per_domain, max_new_tokens)
        gen_s = time.perf_counter() - t0
        built = build_datastore(responses)
        return built.index, (f"built here (the run has neither a bundle datastore nor distill_data): the target's greedy "
                             f"responses to the first {per_domain} train prompts per domain ({gen_s:.0f} s to generate), "
                             f"{len(built.index) - built.index.n_sequences} tokens, {built.index.n_sequences} responses, "
                             f"suffix array in {built.seconds:.2f} s")
    from specdraft.pipelines.readers import load_distill_data

    responses = load_distill_data(root / "distill_data")["train"]["response_ids"]
    built = build_datastore(responses)
    return built.index, (f"built here from {root / 'distill_data'} (no bundle datastore): {len(built.index) - built.index.n_sequences} "
                         f"tokens, {built.index.n_sequences} responses, {built.seconds:.2f} s")


def param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def kv_bytes_per_token(model) -> int:
    c = model.config
    heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    elt = next(model.parameters()).element_size()
    return 2 * c.num_hidden_layers * heads * head_dim * elt


def fmt_spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def build_parser() -> argparse.ArgumentParser:
    """The command line (the module docstring says what each table measures)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", nargs="?", default="/work/runs/demo-base", help="a finished run (prompts/, bundle/)")
    ap.add_argument("--bundle", default=None, help="default: ROOT/bundle")
    ap.add_argument("--set", default="test")
    ap.add_argument("--prompts", type=int, default=6, help="prompts per domain")
    ap.add_argument("--tokens", type=int, default=64, help="max_new_tokens")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved timing passes")
    ap.add_argument("--drafter", default="ofa", help="the parametric arm (the bundle's best drafter overall)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bandit-arms", default=None,
                    help="comma-separated subset of lookup,rest,suffix,DRAFTER for the bandits (default: all four)")
    ap.add_argument("--distill-prompts", type=int, default=20,
                    help="without a datastore or distill_data: train prompts per domain to distill one from")
    ap.add_argument("--no-append", action="store_true")
    return ap


def load_models(args, root: Path) -> tuple:
    """(tokenizer, target, drafter, datastore index, where the datastore came from, K): from the bundle, or
    from the stages' outputs of a run stopped before export."""
    bundle_dir = Path(args.bundle) if args.bundle else root / "bundle"
    if bundle_dir.is_dir():
        bundle = load_bundle(bundle_dir)
        tok = bundle.load_tokenizer()
        target = bundle.load_target(device="cpu", dtype="float32")
        drafter = bundle.load_drafter(args.drafter, device="cpu", dtype="float32", target=target)
        index, ds_note = get_datastore(bundle, root, target, tok, args.distill_prompts, args.tokens)
        return tok, target, drafter, index, ds_note, bundle.defaults.k
    # a run stopped before export: its stages' outputs directly (target/, drafters/, distill_data/)
    from specdraft.decoding.compat import check_pair
    from specdraft.decoding.bundle.loading import load_causal_lm, load_tokenizer

    tok = load_tokenizer(root / "target")
    target = load_causal_lm(root / "target", "float32", "cpu")
    drafter = load_causal_lm(root / "drafters" / args.drafter, "float32", "cpu")
    check_pair(target, drafter)
    index, ds_note = get_datastore(None, root, target, tok, args.distill_prompts, args.tokens)
    return tok, target, drafter, index, ds_note, DEFAULTS.k  # no bundle: the library's default draft length


@dataclasses.dataclass
class World:
    """What every decode and table shares: the models, the arms' resources, the prompts and the arm names."""
    args: argparse.Namespace
    target: object
    drafter: object
    index: SuffixIndex
    k: int  # K = N_max
    eos: int | None
    prompts: list  # (domain, id, prompt text, ids)
    singles: list[str]  # the single arms: lookup, rest, suffix and the drafter
    bandit_arms: list[str]  # the arms the bandits choose among
    res: ArmResources


def decode(w: World, method: str, ids, cost: dict[str, float]):
    """One greedy decode by AR, a single arm or a bandit over the arms (throughput reward priced by `cost`):
    -> (result, its speculator, or None for AR)."""
    args, target, k = w.args, w.target, w.k
    if method == "AR":
        return generate_autoregressive(target, ids, args.tokens, GREEDY, w.eos), None
    if method in w.singles:
        arm = build_arms([method], w.res, n_max=k)[0]
        return generate_speculative(target, arm.speculator, ids, args.tokens, GREEDY, w.eos), arm.speculator
    _, sel, reward = next(b for b in BANDITS if b[0] == method)
    entries = [{"kind": "drafter" if a == args.drafter else a, **({"drafter": a} if a == args.drafter else {}),
                "cost_ratio": cost[a]} for a in w.bandit_arms]
    arms = build_arms(entries, w.res, n_max=k)
    bandit = MultiDrafterSpeculator(arms, make_selector(sel, len(arms), max_len=k, seed=args.seed),
                                    reward=reward, n_max=k)
    return generate_speculative(target, bandit, ids, args.tokens, GREEDY, w.eos), bandit


def unit_costs(w: World) -> tuple[float, float, dict[str, float]]:
    """Pass 0, the warm-up, measures the unit costs: (t_T per target forward (AR), t_D per drafter forward,
    {single arm: its draft seconds per drafted token / t_T})."""
    warm: dict[str, list] = {m: [] for m in ["AR"] + w.singles}
    for _, _, _, ids in w.prompts:
        for m in warm:
            warm[m].append(decode(w, m, ids, {})[0].metrics)
    t_T = sum(x.time_total for x in warm["AR"]) / sum(x.n_target for x in warm["AR"])
    dm = warm[w.args.drafter]
    t_D = sum(x.time_draft for x in dm) / max(1, sum(x.n_draft for x in dm))
    cost = {m: (sum(x.time_draft for x in warm[m]) / max(1, sum(sum(x.drafted) for x in warm[m]))) / t_T
            for m in w.singles}
    return t_T, t_D, cost


def timed_passes(w: World, methods: list[str], cost: dict[str, float]) -> tuple[dict, dict, dict]:
    """--repeats passes, the methods interleaved per prompt in a rotating order: -> ({(method, prompt): result},
    {(method, prompt): [seconds per pass]}, {(method, prompt): datastore bytes read})."""
    # counts are exact and repeat (greedy, seeded bandits); times are noisy: interleave methods per prompt
    counts: dict[tuple[str, int], object] = {}
    seconds: dict[tuple[str, int], list[float]] = {}
    reads: dict[tuple[str, int], int] = {}
    for r in range(w.args.repeats):
        for p, (_, _, _, ids) in enumerate(w.prompts):
            order = rotated(methods, r)
            for m in order:
                rb = w.index.bytes_read
                out, spec = decode(w, m, ids, cost)
                counts[m, p] = out
                seconds.setdefault((m, p), []).append(out.metrics.time_total)
                extra = sum(a.speculator.request_bytes() for a in spec.arms if isinstance(a.speculator, SuffixSpeculator)) \
                    if isinstance(spec, MultiDrafterSpeculator) else (spec.request_bytes() if isinstance(spec, SuffixSpeculator) else 0)
                reads[m, p] = w.index.bytes_read - rb + extra
    return counts, seconds, reads


def group(prompts: list, d: str) -> list[int]:
    """The indices of domain d's prompts ("all": every prompt)."""
    return [p for p, row in enumerate(prompts) if d in ("all", row[0])]


def speed_table(w: World, methods: list[str], domains: list[str], counts: dict, seconds: dict, t_T: float,
                t_D: float) -> tuple[list[str], dict]:
    """Table 1's rows per domain and method, and {(domain, method): median timed tokens/s}."""
    table1 = ["| domain | method | MAT | tokens/s timed, median (min-max) | tokens/s counted | N_target | N_draft | regret (target calls / prompt) |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    summary: dict[tuple[str, str], float] = {}
    for d in domains + ["all"]:
        ps = group(w.prompts, d)
        best_single = {p: min(counts[a, p].metrics.n_target for a in w.bandit_arms) for p in ps}
        for m in methods:
            ms = [counts[m, p].metrics for p in ps]
            tokens = sum(x.n_generated for x in ms)
            n_t, n_d = sum(x.n_target for x in ms), sum(x.n_draft for x in ms)
            timed = [tokens / sum(seconds[m, p][r] for p in ps) for r in range(w.args.repeats)]
            counted = tokens / (n_t * t_T + n_d * t_D)
            regret = (sum(counts[m, p].metrics.n_target - best_single[p] for p in ps) / len(ps)
                      if m not in ("AR",) + tuple(w.singles) else None)
            summary[d, m] = statistics.median(timed)
            table1.append(f"| {d} | {m} | {tokens / n_t:.3f} | {fmt_spread(timed)} | {counted:.1f} | {n_t} | {n_d} | "
                          + (f"{regret:+.2f}" if regret is not None else "-") + " |")
    return table1, summary


def wins_table(w: World, domains: list[str], counts: dict) -> list[str]:
    """Where a model-free arm beats the drafter, prompt by prompt (MAT; counted cost orders the same way here)."""
    wins = ["| domain | prompts | a model-free arm has the best MAT | best model-free arm's MAT / drafter MAT (median) |",
            "| --- | ---: | ---: | ---: |"]
    for d in domains:
        ps = group(w.prompts, d)
        ratio, n_win = [], 0
        for p in ps:
            mf = max(counts[a, p].metrics.mat for a in SINGLE)
            dr = counts[w.args.drafter, p].metrics.mat
            n_win += mf > dr
            ratio.append(mf / dr)
        wins.append(f"| {d} | {len(ps)} | {n_win} | {statistics.median(ratio):.3f} |")
    return wins


def memory_table(w: World, methods: list[str], counts: dict, reads: dict) -> list[str]:
    """Table 2: counted memory and bytes read per generated token, normalised to the drafter arm."""
    args, index = w.args, w.index
    Wt, Wd = param_bytes(w.target), param_bytes(w.drafter)
    kv_t, kv_d = kv_bytes_per_token(w.target), kv_bytes_per_token(w.drafter)
    longest = max(len(ids) for *_, ids in w.prompts) + args.tokens
    mean_ctx = statistics.mean(len(ids) for *_, ids in w.prompts) + args.tokens / 2
    resident = {"AR": Wt + kv_t * longest}
    for a in w.singles:
        resident[a] = resident["AR"]
    resident[args.drafter] += Wd + kv_d * longest
    resident["rest"] += index.nbytes
    resident["suffix"] += index.nbytes + 12 * longest  # + the per-request suffix array (int32 tokens, int64 ranks)
    for b in BANDITS:  # every arm stays resident
        resident[b[0]] = resident["AR"] + Wd + kv_d * longest + index.nbytes + 12 * longest
    table2 = ["| method | memory (counted) | NM | bytes read / token | NMB | of which retrieval |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    per_token = {}
    for m in methods:
        ps = range(len(w.prompts))
        tokens = sum(counts[m, p].metrics.n_generated for p in ps)
        n_t = sum(counts[m, p].metrics.n_target for p in ps)
        n_d = sum(counts[m, p].metrics.n_draft for p in ps)
        retrieval = sum(reads[m, p] for p in ps)
        per_token[m] = ((n_t * (Wt + kv_t * mean_ctx) + n_d * (Wd + kv_d * mean_ctx) + retrieval) / tokens,
                        retrieval / tokens)
    ref_mem, ref_bw = resident[args.drafter], per_token[args.drafter][0]
    for m in methods:
        table2.append(f"| {m} | {resident[m] / 2**20:.2f} MiB | {resident[m] / ref_mem:.4f} | "
                      f"{per_token[m][0] / 2**20:.2f} MiB | {per_token[m][0] / ref_bw:.4f} | {per_token[m][1] / 1024:.1f} KiB |")
    return table2


def verdict_lines(w: World, domains: list[str], summary: dict) -> list[str]:
    """Per domain, the best bandit against the best single arm among the bandits' arms (median timed tokens/s)."""
    verdict = []
    for d in domains + ["all"]:
        b_single = max(w.bandit_arms, key=lambda a: summary[d, a])
        b_bandit = max((b[0] for b in BANDITS), key=lambda b: summary[d, b])
        verdict.append(f"{d}: best single {b_single} {summary[d, b_single]:.1f} tok/s, best bandit {b_bandit} "
                       f"{summary[d, b_bandit]:.1f} tok/s ({summary[d, b_bandit] / summary[d, b_single] - 1:+.1%})")
    return verdict


def intro_lines(w: World, ds_note: str, t_T: float, t_D: float, cost: dict[str, float]) -> list[str]:
    """The section's title, command line, arms and measured unit costs."""
    args, k = w.args, w.k
    return [
        f"## Model-free arms and bandits over arms of any kind: BanditSpec Tables 1-2 on the demo world "
        f"({time.strftime('%Y-%m-%d')}, {platform.machine()} {os.cpu_count()} cores, 1 torch thread)", "",
        f"`python benchmarks/families/bench_model_free.py {args.root} --prompts {args.prompts} --tokens {args.tokens} "
        f"--repeats {args.repeats} --drafter {args.drafter}"
        + (f" --bandit-arms {args.bandit_arms}" if args.bandit_arms else "") + f"`: {len(w.prompts)} {args.set} prompts ({args.prompts} per domain), "
        f"{args.tokens} new tokens, greedy, K = N_max = {k}. Datastore {ds_note}. Arms: prompt lookup (n-gram 3..1), "
        f"REST (longest suffix <= 16, most frequent chain), suffix decoding (global + per request, alpha = 1, "
        f"min_prob = 0.1), drafter `{args.drafter}` at K = {k}. Unit costs measured in the warm-up pass: "
        f"t_T = {t_T * 1e3:.2f} ms per target forward, t_D = {t_D * 1e3:.2f} ms per drafter forward; "
        "the throughput reward's cost per drafted token c (t / t_T): "
        + ", ".join(f"{a} {cost[a]:.4f}" for a in w.singles) + ".", ""]


def table_lines(w: World, table1: list[str], verdict: list[str], wins: list[str], table2: list[str]) -> list[str]:
    """The tables, each under the sentence that says how it was measured."""
    drafter = w.args.drafter
    return [
        "Table 1 shape: MAT, tokens/s (timed: median and min-max over interleaved repeats; counted: from "
        "N_target and N_draft with the unit costs above, retrieval time left out), stopping-time regret "
        f"(target calls per prompt beyond the prompt's best single arm among the bandits' arms {', '.join(w.bandit_arms)}):", "", *table1, "",
        "Bandits vs the best single arm by timed tokens/s (medians; compare with the spread in the table):", "",
        *[f"- {v}" for v in verdict], "",
        f"Prompts on which a model-free arm beats drafter `{drafter}` (MAT):", "", *wins, "",
        "Table 2 shape (counted, not measured: CPU run): resident memory = target weights and KV cache at the "
        "longest context + the arm's drafter weights and KV, datastore and per-request index; bytes read per "
        "generated token = weights and KV (mean context) per forward + suffix-array bytes the retrieval touched; "
        f"NM and NMB normalised to the drafter arm `{drafter}`:", "", *table2, ""]


def main() -> None:
    args = build_parser().parse_args()
    torch.set_num_threads(1)  # a shared 2-core box: one thread gives the steadiest times
    root = Path(args.root)
    tok, target, drafter, index, ds_note, k = load_models(args, root)
    prompts = load_prompts(root, tok, args.set, args.prompts, 384)
    domains = sorted({d for d, *_ in prompts})
    singles = list(SINGLE) + [args.drafter]
    bandit_arms = args.bandit_arms.split(",") if args.bandit_arms else singles
    if not set(bandit_arms) <= set(singles) or len(bandit_arms) < 2:
        sys.exit(f"--bandit-arms must name at least two of {','.join(singles)}")
    w = World(args, target, drafter, index, k, tok.eos_token_id, prompts, singles, bandit_arms,
              ArmResources({args.drafter: drafter}, index))
    t_T, t_D, cost = unit_costs(w)
    methods = ["AR"] + singles + [b[0] for b in BANDITS]
    counts, seconds, reads = timed_passes(w, methods, cost)
    table1, summary = speed_table(w, methods, domains, counts, seconds, t_T, t_D)
    wins = wins_table(w, domains, counts)
    table2 = memory_table(w, methods, counts, reads)
    best_single_all = max(singles, key=lambda a: summary["all", a])
    text = "\n".join(intro_lines(w, ds_note, t_T, t_D, cost)
                     + table_lines(w, table1, verdict_lines(w, domains, summary), wins, table2))
    publish(text, write=not args.no_append)
    print(f"best single arm overall: {best_single_all}")


if __name__ == "__main__":
    main()
