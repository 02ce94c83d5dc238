"""Data scaling: what more distilled data buys a drafter trained from scratch, for both drafter families.

    python benchmarks/real/bench_data_scaling.py RUN [--config configs/real.yaml] [--scales 1,2,4,8]
        [--independent-epochs 4] [--eagle-epochs 2] [--tokens 64] [--k 4] [--no-append]

RUN is a run root of --config whose prepare-data, distill-data and teacher-data ran at the largest scale's data,
e.g. for SmolLM2 at 8x make real's (96 prompts a domain at T = 0, 384 answers):

    specdraft prepare-data configs/real.yaml run.root=RUN demo.train_per_domain=384 distill_data.temperatures=[0.0,1.0]
    (then distill-data and teacher-data with the same overrides)

Scale s takes, per training domain, the first s x U rows (U: --config's demo.train_per_domain, make real's 96) in the
order (temperature as listed, prompt index): so the scales are nested, and past the world's distinct prompts (the
instruct world has 395 code functions to ask about) the larger scales add the target's answers at the next
temperature to the same prompts, as MetaSD's recipe distils at several temperatures. At each scale, from random
weights, both families as make real trains them, for epochs (so compute grows with the data, as the peers'
recipes do):
  - independent: make real's 2 x 256 drafter, its general phase (cross-entropy on the target's answers, lr 1e-3,
    batch 8) for --independent-epochs passes (make real: 200 steps, ~4 passes of its 384 answers);
  - EAGLE-3: make real's train_drafters.eagle (vLLM's layout, 3-step training-time test, 8192-token draft
    vocabulary, lr 1e-3, batch 8) for --eagle-epochs passes, on teacher-data's stored features (the target never
    runs in training).
Each is trained by the stage's own code (pipelines/train_drafters.py train_base, pipelines/train_eagle.py
train_eagle) into RUN/bench_data_scaling/<answers a domain>-a-domain-<hash of the target, the rows and the
training config>/, so a killed run resumes with the next unfinished drafter, and a changed input trains anew.
Judged by the acceptance length at K = --k (MAT: tokens per target forward, bonus counted; exact, greedy) of the
decoder at batch 1 over every test prompt of the training domains, chat-templated as evaluate formats them, in the
dtype the run's target.dtype picks; 90% intervals bootstrap over prompts. Training times are wall clock on the
box as it was. Writes the table as this script's section of benchmarks/real/RESULTS.md and the curve as
benchmarks/real/data_scaling.png.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

import torch  # noqa: E402

from specdraft.data.chat import chat_format  # noqa: E402
from specdraft.decoding.bundle.chat import end_of_turn_ids  # noqa: E402
from specdraft.decoding.bundle.loading import dtype_of, load_causal_lm, load_tokenizer  # noqa: E402
from specdraft.decoding.policies.stopping import FixedK  # noqa: E402
from specdraft.decoding.rounds.sampling import SamplingConfig  # noqa: E402
from specdraft.decoding.speculative import generate_speculative  # noqa: E402
from specdraft.decoding.speculators.drafter import DrafterSpeculator  # noqa: E402
from specdraft.decoding.speculators.eagle import EagleSpeculator  # noqa: E402
from specdraft.decoding.speculators.eagle_model import load_eagle, target_dir_hash  # noqa: E402
from specdraft.pipelines.config import load_config, to_dict  # noqa: E402
from specdraft.pipelines.readers import BASE, TeacherData, load_distill_data, load_teacher_data  # noqa: E402
from specdraft.pipelines.schema import RunConfig  # noqa: E402
from specdraft.pipelines.train_drafters import train_base  # noqa: E402
from specdraft.pipelines.train_eagle import PREFIX, train_eagle  # noqa: E402
from benchmarks.engines.acceptance import pooled_mal, test_prompts  # noqa: E402
from benchmarks.harness.machine import box_load, machine  # noqa: E402
from benchmarks.harness.publish import publish  # noqa: E402
from benchmarks.harness.tables import interval, table  # noqa: E402

GREEDY = SamplingConfig(temperature=0.0)
PLOT = Path(__file__).resolve().with_name("data_scaling.png")


def scale_rows(rows: list[dict], temperatures: list[float], per_domain: int) -> list[dict]:
    """The first `per_domain` rows of each domain in (temperature as listed, prompt index) order: nested in
    `per_domain`. Refuses a scale the rows cannot fill (one line: what to distil)."""
    rank = {float(t): i for i, t in enumerate(temperatures)}

    def order(r: dict) -> tuple:
        return rank[float(r["temperature"])], int(r["prompt_id"].rsplit("/", 1)[1])

    out = []
    for domain in sorted({r["domain"] for r in rows}):
        mine = sorted((r for r in rows if r["domain"] == domain), key=order)
        if len(mine) < per_domain:
            raise SystemExit(f"error: distill_data holds {len(mine)} {domain} train rows, a scale needs {per_domain}; "
                             "distil more (demo.train_per_domain, distill_data.temperatures) or lower --scales")
        out += mine[:per_domain]
    return out


def subset(stored: TeacherData, ids: set[str]) -> TeacherData:
    """`stored` with its train split cut to the rows `ids` (its dev split whole, for the EAGLE dev curve)."""
    train = stored.splits["train"]
    keep = [i for i, x in enumerate(train["id"]) if x in ids]
    if len(keep) != len(ids):
        raise SystemExit("error: teacher_data lacks rows of distill_data's train split; rerun stage teacher-data")
    return dataclasses.replace(stored, splits={**stored.splits, "train": train.select(keep)})


def point_config(cfg: RunConfig, args) -> RunConfig:
    """--config's training sections with the epochs of this benchmark (max_steps off, so passes decide)."""
    tcfg = cfg.train_drafters
    general = dataclasses.replace(tcfg.general, train=dataclasses.replace(
        tcfg.general.train, max_steps=-1, max_epochs=args.independent_epochs))
    eagle = dataclasses.replace(tcfg.eagle, drafters=["ofa"], eval_every_n_steps=0, train=dataclasses.replace(
        tcfg.eagle.train, max_steps=-1, max_epochs=args.eagle_epochs))
    return dataclasses.replace(cfg, train_drafters=dataclasses.replace(
        tcfg, general=general, eagle=eagle, general_on="distilled", init_from=None, init_drafter=None))


