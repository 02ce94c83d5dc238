"""SpecTr (K i.i.d. drafts, k-Seq selection, one tree-masked target forward per round) on a bundle.

    python benchmarks/families/bench_spectr.py runs/demo/bundle [--prompt-set runs/demo/prompts/sets]
        [--prompts-per-domain 4] [--tokens 48] [--seeds 3] [--ks 1,2,4,8] [--ls 4,8] [--no-append]
    python benchmarks/families/bench_spectr.py --target runs/demo/target --drafter-layers 1,2 ...

At T = 1 on the test prompts of each domain, each domain decoded with its own drafter (the bundle's
single-domain drafter; the most general one where a domain has none), or, with --target, with
self-speculative drafters made of the target's first n layers (no training; for when no trained drafter
exists yet), prints
  1. SpecTr Table 1 shape: per (K, L), block efficiency (tokens per target call, the bonus counted),
     draft forwards per token, tree nodes per round, the counted speedup under SpecTr's computational
     model (a K-row or K L-node forward costs what a 1-token one does: MAT / (1 + c N_draft / N_target),
     c the measured drafter/target 1-token forward time ratio) and the timed speedup over autoregressive
     decoding of the target (median and min-max over the seeds; every seed runs every method once,
     methods interleaved in a rotating order);
  2. per domain, block efficiency by K (L = the largest --ls); with several drafters, App. E Table 4's
     shape (block efficiency by drafter size and K);
  3. App. E Tables 2-3 shape: the cost, on this machine, of the target forward that scores a round (one
     row of 1 + K L tokens under a tree mask, the worst case of no shared prefix) and of one drafter step
     over K rows, relative to a plain 4-token target forward / a 1-row drafter step.
Counts are exact; times on a shared CPU are noisy (median and spread reported). Writes the tables as this
script's section of benchmarks/families/RESULTS.md with the date and machine.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import platform
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from specdraft.data.chat import row_messages  # noqa: E402
from specdraft.decoding.bundle.chat import format_prompt  # noqa: E402  # prompts as the pipeline serves them
from specdraft.decoding.rounds import kv  # noqa: E402
from specdraft.decoding.autoregressive import generate_autoregressive  # noqa: E402
from specdraft.decoding.metrics import aggregate  # noqa: E402
from specdraft.decoding.speculators.spectr import drafter_speculator  # noqa: E402
from specdraft.decoding.rounds.sampling import SamplingConfig  # noqa: E402
from specdraft.decoding.speculative import generate_speculative  # noqa: E402
from specdraft.decoding.policies.stopping import FixedK  # noqa: E402
from specdraft.decoding.timing import timed_call  # noqa: E402
from benchmarks.harness.timing import rotated  # noqa: E402
from benchmarks.harness.publish import publish  # noqa: E402

PAPER_TABLE1 = {(1, 4): 2.4, (8, 4): 3.1, (1, 8): 2.9, (8, 8): 4.0}  # PaLM-2 Gecko -> Bison, block efficiency


def own_drafters(bundle) -> tuple[dict[str, str], str]:
    """domain -> its single-domain drafter; and the drafter covering the most domains (the fallback)."""
    by_size = sorted(bundle.drafters.values(), key=lambda d: (len(d.domains), d.name))
    own: dict[str, str] = {}
    for d in by_size:
        if len(d.domains) == 1:
            own.setdefault(d.domains[0], d.name)
    return own, by_size[-1].name


def load_prompts(prompt_set: str, per_domain: int, tok, max_prompt_tokens: int) -> dict[str, list[list[int]]]:
    from datasets import load_from_disk

    from specdraft.data.prompts import fit_prompt

    out: dict[str, list[list[int]]] = {}
    for row in load_from_disk(prompt_set)["test"]:
        ids, _ = fit_prompt(format_prompt(tok, row_messages(row)), max_prompt_tokens, "truncate", row["id"])
        if len(out.setdefault(row["domain"], [])) < per_domain:
            out[row["domain"]].append(ids)
    return out


@torch.inference_mode()
def forward_costs(target, drafter, ks: list[int], ls: list[int], context: int = 64, reps: int = 30,
                  device: str = "cpu") -> dict:
    """Median seconds of the forwards a round is made of, after a `context`-token prefix: the target's
    tree-masked forward over the last committed token + K disjoint chains of L nodes (1 + K L tokens, what
    the decoder feeds when no two drafts share a prefix); a plain 4-token and 1-token target forward; the
    drafter's one-token step over K rows. Interleaved: every repetition times every shape once; each call
    timed by `timed_call` (process CPU time on CPU, CUDA events on a GPU)."""
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(3, target.config.vocab_size, (context,), generator=gen).tolist()
    tcache = kv.new_cache()
    kv.forward(target, tcache, prefix[:-1])  # the loop's target cache never holds the last committed token
    dcaches = {}
    for K in ks:
        dcaches[K] = kv.new_cache()
        kv.forward(drafter, dcaches[K], prefix)
        if K > 1:
            kv.repeat_rows(dcaches[K], K)

    def chains(K: int, L: int):
        parents = [(-1 if j == 0 else i * L + j - 1) for i in range(K) for j in range(L)]
        depths = [j + 1 for _ in range(K) for j in range(L)]
        tokens = torch.randint(3, target.config.vocab_size, (K * L,), generator=gen).tolist()
        return tokens, parents, depths

    shapes = {("tree", K, L): chains(K, L) for K in ks for L in ls}
    samples: dict = {key: [] for key in list(shapes) + [("plain", 4), ("plain", 1)] + [("draft", K) for K in ks]}
    for _ in range(reps):
        for key, (tokens, parents, depths) in shapes.items():
            _, t = timed_call(lambda: kv.forward_tree(target, tcache, prefix[-1:], tokens, parents, depths), device)
            samples[key].append(t.time)
            kv.crop(tcache, context - 1)
        for n in (4, 1):
            _, t = timed_call(lambda: kv.forward(target, tcache, prefix[-1:] + tokens[: n - 1], last=n), device)
            samples[("plain", n)].append(t.time)
            kv.crop(tcache, context - 1)
        for K in ks:
            y = torch.randint(3, drafter.config.vocab_size, (K,), generator=gen)
            _, t = timed_call(lambda: kv.forward_batch(drafter, dcaches[K], y), device)
            samples[("draft", K)].append(t.time)
            kv.crop(dcaches[K], context)
    return {key: statistics.median(v) for key, v in samples.items()}


def truncated_drafter(target, n_layers: int):
    """A self-speculative drafter: the target's first `n_layers` decoder layers, its final norm and its LM
    head (no training). A stand-in where no trained drafter exists; it shares the target's tokenizer."""
    drafter = copy.deepcopy(target)
    drafter.model.layers = drafter.model.layers[:n_layers]
    drafter.config.num_hidden_layers = n_layers
    if getattr(drafter.config, "layer_types", None):
        drafter.config.layer_types = drafter.config.layer_types[:n_layers]
    return drafter.eval()


