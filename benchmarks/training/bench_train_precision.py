"""Training a drafter in fp32 against bf16 autocast on a CPU: dev agreement per minute.

`trainer.precision: null` trains in bf16-mixed on a CPU with bf16 units for a model of at least
`training.trainer.BF16_MIXED_MIN_PARAMETERS`, fp32 elsewhere (and below that size). This is the measurement that
rule stands on: the same drafter, trained on the same distilled rows in the same order, by the stage's own
module, Trainer and fit (`CausalLMModule`, `build_trainer`, `fit`), once per precision and round, the order
turning each round; at every `--eval-every` steps its greedy agreement with the target on the dev answers (the
share of answer positions whose argmax is the target's own greedy token; the answers are the target's at T = 0),
evaluated in fp32 whatever trained it, so the two precisions are judged alike. Training time excludes the
evaluations. A model and its rows:

    --model NAME=INIT,RUN[,fresh][,lr=F][,batch=N][,steps=N][,eval_every=N]

INIT: a model directory (the first drafter's weights, e.g. the pair's 0.5B sibling as convert-target converts it);
`fresh`: its architecture from random weights instead (a drafter trained from scratch, as make real's are).
RUN: a directory holding distill_data/ (train and dev rows; only the T = 0 rows are used). lr (2e-5) and batch (2):
the fit's peak AdamW rate (the stage's cosine schedule over the steps, no warm-up) and rows a step; steps: the
fit's optimizer steps and eval_every its evaluations' interval (--steps and --eval-every unless given).

    python benchmarks/training/bench_train_precision.py --model qwen0.5b=SIBLING,PAIR_RUN \\
        --model smollm2-drafter=DRAFTER,REAL_RUN,fresh,lr=1e-3,batch=8 --steps 16 --eval-every 4 --rounds 2
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

import lightning as L  # noqa: E402
import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from specdraft.core.errors import InputError  # noqa: E402
from specdraft.core import devices  # noqa: E402
from specdraft.drafters import losses  # noqa: E402
from specdraft.drafters.alignment import response_logits  # noqa: E402
from specdraft.drafters.data import CausalLMCollator, CausalLMDataModule  # noqa: E402
from specdraft.drafters.lit_lm import CausalLMModule  # noqa: E402
from specdraft.drafters.model import num_parameters  # noqa: E402
from specdraft.pipelines.readers import load_distill_data  # noqa: E402
from specdraft.training.trainer import TrainerConfig, WandbConfig, build_trainer, fit  # noqa: E402
from benchmarks.harness.machine import box_load, machine  # noqa: E402
from benchmarks.harness.publish import add_section_flags, publish_for  # noqa: E402
from benchmarks.harness.timing import run_child, tail  # noqa: E402

PRECISIONS = ("32-true", "bf16-mixed")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    text: str  # as given on the command line (a child fit gets it back)
    name: str
    init: Path
    run: Path
    fresh: bool = False
    lr: float = 2e-5
    batch: int = 2
    steps: int | None = None  # None: --steps
    eval_every: int | None = None  # None: --eval-every


def parse_model(text: str) -> ModelSpec:
    """NAME=INIT,RUN[,fresh][,lr=F][,batch=N][,steps=N][,eval_every=N] -> ModelSpec, or one InputError line."""
    name, _, rest = text.partition("=")
    parts = rest.split(",")
    usage = f"--model {text!r}: give NAME=INIT,RUN[,fresh][,lr=F][,batch=N][,steps=N][,eval_every=N]"
    if not name or len(parts) < 2:
        raise InputError(usage)
    options: dict = {}
    for opt in parts[2:]:
        key, eq, value = opt.partition("=")
        try:
            if opt == "fresh":
                options["fresh"] = True
            elif key == "lr" and eq and float(value) > 0:
                options["lr"] = float(value)
            elif key in ("batch", "steps", "eval_every") and eq and int(value) >= 1:
                options[key] = int(value)
            else:
                raise ValueError(opt)
        except ValueError:
            raise InputError(usage) from None
    spec = ModelSpec(text, name, Path(parts[0]), Path(parts[1]), **options)
    if not (spec.init / "config.json").is_file():
        raise InputError(f"--model {name}: {spec.init} is not a model directory (no config.json)")
    if not (spec.run / "distill_data").is_dir():
        raise InputError(f"--model {name}: {spec.run} has no distill_data/; run distill-data for it first")
    return spec


def greedy_rows(run: Path, split: str) -> list[dict]:
    rows = [dict(r) for r in load_distill_data(run / "distill_data")[split] if r["temperature"] == 0.0]
    if not rows:
        raise InputError(f"{run}/distill_data has no greedy (T = 0) {split} rows")
    return rows


def new_model(spec: ModelSpec, seed: int):
    if spec.fresh:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(spec.init), dtype=torch.float32)
    return AutoModelForCausalLM.from_pretrained(spec.init, dtype=torch.float32)


@torch.no_grad()
@torch.autocast("cpu", enabled=False)  # judged in fp32, whatever trains the model
def agreement(model, batches: list[dict]) -> float:
    """Share of dev answer positions whose fp32 argmax is the target's greedy token."""
    model.eval()
    hit = total = 0
    for b in batches:
        targets = losses.gather_positions(losses.next_token_targets(b["input_ids"]), b["loss_mask"])
        hit += int((response_logits(model, b).argmax(-1) == targets).sum())
        total += len(targets)
    model.train()
    return hit / total


