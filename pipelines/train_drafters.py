"""Stage `train-drafters`: one specialised drafter per domain plus a one-size-fits-all (OFA) drafter.

MetaSD App. F.2: a small LLaMA drafter is first pretrained on a general corpus, then finetuned on the
target's own responses (self-distillation). Here:
  1. general phase (optional): one base drafter trained on the demo corpus (held-out domains excluded,
     so they stay out-of-domain for every drafter), or (general_on: distilled, a real target with no corpus)
     on the self-distilled responses of every training domain; every drafter starts from it
  2. finetune phase: per drafter, on distill_data train rows of its domains (all domains for OFA);
     loss ce (sequence-level KD on target samples), fkl or tvd against the target: its top-k stored by stage
     teacher-data when that ran (with its extra rows, if any; the target never runs), else its logits
  3. alignment table on distill_data dev rows: 1 - TV(p, q) at T=1 and greedy agreement, per
     drafter x domain, with the general-only base drafter as the no-distillation reference

Every drafter starts from random weights of train_drafters.model or from init_from: a drafter checkpoint, or a
GGUF model such as the target's smaller sibling (converted once in the work dir, its tokenizer checked to be the
target's). init_drafter keeps that untouched model as a serving drafter of its own, with no domains: neither a
specialist nor the all-domain drafter, measured beside them.

Each finished drafter is kept in the work dir, so a killed run resumes with the next drafter (and a
drafter killed mid-training resumes from its last checkpoint).

Writes drafters/
  <name>/           save_pretrained (safetensors) + tokenizer + drafter.json (domains, data hash, steps, metrics);
                    also base/ and the init_drafter's (drafter.json phase "init", domains [])
  alignment.json    drafter -> domain -> {acceptance, agreement, positions}
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import gc
import hashlib
import json
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from specdraft.data.chat import chat_format
from specdraft.data.demo_tokenizer import encode_document, pack
from specdraft.core.devices import resolve_device
from specdraft.core.errors import InputError
from specdraft.pipelines.artifacts import load_dataset_dir
from specdraft.decoding.bundle.loading import dtype_of, load_causal_lm, load_drafter, load_tokenizer
from specdraft.drafters.alignment import alignment_by_domain, format_alignment, specialist_margins
from specdraft.drafters.data import TEACHER_LOGITS, CausalLMCollator, CausalLMDataModule
from specdraft.drafters.lit_lm import CausalLMModule, teacher_logits_per_example
from specdraft.drafters.model import build_causal_lm, num_parameters
from specdraft.core.tokenizers import check_same_vocabulary
from specdraft.drafters.teacher_signal import StoredExamples
from specdraft.pipelines.readers import BASE, TeacherData, load_distill_data, load_teacher_data
from specdraft.pipelines.gguf_convert import convert_gguf
from specdraft.pipelines.gguf_file import describe, gguf_path
from specdraft.pipelines.stage import Context, StageIncomplete, global_rank, on_rank_zero
from specdraft.training.trainer import build_trainer, checkpoint_dir, fit

INIT_KEY = "train_drafters.init_from"



def drafter_specs(cfg, train_domains: list[str]) -> list[tuple[str, list[str]]]:
    """(name, domains) per drafter; default: one per training domain plus 'ofa' on all of them."""
    tcfg = cfg.train_drafters
    if tcfg.drafters is None:
        return [(d, [d]) for d in train_domains] + [("ofa", list(train_domains))]
    specs = []
    for spec in tcfg.drafters:
        doms = spec.domains or list(train_domains)
        for d in doms:
            if d not in train_domains:
                raise InputError(f"drafter '{spec.name}' names domain '{d}', which has no distill_data train rows; "
                                 f"choose from {', '.join(train_domains)}")
        specs.append((spec.name, doms))
    names = [n for n, _ in specs]
    if len(set(names)) != len(names) or BASE in names:
        raise InputError(f"drafter names must be unique and not '{BASE}': {names}")
    return specs


def _train(model, examples: list[dict], phase, pad_id: int, seed: int, work: Path, teacher=None):
    """Fit `model` in place; -> (trainer, stats, timing). Every rank of a multi-process job runs every fit.
    stats go into drafter.json and so into every hash downstream (heads, bundle): only what the same
    config reproduces; timing (wall clock) goes into the stage metrics only."""
    module = CausalLMModule(model, loss=phase.loss, lr=phase.lr, warmup_ratio=phase.warmup_ratio,
                            weight_decay=phase.weight_decay, optimizer=phase.optimizer,
                            teacher=teacher if phase.loss != "ce" else None, teacher_topk=phase.teacher_topk,
                            grad_checkpointing=phase.grad_checkpointing, seed=seed)
    data = CausalLMDataModule(examples, CausalLMCollator(pad_token_id=pad_id, max_length=phase.max_length),
                              batch_size=phase.train.batch_size, seed=seed)
    train_cfg = dataclasses.replace(phase.train, resume=True, seed=seed)
    trainer = build_trainer(train_cfg, work / "train", parameters=num_parameters(model))
    t0 = time.time()
    fit(trainer, module, data, train_cfg)
    seconds = time.time() - t0
    avg_tokens = sum(len(e["input_ids"]) if "input_ids" in e else len(e["prompt_ids"]) + len(e["response_ids"])
                     for e in examples) / len(examples)
    loss = trainer.callback_metrics.get("train/loss")
    stats = {"steps": trainer.global_step, "examples": len(examples), "precision": trainer.precision,
             "final_loss": round(float(loss), 4) if loss is not None else None}
    timing = {"seconds": round(seconds, 1),
              "tokens_per_s": round(trainer.global_step * phase.train.batch_size * avg_tokens / max(seconds, 1e-9))}
    return trainer, stats, timing


def reference_rows(ctx: Context, tok, distill_rows: list[dict]) -> list[dict]:
    """The control without self-distillation: the prompt sets' reference answers (the demo world's
    own text) in place of the target's responses, one row per distilled row so step counts match."""
    from specdraft.data.prompts import load_prompt_sets

    sets = load_prompt_sets(ctx.input("prepare-data"))["train"]
    ref = {r["id"]: r for r in sets}
    rows = []
    for r in distill_rows:
        src = ref[r["prompt_id"]]
        if not src["response"]:
            raise InputError(f"prompt {src['id']} has no reference response; finetune_on: reference needs them")
        rows.append(dict(r, response_ids=tok(src["response"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]))
    return rows


def specialist_steps(specs, rows: list[dict], train) -> int:
    """Optimizer steps of the average single-domain drafter: the budget of an equal-compute OFA drafter."""
    per = [sum(r["domain"] == d[0] for r in rows) for _, d in specs if len(d) == 1]
    if not per:
        raise InputError("train_drafters.ofa_compute: same_steps needs at least one single-domain drafter")
    if train.max_steps != -1:
        return train.max_steps
    return max(1, round(sum(math.ceil(n / train.batch_size) for n in per) / len(per)) * train.max_epochs)


def teacher_cache(teacher, rows: list[dict], phase, batch_size: int) -> dict[str, torch.Tensor]:
    """Row id -> the target's logits at the row's trained-on positions, computed once for every drafter and
    epoch, or {} when they would not fit in phase.teacher_cache_gb. With fkl / tvd each step ran the target
    on its batch: on the demo, 5 specialists x 4 epochs + OFA put every row through the 16-layer target ~5
    times (21,600 of the stage's 22,995 decoder-layer forwards; the stage took 180 s with it, 102 s without)."""
    collate = CausalLMCollator(pad_token_id=0, max_length=phase.max_length)  # padding never reaches a logit row
    positions = sum(collate.positions(r) for r in rows)
    gb = positions * teacher.config.vocab_size * 4 / 1e9
    if not 0 < gb <= phase.teacher_cache_gb:
        if phase.teacher_cache_gb > 0:
            print(f"[train-drafters] the target's logits at {positions:,} trained-on positions take {gb:.1f} GB, over "
                  f"train_drafters.finetune.teacher_cache_gb {phase.teacher_cache_gb}: it runs at every step instead")
        return {}
    t0 = time.time()
    logits = teacher_logits_per_example(teacher, rows, collate, batch_size)
    print(f"[train-drafters] the target's logits at {positions:,} trained-on positions ({gb:.2f} GB) computed once "
          f"in {time.time() - t0:.1f}s, for every drafter and epoch")
    return {r["id"]: x for r, x in zip(rows, logits)}


def _export(model, tok, out: Path, info: dict, dtype: str = "float32") -> None:
    """`model` written to `out` (atomically) with its weights in `dtype` (the model itself is left as it is)."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    weights = None if dtype == "float32" else {k: v.to(getattr(torch, dtype)) for k, v in model.state_dict().items()}
    model.save_pretrained(tmp, safe_serialization=True, state_dict=weights)
    tok.save_pretrained(tmp)
    (tmp / "drafter.json").write_text(json.dumps(info, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def _wait_for(path: Path, timeout_s: float = 600) -> None:
    t0 = time.time()
    while not path.is_dir():
        if time.time() - t0 > timeout_s:
            raise InputError(f"rank {global_rank()} waited {timeout_s:.0f}s for rank 0 to write {path}; is rank 0 running?")
        time.sleep(0.5)


def _data_hash(rows: list[dict]) -> str:
    return hashlib.sha256(json.dumps([r["id"] for r in rows]).encode()).hexdigest()


def build(ctx: Context) -> dict:
    cfg, tcfg = ctx.cfg, ctx.cfg.train_drafters
    seed = cfg.run.seed
    target_path = ctx.target_path()
    tok = load_tokenizer(target_path, cfg.target.trust_remote_code)
    distill = load_distill_data(ctx.input("distill-data"))
    train_rows = [dict(r) for r in distill["train"]]
    if tcfg.finetune_on == "reference":
        train_rows = reference_rows(ctx, tok, train_rows)
    train_domains = sorted({r["domain"] for r in train_rows})
    specs = drafter_specs(cfg, train_domains)
    device = resolve_device(tcfg.device)
    stored = stored_signal(ctx)
    if tcfg.eagle.enabled:  # an EAGLE variant this target cannot hold stops now, not after the drafters trained
        from specdraft.pipelines import train_eagle

        train_eagle.check_target(tcfg.eagle, target_path, cfg.target.trust_remote_code)

    timings: dict[str, dict] = {}  # wall clock of the fits run by this process (not of resumed-over ones)
    kept = tcfg.init_drafter  # the untouched init, a drafter of its own
    if kept in [n for n, _ in specs] + [BASE]:
        raise InputError(f"train_drafters.init_drafter '{kept}' is also the name of a trained drafter; choose another "
                         "name (e.g. sibling)")
    base_dir = train_base(ctx, tok, train_rows, timings, target_path)  # phase 1
    teacher = None
    finetune_stored = stored if stored is not None and (tcfg.finetune.loss != "ce" or stored.has_extra_rows()) else None
    if tcfg.finetune.loss != "ce" and finetune_stored is None:
        teacher = load_causal_lm(target_path, cfg.target.dtype, device, cfg.target.device_map,
                                 cfg.target.quantization, cfg.target.trust_remote_code)
    finetune(ctx, tok, specs, train_rows, base_dir, teacher, timings, finetune_stored)  # phase 2
    if tcfg.eagle.enabled:  # EAGLE twins of the drafters, over the target's features (pipelines/train_eagle.py)
        from specdraft.pipelines import train_eagle

        eagle_target = teacher if teacher is not None else load_causal_lm(
            target_path, cfg.target.dtype, device, cfg.target.device_map, cfg.target.quantization,
            cfg.target.trust_remote_code)
        timings.update(train_eagle.train_eagle(ctx, eagle_target, specs, train_rows, tok.pad_token_id, seed,
                                               target_path, stored, [dict(r) for r in distill.get("dev", [])]))
    if global_rank() != 0:
        raise StageIncomplete(f"rank {global_rank()} finished training; rank 0 writes the stage output")

    # alignment on held-out dev responses, with the target already loaded for distillation or EAGLE if any
    target = teacher if teacher is not None else eagle_target if tcfg.eagle.enabled else load_causal_lm(
        target_path, cfg.target.dtype, device, cfg.target.device_map, cfg.target.quantization,
        cfg.target.trust_remote_code)
    names = [n for n, _ in specs] + [BASE]
    # with no general phase, base is the untouched init: the same weights, loaded and measured once
    aliases = {kept: BASE} if kept is not None and not tcfg.general.enabled else {}
    measured = names + ([kept] if kept is not None and not aliases else [])
    # loaded one at a time by the alignment (a sibling-sized drafter is a third of the target), in the target's
    # dtype and the served weights, as the decoder runs the pair
    drafters = {n: functools.partial(load_drafter, ctx.work / n / "model", dtype_of(target), device,
                                     cfg.decoding.draft_weights) for n in measured}
    dev_rows = [dict(r) for r in distill["dev"]]
    if not dev_rows:
        raise InputError("distill_data has no dev rows; keep 'dev' in distill_data.splits for the alignment table")
    serving = [n for n, _ in specs] + ([kept] if kept is not None else [])  # a specialist's rivals: every drafter
    table = alignment_table(target, drafters, dev_rows, tok.pad_token_id, tcfg, serving, seed, aliases)

    metrics = write_drafters(ctx, serving + [BASE], table, timings)
    if tcfg.eagle.enabled:
        from specdraft.pipelines import train_eagle

        metrics["eagle"] = train_eagle.finish(ctx, target, specs, dev_rows, tok.pad_token_id)
        for name in metrics["eagle"]["drafters"]:
            metrics["eagle"]["drafters"][name].update(timings.get(name, {}))
    return metrics


def stored_signal(ctx: Context) -> TeacherData | None:
    """Stage teacher-data's stored signal when it ran for this run (an optional input), checked against the
    distill-data output this stage reads; None: the drafters that need the target run it at every step."""
    tcfg = ctx.cfg.train_drafters
    if "teacher-data" not in ctx.inputs:
        if tcfg.finetune.loss != "ce" or tcfg.eagle.enabled:
            print("[train-drafters] no stored target signal (stage teacher-data has not run): the target runs at "
                  "every training step")
        return None
    return load_teacher_data(ctx.input("teacher-data"), ctx.manifests["distill-data"].content_hash)


def train_base(ctx: Context, tok, train_rows: list[dict], timings: dict[str, dict], target_path: str) -> Path:
    """Phase 1: the general base drafter every drafter starts from (trained on the demo corpus or on the
    self-distilled mixture `train_rows`, or untrained, from random weights or `init_from`), in the work dir unless
    a resumed run finds it there; -> its directory. The untouched init is kept first when init_drafter names it."""
    cfg, tcfg = ctx.cfg, ctx.cfg.train_drafters
    seed = cfg.run.seed
    base_dir = ctx.work / BASE / "model"
    if base_dir.is_dir():
        return base_dir
    model = init_model(ctx, tok, target_path)
    kept = ctx.work / str(tcfg.init_drafter) / "model"
    if tcfg.init_drafter is not None and not kept.is_dir() and global_rank() == 0:
        _export(model, tok, kept, {"name": tcfg.init_drafter, "domains": [], "parameters": num_parameters(model),
                                   "phase": "init"}, tcfg.save_dtype)
    info = {"name": BASE, "domains": [], "parameters": num_parameters(model), "phase": "general"}
    if tcfg.general.enabled:
        examples = general_examples(ctx, tok, train_rows)
        trainer, info["general"], timings[BASE] = _train(model, examples, tcfg.general, tok.pad_token_id, seed,
                                                         ctx.work / BASE)
        on_rank_zero(trainer, lambda: _export(model, tok, base_dir, info))
    elif global_rank() == 0:
        _export(model, tok, base_dir, info)
    else:
        _wait_for(base_dir)  # no process group yet to wait on: rank 0 writes the untrained base
    return base_dir


def load_to_train(path) -> torch.nn.Module:
    """A drafter's starting weights for training: fp32, plain linears (the inference loader's packing and int8
    weights are for drafters that propose, `load_drafter`)."""
    return load_causal_lm(path, "float32", pack=False)


def init_model(ctx: Context, tok, target_path: str):
    """The model every drafter starts from (train_drafters.init_from): random weights of train_drafters.model, a
    drafter checkpoint dir, or a GGUF model converted once into the work dir, whose tokenizer must be the target's
    (the same vocabulary, ids and special tokens)."""
    cfg, tcfg = ctx.cfg, ctx.cfg.train_drafters
    init = tcfg.init_from
    if init is None:
        return build_causal_lm(tcfg.model, len(tok), seed=cfg.run.seed, bos_token_id=tok.bos_token_id,
                               eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    if isinstance(init, str):
        model = load_to_train(init)
        check_same_vocabulary(model.config.vocab_size, len(tok), name=f"init_from {init}")
        return model
    from transformers import AutoConfig

    directory = converted_init(ctx, init)
    model = load_to_train(directory)
    target_vocab = AutoConfig.from_pretrained(target_path, trust_remote_code=cfg.target.trust_remote_code).vocab_size
    check_same_vocabulary(model.config.vocab_size, target_vocab, directory, tok,
                          name=f"the init_from model ({describe(init, INIT_KEY)})")
    return model


def converted_init(ctx: Context, source) -> Path:
    """init_from's GGUF model as a safetensors directory in the work dir, converted once (a resumed run finds it;
    the assembled parts are dropped once converted). Other ranks wait for rank 0's."""
    out = ctx.work / ".init"  # dot names: no drafter's work dir can be called so
    if out.is_dir():
        return out
    if global_rank() != 0:
        _wait_for(out, timeout_s=3600)
        return out
    tmp = ctx.work / ".init.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    path, sha256 = gguf_path(source, INIT_KEY, ctx.work / ".init-gguf")
    info = convert_gguf(path, tmp, describe(source, INIT_KEY), "train-drafters")
    print(f"[train-drafters] every drafter starts from the init_from model ({info['parameters'] / 1e6:.0f}M "
          f"parameters, GGUF sha256 {sha256[:12]})")
    tmp.rename(out)
    shutil.rmtree(ctx.work / ".init-gguf", ignore_errors=True)
    return out