def load_models(args):
    """-> (tokenizer, target, {drafter set label: {domain or None: (drafter name, model)}}, prompt set)."""
    if args.target:
        from specdraft.decoding.bundle.loading import load_causal_lm, load_tokenizer

        tok = load_tokenizer(args.target)
        target = load_causal_lm(args.target, "auto", args.device)
        n_total = target.config.num_hidden_layers
        sets = {f"first {n} of {n_total} target layers": {None: (f"layers{n}", truncated_drafter(target, n))}
                for n in (int(x) for x in args.drafter_layers.split(","))}
        prompt_set = args.prompt_set or str(Path(args.target).resolve().parent / "prompts" / "sets")
        return tok, target, sets, prompt_set
    from specdraft.decoding.bundle.directory import load_bundle

    bundle = load_bundle(args.bundle, verify=False)
    tok = bundle.load_tokenizer()
    target = bundle.load_target(device=args.device)
    own, general = own_drafters(bundle)
    loaded = {}
    per_domain = {}
    for d in sorted({dom for entry in bundle.drafters.values() for dom in entry.domains}):
        name = own.get(d, general)
        if name not in loaded:
            loaded[name] = bundle.load_drafter(name, device=args.device, target=target)
        per_domain[d] = (name, loaded[name])
    prompt_set = args.prompt_set or str(Path(args.bundle).resolve().parent / "prompts" / "sets")
    return tok, target, {"each domain's own drafter": per_domain}, prompt_set


@dataclasses.dataclass
class Decodes:
    """The method grid and what its decodes measured: what the measurement fills and every table reads."""
    drafter_sets: dict  # {drafter set label: {domain or None: (drafter name, model)}}
    domains: list[str]
    ks: list[int]
    ls: list[int]
    configs: list[tuple]  # ("ar", None, 0, 0), then ("spectr", drafter set label, K, L)
    metrics: dict  # {config: {domain: [metrics per prompt]}}
    seconds: dict  # {config: [seconds per seed, over all prompts]}

    @property
    def labels(self) -> list[str]:
        return list(self.drafter_sets)


def drafter_for(drafter_sets: dict, label: str, domain: str):
    """(name, model) of the drafter set `label` uses on `domain`: the domain's own, else the set's only one."""
    chosen = drafter_sets[label]
    return chosen.get(domain) or chosen[None]