def point_key(cfg: RunConfig, rows: list[dict], target_path: Path) -> str:
    """What a point's drafters are made of (the target's content, the rows, the training sections): its work dir
    is named by it, so a rerun resumes only what the same inputs made."""
    made_of = [target_dir_hash(target_path), [r["id"] for r in rows], to_dict(cfg.train_drafters), cfg.run.seed]
    return hashlib.sha256(json.dumps(made_of, sort_keys=True, default=str).encode()).hexdigest()[:12]


def train_point(cfg: RunConfig, work: Path, rows: list[dict], stored: TeacherData, target, tok, target_path: Path,
                dev_rows: list[dict]) -> dict:
    """Both families at one scale, by the stage's code, into `work` (resumed: a finished drafter is kept);
    -> {family: training seconds of this process, None where resumed}."""
    ctx = SimpleNamespace(cfg=cfg, work=work)
    timings: dict[str, dict] = {}
    t0 = time.perf_counter()
    train_base(ctx, tok, rows, timings, str(target_path))
    independent = round(time.perf_counter() - t0, 1) if BASE in timings else None
    domains = sorted({r["domain"] for r in rows})
    eagle = train_eagle(ctx, target, [("ofa", domains)], rows, tok.pad_token_id, cfg.run.seed, target_path,
                        subset(stored, {r["id"] for r in rows}), dev_rows)
    done = {"independent": independent, "eagle3": eagle.get(PREFIX + "ofa", {}).get("seconds")}
    record = work / "training.json"  # the first run's times: a resumed point reports what it cost then
    first = json.loads(record.read_text()) if record.is_file() else {}
    merged = {k: first.get(k) if done[k] is None else done[k] for k in done}
    record.write_text(json.dumps(merged) + "\n")
    return merged


def acceptance_length(target, speculator, prompts, tokens: int, eos) -> tuple[float, float, float]:
    """MAT over `prompts` (a fresh speculator per prompt), pooled, with a 90% bootstrap interval over prompts."""
    with torch.inference_mode():
        counts = [generate_speculative(target, speculator(), ids, tokens, GREEDY, eos).metrics for _, ids in prompts]
    return pooled_mal([m.n_generated for m in counts], [m.n_target for m in counts], n_boot=1000)


