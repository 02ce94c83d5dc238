"""Stage `acceptance-data`: SpecDec++ training data for acceptance heads, per drafter (paper §4.4).

Drafter by drafter (one in memory at a time: a real pair's drafter is a third of its target), for every
self-distilled response X of the drafter's (reused from distill-data; nothing is generated), in batches:
  1. one teacher-forced target forward on (prompt, X) gives p_i (a response several drafters label is run once
     for each: target forwards traded for holding one drafter, not all)
  2. one teacher-forced draft forward on (prompt, X) gives q_i; Y_i ~ q_i;
     label P_i = min(1, p_i(Y_i) / q_i(Y_i)), also 1 - TV(p_i, q_i) and greedy agreement; p and q go
     through a sampling transform the decoder will serve with (acceptance_data.label_transforms; one
     set of labels, features and later heads per transform), never a different one
  3. token mixing: Z_i = X_i with probability r, else Y_i (seeded per example)
  4. per transform, one draft forward on (prompt, Z) caches the final hidden state at every position
     taken from Y (fp16): the head's input e_i(prompt, Z_<i, Y_i); heads then train on the cache

Writes acceptance_data/<drafter>/<transform tag>/   (tag: "greedy", "T1", "T0.7_k50", ...)
  sequences/                 DatasetDict {train, dev}: id, domain, temperature, x_ids, z_ids, from_y,
                             accept_prob, one_minus_tv, greedy_agree (per response position)
  features_{train,dev}.safetensors   features (M, H) fp16 (unless cache_features is off: then
                             train-heads recomputes them online), labels (M,), one_minus_tv (M,),
                             sequence (M,) and position (M,) of each Y position, in sequence order
  info.json                  drafter, drafter hash, hidden size, label transform, counts
"""
from __future__ import annotations

import json
import time

import datasets
import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

from specdraft.core.devices import resolve_device
from specdraft.core.errors import InputError
from specdraft.core.hashing import derive_seed
from specdraft.decoding.bundle.loading import dtype_of, load_causal_lm, load_drafter, load_tokenizer
from specdraft.drafters.alignment import response_hidden, response_logits
from specdraft.drafters.data import CausalLMCollator
from specdraft.core.tokenizers import check_same_vocabulary
from specdraft.heads.labels import acceptance_labels, mix_tokens
from specdraft.decoding.bundle.directory import subdir_files
from specdraft.core.hashing import drafter_hash
from specdraft.pipelines.readers import load_distill_data, read_drafter_info
from specdraft.pipelines.stage import Context
from specdraft.pipelines.readers import BASE


def forward_at_response(model, batch: dict, hidden: bool = False) -> torch.Tensor:
    """Logits at the positions predicting response tokens 0..r-1, or final hidden states at the
    positions holding them (drafters/alignment.py); (N_total, V or H) float32 on CPU in batch order."""
    return response_hidden(model, batch) if hidden else response_logits(model, batch)


def select_rows(rows: list[dict], domains: list[str], max_sequences: int, seed: int, split: str) -> list[dict]:
    """A drafter's rows of one split: those of its domains, at most max_sequences of them. Every drafter ranks rows
    by the same seeded hash and takes its first ones, so an all-domain drafter's picks are among the specialists'
    (the first rows overall are among the first of their own domain), and the drafters' labels compare on the
    same responses."""
    chosen = [r for r in rows if not domains or r["domain"] in domains]  # no domains (an untouched init): all
    if len(chosen) > max_sequences:
        chosen = sorted(sorted(chosen, key=lambda r: derive_seed(seed, split, r["id"]))[:max_sequences],
                        key=lambda r: r["id"])
    return chosen


