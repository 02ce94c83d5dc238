"""Stage `teacher-data`: the target's signal over every training row, computed once, so that no drafter's training
runs the target.

One teacher-forced pass of the target (in the dtype `target.dtype` resolves to) over each distilled row (prompt +
response, fitted to the context the drafters train at) stores, with the row, the target's top-k distribution at
every trained-on position and, when EAGLE drafters are trained, the hidden states they read at every token
(drafters/teacher_signal.py has the layout). The finetune phase's fkl / tvd and the EAGLE drafters read them
instead of running the target at every step, for every epoch and every drafter.

A second source at prefill speed (`teacher_data.extra`): text of the prompt world the target did not write (the
train prompts' reference answers, each after its prompt as the target saw it; or prepare-data's corpus), scored in
the same pass, as extra training rows; held-out domains stay out.

Work is cut into chunks of rows (per split and source, in id order); chunk i belongs to shard i mod N, so N
processes (Slurm array tasks, torchrun ranks, SPECDRAFT_SHARD=i/N, or the `teacher_data.processes` this one
starts on its own machine) split it without talking to each other. A finished chunk is a `datasets` directory
renamed into the work dir whole, so a killed run redoes only its unfinished chunk; the shard that finds every
chunk done links them into the output.

Writes teacher_data/
  info.json              the format (top_k, dtypes, feature layers, context length), the distill-data output it
                         was scored from, the chunks of each split in order
  data/<split>/<chunk>/  the stored rows (Arrow)
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import datasets
import torch
from tqdm.auto import tqdm

from specdraft.core.devices import resolve_device
from specdraft.core.errors import InputError
from specdraft.data.chat import chat_format, user_turn
from specdraft.decoding.bundle.chat import format_prompt
from specdraft.decoding.bundle.loading import load_causal_lm, load_tokenizer
from specdraft.drafters.teacher_signal import DISTILLED, ROW_FEATURES, SignalFormat, score_rows, signal_format
from specdraft.pipelines.artifacts import load_dataset_dir
from specdraft.pipelines.readers import TEACHER_INFO, load_distill_data
from specdraft.pipelines.schema import stored_signal_readers
from specdraft.pipelines.shards import merger_or_stop, processes_started_here, this_share, threads_per_process
from specdraft.pipelines.stage import Context

SPLITS = ("train", "dev")  # what the drafters train on, and what the EAGLE dev curve reads


def distilled_rows(distill: datasets.DatasetDict) -> dict[str, list[dict]]:
    return {split: [{"id": r["id"], "prompt_id": r["prompt_id"], "domain": r["domain"], "source": DISTILLED,
                     "prompt_ids": r["prompt_ids"], "response_ids": r["response_ids"]} for r in distill[split]]
            for split in SPLITS if split in distill}


def reference_rows(ctx: Context, tok, train: list[dict], domains: set[str]) -> list[dict]:
    """The train prompts' reference answers, each after its prompt as the target was given it (a distilled row's
    prompt ids), ending with EOS; prompts without a reference are left out."""
    from specdraft.data.prompts import load_prompt_sets

    refs = {r["id"]: r["response"] for r in load_prompt_sets(ctx.input("prepare-data"))["train"]}
    prompts = {}
    for r in sorted(train, key=lambda r: r["id"]):
        prompts.setdefault(r["prompt_id"], r)
    return [{"id": f"reference:{pid}", "prompt_id": pid, "domain": r["domain"], "source": "reference",
             "prompt_ids": r["prompt_ids"],
             "response_ids": tok(refs[pid], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]}
            for pid, r in sorted(prompts.items()) if refs.get(pid) and r["domain"] in domains]


def corpus_rows(ctx: Context, tok, domains: set[str]) -> list[dict]:
    """prepare-data's corpus documents of the training domains, each prompt formatted as the target is served."""
    corpus_dir = ctx.input("prepare-data") / "corpus"
    if not corpus_dir.is_dir():
        raise InputError("teacher_data.extra names corpus, and this prompt world has none (the demo and quality "
                         "worlds do); use reference, or drop it")
    chat = chat_format(ctx.cfg.prompts)
    return [{"id": f"corpus:{i:07d}", "prompt_id": "", "domain": r["domain"], "source": "corpus",
             "prompt_ids": format_prompt(tok, user_turn(r["prompt"]), chat),
             "response_ids": tok(r["response"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]}
            for i, r in enumerate(load_dataset_dir(corpus_dir, "prepare-data")) if r["domain"] in domains]


def extra_rows(ctx: Context, tok, train: list[dict]) -> list[dict]:
    """teacher_data.extra's rows of the training domains (held-out ones excluded), at most extra_per_domain of each
    source and domain."""
    dcfg = ctx.cfg.teacher_data
    domains = {r["domain"] for r in train} - set(ctx.cfg.demo.heldout_domains)
    rows = []
    for source in dcfg.extra:
        found = reference_rows(ctx, tok, train, domains) if source == "reference" else corpus_rows(ctx, tok, domains)
        kept: dict[str, int] = {}
        for r in found:
            kept[r["domain"]] = kept.get(r["domain"], 0) + 1
            if dcfg.extra_per_domain is None or kept[r["domain"]] <= dcfg.extra_per_domain:
                rows.append(r)
    return rows


def plan_chunks(rows: dict[str, list[dict]], chunk_size: int) -> list[dict]:
    """Fixed, ordered chunks of rows: per split and source, in id order."""
    chunks = []
    for split, split_rows in rows.items():
        for source in sorted({r["source"] for r in split_rows}):
            part = sorted((r for r in split_rows if r["source"] == source), key=lambda r: r["id"])
            for start in range(0, len(part), chunk_size):
                chunks.append({"name": f"{split}-{source}-{start // chunk_size:05d}", "split": split,
                               "rows": part[start:start + chunk_size]})
    return chunks


def eagle_feature_layers(cfg, target_path: str) -> tuple[int, ...] | None:
    """The hidden-state indices the configured EAGLE drafter reads (its own check of them on the meta device, from
    the target's config alone); None when no EAGLE drafter reads the stored signal."""
    if "train_drafters.eagle" not in stored_signal_readers(cfg):
        return None
    from transformers import AutoConfig

    from specdraft.decoding.speculators.eagle_model import new_eagle_drafter

    ecfg = cfg.train_drafters.eagle
    target_config = AutoConfig.from_pretrained(target_path, trust_remote_code=cfg.target.trust_remote_code)
    with torch.device("meta"):
        return tuple(new_eagle_drafter(target_config, variant=ecfg.variant, feature_layers=ecfg.layers).feature_layers)


def score_chunks(ctx: Context, todo: list[dict], chunk_dir: Path, fmt: SignalFormat, place) -> None:
    """This process's chunks, each renamed into `chunk_dir` whole when done, with its time beside it."""
    cfg, dcfg = ctx.cfg, ctx.cfg.teacher_data
    target_path = ctx.target_path()
    pad_id = load_tokenizer(target_path, cfg.target.trust_remote_code).pad_token_id
    target = load_causal_lm(target_path, cfg.target.dtype, resolve_device(dcfg.device), cfg.target.device_map,
                            cfg.target.quantization, cfg.target.trust_remote_code)
    print(f"[teacher-data] shard {place.shard}/{place.count}: {len(todo)} chunks to score "
          f"(target in {next(target.parameters()).dtype})")
    with threads_per_process(place.side_by_side):
        for chunk in tqdm(todo, desc=f"teacher-data shard {place.shard}", unit="chunk"):
            t0 = time.perf_counter()
            rows = score_rows(target, chunk["rows"], fmt, pad_id, dcfg.batch_size)
            seconds = time.perf_counter() - t0
            tmp = chunk_dir / f"{chunk['name']}.tmp{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            datasets.Dataset.from_list(rows, features=ROW_FEATURES).save_to_disk(str(tmp))
            tokens = sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows)
            (tmp / "scored.json").write_text(json.dumps({"seconds": seconds, "tokens": tokens}))
            os.replace(tmp, chunk_dir / chunk["name"])  # whole or not at all


