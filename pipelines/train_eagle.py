"""The EAGLE part of stage `train-drafters` (train_drafters.eagle): white-box drafters over the target.

For each named drafter spec (default: all, i.e. one per domain + OFA, as MetaEagle does) an EAGLE drafter
"eagle-<name>" is trained on the same self-distilled rows (drafters/eagle.py: EAGLE-1 loss, or EAGLE-3 with
`variant: eagle3`), for epochs over every row. Its features and the target's distribution come from the stored
signal of stage teacher-data when there is one (with its extra rows, if any; the target never runs), else from
the frozen target in every step. Each is
written as a self-describing directory (eagle_config.json with the target's content hash, and
model.safetensors with the projection and decoder layer only) under drafters/eagle/<name>/, where the
stages that read independent drafters (they look for drafter.json) do not see it; export bundles them.

With `eval_every_n_steps`, the drafter's teacher-forced dev agreement and acceptance every so many steps go into
its eagle_config.json (`dev_curve`). A teacher-forced alignment on the dev rows (the drafter's q from its prediction at each response
position, against the target's p there) goes to eagle/alignment.json, like the independent drafters'.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path

import torch

from specdraft.decoding.speculators.eagle_model import (EagleDrafter, count_parameters, fused_features, load_eagle,
                                                        new_eagle_drafter, save_eagle, target_dir_hash)
from specdraft.core.errors import InputError
from specdraft.drafters.data import CausalLMCollator, CausalLMDataModule
from specdraft.drafters.eagle import DevCurve, EagleModule, FrozenParts
from specdraft.drafters.teacher_signal import StoredExamples
from specdraft.pipelines.stage import on_rank_zero
from specdraft.training.trainer import build_trainer, fit

EAGLE_DIR = "eagle"
PREFIX = "eagle-"


def eagle_specs(ecfg, specs: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    """(eagle drafter name, domains) for the drafter specs `ecfg.drafters` names (all when null)."""
    by_name = dict(specs)
    chosen = list(by_name) if ecfg.drafters is None else list(ecfg.drafters)
    for name in chosen:
        if name not in by_name:
            raise InputError(f"train_drafters.eagle.drafters names '{name}', which is not a drafter of this run; "
                             f"choose from {', '.join(by_name)}")
    return [(PREFIX + name, by_name[name]) for name in chosen]


def check_target(ecfg, target_path, trust_remote_code: bool) -> None:
    """The drafter `ecfg` asks for, built on the meta device from the target's config alone (no weights): its
    InputError (an eagle3 drafter over a target of fewer than 3 layers, layer ids past the target's depth, a
    draft vocabulary larger than the target's)."""
    from transformers import AutoConfig

    target_config = AutoConfig.from_pretrained(target_path, trust_remote_code=trust_remote_code)
    if ecfg.draft_vocab is not None:
        check_draft_vocab(ecfg.draft_vocab, target_config.vocab_size)
    with torch.device("meta"):
        new_eagle_drafter(target_config, variant=ecfg.variant, n_layers=ecfg.n_layers, feature_layers=ecfg.layers)


def train_eagle(ctx, target, specs, train_rows: list[dict], pad_id: int, seed: int, target_path, stored=None,
                dev_rows: list[dict] | None = None) -> dict:
    """Train the EAGLE drafters not yet in the work dir, on `stored` (pipelines.readers.TeacherData: the target's
    stored signal) when given, else on `train_rows` with the target run at every step; -> {name: timing} of the
    fits this process ran."""
    ecfg = ctx.cfg.train_drafters.eagle
    target_hash = target_dir_hash(target_path)
    timings = {}
    for name, domains in eagle_specs(ecfg, specs):
        done = ctx.work / name / "model"
        if done.is_dir():
            print(f"[train-drafters] {name}: already trained (resumed run)")
            continue
        rows = [r for r in train_rows if r["domain"] in domains]
        draft_ids = None if ecfg.draft_vocab is None else frequent_tokens(rows, ecfg.draft_vocab, target.config.vocab_size)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            drafter = new_eagle_drafter(target.config, variant=ecfg.variant, n_layers=ecfg.n_layers,
                                        target_hash=target_hash, feature_layers=ecfg.layers, draft_ids=draft_ids)
        if hasattr(drafter, "init_from_target"):
            drafter.init_from_target(target)
        drafter.to(dtype=next(target.parameters()).dtype)
        examples, dev = eagle_examples(ecfg, drafter, rows, domains, stored, dev_rows or [], pad_id)
        module = EagleModule(drafter, target if stored is None else FrozenParts(target), lr=ecfg.lr,
                             warmup_ratio=ecfg.warmup_ratio, weight_decay=ecfg.weight_decay,
                             feature_noise=ecfg.feature_noise, token_weight=ecfg.token_weight, seed=seed,
                             ttt_steps=ecfg.ttt_steps)
        data = CausalLMDataModule(examples, CausalLMCollator(pad_token_id=pad_id, max_length=ecfg.max_length),
                                  batch_size=ecfg.train.batch_size, seed=seed)
        curve = DevCurve(dev, ecfg.eval_every_n_steps) if ecfg.eval_every_n_steps else None
        train_cfg = dataclasses.replace(ecfg.train, resume=True, seed=seed)
        trainer = build_trainer(train_cfg, ctx.work / name / "train", callbacks=[curve] if curve else None)
        print(f"[train-drafters] {name}: EAGLE drafter on {len(examples)} rows ({', '.join(domains)})"
              + (" from the target's stored signal" if stored is not None else ", the target run at every step"))
        t0 = time.time()
        fit(trainer, module, data, train_cfg)
        seconds = time.time() - t0
        loss = trainer.callback_metrics.get("train/loss")
        info = {"name": name, "domains": domains, "kind": "eagle", "steps": trainer.global_step,
                "examples": len(examples), "final_loss": round(float(loss), 4) if loss is not None else None,
                **({"dev_curve": curve.points} if curve else {})}
        timings[name] = {"seconds": round(seconds, 1)}
        on_rank_zero(trainer, lambda: _export(drafter, done, info))
    return timings


def eagle_examples(ecfg, drafter, rows: list[dict], domains: list[str], stored, dev_rows: list[dict], pad_id: int):
    """(training examples, dev batches for the dev curve): the stored rows of `domains` (extra rows included) and
    stored dev rows when the signal is stored, else `rows` and `dev_rows` for the target to run on."""
    collate = CausalLMCollator(pad_token_id=pad_id, max_length=ecfg.max_length)
    if stored is None:
        examples = [{"prompt_ids": r["prompt_ids"], "response_ids": r["response_ids"]} for r in rows]
        dev = [{"prompt_ids": r["prompt_ids"], "response_ids": r["response_ids"]} for r in dev_rows]
    else:
        fmt = stored.format
        if fmt.feature_layers != tuple(drafter.feature_layers) or fmt.max_length != ecfg.max_length:
            raise InputError(f"the stored signal holds features of layers {fmt.feature_layers} at length "
                             f"{fmt.max_length}; this EAGLE drafter reads {tuple(drafter.feature_layers)} at "
                             f"{ecfg.max_length}: rerun stage teacher-data")
        examples = StoredExamples(stored.splits["train"], stored.indices("train", domains), fmt, features=True)
        dev = ([] if "dev" not in stored.splits else
               StoredExamples(stored.splits["dev"], stored.indices("dev", domains), fmt, features=True))
    if ecfg.eval_every_n_steps and not len(dev):
        raise InputError("train_drafters.eagle.eval_every_n_steps needs dev rows; keep 'dev' in distill_data.splits")
    size = ecfg.train.batch_size
    return examples, [collate([dev[i] for i in range(j, min(j + size, len(dev)))]) for j in range(0, len(dev), size)]


def check_draft_vocab(n: int, vocab_size: int) -> None:
    if n > vocab_size:
        raise InputError(f"train_drafters.eagle.draft_vocab is {n}, the target's vocabulary only {vocab_size}; "
                         f"set it to at most {vocab_size}, or null for the whole vocabulary")


def frequent_tokens(rows: list[dict], n: int, vocab_size: int) -> list[int]:
    """The draft vocabulary: the `n` tokens most frequent in the rows' responses (what the drafter is
    trained to predict), ties to the lower id, in id order."""
    check_draft_vocab(n, vocab_size)
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for r in rows:
        counts += torch.bincount(torch.as_tensor(r["response_ids"], dtype=torch.long), minlength=vocab_size)
    order = sorted(range(vocab_size), key=lambda i: (-int(counts[i]), i))
    return sorted(order[:n])


def _export(drafter: EagleDrafter, out: Path, info: dict) -> None:
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_eagle(drafter, tmp, extra=info)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


@torch.no_grad()
def eagle_alignment(target, drafter, rows: list[dict], pad_id: int, max_length: int, batch_size: int = 16) -> dict:
    """Teacher-forced 1 - TV(p, q) at T=1 and greedy agreement over the response positions of `rows`
    (the drafter reads the target's true features: the first draft position of every round)."""
    collate = CausalLMCollator(pad_token_id=pad_id, max_length=max_length)
    acc = agree = n = 0.0
    for i in range(0, len(rows), batch_size):
        batch = collate([{"prompt_ids": r["prompt_ids"], "response_ids": r["response_ids"]}
                         for r in rows[i : i + batch_size]])
        batch = {k: v.to(target.device) for k, v in batch.items()}
        out = target(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False,
                     output_hidden_states=True)
        feats = fused_features(out.hidden_states, drafter.feature_layers)  # EAGLE-3: 3 layers, fused inside
        pred = drafter(feats[:, :-1], batch["input_ids"][:, 1:], attention_mask=batch["attention_mask"][:, 1:])
        mask = batch["loss_mask"][:, 1:].bool() & batch["attention_mask"][:, 1:].bool()
        p = out.logits[:, 1:][mask].float().softmax(-1)
        q = drafter.lm_logits(pred[mask]).float().softmax(-1)
        acc += float(torch.minimum(p, q).sum(-1).sum())
        agree += float((p.argmax(-1) == q.argmax(-1)).sum())
        n += int(mask.sum())
    return {"acceptance": round(acc / max(n, 1), 4), "agreement": round(agree / max(n, 1), 4), "positions": int(n)}


def finish(ctx, target, specs, dev_rows: list[dict], pad_id: int) -> dict:
    """Rank 0, after training: alignment per EAGLE drafter x dev domain, then the drafters and
    eagle/alignment.json into the stage output. -> the stage metrics' "eagle" entry."""
    ecfg = ctx.cfg.train_drafters.eagle
    domains = sorted({r["domain"] for r in dev_rows})
    table, infos = {}, {}
    for name, _ in eagle_specs(ecfg, specs):
        drafter = load_eagle(ctx.work / name / "model", target=target)
        table[name] = {d: eagle_alignment(target, drafter, [r for r in dev_rows if r["domain"] == d], pad_id,
                                          ecfg.max_length) for d in domains}
        shutil.copytree(ctx.work / name / "model", ctx.out / EAGLE_DIR / name)
        meta = json.loads((ctx.out / EAGLE_DIR / name / "eagle_config.json").read_text())
        infos[name] = {"domains": meta["domains"], "variant": meta.get("variant", "eagle1"), "parameters": count_parameters(drafter), "steps": meta["steps"],
                       "final_loss": meta["final_loss"], **({"dev_curve": meta["dev_curve"]} if "dev_curve" in meta else {})}
        print(f"[train-drafters] {name}: teacher-forced acceptance "
              + ", ".join(f"{d} {v['acceptance']:.3f}" for d, v in table[name].items()))
    (ctx.out / EAGLE_DIR / "alignment.json").write_text(json.dumps(table, indent=2) + "\n")
    return {"drafters": infos, "alignment": table}