def build(ctx: Context) -> dict:
    cfg, acfg = ctx.cfg, ctx.cfg.acceptance_data
    transforms = [t.config() for t in acfg.label_transforms]  # one set of labels + features (+ heads) each
    target_path = ctx.target_path()
    tok = load_tokenizer(target_path, cfg.target.trust_remote_code)
    device = resolve_device(acfg.device)
    target = load_causal_lm(target_path, cfg.target.dtype, device, cfg.target.device_map, cfg.target.quantization,
                            cfg.target.trust_remote_code)
    drafters_dir = ctx.input("train-drafters")
    drafter_manifest = ctx.manifests["train-drafters"]
    infos = drafters_to_label(drafters_dir, acfg.drafters)
    distill = load_distill_data(ctx.input("distill-data"))
    collate = CausalLMCollator(pad_token_id=tok.pad_token_id, max_length=acfg.max_length)

    # per drafter and split: its sequences (own domains, or all for an OFA drafter), capped
    plan = {n: {s: select_rows([dict(r) for r in distill[s]], infos[n]["domains"],
                               acfg.max_sequences[s] if s in acfg.max_sequences else 10 ** 9, cfg.run.seed, s)
                for s in ("train", "dev")} for n in infos}
    counters = {"target_forwards": 0, "draft_label_forwards": 0, "draft_feature_forwards": 0,
                "sequences": sum(len({r["id"] for n in plan for r in plan[n][s]}) for s in ("train", "dev"))}
    summary, t0 = {}, time.time()
    for n in infos:  # one drafter in memory at a time: a sibling-sized drafter is a third of the target
        # in the target's precision, as the decoder runs the pair: labels and features are the served ones
        drafter = load_drafter(drafters_dir / n, dtype_of(target), device, cfg.decoding.draft_weights)
        check_same_vocabulary(drafter.config.vocab_size, target.config.vocab_size, name=f"drafter '{n}'")
        results = label_sequences(target, n, drafter, plan[n], transforms, collate, acfg, cfg.run.seed, counters)
        for sampling in transforms:
            counts = write_drafter_data(ctx.out / n / sampling.tag, results[sampling.tag], n, sampling,
                                        drafter, drafter_manifest, acfg)
            summary.setdefault(n, {})[sampling.tag] = counts
            print(f"[acceptance-data] {n} ({sampling.tag}): " + ", ".join(
                f"{s} {c['sequences']} seqs / {c['y_positions']} Y positions (mean P {c['mean_label']:.3f})"
                for s, c in counts.items()))
        del drafter, results  # before the next drafter loads
    seconds = time.time() - t0
    return {"drafters": summary, "forwards": counters, "seconds": round(seconds, 1),
            "sequences_per_s": round(counters["sequences"] / max(seconds, 1e-9), 2),
            "label_transforms": {t.tag: t.as_dict() for t in transforms}}


def drafters_to_label(drafters_dir, chosen: list[str] | None) -> dict[str, dict]:
    """The serving drafters (all but `base`, or the ones acceptance_data.drafters names), by name in sorted
    order, with their drafter.json; build loads each when its turn comes."""
    names = sorted(p.name for p in drafters_dir.iterdir() if (p / "drafter.json").is_file() and p.name != BASE)
    if chosen is not None:
        missing = sorted(set(chosen) - set(names))
        if missing:
            raise InputError(f"acceptance_data.drafters names {missing}, not in {drafters_dir}; choose from {names}")
        names = [n for n in names if n in chosen]
    return {n: read_drafter_info(drafters_dir / n) for n in names}


def label_sequences(target, n: str, drafter, plan: dict, transforms: list, collate, acfg, seed: int,
                    counters: dict[str, int]) -> dict:
    """Steps 1-4 over one drafter's planned sequences (split -> rows), in batches: -> transform tag -> split ->
    {"rows", "feats"}; forwards counted into `counters`. The target runs on each batch for this drafter: with
    one drafter in memory at a time a sequence shared by several drafters costs one target forward each."""
    results = {t.tag: {s: {"rows": [], "feats": []} for s in ("train", "dev")} for t in transforms}
    for split in ("train", "dev"):
        rows = sorted(plan[split], key=lambda r: r["id"])
        for start in tqdm(range(0, len(rows), acfg.batch_size), desc=f"acceptance-data {n} {split}", unit="batch"):
            chunk = rows[start:start + acfg.batch_size]
            batch = collate([{"prompt_ids": r["prompt_ids"], "response_ids": r["response_ids"]} for r in chunk])
            lengths = batch["loss_mask"].sum(1).tolist()  # response tokens kept per row
            p_logits = forward_at_response(target, batch).split(lengths)
            q_logits = forward_at_response(drafter, batch).split(lengths)
            counters["target_forwards"] += 1
            counters["draft_label_forwards"] += 1
            every = list(range(len(chunk)))
            for sampling in transforms:  # the logits are shared; Y, Z and so the features are not
                _label_and_cache(n, sampling, chunk, every, batch, lengths, p_logits, q_logits, drafter,
                                 collate, acfg, seed, results[sampling.tag][split], counters)
    return results