def link_chunks(chunks: list[dict], chunk_dir: Path, out: Path) -> None:
    """The finished chunks into the output, as hard links (no copy; the work dir goes after the commit)."""
    for c in chunks:
        dest = out / "data" / c["split"] / c["name"]
        dest.mkdir(parents=True)
        for f in (chunk_dir / c["name"]).iterdir():
            if f.name != "scored.json":  # its clock stays out of the output's content
                try:
                    os.link(f, dest / f.name)
                except OSError:  # another file system
                    shutil.copy2(f, dest / f.name)


def summary(chunks: list[dict], chunk_dir: Path, out: Path) -> dict:
    """Rows, tokens and scoring time (of the chunks' own runs) per split and source; bytes on disk."""
    per: dict[str, dict[str, dict]] = {}
    for c in chunks:
        scored = json.loads((chunk_dir / c["name"] / "scored.json").read_text())
        entry = per.setdefault(c["split"], {}).setdefault(c["rows"][0]["source"], {"rows": 0, "tokens": 0, "seconds": 0.0})
        entry["rows"] += len(c["rows"])
        entry["tokens"] += scored["tokens"]
        entry["seconds"] = round(entry["seconds"] + scored["seconds"], 1)
    tokens = sum(e["tokens"] for split in per.values() for e in split.values())
    seconds = sum(e["seconds"] for split in per.values() for e in split.values())
    size = sum(f.stat().st_size for f in (out / "data").rglob("*") if f.is_file())
    return {"rows": per, "tokens": tokens, "bytes": size, "bytes_per_token": round(size / max(tokens, 1), 1),
            "score_seconds": round(seconds, 1), "seconds_per_1k_tokens": round(1000 * seconds / max(tokens, 1), 3)}