def general_examples(ctx: Context, tok, train_rows: list[dict]) -> list[dict]:
    """The general phase's training examples (train_drafters.general_on): packed blocks of the built-in world's
    corpus, or the self-distilled responses of every training domain."""
    cfg, tcfg = ctx.cfg, ctx.cfg.train_drafters
    if tcfg.general_on == "distilled":
        print(f"[train-drafters] general phase: {len(train_rows)} self-distilled responses of every training domain")
        return [{"prompt_ids": r["prompt_ids"], "response_ids": r["response_ids"]} for r in train_rows]
    corpus_dir = ctx.input("prepare-data") / "corpus"
    if not corpus_dir.is_dir():
        raise InputError("train_drafters.general.enabled needs a pretraining corpus, which only the demo and quality "
                         "worlds provide; set train_drafters.general_on: distilled, general.enabled: false, or init_from")
    corpus = load_dataset_dir(corpus_dir, "prepare-data")
    held = set(cfg.demo.heldout_domains)
    chat = chat_format(cfg.prompts)  # the corpus formatted as pretrain-target formatted it
    docs = [encode_document(tok, r["prompt"], r["response"], chat) for r in corpus if r["domain"] not in held]
    perm = torch.randperm(len(docs), generator=torch.Generator().manual_seed(cfg.run.seed)).tolist()
    blocks = [{"input_ids": b} for b in pack([docs[i] for i in perm], tcfg.general.max_length)]
    print(f"[train-drafters] general phase: {len(blocks)} blocks of {tcfg.general.max_length} tokens")
    return blocks