def plot(points: list[dict], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for family, style in (("independent", "o-"), ("eagle3", "s-")):
        xs = [p["tokens"] for p in points]
        ax.errorbar(xs, [p[family][0] for p in points], fmt=style, capsize=3, label=family,
                    yerr=[[p[family][0] - p[family][1] for p in points], [p[family][2] - p[family][0] for p in points]])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("distilled response tokens")
    ax.set_ylabel("acceptance length at K = 4 (MAT)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)
    plt.close(fig)


def run_bench(args) -> str:
    run = Path(args.run)
    cfg = load_config(RunConfig, args.config, [f"run.root={run}"])
    unit = args.unit or cfg.demo.train_per_domain
    target_path = run / "target"
    tok = load_tokenizer(target_path, cfg.target.trust_remote_code)
    target = load_causal_lm(target_path, cfg.target.dtype, "cpu")
    distill = load_distill_data(run / "distill_data")
    # as distill-data listed them: its chunks run one temperature after another, in the config's order
    temperatures = list(dict.fromkeys(float(t) for t in distill["train"]["temperature"]))
    all_rows = [dict(r) for r in distill["train"]]
    dev_rows = [dict(r) for r in distill["dev"]]
    stored = load_teacher_data(run / "teacher_data")
    pcfg = point_config(cfg, args)
    domains = sorted({r["domain"] for r in all_rows})
    eos = end_of_turn_ids(tok, target)
    prompts = [(d, ids) for d, ids in test_prompts(run, tok, chat_format(cfg.prompts), cfg.demo.test_per_domain,
                                                   args.max_prompt_tokens) if d in domains]
    points = []
    for s in args.scales:
        rows = scale_rows(all_rows, temperatures, s * unit)
        work = run / "bench_data_scaling" / f"{s * unit}-a-domain-{point_key(pcfg, rows, target_path)}"
        print(f"[bench_data_scaling] {s}x: {len(rows)} rows")
        seconds = train_point(pcfg, work, rows, stored, target, tok, target_path, dev_rows)
        drafter = load_causal_lm(work / BASE / "model", dtype_of(target), "cpu")
        eagle = load_eagle(work / (PREFIX + "ofa") / "model", target=target, target_hash=target_dir_hash(target_path))
        points.append({
            "scale": s, "rows": len(rows), "tokens": sum(len(r["response_ids"]) for r in rows),
            "temperatures": sorted({float(r["temperature"]) for r in rows}), "seconds": seconds,
            "independent": acceptance_length(target, lambda: DrafterSpeculator(drafter, FixedK(args.k)), prompts,
                                             args.tokens, eos),
            "eagle3": acceptance_length(target, lambda: EagleSpeculator(eagle, FixedK(args.k)), prompts,
                                        args.tokens, eos)})
        print(f"[bench_data_scaling] {s}x: independent {points[-1]['independent'][0]:.3f}, "
              f"EAGLE-3 {points[-1]['eagle3'][0]:.3f}")
    # what RUN holds, for the section's rerun line: its prompts a domain and the temperatures it was distilled at
    held = min(1 + max(int(r["prompt_id"].rsplit("/", 1)[1]) for r in all_rows if r["domain"] == d) for d in domains)
    args.data = f"demo.train_per_domain={held} distill_data.temperatures=[{','.join(map(str, temperatures))}]"
    return render(args, cfg, target, points, unit, len(prompts))


def render(args, cfg: RunConfig, target, points: list[dict], unit: int, n_prompts: int) -> str:
    gguf = cfg.target.gguf
    name = (Path(gguf.file).name if gguf and gguf.file else f"GGUF of {len(gguf.parts)} parts" if gguf
            else str(cfg.target.name_or_path))
    name += f" ({target.config.num_hidden_layers} x {target.config.hidden_size})"
    if not args.no_append:
        plot(points, f"{name}, {cfg.demo.world} world, K = {args.k}")
    rows = [[f"{p['scale']}x", p["rows"], f"{p['tokens']:,}", ", ".join(f"{t:g}" for t in p["temperatures"]),
             interval(p["independent"]), p["seconds"]["independent"], interval(p["eagle3"]), p["seconds"]["eagle3"]]
            for p in points]
    dtype = str(dtype_of(target)).removeprefix("torch.")
    return "\n".join([
        f"## Acceptance length against distilled data ({datetime.date.today()}, {machine('cpu', dtype)}; "
        f"{box_load()})", "",
        f"`python benchmarks/real/bench_data_scaling.py {' '.join('RUN' if a == args.run else a for a in args.argv)}`, RUN: {args.config}'s "
        f"prepare-data, distill-data and teacher-data with {args.data}", "",
        f"Target {name}; {cfg.demo.world} world; drafters from random "
        f"weights at each scale: the independent drafter ({cfg.train_drafters.model.hidden} wide, "
        f"{cfg.train_drafters.model.n_layers} layers) for {args.independent_epochs} passes, EAGLE-3 "
        f"({cfg.train_drafters.eagle.draft_vocab} draft tokens, test length {cfg.train_drafters.eagle.ttt_steps}) for "
        f"{args.eagle_epochs} passes on the stored features. 1x = {unit} answers a domain"
        + (" (make real's)" if unit == cfg.demo.train_per_domain else "") + f". MAT at K = {args.k} "
        f"(tokens per target forward), greedy, batch 1, {n_prompts} test prompts x {args.tokens} new tokens, "
        "pooled, 90% interval over prompts; training seconds wall clock (this process).", "",
        *table(["scale", "answers", "response tokens", "temperatures", "independent MAT", "its training s",
                "EAGLE-3 MAT", "its training s"], rows, "lrrlrrrr"),
        "", "![acceptance length against distilled tokens](data_scaling.png)", ""])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", help="a run root whose distill-data and teacher-data ran at the largest scale")
    parser.add_argument("--config", default="configs/real.yaml", help="the run's config: 1x and the recipes")
    parser.add_argument("--scales", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8],
                        help="multiples of the config's demo.train_per_domain, comma-separated")
    parser.add_argument("--independent-epochs", type=int, default=4, help="passes of the independent drafter")
    parser.add_argument("--eagle-epochs", type=int, default=2, help="passes of the EAGLE-3 drafter")
    parser.add_argument("--unit", type=int, default=None,
                        help="answers a domain at 1x (default: the config's demo.train_per_domain)")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per test prompt")
    parser.add_argument("--k", type=int, default=4, help="draft length")
    parser.add_argument("--max-prompt-tokens", type=int, default=448, help="test prompts truncated from the left")
    parser.add_argument("--no-append", action="store_true", help="print only; leave RESULTS.md alone")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    publish(run_bench(args), write=not args.no_append)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