def build(ctx: Context) -> dict:
    cfg, dcfg = ctx.cfg, ctx.cfg.teacher_data
    target_path = ctx.target_path()
    tok = load_tokenizer(target_path, cfg.target.trust_remote_code)
    rows = distilled_rows(load_distill_data(ctx.input("distill-data")))
    if "train" not in rows:
        raise InputError("distill_data has no train rows; keep 'train' in distill_data.splits")
    rows["train"] = rows["train"] + extra_rows(ctx, tok, rows["train"])
    from transformers import AutoConfig

    fmt = signal_format(AutoConfig.from_pretrained(target_path, trust_remote_code=cfg.target.trust_remote_code),
                        dcfg.top_k, next(iter(stored_signal_readers(cfg).values())),
                        eagle_feature_layers(cfg, target_path), dcfg.hidden_dtype, dcfg.logprob_dtype)
    chunks = plan_chunks(rows, dcfg.chunk_size)
    chunk_dir = ctx.work / "chunks"
    chunk_dir.mkdir(parents=True, exist_ok=True)
    place = this_share(dcfg.processes)
    todo = [c for i, c in enumerate(chunks) if i % place.count == place.shard and not (chunk_dir / c["name"]).is_dir()]
    with processes_started_here(ctx, "teacher-data", place):
        if todo:
            score_chunks(ctx, todo, chunk_dir, fmt, place)
    merger_or_stop(ctx, "teacher-data", place, [c["name"] for c in chunks if not (chunk_dir / c["name"]).is_dir()])

    link_chunks(chunks, chunk_dir, ctx.out)
    names: dict[str, list[str]] = {}
    for c in chunks:
        names.setdefault(c["split"], []).append(c["name"])
    (ctx.out / TEACHER_INFO).write_text(json.dumps(
        {"format": fmt.to_json(), "distill_data": ctx.manifests["distill-data"].content_hash, "chunks": names},
        indent=2) + "\n")
    metrics = {**summary(chunks, chunk_dir, ctx.out), "format": fmt.to_json(), "chunks": len(chunks)}
    print(f"[teacher-data] {json.dumps({k: metrics[k] for k in ('rows', 'tokens', 'bytes', 'seconds_per_1k_tokens')})}")
    return metrics


if __name__ == "__main__":
    from specdraft.pipelines.cli import stage_main

    stage_main("teacher-data")