def method_grid(drafter_sets: dict, domains: list[str], ks: list[int], ls: list[int]) -> Decodes:
    """Autoregressive first (every speedup's baseline), then SpecTr at every (drafter set, L, K)."""
    configs = [("ar", None, 0, 0)] + [("spectr", lab, K, L) for lab in drafter_sets for L in ls for K in ks]
    return Decodes(drafter_sets, domains, ks, ls, configs, {c: {d: [] for d in domains} for c in configs},
                   {c: [] for c in configs})


def decode_one(args, target, grid: Decodes, config: tuple, domain: str, ids: list[int], gen, eos):
    """One timed decode of one prompt by one method: (result, timing)."""
    _, label, K, L = config
    sampling = SamplingConfig(temperature=1.0)
    if K == 0:
        return timed_call(lambda: generate_autoregressive(target, ids, args.tokens, sampling, eos, gen), args.device)
    speculator = drafter_speculator(drafter_for(grid.drafter_sets, label, domain)[1], FixedK(L), K)
    return timed_call(lambda: generate_speculative(target, speculator, ids, args.tokens, sampling, eos, gen),
                      args.device)


def decode_interleaved(args, target, grid: Decodes, prompts: dict, eos) -> None:
    """Every seed runs every method once over all prompts, the methods in an order rotating by seed (no fixed
    position bias); fills the grid's per-prompt metrics and per-seed seconds."""
    configs = grid.configs
    for seed in range(args.seeds):
        order = rotated(configs, seed)  # rotate: no fixed position bias
        for config in order:
            total = 0.0
            for d in grid.domains:
                for i, ids in enumerate(prompts[d]):
                    gen = torch.Generator().manual_seed(1000 * seed + i)
                    res, t = decode_one(args, target, grid, config, d, ids, gen, eos)
                    total += t.time
                    grid.metrics[config][d].append(res.metrics)
            grid.seconds[config].append(total)
        print(f"[bench_spectr] seed {seed} done", flush=True)


def run(args) -> str:
    """Load the models and prompts, decode every method interleaved, then render the tables (each drafter
    set's forward costs timed right before its tables)."""
    torch.set_num_threads(args.threads)
    tok, target, drafter_sets, prompt_set = load_models(args)
    prompts = load_prompts(prompt_set, args.prompts_per_domain, tok, args.max_prompt_tokens)
    ks, ls = [int(x) for x in args.ks.split(",")], [int(x) for x in args.ls.split(",")]
    grid = method_grid(drafter_sets, sorted(prompts), ks, ls)
    decode_interleaved(args, target, grid, prompts, tok.eos_token_id)
    lines = header_lines(args, grid)
    costs_by_label = {}
    for label in grid.labels:
        drafter = drafter_for(drafter_sets, label, grid.domains[0])[1]
        costs_by_label[label] = forward_costs(target, drafter, ks, ls, reps=args.reps, device=args.device)
        lines += drafter_set_tables(grid, label, costs_by_label[label])
    if len(grid.labels) > 1:  # App. E Table 4 shape: block efficiency by drafter size and K
        lines += drafter_size_table(grid)
    lines += forward_cost_table(args, grid, costs_by_label[grid.labels[-1]])
    return "\n".join(lines) + "\n"


def header_lines(args, grid: Decodes) -> list[str]:
    """The section's title (date, machine), command line and how each column is measured."""
    ar = aggregate(m for d in grid.domains for m in grid.metrics[grid.configs[0]][d])
    source = f"target {args.target}" if args.target else f"bundle {args.bundle}"
    machine = (torch.cuda.get_device_name(args.device) if torch.device(args.device).type == "cuda"
               else f"{platform.node()}, {args.threads} thread{'s' if args.threads > 1 else ''}")
    return [f"## SpecTr: K drafts x L tokens at T = 1 ({datetime.date.today()}, {machine})", "",
            f"`python benchmarks/families/bench_spectr.py {' '.join(args.argv)}`: {source}, "
            f"{len(grid.domains)} domains x {args.prompts_per_domain} test prompts, max_new_tokens={args.tokens}, "
            f"{args.seeds} seeds (each seed: every method once, methods interleaved in a rotating order). "
            f"Autoregressive: {ar.n_generated} tokens over all seeds. Block efficiency = tokens per target call "
            "(bonus counted). Counted speedup = block efficiency / (1 + c N_draft / N_target), c = t_draft / "
            "t_target of 1-token forwards: SpecTr's computational model, where K rows and K L tree tokens "
            "cost what one token does. Timed speedup = autoregressive seconds / SpecTr seconds per seed "
            "(process CPU seconds on a CPU, CUDA event seconds on a GPU).", ""]


