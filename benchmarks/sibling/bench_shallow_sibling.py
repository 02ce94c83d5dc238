"""A shallower sibling: does dropping layers from the drafter, then distilling it, buy speed on the real pair?

    python benchmarks/sibling/bench_shallow_sibling.py runs/real-pair [--config configs/real-pair.yaml]
        [--depths 24,18,12] [--epochs 3] [--lr 5e-5] [--tokens 64] [--k 4]

On the pair (Qwen2.5-Coder-1.5B-Instruct and its 0.5B sibling) speculation is bounded by what a draft step costs
(c ~0.3 of a target step), not by acceptance: a cheaper drafter is the lever the pair issue names. The cheapest way
to a cheaper sibling is to keep fewer of its 24 layers (its first L - 1 and its last, which maps into the LM head's
space; kept in order), then heal it by self-distillation on the target's answers. The embedding and the 151,936-token
LM head stay whole, so halving the layers does not halve the cost: the calibration says by how much it does.

For each depth L of --depths, from RUN's untouched sibling (RUN/drafters/sibling):
  - as cut: the sibling with its layers dropped, no training;
  - distilled (below the sibling's depth): that model fine-tuned by train-drafters' own finetune phase (pipelines/train_drafters.py `finetune`:
    response-only cross-entropy on the target's greedy answers) on every training row of RUN's distill-data, for
    --epochs passes at --lr, into RUN/bench_shallow_sibling/<L>-<hash of what it is made of>/ (a killed run resumes
    with the next unfinished depth). The whole sibling is not trained again: its distilled drafters are the run's.
Judged at batch 1, greedy, fixed K = --k, on every test prompt of RUN (chat-templated as evaluate formats them) by
the decoder (decode_batch), in the dtype the config's target.dtype picks, each drafter loaded as the stages load it
(`load_drafter`: int8 weights where decoding.draft_weights: auto picks them): MAT (tokens per target forward, bonus
counted) and the counted speedup over the target alone, pricing each prompt's rounds with one calibration of every
drafter beside the target (decoding/costs/calibration.py, interleaved passes: c and v(K) are this box's); 90%
intervals bootstrap over prompts. Writes its section of benchmarks/sibling/RESULTS.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

import torch  # noqa: E402

from specdraft.data.chat import chat_format  # noqa: E402
from specdraft.decoding.bundle.chat import end_of_turn_ids  # noqa: E402
from specdraft.decoding.bundle.loading import dtype_of, load_causal_lm, load_drafter, load_tokenizer  # noqa: E402
from specdraft.decoding.costs.calibration import calibrate  # noqa: E402
from specdraft.decoding.generate import Plan, decode_batch  # noqa: E402
from specdraft.decoding.metrics import GenerationMetrics  # noqa: E402
from specdraft.decoding.policies.spec import PolicySpec, build_policy  # noqa: E402
from specdraft.decoding.rounds.sampling import SamplingConfig  # noqa: E402
from specdraft.decoding.timing import bootstrap_ratio  # noqa: E402
from specdraft.pipelines.artifacts import read_manifest  # noqa: E402
from specdraft.pipelines.config import load_config, to_dict  # noqa: E402
from specdraft.pipelines.readers import load_distill_data  # noqa: E402
from specdraft.pipelines.schema import RunConfig  # noqa: E402
from specdraft.pipelines.train_drafters import finetune  # noqa: E402
from benchmarks.engines.acceptance import pooled_mal, test_prompts  # noqa: E402
from benchmarks.harness.machine import box_load, machine  # noqa: E402
from benchmarks.harness.publish import add_section_flags, publish_for  # noqa: E402
from benchmarks.harness.tables import interval, table  # noqa: E402


def kept_layers(n_layers: int, depth: int) -> list[int]:
    """The layers a `depth`-layer cut keeps: the first depth - 1 and the last (the one whose output the final norm
    and the LM head read). Tried by hand at 12 of 24 before distillation: every other layer plus the last accepted
    no better (MAT 1.06 against 1.02 at K = 4; the whole sibling 3.46)."""
    if not 1 <= depth <= n_layers:
        raise SystemExit(f"error: --depths holds {depth}; the sibling has {n_layers} layers: give depths 1..{n_layers}")
    return list(range(depth - 1)) + [n_layers - 1] if depth < n_layers else list(range(n_layers))


def cut(model, depth: int):
    """`model` (a transformers decoder-only LM) with only `kept_layers` of its layers, in place; each kept layer's
    attention renumbered to its new index (the KV cache is indexed by it) and the config made to say the depth, so
    the model saves and loads as a `depth`-layer model of its architecture."""
    cfg = model.config
    keep = kept_layers(cfg.num_hidden_layers, depth)
    layers = model.model.layers
    model.model.layers = torch.nn.ModuleList(layers[i] for i in keep)
    for i, layer in enumerate(model.model.layers):
        layer.self_attn.layer_idx = i
    cfg.num_hidden_layers = depth
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = [cfg.layer_types[i] for i in keep]
    return model


def made_of(run: Path, cfg: RunConfig, depth: int, rows: list[dict]) -> str:
    """What a distilled depth is made of (the sibling's and the target's content, the rows, the finetune recipe,
    the seed): its work dir is named by it, so a rerun resumes only what the same inputs made."""
    parts = [read_manifest(run / "drafters").content_hash, read_manifest(run / "target").content_hash, depth,
             [r["id"] for r in rows], to_dict(cfg.train_drafters.finetune), cfg.run.seed]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def recipe(cfg: RunConfig, args) -> RunConfig:
    """The config's finetune phase at this benchmark's passes and learning rate (one drafter on every domain)."""
    tcfg = cfg.train_drafters
    phase = dataclasses.replace(tcfg.finetune, lr=args.lr, train=dataclasses.replace(
        tcfg.finetune.train, max_steps=-1, max_epochs=args.epochs))
    return dataclasses.replace(cfg, train_drafters=dataclasses.replace(tcfg, finetune=phase, ofa_compute="same_epochs"))


def sibling_layers(run: Path) -> int:
    return int(json.loads((run / "drafters" / "sibling" / "config.json").read_text())["num_hidden_layers"])


def prepare(run: Path, cfg: RunConfig, depth: int, n_layers: int, rows: list[dict], tok
            ) -> tuple[Path, Path | None, float | None]:
    """The cut model's directory and the distilled one's (trained here unless a finished one is found; None at the
    sibling's own depth); -> (cut, distilled, its training seconds: None where not recorded)."""
    if depth == n_layers:  # the whole sibling, the control: as the run keeps it, not trained again (its
        return run / "drafters" / "sibling", None, None  # distilled drafters are the run's; a step costs ~15 s here)
    work = run / "bench_shallow_sibling" / f"{depth}-{made_of(run, cfg, depth, rows)}"
    cut_dir = work / "cut"
    if not cut_dir.is_dir():
        sibling = load_causal_lm(run / "drafters" / "sibling", "float32", pack=False)
        tmp = work / "cut.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        cut(sibling, depth).save_pretrained(tmp)
        tok.save_pretrained(tmp)
        tmp.rename(cut_dir)
        del sibling
    name = f"distilled-{depth}"
    timings: dict[str, dict] = {}
    ctx = SimpleNamespace(cfg=cfg, work=work)
    finetune(ctx, tok, [(name, sorted({r["domain"] for r in rows}))], rows, cut_dir, None, timings)
    gc.collect()
    record = work / "training.json"  # the fit's wall time, kept: a resumed depth reports what it cost then
    if name in timings:
        record.write_text(json.dumps({"seconds": timings[name]["seconds"]}) + "\n")
    seconds = json.loads(record.read_text())["seconds"] if record.is_file() else None
    return cut_dir, work / name / "model", seconds


def parameters(path: Path) -> int:
    """A model directory's parameter count, from its config (a model built on the meta device: no weights read; the
    loaded drafter's int8 weights are buffers, which a count over its parameters would miss)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return sum(p.numel() for p in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path)).parameters())


def counted(target, drafter, prompts, k: int, tokens: int, eos) -> list:
    """Each prompt's GenerationMetrics: the decoder's fixed-K chain at batch 1, greedy (as the engines' benchmarks'
    `decode_counts` decodes, whose rows they store as JSON: the metrics, which pricing needs, stay here)."""
    spec = PolicySpec("fixed", k=k)
    plan = Plan(f"K={k}", drafter, lambda: build_policy(spec))
    with torch.inference_mode():
        return [decode_batch(target, [ids], tokens, plan, SamplingConfig(0.0), eos, seed=0)[0].metrics
                for _, ids in prompts]


def speedup(cal, name: str, metrics: list) -> tuple[float, float, float]:
    """The counted speedup over the target alone (one forward a token, as its own decode counts them), both priced
    by `cal` as evaluate prices them (`Calibration.cost`), pooled over prompts with a 90% bootstrap interval."""
    def priced(family: str, m) -> float:
        return cal.cost(SimpleNamespace(key=SimpleNamespace(family=family), metrics=m, drafter=name))

    alone = [GenerationMetrics(n_generated=m.n_generated, n_target=m.n_generated) for m in metrics]
    spread = bootstrap_ratio([(priced("ar", a), priced("spec", m)) for a, m in zip(alone, metrics)], n_boot=2000)
    return spread.median, spread.lo, spread.hi


def run_bench(args) -> str:
    run = Path(args.run)
    cfg = recipe(load_config(RunConfig, args.config, [f"run.root={run}"]), args)
    tok = load_tokenizer(run / "target", cfg.target.trust_remote_code)
    rows = [dict(r) for r in load_distill_data(run / "distill_data")["train"]]
    n_layers = sibling_layers(run)
    for depth in args.depths:
        kept_layers(n_layers, depth)  # every depth checked before hours of training
    made, seconds = {}, {}
    for depth in args.depths:  # train first, the target not yet loaded: one fit's memory at a time
        print(f"[bench_shallow_sibling] depth {depth}: {len(rows)} rows, {args.epochs} passes at lr {args.lr:g}")
        made[f"cut-{depth}"], made[f"distilled-{depth}"], seconds[depth] = prepare(run, cfg, depth, n_layers, rows, tok)
    made = {name: path for name, path in made.items() if path is not None}
    target = load_causal_lm(run / "target", cfg.target.dtype, "cpu")
    eos = end_of_turn_ids(tok, target)
    prompts = test_prompts(run, tok, chat_format(cfg.prompts), cfg.demo.test_per_domain, args.max_prompt_tokens)
    drafters = {name: load_drafter(path, dtype_of(target), "cpu", cfg.decoding.draft_weights)
                for name, path in made.items()}
    cal = calibrate(target, drafters, args.k + 1, args.context, args.calibration_reps, "cpu", cfg.run.seed,
                    draft_run=args.k)
    results = {}
    for name, drafter in drafters.items():
        t0 = time.perf_counter()
        metrics = counted(target, drafter, prompts, args.k, args.tokens, eos)
        results[name] = {"mat": pooled_mal([m.n_generated for m in metrics], [m.n_target for m in metrics]),
                         "speedup": speedup(cal, name, metrics), "c": cal.drafter_s[name] / cal.target(1),
                         "parameters": parameters(made[name])}
        print(f"[bench_shallow_sibling] {name}: MAT {results[name]['mat'][0]:.3f}, counted speedup "
              f"{results[name]['speedup'][0]:.3f} ({time.perf_counter() - t0:.0f} s)")
    calibration = {"v": cal.v(args.k), "passes": cal.reps}
    return render(args, cfg, dtype_of(target), results, seconds, calibration, len(rows), len(prompts), n_layers)


def render(args, cfg, dtype: str, results: dict, seconds: dict, calibration: dict, n_rows: int, n_prompts: int,
           n_layers: int) -> str:
    rows = []
    for depth in args.depths:
        for stage in ("cut", "distilled"):
            name = f"{stage}-{depth}"
            if name not in results:
                continue
            r = results[name]
            rows.append([f"{depth} of {n_layers}" + (" (the sibling)" if depth == n_layers else ""),
                         "as cut" if stage == "cut" and depth < n_layers else "none" if stage == "cut"
                         else f"{args.epochs} passes", f"{r['parameters'] / 1e6:.0f}M", f"{r['c']:.3f}",
                         interval(r["mat"]), interval(r["speedup"]),
                         "" if stage == "cut" else (seconds[depth] if seconds[depth] is not None else "not recorded")])
    ft = cfg.train_drafters.finetune
    return "\n".join([
        f"## A shallower sibling ({datetime.date.today()}, {machine('cpu', dtype)}; {box_load()})", "",
        f"`python benchmarks/sibling/bench_shallow_sibling.py {' '.join('RUN' if a == args.run else a for a in args.argv)}`"
        f", RUN: `make real-pair`'s run ({args.config})", "",
        f"The sibling's first L - 1 layers and its last kept; distilled: train-drafters' finetune phase ({ft.loss}, "
        f"lr {ft.lr:g}, batch {ft.train.batch_size}, {ft.max_length} tokens) on all {n_rows} distilled answers for "
        f"{args.epochs} passes. Batch 1, greedy, K = {args.k}, {n_prompts} test prompts x {args.tokens} new tokens; "
        f"drafters as the stages load them (decoding.draft_weights: {cfg.decoding.draft_weights}). c: a draft step "
        f"over a target step, from one calibration of all drafters ({calibration['passes']} interleaved passes, "
        f"v({args.k}) = {calibration['v']:.3f}); counted speedup: the rounds priced with it, against the target alone. "
        "90% intervals over prompts; training seconds wall clock.", "",
        *table(["layers", "training", "parameters", "c", "MAT", "counted speedup", "training s"], rows, "llrrrrr"),
        ""])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a run root of --config through train-drafters (make real-pair's)")
    parser.add_argument("--config", default="configs/real-pair.yaml", help="the run's config")
    parser.add_argument("--depths", type=lambda s: [int(x) for x in s.split(",")], default=[24, 18, 12],
                        help="layers to keep, comma-separated (the sibling's own count: the control)")
    parser.add_argument("--epochs", type=int, default=2, help="passes of the distillation over the answers")
    parser.add_argument("--lr", type=float, default=5e-5, help="its peak learning rate")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per test prompt")
    parser.add_argument("--k", type=int, default=4, help="draft length")
    parser.add_argument("--max-prompt-tokens", type=int, default=448, help="test prompts truncated from the left")
    parser.add_argument("--context", type=int, default=256, help="the cached context the calibration's steps see")
    parser.add_argument("--calibration-reps", type=int, default=10, help="calibration passes")
    add_section_flags(parser)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    publish_for(run_bench(args), not args.no_append, Path(__file__), args.section, args.page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