def write_drafter_data(out, res: dict, n: str, sampling, drafter, drafter_manifest, acfg) -> dict[str, dict]:
    """One drafter's acceptance data under one label transform: sequences/, features_{train,dev}.safetensors
    and info.json in `out`; -> its counts per split."""
    out.mkdir(parents=True)
    datasets.DatasetDict({s: datasets.Dataset.from_list(res[s]["rows"]) for s in ("train", "dev")}
                         ).save_to_disk(str(out / "sequences"))
    counts = {}
    for s in ("train", "dev"):
        feats = res[s]["feats"]
        if not feats:
            raise InputError(f"drafter '{n}' has no {s} sequences for acceptance data; check distill_data.splits")
        tensors = {"labels": torch.cat([f[1] for f in feats]),
                   "one_minus_tv": torch.cat([f[2] for f in feats]),
                   "sequence": torch.cat([torch.full((len(f[3]),), k) for k, f in enumerate(feats)]),
                   "position": torch.cat([f[3] for f in feats])}
        if acfg.cache_features:
            tensors["features"] = torch.cat([f[0] for f in feats])
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / f"features_{s}.safetensors"))
        counts[s] = {"sequences": len(feats), "y_positions": int(tensors["labels"].numel()),
                     "mean_label": round(float(tensors["labels"].mean()), 4)}
    info = {"drafter": n, "drafter_hash": drafter_hash(subdir_files(drafter_manifest.files, n)),
            "hidden_size": drafter.config.hidden_size,
            "label_transform": sampling.as_dict(), "transform_tag": sampling.tag,
            "mix_rate": acfg.mix_rate, "cached_features": acfg.cache_features, "max_length": acfg.max_length,
            "counts": counts}
    (out / "info.json").write_text(json.dumps(info, indent=2) + "\n")
    return counts


def _label_and_cache(n, sampling, chunk, rows, sub, lengths, p_logits, q_logits, drafter, collate, acfg, seed,
                     res, counters) -> None:
    """Labels, token mixing and (one draft forward on (prompt, Z)) cached features of one drafter's
    rows of a batch under one label transform, appended to `res` {"rows", "feats"}."""
    z_examples, metas = [], []
    for j, i in enumerate(rows):
        r, n_i = chunk[i], lengths[i]
        gen = torch.Generator().manual_seed(derive_seed(seed, n, sampling.tag, r["id"]))
        lab = acceptance_labels(p_logits[i], q_logits[j], sampling, gen)
        x = torch.tensor(r["response_ids"][:n_i], dtype=torch.long)
        z, from_y = mix_tokens(x, lab.draft_tokens, gen, acfg.mix_rate)
        prompt = sub["input_ids"][j][: int(sub["attention_mask"][j].sum()) - n_i].tolist()
        z_examples.append({"prompt_ids": prompt, "response_ids": z.tolist()})
        metas.append((r, x, z, from_y, lab))
    if acfg.cache_features:
        hidden = forward_at_response(drafter, collate(z_examples), hidden=True).split([m[1].numel() for m in metas])
        counters["draft_feature_forwards"] += 1
    else:  # train-heads recomputes them every epoch (heads/online.py)
        hidden = [torch.zeros(m[1].numel(), 0) for m in metas]
    for (r, x, z, from_y, lab), h, zex in zip(metas, hidden, z_examples):
        if not torch.isfinite(h).all():
            raise InputError(f"drafter '{n}' produced NaN/inf hidden states on example {r['id']}; "
                             "check the drafter checkpoint")
        res["rows"].append({
            "id": r["id"], "domain": r["domain"], "temperature": r["temperature"],
            "prompt_ids": zex["prompt_ids"], "x_ids": x.tolist(), "z_ids": z.tolist(), "from_y": from_y.tolist(),
            "accept_prob": lab.accept_prob.tolist(), "one_minus_tv": lab.one_minus_tv.tolist(),
            "greedy_agree": lab.greedy_agree.tolist()})
        res["feats"].append((h[from_y].half(), lab.accept_prob[from_y], lab.one_minus_tv[from_y],
                             from_y.nonzero().squeeze(-1)))


if __name__ == "__main__":
    from specdraft.pipelines.cli import stage_main

    stage_main("acceptance-data")