class DevCurve(L.Callback):
    """Dev agreement at step 0 and every `every` steps, and the fit's own seconds (evaluations excluded)."""

    def __init__(self, batches: list[dict], every: int):
        self.batches, self.every = batches, every
        self.points: list[tuple[int, float, float]] = []  # (step, training seconds so far, agreement)
        self.eval_s = 0.0

    def measure(self, trainer, module) -> None:
        t = time.perf_counter()
        self.points.append((trainer.global_step, t - self.start - self.eval_s, agreement(module.model, self.batches)))
        self.eval_s += time.perf_counter() - t

    def on_train_start(self, trainer, module) -> None:
        self.start = time.perf_counter()
        self.measure(trainer, module)

    def on_train_batch_end(self, trainer, module, *args) -> None:
        if trainer.global_step % self.every == 0:
            self.measure(trainer, module)


def fit_once(spec: ModelSpec, precision: str, rows: list[dict], dev: list[dict], args) -> DevCurve:
    model = new_model(spec, args.seed)
    collate = CausalLMCollator(pad_token_id=0, max_length=args.max_length)  # padding is masked: its id is moot
    module = CausalLMModule(model, loss="ce", lr=spec.lr, warmup_ratio=0.0, seed=args.seed)
    data = CausalLMDataModule(rows, collate, batch_size=spec.batch, seed=args.seed)
    cfg = TrainerConfig(max_steps=spec.steps or args.steps, batch_size=spec.batch, precision=precision,
                        accelerator="cpu", devices=1, checkpoint_every_n_steps=0, save_last=False, seed=args.seed,
                        wandb=WandbConfig(mode="disabled"))
    curve = DevCurve([collate(dev[i:i + 4]) for i in range(0, len(dev), 4)], spec.eval_every or args.eval_every)
    with tempfile.TemporaryDirectory() as out:
        trainer = build_trainer(cfg, out, callbacks=[curve], parameters=num_parameters(model),
                                enable_progress_bar=False)
        fit(trainer, module, data, cfg)
    return curve


def child_fit(spec: ModelSpec, precision: str, args, work: Path) -> dict:
    """One fit in a process of its own -> {"points", "peak_gb"}: each fit starts from an empty process, so neither
    the memory a previous fit left to the allocator nor its threads' state is measured with it."""
    out = work / f"{spec.name}-{precision}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--model", spec.text, "--fit-one", precision,
           "--fit-out", str(out), "--steps", str(args.steps), "--eval-every", str(args.eval_every),
           "--max-length", str(args.max_length), "--threads", str(args.threads), "--seed", str(args.seed)]
    run = run_child(cmd, work / f"{spec.name}-{precision}.log")
    if run["rc"] != 0:
        raise InputError(f"the {precision} fit of {spec.name} ended with exit code {run['rc']} (a code of -9: killed, "
                         f"e.g. out of memory); its log ends:\n{tail(work / f'{spec.name}-{precision}.log')}")
    return {"points": json.loads(out.read_text()), "peak_gb": run["peak_rss_mib"] / 1024}


def measure(spec: ModelSpec, args) -> dict:
    rows, dev = greedy_rows(spec.run, "train"), greedy_rows(spec.run, "dev")
    with torch.device("meta"):  # the count alone: no weights read or allocated
        params = num_parameters(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(spec.init)))
    fits = {p: [] for p in PRECISIONS}
    with tempfile.TemporaryDirectory() as work:
        for r in range(args.rounds):
            for p in (PRECISIONS if r % 2 == 0 else PRECISIONS[::-1]):
                print(f"[bench] {spec.name}: round {r + 1}/{args.rounds}, {p}", flush=True)
                fits[p].append(child_fit(spec, p, args, Path(work)))
    return {"spec": spec, "parameters": params, "rows": len(rows), "dev": len(dev), "fits": fits}


