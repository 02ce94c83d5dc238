"""What more pretraining of the demo target buys in task quality, and what it costs.

For each pretraining length (`pretrain_target.train.max_steps`), the pretrain-target stage runs through
the normal stage machinery (`pipelines.stage.run_stage`, every other key of the config as given) on a
scratch run root holding only a copy of the finished run's `prompts/`, timed in wall and process CPU
seconds. The run's own target is reused for the step count it was trained with (its wall time from its
manifest; `--retrain` trains that step count here as well, so every timing is taken under the same
conditions). Each target then greedy-decodes the first `--prompts` test prompts of every scored domain,
formatted exactly as the evaluate stage formats them (`format_prompt` with the run's chat format,
`fit_prompt` to evaluate.max_prompt_tokens), stopping at the end-of-turn ids, and the outputs are scored
with data/quality.py's `aggregate` against the references (0-100). Each step count is its own run from
scratch (cosine schedule over its max_steps), not a continuation; one epoch of the demo corpus is
4513 blocks of 256 tokens = 1128 steps of the demo's batch 4, so 1440 and 2880 steps repeat the corpus.

    python benchmarks/training/bench_target_quality.py RUN_ROOT [--config configs/demo.yaml] [--steps 720 1440 2880]
        [--prompts 10] [--max-new-tokens 48] [--scratch /work/runs/quality-steps-{steps}] [--retrain] [--no-append]

A scratch root whose target is already built is a cache hit: its timings come from the sidecar
`bench_timing.json` written when it was trained (so a second invocation adds step counts cheaply).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import pathlib
import platform
import shlex
import shutil
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

import torch  # noqa: E402

from benchmarks.harness.publish import publish  # noqa: E402

NEUTRAL = ("wandb", "log_every_n_steps", "checkpoint_every_n_steps", "resume", "max_steps")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_root", help="a finished demo run root (prompts/ and target/)")
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--steps", type=int, nargs="+", default=[720, 1440, 2880], help="pretraining max_steps values")
    ap.add_argument("--prompts", type=int, default=10, help="test prompts per scored domain")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--scratch", default=None,
                    help="scratch run root per step count, with {steps} (default: RUN_ROOT/../quality-steps-{steps})")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--retrain", action="store_true",
                    help="also train the step count of the run's own target here (timings under this run's conditions)")
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args(argv)
    if any(s <= 0 for s in args.steps):
        ap.error("--steps must be positive")
    if args.prompts <= 0:
        ap.error("--prompts must be positive")
    return args


def _load(cfg_path: str, overrides: list[str]):
    from specdraft.pipelines.config import load_config
    from specdraft.pipelines.schema import RunConfig

    return load_config(RunConfig, cfg_path, overrides)


def _strip(d):
    if isinstance(d, dict):
        return {k: _strip(v) for k, v in d.items() if k not in NEUTRAL}
    return d


def _final_loss(csv_path: pathlib.Path) -> float | None:
    """The last logged train/loss of a Lightning CSV log."""
    if not csv_path.is_file():
        return None
    last = None
    with csv_path.open() as f:
        for row in csv.DictReader(f):
            if row.get("train/loss"):
                last = float(row["train/loss"])
    return last


def train_target(cfg_path: str, run_root: pathlib.Path, scratch: pathlib.Path, steps: int) -> dict:
    """The pretrain-target stage at `steps` on `scratch` (prompts/ copied from run_root); timings."""
    import specdraft.pipelines.pretrain_target as pt_stage
    from specdraft.pipelines.stage import run_stage

    scratch.mkdir(parents=True, exist_ok=True)
    if not (scratch / "prompts").is_dir():
        shutil.copytree(run_root / "prompts", scratch / "prompts")
    cfg = _load(cfg_path, [f"pretrain_target.train.max_steps={steps}", f"run.root={scratch}"])
    sidecar = scratch / "bench_timing.json"
    log_copy = scratch / "pretrain_metrics.csv"
    original = pt_stage.build

    def build_keeping_log(ctx):  # the stage removes its work dir (and the CSV log) after committing
        out = original(ctx)
        logs = sorted((ctx.work / "train" / "csv").glob("version_*/metrics.csv"))
        if logs:
            shutil.copy(logs[-1], log_copy)
        return out

    lines: list[str] = []

    def log(msg: str) -> None:
        lines.append(msg)
        print(msg, flush=True)

    pt_stage.build = build_keeping_log
    t0, c0 = time.time(), time.process_time()
    try:
        out = run_stage(cfg, "pretrain-target", log=log)
    finally:
        pt_stage.build = original
    wall, cpu = time.time() - t0, time.process_time() - c0
    manifest = json.loads((out / "manifest.json").read_text())
    if any("cache hit" in m for m in lines):
        if not sidecar.is_file():
            raise SystemExit(f"{out} is a cache hit with no {sidecar.name}: its training time is unknown; "
                             f"remove {out} to retrain")
        timing = json.loads(sidecar.read_text())
    else:
        timing = {"wall_s": wall, "cpu_s": cpu, "stage_wall_s": manifest.get("wall_time_s"),
                  "final_loss": _final_loss(log_copy), "date": datetime.datetime.utcnow().isoformat() + "Z"}
        sidecar.write_text(json.dumps(timing, indent=1))
    return {"target": out, "source": "trained here", "manifest": manifest, **timing}


def reuse_target(cfg_path: str, run_root: pathlib.Path, steps: int) -> dict | None:
    """The run's own target when it was trained for `steps` with the config's other pretrain keys."""
    from specdraft.pipelines.config import to_dict

    path = run_root / "target" / "manifest.json"
    if not path.is_file():
        return None
    manifest = json.loads(path.read_text())
    cfg = _load(cfg_path, [f"pretrain_target.train.max_steps={steps}"])
    same = (_strip(manifest["config"]["pretrain_target"]) == _strip(to_dict(cfg.pretrain_target))
            and manifest["config"]["prompts"] == to_dict(cfg.prompts)
            and manifest["config"]["run"]["seed"] == cfg.run.seed)
    if not same or manifest.get("metrics", {}).get("steps") != steps:
        return None
    return {"target": run_root / "target", "source": f"reused {run_root / 'target'}", "manifest": manifest,
            "wall_s": manifest.get("wall_time_s"), "cpu_s": None, "stage_wall_s": manifest.get("wall_time_s"),
            "final_loss": None}


def score_target(cfg_path: str, run_root: pathlib.Path, target: pathlib.Path, n_prompts: int,
                 max_new_tokens: int) -> dict:
    """Greedy output of the target on the first n test prompts per scored domain, scored per domain."""
    from specdraft.data.chat import chat_format, row_messages
    from specdraft.data.prompts import fit_prompt, load_prompt_sets
    from specdraft.data.quality import SCORED_DOMAINS, score_set
    from specdraft.decoding.autoregressive import generate_autoregressive
    from specdraft.decoding.bundle.chat import end_of_turn_ids, format_prompt
    from specdraft.decoding.bundle.loading import load_causal_lm, load_tokenizer
    from specdraft.decoding.rounds.sampling import SamplingConfig

    cfg = _load(cfg_path, [])
    tok = load_tokenizer(target)
    model = load_causal_lm(target, cfg.target.dtype, "cpu")
    eos = end_of_turn_ids(tok, model)
    chat = chat_format(cfg.prompts)
    ctx_len = getattr(model.config, "max_position_embeddings", None) or 10**9
    max_prompt = min(cfg.evaluate.max_prompt_tokens, ctx_len - max_new_tokens - 1)
    test = load_prompt_sets(run_root / "prompts")["test"]
    out, t0 = {}, time.process_time()
    for domain in SCORED_DOMAINS:
        rows = [r for r in test if r["domain"] == domain][:n_prompts]
        texts, refs = [], []
        for row in rows:
            ids, _ = fit_prompt(format_prompt(tok, row_messages(row), chat), max_prompt, "truncate", row["id"])
            res = generate_autoregressive(model, ids, max_new_tokens, SamplingConfig(temperature=0.0), eos)
            texts.append(tok.decode(res.tokens, skip_special_tokens=True))
            refs.append(row["response"])
        out[domain] = {**score_set(domain, texts, refs), "example": texts[0], "reference": refs[0]}
    out["decode_cpu_s"] = time.process_time() - t0
    return out


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def _label(row: dict) -> str:
    return f"{row['steps']} (the run's target)" if row.get("reused") else str(row["steps"])


def table(rows: list[dict]) -> str:
    """Markdown table from rows of {steps, wall_s, cpu_s, final_loss, quality: {domain: metrics}}."""
    head = ["| steps | pretrain s (wall) | pretrain s (CPU) | final train loss | math exact_match "
            "| translate exact_match / bleu | summarize rouge2 | code exact_match / bleu |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    body = []
    for r in rows:
        q = r["quality"]
        body.append(f"| {_label(r)} | {_f(r['wall_s'], '{:.0f}')} | {_f(r['cpu_s'], '{:.0f}')} "
                    f"| {_f(r['final_loss'], '{:.3f}')} | {q['math']['exact_match']:.1f} "
                    f"| {q['translate']['exact_match']:.1f} / {q['translate']['bleu']:.1f} "
                    f"| {q['summarize']['rouge2']:.1f} "
                    f"| {q['code']['exact_match']:.1f} / {q['code']['bleu']:.1f} |")
    return "\n".join(head + body)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    run_root = pathlib.Path(args.run_root).resolve()
    scratch_fmt = args.scratch or str(run_root.parent / "quality-steps-{steps}")
    rows = []
    plan = []
    for steps in args.steps:
        reused = reuse_target(args.config, run_root, steps)
        if reused is not None:
            plan.append((steps, reused))
        if reused is None or args.retrain:
            plan.append((steps, None))
    for steps, got in plan:
        if got is None:
            print(f"== {steps} steps: pretrain-target on {scratch_fmt.format(steps=steps)}", flush=True)
            got = train_target(args.config, run_root, pathlib.Path(scratch_fmt.format(steps=steps)), steps)
        else:
            print(f"== {steps} steps: {got['source']}", flush=True)
        quality = score_target(args.config, run_root, got["target"], args.prompts, args.max_new_tokens)
        ppl = {d: v["target_ppl"] for d, v in got["manifest"]["metrics"].get("dev_perplexity", {}).items()}
        row = {"steps": steps, "reused": got["source"] != "trained here", "wall_s": got["wall_s"],
               "cpu_s": got["cpu_s"], "final_loss": got["final_loss"],
               "source": got["source"], "quality": quality, "dev_ppl": ppl}
        rows.append(row)
        print(f"   pretrain wall {_f(row['wall_s'])} s, CPU {_f(row['cpu_s'])} s, final loss "
              f"{_f(row['final_loss'], '{:.3f}')}; decode CPU {quality['decode_cpu_s']:.1f} s")
        print(f"   dev perplexity: {ppl}")
        for d in ("math", "translate", "summarize", "code"):
            metrics = {k: round(v, 2) for k, v in quality[d].items() if isinstance(v, float)}
            print(f"   {d:<9} {metrics}")
            print(f"     example: {quality[d]['example'][:160]!r}")
            print(f"     ref:     {quality[d]['reference'][:160]!r}")
        print(table(rows), flush=True)

    cmd = "python benchmarks/training/bench_target_quality.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    sources = "; ".join(f"{r['steps']}: {r['source']}" for r in rows)
    ppl_rows = [f"| {_label(r)} | " + " | ".join(_f(r["dev_ppl"].get(d), "{:.1f}")
                                             for d in ("math", "translate", "summarize", "code", "chat")) + " |"
                for r in rows]
    text = "\n".join([
        f"## Demo target quality vs pretraining steps ({datetime.date.today()}, {platform.machine()}, "
        f"{args.threads} thread(s))", "",
        # the run's own target was trained by the stage's threads, not these: its seconds compare with the
        # others only when they ran with the same ones
        f"`{cmd}` (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, {args.threads} torch "
        "thread(s) for training here)", "",
        f"Config {args.config} with only `pretrain_target.train.max_steps` changed; targets: {sources}. "
        f"Greedy output of each target on the first {args.prompts} test prompts per scored domain, formatted as "
        f"the evaluate stage formats them, at most {args.max_new_tokens} new tokens, stopping at the end-of-turn "
        "ids; scored with data/quality.py `aggregate` (0-100; BLEU is corpus BLEU). Pretrain seconds are the "
        "pretrain-target stage's whole run (tokenizer, packing, training, dev perplexity, save); CPU is this "
        "process's CPU time (n/a for a reused target, whose manifest records wall time only).", "",
        table(rows), "",
        "Dev perplexity from each stage's manifest (target; lower is better):", "",
        "| steps | math | translate | summarize | code | chat |", "|---:|---:|---:|---:|---:|---:|", *ppl_rows, ""])
    publish(text, write=not args.no_append)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
