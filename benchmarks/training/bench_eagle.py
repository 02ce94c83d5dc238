"""EAGLE drafters on a finished run: train one on the run's self-distilled data, then decode with it.

    python benchmarks/training/bench_eagle.py RUN [--drafter ofa] [--steps 200] [--prompts-per-domain 3] [--tokens 48]
        [--k 4] [--tree 4,4,16] [--reps 3] [--eagle DIR] [--no-append]

RUN is a finished run root (prompts/, target/, distill_data/, bundle/; e.g. a copy of runs/demo). Steps:
  1. train an EAGLE drafter of --variant (decoding/speculators/eagle_model.py, drafters/eagle.py; target features
     online) on distill_data's train rows of every domain (an OFA EAGLE drafter) through the shared trainer,
     for --steps optimizer steps; its wall time is the demo's budget question. --eagle DIR skips this.
     Teacher-forced alignment on the dev rows (1 - TV at T=1, greedy agreement), beside the bundle's
     independent drafter's (train-drafters' alignment.json).
  2. greedy decoding of the test prompts of every domain with: the target alone (AR), the bundle's
     independent drafter --drafter at fixed K (SpS), the EAGLE drafter as a chain at K, and as an EAGLE-2
     tree (--tree depth,top-k,nodes). Per method: MAT (tokens per target call, bonus counted), accepted
     length per drafting round without and with the bonus token (peer tools' "acceptance length" is the
     latter), acceptance at each draft position (P(position i accepted | positions < i accepted), chain
     methods), draft forwards per token, and the per-round cost split (seconds in drafting, in the target
     forward, and the rest: verification, rollback, loop) with the timed speedup over AR (median and
     min-max over --reps interleaved passes).
Counts are exact (greedy); times on a shared CPU are noisy. Writes the tables as this script's section of benchmarks/training/RESULTS.md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from specdraft.decoding.autoregressive import generate_autoregressive  # noqa: E402
from specdraft.decoding.bundle.directory import load_bundle  # noqa: E402
from specdraft.decoding.speculators.eagle import EagleSpeculator, TreeShape  # noqa: E402
from specdraft.decoding.speculators.eagle_model import load_eagle, new_eagle_drafter, save_eagle, target_dir_hash  # noqa: E402
from specdraft.decoding.metrics import aggregate  # noqa: E402
from specdraft.decoding.rounds.sampling import SamplingConfig  # noqa: E402
from specdraft.decoding.speculative import generate_speculative  # noqa: E402
from specdraft.decoding.speculators.drafter import DrafterSpeculator  # noqa: E402
from specdraft.decoding.policies.stopping import FixedK  # noqa: E402
from benchmarks.harness.timing import rotated  # noqa: E402
from benchmarks.harness.publish import publish  # noqa: E402

GREEDY = SamplingConfig(temperature=0.0)


def train(run: Path, target, steps: int, batch_size: int, lr: float, out: Path, seed: int, variant: str = "eagle1") -> dict:
    from specdraft.drafters.data import CausalLMCollator, CausalLMDataModule
    from specdraft.drafters.eagle import EagleModule
    from specdraft.pipelines.readers import load_distill_data
    from specdraft.training.trainer import TrainerConfig, WandbConfig, build_trainer, fit

    rows = load_distill_data(run / "distill_data")["train"]
    examples = [{"prompt_ids": r["prompt_ids"], "response_ids": r["response_ids"]} for r in rows]
    torch.manual_seed(seed)
    drafter = new_eagle_drafter(target.config, variant=variant, target_hash=target_dir_hash(run / "target"))
    if hasattr(drafter, "init_from_target"):
        drafter.init_from_target(target)
    module = EagleModule(drafter, target, lr=lr, seed=seed)
    cfg = TrainerConfig(max_steps=steps, batch_size=batch_size, checkpoint_every_n_steps=0, accelerator="cpu",
                        wandb=WandbConfig(mode="disabled"), seed=seed)
    data = CausalLMDataModule(examples, CausalLMCollator(pad_token_id=target.config.pad_token_id or 0, max_length=256),
                              batch_size=batch_size, seed=seed)
    trainer = build_trainer(cfg, out / "train")
    t0 = time.perf_counter()
    fit(trainer, module, data, cfg)
    seconds = time.perf_counter() - t0
    info = {"steps": trainer.global_step, "seconds": round(seconds, 1), "examples": len(examples),
            "final_loss": round(float(trainer.callback_metrics["train/loss"]), 4), "domains": "all"}
    save_eagle(drafter, out / "eagle-ofa", extra={"domains": sorted(set(rows["domain"])), **info})
    return info


def load_prompts(run: Path, per_domain: int, tok, max_prompt_tokens: int = 384) -> dict[str, list[list[int]]]:
    from datasets import load_from_disk

    out: dict[str, list[list[int]]] = {}
    for row in load_from_disk(str(run / "prompts" / "sets"))["test"]:
        if len(out.setdefault(row["domain"], [])) < per_domain:
            out[row["domain"]].append(tok(row["prompt"])["input_ids"][-max_prompt_tokens:])
    return out


def position_acceptance(metrics_list, k: int) -> list[float | None]:
    """P(draft position i accepted | positions 1..i-1 accepted), i = 1..k, over chain rounds that drafted >= i."""
    reached = [0] * k
    taken = [0] * k
    for m in metrics_list:
        for d, a in zip(m.drafted, m.accepted):
            for i in range(min(d, a + 1)):
                reached[i] += 1
                taken[i] += a > i
    return [taken[i] / reached[i] if reached[i] else None for i in range(k)]


def eagle_drafter(args, run: Path, bundle, target) -> tuple:
    """(EAGLE drafter, its directory, its training info or None): trained here, or loaded from --eagle."""
    out = Path(args.workdir or run / "bench_eagle")
    info = None
    if args.eagle is None:
        info = train(run, target, args.steps, args.batch_size, args.lr, out, args.seed, args.variant)
        eagle_dir = out / "eagle-ofa"
    else:
        eagle_dir = Path(args.eagle)
    eagle = load_eagle(eagle_dir, target=target, target_hash=target_dir_hash(bundle.target_path))
    return eagle, eagle_dir, info


def dev_alignment(run: Path, target, eagle) -> dict:
    """{domain: the EAGLE drafter's teacher-forced alignment on the domain's dev responses}."""
    from specdraft.pipelines.readers import load_distill_data
    from specdraft.pipelines.train_eagle import eagle_alignment

    dev = [dict(r) for r in load_distill_data(run / "distill_data")["dev"]]
    return {d: eagle_alignment(target, eagle, [r for r in dev if r["domain"] == d], target.config.pad_token_id or 0,
                               256) for d in sorted({r["domain"] for r in dev})}


def build_methods(args, sps, eagle, tree: TreeShape) -> dict:
    """{name: a fresh speculator per decode}, AR (None) first: the baseline of every speedup."""
    return {
        "AR (target alone)": None,
        f"SpS: {args.drafter} K={args.k}": lambda: DrafterSpeculator(sps, FixedK(args.k)),
        f"EAGLE chain K={args.k}": lambda: EagleSpeculator(eagle, FixedK(args.k)),
        f"EAGLE-2 tree {tree.depth}x{tree.top_k}x{tree.nodes}": lambda: EagleSpeculator(eagle, FixedK(tree.depth), tree),
    }


def timed_passes(args, target, eos, methods: dict, prompts: list) -> tuple[dict, dict]:
    """--reps passes over the prompts, every method on each prompt in an order rotating by pass and prompt:
    -> ({method: first pass's metrics per prompt}, {method: [seconds split per decode]})."""
    counts: dict[str, list] = {m: [] for m in methods}
    times: dict[str, list[dict]] = {m: [] for m in methods}
    with torch.inference_mode():
        for rep in range(args.reps):
            for j, (_, ids) in enumerate(prompts):
                order = list(methods)
                split = {m: None for m in order}
                for name in rotated(order, rep + j):  # rotate the order: a slow phase hits every method alike
                    make = methods[name]
                    t0 = time.perf_counter()
                    if make is None:
                        res = generate_autoregressive(target, ids, args.tokens, GREEDY, eos)
                    else:
                        res = generate_speculative(target, make(), ids, args.tokens, GREEDY, eos)
                    total = time.perf_counter() - t0
                    m = res.metrics
                    split[name] = {"total": total, "draft": m.time_draft, "target": m.time_target, "n": m.n_generated}
                    if rep == 0:
                        counts[name].append(m)
                for name in order:
                    times[name].append(split[name])
    return counts, times


def run_bench(args) -> str:
    """Load the bundle, train (or load) the EAGLE drafter, measure its alignment, decode every method
    interleaved, then render the tables."""
    torch.set_num_threads(args.threads)
    run = Path(args.run)
    bundle = load_bundle(run / "bundle")
    tok = bundle.load_tokenizer()
    target = bundle.load_target(device="cpu")
    sps = bundle.load_drafter(args.drafter, device="cpu", target=target)
    eagle, eagle_dir, info = eagle_drafter(args, run, bundle, target)
    meta = json.loads((eagle_dir / "eagle_config.json").read_text())
    align = dev_alignment(run, target, eagle)
    sps_align = bundle.drafter(args.drafter).alignment
    depth, top_k, nodes = (int(x) for x in args.tree.split(","))
    tree = TreeShape(depth, top_k, nodes)
    methods = build_methods(args, sps, eagle, tree)
    prompts = [(d, p) for d, ps in load_prompts(run, args.prompts_per_domain, tok).items() for p in ps]
    counts, times = timed_passes(args, target, tok.eos_token_id, methods, prompts)
    lines = header_lines(args, bundle, target, meta, info, eagle_dir, len(prompts))
    lines += alignment_table(args, align, sps_align)
    lines += method_table(methods, counts, times)
    lines += position_table(args, methods, counts)
    lines += ["", "Rounds with no draft (EAGLE's first round: the target's prefill makes the features) are left out "
              "of the per-round acceptance; MAT counts every round. The tree verifies up to "
              f"{tree.nodes} nodes in one tree-masked target forward; the per-round split is per round of each method."]
    return "\n".join(lines) + "\n"


def header_lines(args, bundle, target, meta: dict, info: dict | None, eagle_dir: Path, n_prompts: int) -> list[str]:
    """The section's title, command line, the two drafters (the EAGLE one's training) and the decodes."""
    return [f"## EAGLE drafters: chain vs tree vs the independent drafter ({datetime.date.today()}, "
            f"{platform.machine()}, {args.threads} thread(s))", "",
            f"`python benchmarks/training/bench_eagle.py {' '.join(args.argv)}`", "",
            f"Target: {bundle.target_path} ({target.config.num_hidden_layers} layers, hidden "
            f"{target.config.hidden_size}). EAGLE drafter ({meta.get('variant', 'eagle1')}): one decoder layer + its input projection, "
            f"{meta['parameters']:,} parameters of its own (the target's embedding and LM head are shared); "
            + (f"trained here for {info['steps']} steps (batch {args.batch_size}) on {info['examples']} self-distilled "
               f"responses of every domain in **{info['seconds']} s** wall (features online; final loss "
               f"{info['final_loss']}). " if info else f"loaded from {eagle_dir}. ")
            + f"Independent drafter: the bundle's `{args.drafter}` ({bundle.drafter(args.drafter).parameters:,} "
            f"parameters). Greedy; {n_prompts} test prompts ({args.prompts_per_domain} per domain), "
            f"{args.tokens} new tokens; counts from the first pass, times median [min, max] over {args.reps} "
            "interleaved passes.", ""]


def alignment_table(args, align: dict, sps_align: dict) -> list[str]:
    """Teacher-forced alignment per domain, the EAGLE drafter beside the independent one."""
    lines = ["Teacher-forced alignment on the dev responses (1 - TV at T=1 / greedy agreement; EAGLE reads the "
             "target's true features, i.e. the first draft position of a round):", "",
             "| domain | EAGLE | " + f"{args.drafter} (independent) |", "| --- | ---: | ---: |"]
    for d, a in align.items():
        s = sps_align.get(d, {})
        lines.append(f"| {d} | {a['acceptance']:.3f} / {a['agreement']:.3f} | "
                     f"{s.get('acceptance', float('nan')):.3f} / {s.get('agreement', float('nan')):.3f} |")
    return lines


def method_table(methods: dict, counts: dict, times: dict) -> list[str]:
    """Per method: MAT, accepted length per round, draft forwards per token, the per-round cost split and the
    timed speedup over AR."""
    lines = ["", "| method | MAT | accepted / round (no bonus) | accepted / round (with bonus) | draft fwd / token "
             "| draft s / round | target s / round | other s / round | timed speedup |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    ar_tok = [t["total"] / t["n"] for t in times[next(iter(methods))]]
    for name in methods:
        agg = aggregate(counts[name])
        rounds = [(d, a) for m in counts[name] for d, a in zip(m.drafted, m.accepted) if d > 0]
        acc = statistics.mean(a for _, a in rounds) if rounds else 0.0
        ts = times[name]
        speed = [a / (t["total"] / t["n"]) for a, t in zip(ar_tok, ts)]
        other = [t["total"] - t["draft"] - t["target"] for t in ts]
        rps = agg.n_target / len(counts[name])  # rounds (target calls) per prompt
        lines.append(
            f"| {name} | {agg.mat:.2f} | {acc:.2f} | {acc + 1:.2f} | {agg.n_draft / max(agg.n_generated, 1):.2f} | "
            f"{statistics.median(t['draft'] for t in ts) / rps * 1e3:.2f} ms | "
            f"{statistics.median(t['target'] for t in ts) / rps * 1e3:.2f} ms | "
            f"{statistics.median(other) / rps * 1e3:.2f} ms | "
            f"{statistics.median(speed):.2f} [{min(speed):.2f}, {max(speed):.2f}] |")
    return lines


def position_table(args, methods: dict, counts: dict) -> list[str]:
    """Acceptance at each draft position, for the two chain methods."""
    lines = ["", "Acceptance at each draft position, P(position i accepted | 1..i-1 accepted) (chain methods):", "",
             "| method | " + " | ".join(f"pos {i + 1}" for i in range(args.k)) + " |",
             "| --- |" + " ---: |" * args.k]
    for name in list(methods)[1:3]:
        pa = position_acceptance(counts[name], args.k)
        lines.append(f"| {name} | " + " | ".join("-" if x is None else f"{x:.3f}" for x in pa) + " |")
    return lines


# flag, type, default, help
OPTIONS = [
    ("--drafter", str, "ofa", "the bundle's independent drafter to compare with"),
    ("--eagle", str, None, "a trained EAGLE drafter dir (skips training)"),
    ("--workdir", str, None, "where the trained drafter goes (default RUN/bench_eagle)"),
    ("--steps", int, 200, "EAGLE training steps"),
    ("--variant", str, "eagle1", "EAGLE variant trained: eagle1, eagle3 (vLLM's layout) or eagle3-proj"),
    ("--batch-size", int, 16, "EAGLE training batch"),
    ("--lr", float, 3e-3, "EAGLE learning rate"),
    ("--prompts-per-domain", int, 3, "test prompts per domain"),
    ("--tokens", int, 48, "new tokens per generation"),
    ("--k", int, 4, "draft length of the chain methods"),
    ("--tree", str, "4,4,16", "EAGLE-2 tree depth,top-k,nodes"),
    ("--reps", int, 3, "interleaved timing passes"),
    ("--threads", int, 1, "torch CPU threads"),
    ("--seed", int, 0, "training seed"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a finished run root (prompts/, target/, distill_data/, bundle/)")
    for flag, kind, default, text in OPTIONS:
        parser.add_argument(flag, type=kind, default=default, help=text)
    parser.add_argument("--no-append", action="store_true", help="print only; leave RESULTS.md alone")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # quoted in the section's command line
    publish(run_bench(args), write=not args.no_append)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