def drafter_set_tables(grid: Decodes, label: str, costs: dict) -> list[str]:
    """Table 1's shape for one drafter set (per K and L), then its block efficiency by domain at the largest L."""
    c = costs[("draft", 1)] / costs[("plain", 1)]
    lines = [f"Drafter: {label} (c = {c:.3f}).", "",
             "| K | L | block efficiency | paper (Table 1) | draft forwards / token | nodes / round | "
             "counted speedup | timed speedup: median (min-max) |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for config in grid.configs[1:]:
        _, lab, K, L = config
        if lab != label:
            continue
        m = aggregate(x for d in grid.domains for x in grid.metrics[config][d])
        nodes = (m.n_discarded + sum(m.accepted)) / m.n_rounds
        counted = m.mat / (1 + c * m.n_draft / m.n_target)
        speedups = [a / s for a, s in zip(grid.seconds[grid.configs[0]], grid.seconds[config])]
        paper = PAPER_TABLE1.get((K, L))
        lines.append(f"| {K} | {L} | {m.mat:.3f} | {paper if paper else '-'} | "
                     f"{m.n_draft / m.n_generated:.3f} | {nodes:.1f} | {counted:.2f}x | "
                     f"{statistics.median(speedups):.2f}x ({min(speedups):.2f}-{max(speedups):.2f}) |")
    L = max(grid.ls)
    lines += ["", f"Block efficiency by domain (L = {L}):", "",
              "| domain | drafter | " + " | ".join(f"K={K}" for K in grid.ks) + " |",
              "| --- | --- |" + " ---: |" * len(grid.ks)]
    for d in grid.domains:
        cells = [f"{aggregate(grid.metrics[('spectr', label, K, L)][d]).mat:.3f}" for K in grid.ks]
        lines.append(f"| {d} | {drafter_for(grid.drafter_sets, label, d)[0]} | " + " | ".join(cells) + " |")
    return lines + [""]


def drafter_size_table(grid: Decodes) -> list[str]:
    """App. E Table 4's shape: block efficiency by drafter set and K, at the largest L."""
    L = max(grid.ls)
    lines = [f"Block efficiency by drafter and K (L = {L}; SpecTr App. E Table 4 shape):", "",
             "| drafter | " + " | ".join(f"K={K}" for K in grid.ks) + " |", "| --- |" + " ---: |" * len(grid.ks)]
    for label in grid.labels:
        cells = [f"{aggregate(x for d in grid.domains for x in grid.metrics[('spectr', label, K, L)][d]).mat:.3f}"
                 for K in grid.ks]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines + [""]


def forward_cost_table(args, grid: Decodes, costs: dict) -> list[str]:
    """App. E Tables 2-3's shape: the round's forwards on this machine, relative to the plain ones."""
    ks, ls = grid.ks, grid.ls
    lines = [f"Forward cost on this machine (median of {args.reps}, 64-token cache; SpecTr App. E Tables 2-3 "
             "shape): the target's tree-masked forward over 1 + K L tokens (K drafts sharing no prefix) relative "
             f"to a plain 4-token forward (1 + 3 drafts), and the drafter's ({grid.labels[-1]}) one-token step over "
             "K rows relative to 1 row.", "",
             "| K | " + " | ".join(f"target, L={L} (tokens)" for L in ls) + " | drafter step, K rows |",
             "| ---: |" + " ---: |" * (len(ls) + 1)]
    for K in ks:
        cells = [f"{costs[('tree', K, L)] / costs[('plain', 4)]:.2f} ({1 + K * L})" for L in ls]
        lines.append(f"| {K} | " + " | ".join(cells) + f" | {costs[('draft', K)] / costs[('draft', 1)]:.2f} |")
    lines.append(f"\nPlain target forwards: 1 token {costs[('plain', 1)] * 1e3:.2f} ms, 4 tokens "
                 f"{costs[('plain', 4)] * 1e3:.2f} ms; drafter 1-row step {costs[('draft', 1)] * 1e3:.2f} ms.")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bundle", nargs="?", default="/work/runs/demo-base/bundle")
    parser.add_argument("--target", default=None,
                        help="a target directory instead of a bundle; drafters: its first --drafter-layers layers")
    parser.add_argument("--drafter-layers", default="1,2", help="with --target: drafter depths (comma list)")
    parser.add_argument("--prompt-set", default=None, help="a run's prompts/sets (default: next to the bundle)")
    parser.add_argument("--prompts-per-domain", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--max-prompt-tokens", type=int, default=384)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--ks", default="1,2,4,8")
    parser.add_argument("--ls", default="4,8")
    parser.add_argument("--reps", type=int, default=30, help="repetitions of each forward-cost measurement")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda: where the target and drafters run")
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    publish(run(args), write=not args.no_append)
    return 0


if __name__ == "__main__":
    sys.exit(main())