def render(results: list[dict], args, command: str) -> str:
    out = [f"## Drafter training, fp32 against bf16 autocast on a CPU ({datetime.date.today()}, {machine()}, bf16 "
           f"units: {'/'.join(devices.cpu_bf16_units()) or 'none'})", "",
           f"`{command}`: CE on the target's greedy answers (response positions), AdamW (the stage's cosine "
           f"schedule, no warm-up), at most {args.max_length} tokens a row, {args.rounds} round(s) with the precisions "
           f"taking turns; the same rows in the same order for both. Dev agreement: the share of dev "
           f"answer positions whose argmax (fp32) is the target's greedy token. Seconds: the fit's wall clock, "
           f"evaluations excluded; medians over rounds (min-max). {box_load()} at the end.", ""]
    for r in results:
        spec, curves = r["spec"], {p: [f["points"] for f in fits] for p, fits in r["fits"].items()}
        out += [f"### {spec.name}: {r['parameters'] / 1e6:.1f}M parameters, "
                f"{'random initial weights' if spec.fresh else 'from ' + spec.init.name}; lr {spec.lr}, batch "
                f"{spec.batch}, {spec.steps or args.steps} steps; {r['rows']} train rows, {r['dev']} dev answers", ""]
        steps = [s for s, _, _ in curves[PRECISIONS[0]][0]]
        out += ["| precision | s a step | " + " | ".join(f"agreement at {s}" for s in steps)
                + " | agreement per minute | peak GB |",
                "| --- | ---: | " + " | ".join("---:" for _ in steps) + " | ---: | ---: |"]
        per_step = {}
        for p in PRECISIONS:
            runs = curves[p]
            s_step = [c[-1][1] / c[-1][0] for c in runs]
            per_step[p] = statistics.median(s_step)
            gain = [(c[-1][2] - c[0][2]) / (c[-1][1] / 60) for c in runs]
            cells = [f"{statistics.median(c[i][2] for c in runs):.3f}" for i in range(len(steps))]
            peak = max(f["peak_gb"] for f in r["fits"][p])
            out.append(f"| {p} | {per_step[p]:.2f} ({min(s_step):.2f}-{max(s_step):.2f}) | " + " | ".join(cells)
                       + f" | {statistics.median(gain):+.4f} | {peak:.1f} |")
        out += ["", f"fp32 over bf16-mixed, seconds a step: {per_step['32-true'] / per_step['bf16-mixed']:.2f}x. "
                    "Agreement per minute: the gain in dev agreement over the fit, per minute of training. Peak GB: "
                    "the largest resident set of a fit's process (each fit runs in its own).", ""]
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", required=True,
                    help="NAME=INIT,RUN[,fresh][,lr=F][,batch=N][,steps=N][,eval_every=N] (repeatable; lr 2e-5 "
                         "and batch 2 unless given)")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fit-one", choices=PRECISIONS, help=argparse.SUPPRESS)  # a child: one fit of one --model
    ap.add_argument("--fit-out", help=argparse.SUPPRESS)  # where the child writes its dev curve (JSON)
    add_section_flags(ap)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if min(args.steps, args.eval_every, args.rounds, args.max_length, args.threads) < 1:
            raise InputError("--steps, --eval-every, --rounds, --max-length and --threads must be >= 1")
        specs = [parse_model(t) for t in args.model]
        torch.set_num_threads(args.threads)
        if args.fit_one:
            spec = specs[0]
            curve = fit_once(spec, args.fit_one, greedy_rows(spec.run, "train"), greedy_rows(spec.run, "dev"), args)
            Path(args.fit_out).write_text(json.dumps(curve.points))
            return 0
        if not devices.cpu_bf16_units():
            raise InputError("this CPU has no bf16 units (avx512_bf16 or AMX): bf16 autocast converts every element "
                             "here, and trainer.precision null keeps fp32; run it on a CPU that has them")
        command = "python benchmarks/training/bench_train_precision.py " + " ".join(
            f"--model {s.name}=INIT,RUN{',fresh' if s.fresh else ''},lr={s.lr},batch={s.batch}"
            + (f",steps={s.steps}" if s.steps else "") + (f",eval_every={s.eval_every}" if s.eval_every else "")
            for s in specs) + (
            f" --steps {args.steps} --eval-every {args.eval_every} --rounds {args.rounds} --max-length "
            f"{args.max_length} --threads {args.threads}")
        results = [measure(s, args) for s in specs]
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    publish_for(render(results, args, command), not args.no_append, Path(__file__), args.section, args.page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