def finetune(ctx: Context, tok, specs, train_rows: list[dict], base_dir: Path, teacher,
             timings: dict[str, dict], stored: TeacherData | None = None) -> None:
    """Phase 2: self-distillation finetuning from the base drafter, one drafter at a time (finished ones are
    skipped on rerun); on `stored` rows and top-k when given, else against `teacher`'s logits (cached once when
    they fit) unless the loss is ce."""
    tcfg, seed = ctx.cfg.train_drafters, ctx.cfg.run.seed
    if stored is not None:
        if stored.format.max_length != tcfg.finetune.max_length:
            raise InputError(f"the stored signal was computed at length {stored.format.max_length}, the finetune phase "
                             f"trains at {tcfg.finetune.max_length}; rerun stage teacher-data")
        train_rows = stored.splits["train"].select_columns(["id", "domain"]).to_list()
    cached = None
    for name, domains in specs:
        done = ctx.work / name / "model"
        if done.is_dir():
            print(f"[train-drafters] {name}: already trained (resumed run)")
            continue
        rows = [r for r in train_rows if r["domain"] in domains]
        if not rows:
            raise InputError(f"drafter '{name}' has no training rows for domains {domains}")
        if teacher is not None and cached is None:  # the first drafter left to train builds it for all
            cached = teacher_cache(teacher, train_rows, tcfg.finetune, tcfg.alignment_batch_size)
        model = load_to_train(base_dir).train()  # from_pretrained returns eval mode
        examples = finetune_examples(rows, cached) if stored is None else StoredExamples(
            stored.splits["train"], stored.indices("train", domains), stored.format, topk=tcfg.finetune.loss != "ce")
        phase = tcfg.finetune
        if tcfg.ofa_compute == "same_steps" and len(domains) > 1:
            phase = dataclasses.replace(phase, train=dataclasses.replace(
                phase.train, max_steps=specialist_steps(specs, train_rows, phase.train)))
        print(f"[train-drafters] {name}: finetuning on {len(rows)} rows ({', '.join(domains)})"
              + (" from the target's stored signal" if stored is not None else "")
              + (f" for {phase.train.max_steps} steps (as many as a specialist)" if phase is not tcfg.finetune else ""))
        trainer, stats, timings[name] = _train(model, examples, phase, tok.pad_token_id, seed, ctx.work / name, teacher)
        info = {"name": name, "domains": domains, "parameters": num_parameters(model), "phase": "finetune",
                "data_hash": _data_hash(rows), "finetune": stats, "loss": tcfg.finetune.loss}
        on_rank_zero(trainer, lambda: _export(model, tok, done, info, tcfg.save_dtype))
        if global_rank() == 0:  # its checkpoint (weights and optimizer: ~12 bytes a parameter) resumes nothing now
            shutil.rmtree(checkpoint_dir(ctx.work / name / "train"), ignore_errors=True)
        # the trainer holds the optimizer (8 bytes a parameter): dropped before the next drafter loads, not after
        del model, trainer
        gc.collect()


