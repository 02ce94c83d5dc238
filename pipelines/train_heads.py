"""Stage `train-heads`: the SpecDec++ head grid per drafter, thresholds chosen by simulation.

Per drafter and label transform (SpecDec++ §4.4, §5.1):
  1. train D in {0..4} x w_rej in {1, 3, 6, 12} (20 heads) on the cached features, in one Lightning run
  2. score each head on train and dev: unweighted binary KL, AUROC of predicting rejection, ECE, Brier;
     beside them the constant predictor (the dev mean label) and 1 - TV(p, q) as a predictor (knows the
     target, not the drafted token: under sampling labels most of P's variance is the draw of Y)
  3. choose each head's threshold h by simulating the stopping rule on the dev sequences under the
     cost model T = t_draft N_draft + t_target N_target (c = t_draft / t_target from config, or calibrated
     on the machine as evaluate calibrates it)
  4. references on the same dev sequences: every fixed K (and the best one) and the greedy oracle of
     Theorem 4.1; the gap to the oracle is what a better head would close

Writes heads/
  <drafter>/<tag>/<D{d}_w{w}>/   head.safetensors + head_config.json (D, hidden size, tying, drafter path and
                           hash, w_rej, label transform, chosen h, metrics)
  <drafter>/<tag>/acceptance_summary.json   the dev sequences' P_i and the best head's sigma_i (the first 64,
                           decoding/costs/throughput.py): export ships it, `specdraft predict` simulates from it
  sweep.json               drafter -> transform tag -> every metric, simulation and reference above
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from specdraft.core.devices import resolve_device
from specdraft.core.errors import InputError
from specdraft.pipelines.artifacts import load_dataset_dir
from specdraft.decoding.bundle.loading import dtype_of, load_causal_lm, load_drafter, load_tokenizer
from specdraft.decoding.policies.acceptance_head import save_head
from specdraft.heads.lit_head import HeadTrainConfig, predict_logits, train_head_grid
from specdraft.heads.metrics import constant_baseline, overlap_reference
from specdraft.heads.online import OnlineFeatures, compute_features
from specdraft.heads.simulate import best, greedy_oracle, simulate_fixed_k, simulate_specdecpp
from specdraft.decoding.costs.throughput import ACCEPTANCE_FILE, summarize_acceptance
from specdraft.pipelines.readers import load_features, read_acceptance_info, transform_dirs
from specdraft.pipelines.shards import (claim_merge, is_helper, processes_started_here, read_piece, this_share,
                                        threads_per_process, write_json_atomic)
from specdraft.pipelines.stage import Context, StageIncomplete


def measure_cost_ratio(target, drafter, device: str, seed: int, draft_run: int, reps: int = 60) -> dict:
    """c = t_draft / t_target measured as evaluate calibrates it (`decoding.costs.calibration.calibrate`: passes that
    interleave the two models, the drafter timed over `draft_run` forwards in a row right after a target
    forward, as a round drafts, a low quantile over the passes), so the heads, thresholds and the assistant
    K are picked with the c their counted speedup is later priced with. Timing a lone drafter forward
    instead prices every drafted token as the cold first one (0.076-0.090 here against evaluate's 0.097)."""
    from specdraft.decoding.costs.calibration import calibrate

    calib = calibrate(target, {"drafter": drafter}, 1, 64, reps, device, seed, draft_run=draft_run)
    t_draft, t_target = calib.drafter_s["drafter"], calib.target_s[1]
    return {"t_draft_s": t_draft, "t_target_s": t_target, "cost_ratio": t_draft / t_target, "source": "calibrated",
            "draft_run": draft_run, "reps": reps}


def check_cache(features: dict[str, torch.Tensor], ids: list[str], where: str) -> None:
    """NaN/inf features or labels outside [0, 1] -> InputError naming the example (sequence id)."""
    bad = ~torch.isfinite(features["features"].float()).all(-1)
    lab = features["labels"]
    bad |= ~(torch.isfinite(lab) & (lab >= 0) & (lab <= 1))
    if bad.any():
        row = int(bad.nonzero()[0])
        example = ids[int(features["sequence"][row])]
        raise InputError(f"{where}: example {example} (position {int(features['position'][row])}) has NaN/inf "
                         f"features or a label outside [0, 1] ({int(bad.sum())} bad rows); rebuild acceptance-data "
                         "with --force and check the drafter")


def dev_sequences(features: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Row indices of each dev sequence's Y positions, in order (the cache is in sequence order)."""
    seq = features["sequence"]
    counts = torch.bincount(seq, minlength=int(seq.max()) + 1 if len(seq) else 0).tolist()
    return list(torch.arange(len(seq)).split(counts))


def build(ctx: Context) -> dict:
    cfg, hcfg = ctx.cfg, ctx.cfg.train_heads
    acc_dir = ctx.input("acceptance-data")
    sets = transform_dirs(acc_dir)  # <drafter>/<transform tag>/: one grid of heads each
    if not sets:
        raise InputError(f"{acc_dir} holds no drafters; rerun `specdraft acceptance-data`")
    device = resolve_device("auto")  # train-heads has no device key: the GPU when there is one
    # only `--shard` (or the processes started below) splits this stage: a Slurm array or torchrun rank around
    # a whole run must not
    place = this_share(hcfg.processes, from_env="SPECDRAFT_SHARD" in os.environ)
    shard, n_shards, started_here = place.shard, place.count, place.started_here
    cost = shared_cost(ctx, sets[0], device)  # before the processes start: they read it
    store = ctx.work / "units"
    todo = [d for i, d in enumerate(sets) if i % n_shards == shard and not (unit_dir(store, d) / UNIT_FILE).exists()]
    with processes_started_here(ctx, "train-heads", place), \
            threads_per_process(place.side_by_side):
        if todo:
            tok = load_tokenizer(ctx.target_path(), cfg.target.trust_remote_code)
        for data_dir in todo:
            train_unit(ctx, data_dir, cost, unit_dir(store, data_dir), tok, device)
    if not started_here and is_helper():
        raise StageIncomplete(f"shard {shard}/{n_shards} is done; the process that started it merges")
    missing = [d for d in sets if not (unit_dir(store, d) / UNIT_FILE).exists()]
    if missing:
        raise StageIncomplete(f"shard {shard}/{n_shards} is done; {len(missing)} head grids remain for other shards "
                              "(the shard that finishes last, or a rerun, writes the heads)")
    if n_shards > 1 and not started_here and not claim_merge(ctx.work, shard):
        raise StageIncomplete(f"shard {shard}/{n_shards} is done; another shard merges the heads")
    return merge_units(ctx, sets, store, printed_here={unit_dir(store, d) for d in todo})


UNIT_FILE = "unit.json"  # a finished grid's sweep entry, table and seconds: written last, so present = done


def unit_dir(store: Path, data_dir: Path) -> Path:
    return store / data_dir.parent.name / data_dir.name


def shared_cost(ctx: Context, first_set: Path, device: str) -> dict:
    """c for every grid of the stage: from the config, or measured once (drafters share one architecture:
    carefully, on the first drafter) and kept in the work dir, so every process prices with the same c.
    Processes that measure at once keep the first file written (an exclusive link)."""
    cfg, hcfg = ctx.cfg, ctx.cfg.train_heads
    if hcfg.cost_ratio is not None:
        return {"cost_ratio": hcfg.cost_ratio, "source": "config"}
    path = ctx.work / "cost.json"
    if not path.exists():
        target = load_causal_lm(ctx.target_path(), cfg.target.dtype, device)
        info = read_acceptance_info(first_set)
        # c is the served pair's ratio: the drafter in the target's precision, as the decoder runs them
        drafter = load_drafter(ctx.input("train-drafters") / info["drafter"], dtype_of(target),
                               target.get_input_embeddings().weight.device, cfg.decoding.draft_weights).eval()
        cost = measure_cost_ratio(target, drafter, device, cfg.run.seed, draft_run=cfg.decoding.k)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(cost))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        tmp.unlink()
    return read_piece(path, "train-heads cost", lambda c: float(c["cost_ratio"]))


def train_unit(ctx: Context, data_dir: Path, cost: dict, dest: Path, tok, device: str) -> None:
    """One drafter's grid under one label transform: its heads, their thresholds, the acceptance summary and
    the sweep entry, all under `dest` (the work dir), UNIT_FILE last."""
    cfg, hcfg = ctx.cfg, ctx.cfg.train_heads
    k_max = cfg.decoding.k_max  # the decoder's SpecDec++ cap: rounds are simulated as they will be served
    train_cfg = HeadTrainConfig(lr=hcfg.lr, epochs=hcfg.epochs, batch_size=hcfg.batch_size, tie_blocks=hcfg.tie_blocks,
                                zero_init=hcfg.zero_init, seed=cfg.run.seed)
    name, tag = data_dir.parent.name, data_dir.name
    info = read_acceptance_info(data_dir)
    tr, dev, seqs_ds, loader = load_acceptance_data(ctx, data_dir, info, tok, device)
    online = loader is not None  # acceptance_data.cache_features was off: features recomputed every epoch
    c = cost["cost_ratio"]
    t0 = time.time()
    print(f"[train-heads] {name} ({tag} labels): {len(hcfg.depths) * len(hcfg.w_rejs)} heads on {len(tr['labels'])} positions "
          f"(dev {len(dev['labels'])}){' with features recomputed online' if online else ''}, "
          f"c = t_draft/t_target = {c:.3f}")
    trained = train_head_grid(None if online else (tr["features"], tr["labels"]), (dev["features"], dev["labels"]),
                              hcfg.depths, hcfg.w_rejs, train_cfg, train_loader=loader)
    seconds = round(time.time() - t0, 1)

    seqs = dev_sequences(dev)
    accept = [dev["labels"][i] for i in seqs]
    refs = fixed_k_references(seqs_ds["dev"], accept, c, k_max)
    heads_out = choose_thresholds(ctx, name, info, trained, dev, seqs, accept, c, k_max, dest)
    entry = sweep_entry(info, cost, tr, dev, heads_out, refs)
    # what `specdraft predict` simulates from once exported (decoding/costs/throughput.py documents it): the
    # dev sequences' acceptance probabilities and the best head's predictions at the same positions
    chosen = next(th for th in trained if th.spec.name == entry["best_head"])
    sigma = torch.sigmoid(predict_logits(chosen.head, dev["features"]).double())
    summarize_acceptance(accept, [sigma[i] for i in seqs], head=chosen.spec.name,
                         threshold=next(r["threshold"] for r in heads_out if r["head"] == chosen.spec.name),
                         k_max=k_max, label_transform=info["label_transform"]).save(dest / ACCEPTANCE_FILE)
    table = _table(f"{name} ({tag} labels)", entry)
    print(table)
    write_json_atomic(dest / UNIT_FILE, {"sweep": entry, "table": table, "seconds": seconds})


def merge_units(ctx: Context, sets: list[Path], store: Path, printed_here: set[Path]) -> dict:
    """Every grid's files into the stage output and sweep.json in the drafters' order; the tables of grids
    another process trained printed here. Seconds go to the manifest's metrics, never into sweep.json: an output
    file holds only what a rerun reproduces exactly (a killed and resumed stage leaves the same files)."""
    sweep, seconds = {}, {}
    for data_dir in sets:
        name, tag = data_dir.parent.name, data_dir.name
        src = unit_dir(store, data_dir)
        unit = read_piece(src / UNIT_FILE, "train-heads grid", lambda u: (u["sweep"]["best_head"], u["table"]))
        shutil.copytree(src, ctx.out / name / tag, ignore=shutil.ignore_patterns(UNIT_FILE))
        sweep.setdefault(name, {})[tag] = unit["sweep"]
        seconds.setdefault(name, {})[tag] = unit["seconds"]
        if src not in printed_here:
            print(unit["table"])
    (ctx.out / "sweep.json").write_text(json.dumps(sweep, indent=2) + "\n")
    return {"drafters": {n: {tag: {"best_head": s["best_head"], "best_fixed_k": s["best_fixed_k"]["policy"],
                                   "train_seconds": seconds[n][tag]} for tag, s in by_tag.items()}
                         for n, by_tag in sweep.items()}}


def load_acceptance_data(ctx: Context, data_dir, info: dict, tok,
                         device) -> tuple[dict, dict, object, DataLoader | None]:
    """One drafter's acceptance data under one label transform, checked: (train features, dev features, its
    sequences, and the loader that recomputes the train features every epoch when none were cached, else None)."""
    hcfg, seed = ctx.cfg.train_heads, ctx.cfg.run.seed
    name, tag = data_dir.parent.name, data_dir.name
    tr, dev = load_features(data_dir, "train"), load_features(data_dir, "dev")
    seqs_ds = load_dataset_dir(data_dir / "sequences", "acceptance-data")
    loader = None
    if "features" not in tr:  # acceptance_data.cache_features was off: recompute every epoch
        # in the target's configured precision, as acceptance-data computed the cached ones
        drafter = load_drafter(ctx.input("train-drafters") / info["drafter"], ctx.cfg.target.dtype, device,
                               ctx.cfg.decoding.draft_weights).eval()
        pad = tok.pad_token_id
        loader = DataLoader(OnlineFeatures(drafter, [dict(r) for r in seqs_ds["train"]], pad, hcfg.batch_size,
                                           max_length=info["max_length"], seed=seed), batch_size=None)
        dev["features"] = compute_features(drafter, [dict(r) for r in seqs_ds["dev"]], pad, info["max_length"])
    else:
        check_cache(tr, list(seqs_ds["train"]["id"]), f"acceptance_data/{name}/{tag} train")
    check_cache(dev, list(seqs_ds["dev"]["id"]), f"acceptance_data/{name}/{tag} dev")
    return tr, dev, seqs_ds, loader


def fixed_k_references(dev_rows, accept: list[torch.Tensor], c: float, k_max: int) -> dict:
    """Step 4 on the dev sequences: every fixed K and the best one, under the label transform and under
    greedy agreement, and the greedy oracle of Theorem 4.1 (sweep.json's fields, in its order)."""
    ks = list(range(1, k_max + 1))
    fixed = simulate_fixed_k(accept, c, ks)
    best_fixed = best(fixed)
    agree = [torch.tensor(a)[torch.tensor(f)] for a, f in zip(dev_rows["greedy_agree"], dev_rows["from_y"])]
    oracle = greedy_oracle(agree, c)
    fixed_greedy = simulate_fixed_k([a.double() for a in agree], c, ks)
    best_fixed_greedy = best(fixed_greedy)
    return {"fixed_k": {r.policy: r.as_dict() for r in fixed}, "best_fixed_k": best_fixed.as_dict(),
            "oracle": oracle.as_dict(), "best_fixed_k_greedy": best_fixed_greedy.as_dict(), "dev_sequences": len(accept),
            # the best fixed K as numbers (export writes them into the bundle): under the label
            # transform, and under greedy agreement for greedy serving
            "best_k": ks[fixed.index(best_fixed)], "best_k_greedy": ks[fixed_greedy.index(best_fixed_greedy)]}


def choose_thresholds(ctx: Context, name: str, info: dict, trained, dev: dict, seqs: list[torch.Tensor],
                      accept: list[torch.Tensor], c: float, k_max: int, dest: Path) -> list[dict]:
    """Step 3: each head's threshold h by simulating its stopping rule on the dev sequences; each head saved
    with its h and metrics; -> one row per head with its simulation at every threshold."""
    hcfg = ctx.cfg.train_heads
    heads_out = []
    for th in trained:
        sigma = torch.sigmoid(predict_logits(th.head, dev["features"]).double())
        sims = simulate_specdecpp(accept, [sigma[i] for i in seqs], c, hcfg.thresholds, k_max)
        chosen = best(sims)  # the threshold with the lowest simulated cost (ties: the smaller h)
        h = float(hcfg.thresholds[sims.index(chosen)])
        meta = {"drafter": name, "drafter_path": f"drafters/{name}", "drafter_hash": info["drafter_hash"],
                "w_rej": th.spec.w_rej, "w_acc": 1.0, "label_transform": info["label_transform"],
                "threshold": h, "k_max": k_max, "train_metrics": th.train_metrics,
                "eval_metrics": th.eval_metrics, "simulated": chosen.as_dict()}
        save_head(th.head, dest / th.spec.name, meta)
        heads_out.append({"head": th.spec.name, "depth": th.spec.depth, "w_rej": th.spec.w_rej,
                          "train": th.train_metrics, "eval": th.eval_metrics, "threshold": h,
                          "simulated": chosen.as_dict(),  # at the chosen h; every h of the sweep below
                          "by_threshold": [{"threshold": t, **s.as_dict()} for t, s in zip(hcfg.thresholds, sims)]})
    return heads_out


def sweep_entry(info: dict, cost: dict, tr: dict, dev: dict, heads_out: list[dict], refs: dict) -> dict:
    """sweep.json's entry for one drafter and label transform: the baselines, every head, the best one and
    the references."""
    best_head = min(heads_out, key=lambda r: r["simulated"]["cost"])
    return {"label_transform": info["label_transform"], "cost": cost,
            "constant_predictor": {"train": constant_baseline(tr["labels"]),
                                   "eval": constant_baseline(dev["labels"], float(tr["labels"].mean()))},
            # under greedy labels 1 - TV of one-hots *is* the label: no reference there
            "overlap_reference": (None if info["label_transform"]["temperature"] == 0
                                  else overlap_reference(dev["labels"], dev["one_minus_tv"])),
            "heads": heads_out, "best_head": best_head["head"], **refs}


def _table(name: str, s: dict) -> str:
    """Per drafter, like SpecDec++ Table 3: simulated cost per (D, w_rej) at its chosen h."""
    const, overlap = s["constant_predictor"]["eval"]["kl"], s["overlap_reference"]
    lines = [f"{name}: dev KL / AUROC / chosen h / simulated speedup (constant-predictor KL {const:.4f}"
             + (f"; predicting 1 - TV(p, q): KL {overlap['kl']:.4f})" if overlap else ")"),
             f"{'head':<10}{'KL train':>10}{'KL dev':>9}{'AUROC':>8}{'ECE':>7}{'h':>5}{'ver.rate':>10}{'disc.rate':>10}{'speedup':>9}"]
    for r in s["heads"]:
        sim = r["simulated"]
        lines.append(f"{r['head']:<10}{r['train']['kl']:>10.4f}{r['eval']['kl']:>9.4f}{r['eval']['auroc_reject']:>8.3f}"
                     f"{r['eval']['ece']:>7.3f}{r['threshold']:>5.1f}{sim['verification_rate']:>10.3f}"
                     f"{sim['discard_rate']:>10.3f}{sim['speedup']:>9.3f}")
    for label, sim in (("best " + s["best_fixed_k"]["policy"], s["best_fixed_k"]),
                       ("greedy: best " + s["best_fixed_k_greedy"]["policy"], s["best_fixed_k_greedy"]),
                       ("greedy: hindsight oracle (Thm 4.1)", s["oracle"])):
        lines.append(f"{label:<46}{sim['verification_rate']:>10.3f}{sim['discard_rate']:>10.3f}{sim['speedup']:>9.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    from specdraft.pipelines.cli import stage_main

    stage_main("train-heads")