def finetune_examples(rows: list[dict], cached: dict | None) -> list[dict]:
    """The distilled rows as examples, with the target's cached logits when there are (fkl / tvd)."""
    return [{"prompt_ids": r["prompt_ids"], "response_ids": r["response_ids"],
             **({TEACHER_LOGITS: cached[r["id"]]} if cached else {})} for r in rows]


def alignment_table(target, drafters: dict, dev_rows: list[dict], pad_id: int, tcfg, rivals: list[str],
                    seed: int, aliases: dict[str, str]) -> dict:
    """The alignment table on the dev responses (drafter -> domain -> acceptance, agreement and each
    specialist's margin over its rivals; drafters: name -> a function that loads it), printed; `aliases` (name -> measured drafter of the same weights) get
    that drafter's rows."""
    print(f"[train-drafters] alignment on {len(dev_rows)} dev responses")
    table, by_domain = alignment_by_domain(target, drafters, dev_rows, pad_id, tcfg.alignment_batch_size,
                                           tcfg.finetune.max_length)
    measured = list(drafters)
    for alias, same in aliases.items():  # its row and its per-sequence column: the margins index both by name
        table[alias] = copy.deepcopy(table[same])
        j = measured.index(same)
        by_domain = {d: np.concatenate([s, s[:, j:j + 1]], 1) for d, s in by_domain.items()}
    specialist_margins(table, by_domain, rivals=rivals, seed=seed)
    print("[train-drafters] acceptance 1 - TV(p, q) at T=1 (rows: drafters, columns: dev domain)\n"
          + format_alignment(table, "acceptance"))
    print("[train-drafters] greedy agreement\n" + format_alignment(table, "agreement"))
    margins = [f"{d} {row[d]['agreement_vs_best_other']:.3f} [{row[d]['agreement_vs_best_other_lo']:.3f}, "
               f"{row[d]['agreement_vs_best_other_hi']:.3f}]" for d, row in table.items() if "agreement_vs_best_other"
               in row.get(d, {})]
    if margins:
        print("[train-drafters] own-domain agreement over the best other drafter's there [90% interval over "
              "responses]: " + ", ".join(margins))
    return table


def link_or_copy(src: str, dst: str) -> None:
    """A hard link where the file system allows one (a sibling-sized drafter is GBs; the work dir's files are
    written once, never changed in place), else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def write_drafters(ctx: Context, names: list[str], table: dict, timings: dict[str, dict]) -> dict:
    """The drafters and alignment.json into the stage output; -> the stage metrics."""
    for n in names:
        shutil.copytree(ctx.work / n / "model", ctx.out / n, copy_function=link_or_copy)
    (ctx.out / "alignment.json").write_text(json.dumps(table, indent=2) + "\n")
    infos = {n: json.loads((ctx.out / n / "drafter.json").read_text()) for n in names}
    return {"drafters": {n: {"domains": i["domains"], "parameters": i["parameters"]} for n, i in infos.items()},
            "alignment": table,
            "training": {n: {**(i.get("finetune") or i.get("general") or {}), **timings.get(n, {})}
                         for n, i in infos.items()}}


if __name__ == "__main__":
    from specdraft.pipelines.cli import stage_main

    stage_main("train-drafters")
