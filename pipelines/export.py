"""Stage `export`: one relocatable bundle with everything the decoder serves with.

1. target: the demo target's HF dir is copied into the bundle, unless export.target is "reference"
   (then bundle.json names its absolute path); a user's target.name_or_path is always referenced
2. drafters: every serving drafter of train-drafters (not the general-phase `base`), with its domains,
   parameter count and alignment row; its tokenizer and vocabulary must be the target's
3. heads: per drafter and label transform the head with the best simulated cost (sweep.json
   `best_head`), or all of them, named "<transform tag>/<head>"; the drafter's default head is the best
   one labelled under the serving transform (the config's decoding section). Each must have been trained on exactly
   the exported drafter (its recorded drafter_hash); beside them acceptance/<drafter>/acceptance_summary.json,
   the default head's dev acceptance statistics (decoding/costs/throughput.py), which `specdraft predict` reads;
3b. per drafter its best fixed K (bundle.json, generation_config.json) and vllm/<name>/speculative_config.json,
   with synthetic_speculative_config.json beside it: the acceptance summary as vLLM's synthetic acceptance
   rates (pipelines/vllm_export.py). Those configs name absolute paths, right where the stage wrote the
   bundle; `specdraft export-paths BUNDLE` rewrites them after a move or copy
4. router: train-router's output directory as is, when that stage has run
4b. datastore (export.datastore, default on): a suffix array over distill-data's train responses
   (token ids, the target's own text), read by the REST and suffix-decoding arms; its size and build
   time go into the stage manifest's metrics. Without it the bundle still loads (no REST arm)
5. bundle.json (decoding/bundle/directory.py documents the format): the above, the decoding defaults, the prompt
   format (chat template settings, prompts.*), and the
   sha256 of every file. Files are copied from the lists in the input stages' manifests and checked
   against the hashes recorded there, so a bundle holds exactly what the stages produced.
5b. per drafter with an acceptance summary, the engine schedule in its vllm/<name>/ configs: vLLM's K per
   batch-size range, what `specdraft predict` recommends, priced with a cost table timed here (one per target
   and drafter shape, cached; `export_engine_schedules`; whether it is priced follows from the target's size
   and the device, never from the clock), the device and dtype named in vllm/<name>/engine_schedule.json;
   `specdraft predict BUNDLE --drafter NAME --write-engine-config` rewrites it for the serving device

Weights are safetensors only: a pickle-based file anywhere in the inputs fails the stage.

Writes bundle/ (layout in decoding/bundle/directory.py); `specdraft inspect-bundle runs/<run>/bundle` summarises it.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

from specdraft.data.chat import chat_format
from specdraft.decoding.bundle.directory import BUNDLE_JSON, check_safe_weights, drafter_hash, load_bundle, subdir_files, describe, write_bundle
from specdraft.decoding.bundle.schema import (BundleSpec, DatastoreEntry, DrafterEntry, EagleEntry, HeadEntry,
                                    RouterEntry, TargetEntry)
from specdraft.core.hashing import content_hash, file_sha256
from specdraft.decoding.defaults import DecodingDefaults
from specdraft.core.tokenizers import tokenizer_fingerprint
from specdraft.decoding.speculators.datastore import build_datastore
from specdraft.decoding.costs.throughput import ACCEPTANCE_FILE
from specdraft.core.errors import InputError
from specdraft.decoding.bundle.loading import load_tokenizer
from specdraft.drafters.model import num_parameters
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.policies.acceptance_head import CONFIG_NAME as HEAD_CONFIG
from specdraft.pipelines.artifacts import MANIFEST, Manifest
from specdraft.pipelines.config import to_dict
from specdraft.pipelines.stage import Context
from specdraft.pipelines.readers import BASE


def copy_listed(src: Path, manifest: Manifest, sub: str | None, dst: Path, only: set[str] | None = None) -> dict[str, str]:
    """Copy the files a finished stage's manifest lists (under `sub`/, or all; of those only the relative
    paths in `only` when given) into dst, checking each copy against the hash recorded there. Returns
    dst-relative path -> sha256."""
    listed = dict(manifest.files) if sub is None else subdir_files(manifest.files, sub)
    if only is not None:
        listed = {rel: h for rel, h in listed.items() if rel in only}
    if not listed:
        raise InputError(f"'{src / (sub or '')}' lists no files in its {MANIFEST}; rerun stage '{manifest.stage}'")
    check_safe_weights(listed)
    copied = {}
    for rel, want in sorted(listed.items()):
        source = src / sub / rel if sub is not None else src / rel
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copyfile(source, target)
        except FileNotFoundError:
            raise InputError(f"'{source}' is missing; rerun stage '{manifest.stage}' with --force") from None
        copied[rel] = file_sha256(target)
        if copied[rel] != want:
            raise InputError(f"'{source}' changed since stage '{manifest.stage}' finished; rerun it with --force")
    return copied


def build_datastore_dir(distill_dir: Path, dst: Path) -> dict:
    """Suffix array over distill-data's train responses (decoding/speculators/datastore.py) written into dst;
    returns its datastore.json (tokens, sequences, bytes, source) and the build time in seconds."""
    from specdraft.pipelines.readers import load_distill_data

    data = load_distill_data(distill_dir)
    if "train" not in data or len(data["train"]) == 0:
        raise InputError(f"'{distill_dir}' has no train responses for the datastore; rerun distill-data "
                         "or set export.datastore: false")
    built = build_datastore(data["train"]["response_ids"], source="distill-data train response_ids")
    return built.index.save(dst, built.meta), built.seconds


def decoding_defaults(ctx: Context) -> DecodingDefaults:
    """The config's decoding section (checked when the config loaded, selector and cascade included). Its
    cost ratio is resolved later, from train-heads (`with_cost_ratio`)."""
    return ctx.cfg.decoding


def measured_cost_ratio(sweep: dict) -> float:
    """The c = t_draft / t_target train-heads chose its heads and best K with (measured once per run, or
    pinned by train_heads.cost_ratio): one number for the whole sweep."""
    found = {float(s["cost"]["cost_ratio"]) for by_tag in sweep.values() for s in by_tag.values()
             if isinstance(s.get("cost"), dict) and "cost_ratio" in s["cost"]}
    if len(found) != 1:
        raise InputError(f"train-heads' sweep.json records {len(found)} cost ratios ({sorted(found)}), not one; "
                         "rerun train-heads with --force")
    return found.pop()


def eagle_names(manifest: Manifest) -> list[str]:
    return sorted({rel.split("/")[1] for rel in manifest.files
                   if rel.startswith("eagle/") and rel.endswith("/eagle_config.json")})


def check_eagle_sources(drafters_dir: Path, manifest: Manifest, target_config: dict) -> dict:
    """Before anything is written: every EAGLE drafter's config agrees with its weights, and each eagle3
    (vLLM layout) drafter is one vLLM can serve beside this target. -> {name: drafter}."""
    from specdraft.decoding.speculators.eagle_model import drafter_from_config, eagle_state_and_config
    from specdraft.pipelines.vllm_export import check_servable

    drafters = {}
    for name in eagle_names(manifest):
        src = drafters_dir / "eagle" / name
        meta, state = eagle_state_and_config(src)
        drafters[name] = drafter_from_config(meta, state, src)
        if meta.get("variant") == "eagle3":
            check_servable(name, meta, target_config)
    return drafters


def export_eagle(ctx: Context, drafters_dir: Path, manifest: Manifest, out: Path, files: dict[str, str],
                 target: TargetEntry, add, checked: dict) -> dict[str, EagleEntry]:
    """Copy train-drafters' eagle/<name>/ dirs into eagle/<name>/ and describe them for bundle.json; each
    must have been trained on this target (its recorded target content hash, when both are known). Each
    eagle3 drafter (`checked`: the drafters check_eagle_sources built) also goes to vllm/<name>/ in the
    layout vLLM's eagle3 method loads, with its speculative_config.json at the bundle's K."""
    from specdraft.decoding.speculators.eagle_model import read_eagle_config, target_dir_hash, target_hash_from_files
    from specdraft.pipelines.vllm_export import PROVEN_WITH, write_vllm_drafter

    names = eagle_names(manifest)
    if not names:
        return {}
    others = [n for n in names if checked[n].variant != "eagle3"]
    if others:
        print(f"[export] EAGLE drafters {others} are of specdraft's own variants (eagle1, eagle3-proj), which vLLM cannot "
              "load: serve them with specdraft's decoder; variant eagle3 exports for vLLM")
    final = ctx.root / ctx.spec.out  # where the bundle will be once the stage commits
    if target.path is not None:
        want = target_hash_from_files(subdir_files(files, target.path.relative_to(out).as_posix()))
    else:
        want = target_dir_hash(target.reference)
    alignment_file = drafters_dir / "eagle" / "alignment.json"
    alignment = _json(alignment_file) if alignment_file.is_file() else {}
    tree = to_dict(ctx.cfg.train_drafters.eagle.tree)
    eagle = {}
    for name in names:
        rel = f"eagle/{name}"
        copied = copy_listed(drafters_dir, manifest, rel, out / rel)
        add(rel, copied)
        meta = read_eagle_config(out / rel)
        if meta["vocab_size"] != target.vocab_size:
            raise InputError(f"EAGLE drafter '{name}' drafts in a vocabulary of {meta['vocab_size']}, the target has "
                             f"{target.vocab_size}; rerun train-drafters for this target")
        if want is not None and meta.get("target_hash") not in (None, want):
            raise InputError(f"EAGLE drafter '{name}' was trained for another target (content hash "
                             f"{str(meta['target_hash'])[:12]}, this one {want[:12]}); rerun train-drafters")
        if checked[name].variant == "eagle3":
            k = ctx.cfg.decoding.k
            verifier = str((final / "target").resolve()) if target.path is not None else target.reference
            add(f"vllm/{name}", write_vllm_drafter(checked[name], out / "vllm" / name, k, verifier,
                                                   (final / "vllm" / name).resolve()))
            print(f"[export] {name}: vllm/{name}/ loads in vLLM as method eagle3 (proven with {PROVEN_WITH}); "
                  f"its speculative_config.json serves it at K = {k}")
        eagle[name] = EagleEntry(name=name, path=out / rel, domains=meta.get("domains", []),
                                 parameters=meta["parameters"], hidden_size=meta["hidden_size"],
                                 vocab_size=meta["vocab_size"], target_hash=meta.get("target_hash"),
                                 content_hash=content_hash(copied), alignment=alignment.get(name, {}), tree=tree)
    return eagle


def best_fixed_k(by_tag: dict, default_head: HeadEntry | None, serving: SamplingConfig) -> int | None:
    """The best fixed K train-heads found for a drafter, under the transform it is served with: that of the
    sweep whose labels its default head was trained on (labels at the serving transform when there are
    such), greedy agreement for greedy serving. None when the drafter has no heads."""
    s = next((s for s in by_tag.values() if default_head is not None
              and s.get("label_transform") == default_head.label_transform), None)
    if not s:
        return None
    key = "best_k_greedy" if serving.greedy else "best_k"
    if not isinstance(s.get(key), int):
        raise InputError(f"train-heads' sweep.json has no integer '{key}' (written by an older specdraft); "
                         "rerun train-heads with --force")
    return s[key]


def write_assistant_config(path: Path, k: int) -> str:
    """The drafter's generation_config.json with transformers' assisted-generation keys: K draft tokens
    per round, constant (the default "heuristic" schedule would change K as tokens are accepted).
    Returns the file's sha256."""
    from transformers import GenerationConfig

    cfg = GenerationConfig.from_pretrained(path.parent) if path.is_file() else GenerationConfig()
    cfg.num_assistant_tokens = k
    cfg.num_assistant_tokens_schedule = "constant"
    cfg.save_pretrained(path.parent)
    return file_sha256(path)


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def build(ctx: Context) -> dict:
    cfg, ecfg, out = ctx.cfg, ctx.cfg.export, ctx.out
    defaults = decoding_defaults(ctx)  # bad config fails before anything is copied
    files: dict[str, str] = {}
    from transformers import AutoConfig

    target_src = ctx.target_path()
    target_config = AutoConfig.from_pretrained(target_src, trust_remote_code=cfg.target.trust_remote_code)
    # EAGLE drafters vLLM could not serve, or whose config disagrees with their weights, fail before any copy
    drafters_dir, drafters_manifest = ctx.input("train-drafters"), ctx.manifests["train-drafters"]
    eagle_checked = check_eagle_sources(drafters_dir, drafters_manifest, target_config.to_dict())

    def add(prefix: str, copied: dict[str, str]) -> None:
        files.update({f"{prefix}/{rel}": h for rel, h in copied.items()})

    target = export_target(ctx, target_src, target_config, add)  # 1.
    drafters = export_drafters(ctx, drafters_dir, drafters_manifest, target, add)  # 2.
    names = sorted(drafters)
    # 2b. EAGLE drafters (train_drafters.eagle): self-describing dirs pinned to this target by content hash
    eagle = export_eagle(ctx, drafters_dir, drafters_manifest, out, files, target, add, eagle_checked)
    serving = SamplingConfig(defaults.temperature, defaults.top_k, defaults.top_p)
    heads, sweep = export_heads(ctx, drafters, serving, add)  # 3.
    export_fixed_k(ctx, drafters, heads, sweep, serving, defaults, files, add)  # 3b.
    # the cost ratio the bandits price drafts with: pinned in decoding.cost_ratio, else the one train-heads measured
    if defaults.cost_ratio is None:
        defaults = replace(defaults, cost_ratio=measured_cost_ratio(sweep))
    routers = export_routers(ctx, add)  # 4.
    # 4b. datastore: the self-distilled responses, as REST's and suffix decoding's retrieval structure
    datastore_meta, datastore_metrics = None, {"datastore": None}
    if ecfg.datastore and "distill-data" in ctx.inputs:
        datastore_meta, seconds = build_datastore_dir(ctx.input("distill-data"), out / "datastore")
        add("datastore", {p.name: file_sha256(p) for p in sorted((out / "datastore").iterdir())})
        datastore_metrics = {"datastore": {**{k: datastore_meta[k] for k in ("tokens", "sequences", "bytes")},
                                           "build_seconds": round(seconds, 4)}}

    # 5. bundle.json, then load it back the way the decoder will (paths, tokenizers, every head)
    datastore = DatastoreEntry(path=out / "datastore", **datastore_meta) if datastore_meta else None
    # the prompt format every stage used: the decoder formats requests the same way (decoding/bundle/chat.py)
    write_bundle(out, BundleSpec(target=target, drafters=drafters, heads=heads, decoding=defaults, files=files,
                                 routers=routers, chat=chat_format(cfg.prompts), datastore=datastore, eagle=eagle))
    bundle = load_bundle(out, verify=False)  # the hashes were checked while copying
    for name, by_head in bundle.heads.items():
        for head in by_head:
            bundle.load_head(name, head)
    schedule_metrics = export_engine_schedules(bundle, defaults)  # 5b. (rewrites bundle.json's hashes)
    bundle = load_bundle(out, verify=False)
    files = bundle.spec.files
    print("[export] " + describe(bundle).split("\n", 1)[1])
    size = sum((out / rel).stat().st_size for rel in files)
    return {"target": "bundled" if target.path is not None else "referenced", "drafters": names, "eagle": sorted(eagle),
            "heads": {n: sorted(h) for n, h in heads.items()}, "routers": {n: r.kind for n, r in routers.items()},
            "files": len(files) + 1, "bytes": size + (out / BUNDLE_JSON).stat().st_size, **datastore_metrics,
            **schedule_metrics}


def export_target(ctx: Context, target_src, target_config, add) -> TargetEntry:
    """Step 1: the target, copied in (a demo target) or referenced (a local directory or a pinned hub id)."""
    cfg = ctx.cfg
    external = cfg.target.name_or_path is not None
    tok = load_tokenizer(target_src, cfg.target.trust_remote_code)
    where: dict = {}  # exactly one of path (copied in) and reference (+ revision)
    revision = ctx.input_hashes.get("target", {}).get("revision")
    if revision is not None:  # a hub id: named with its pinned commit, so the bundle loads on any machine
        where.update(reference=cfg.target.name_or_path, revision=revision)
    elif external or cfg.export.target == "reference":
        local = Path(target_src).expanduser()
        where["reference"] = str(local.resolve()) if local.exists() else target_src  # a dir or a hub id
    else:
        add("target", copy_listed(Path(target_src), ctx.manifests[ctx.target_stage()], None, ctx.out / "target"))
        where["path"] = ctx.out / "target"
    return TargetEntry(tokenizer_sha256=tokenizer_fingerprint(tok), vocab_size=target_config.vocab_size,
                       dtype=cfg.target.dtype, quantization=cfg.target.quantization, device_map=cfg.target.device_map,
                       **where)


def export_drafters(ctx: Context, drafters_dir, drafters_manifest, target: TargetEntry, add) -> dict[str, DrafterEntry]:
    """Step 2: every serving drafter copied in, each checked to share the target's tokenizer and vocabulary."""
    names = sorted({rel.split("/")[0] for rel in drafters_manifest.files if rel.endswith("/drafter.json")} - {BASE})
    if not names:
        raise InputError(f"{drafters_dir} holds no serving drafters; rerun `specdraft train-drafters`")
    alignment = _json(drafters_dir / "alignment.json")
    drafters = {}
    for name in names:
        rel = f"drafters/{name}"
        copied = copy_listed(drafters_dir, drafters_manifest, name, ctx.out / rel)
        add(rel, copied)
        info, config = _json(ctx.out / rel / "drafter.json"), _json(ctx.out / rel / "config.json")
        fingerprint = tokenizer_fingerprint(load_tokenizer(ctx.out / rel))
        if fingerprint != target.tokenizer_sha256 or config["vocab_size"] != target.vocab_size:
            raise InputError(f"drafter '{name}' does not share the target's tokenizer and vocabulary "
                             f"({config['vocab_size']} vs {target.vocab_size}); rerun train-drafters for this target")
        drafters[name] = DrafterEntry(
            name=name, path=ctx.out / rel, domains=info["domains"], parameters=info["parameters"],
            hidden_size=config["hidden_size"], vocab_size=config["vocab_size"], tokenizer_sha256=fingerprint,
            content_hash=drafter_hash(copied), alignment=alignment.get(name, {}))
    return drafters


def export_heads(ctx: Context, drafters: dict[str, DrafterEntry], serving: SamplingConfig,
                 add) -> tuple[dict[str, dict[str, HeadEntry]], dict]:
    """Step 3: each drafter's heads (the best per label transform, or all), its default head (the best one
    labelled under the serving transform, else the first tag's) and that head's acceptance summary; the
    drafters' entries updated in place. -> (heads, train-heads' sweep)."""
    out, ecfg = ctx.out, ctx.cfg.export
    heads_dir, heads_manifest = ctx.input("train-heads"), ctx.manifests["train-heads"]
    sweep = _json(heads_dir / "sweep.json")
    heads: dict[str, dict[str, HeadEntry]] = {}
    for name, by_tag in sorted(sweep.items()):
        if name not in drafters:
            raise InputError(f"train-heads has heads for drafter '{name}', which train-drafters lacks; rerun train-heads")
        tags = sorted(by_tag, key=lambda t: (not serving.matches(by_tag[t]["label_transform"]), t))
        for tag in tags:
            s = by_tag[tag]
            chosen = [s["best_head"]] if ecfg.heads == "best" else [h["head"] for h in s["heads"]]
            for head in chosen:
                key = f"{tag}/{head}"
                rel = f"heads/{name}/{key}"
                add(rel, copy_listed(heads_dir, heads_manifest, f"{name}/{key}", out / rel))
                hc = _json(out / rel / HEAD_CONFIG)
                if hc.get("drafter_hash") != drafters[name].content_hash:
                    raise InputError(f"head {name}/{key} was trained on another version of drafter '{name}'; "
                                     "rerun acceptance-data and train-heads")
                heads.setdefault(name, {})[key] = HeadEntry(
                    name=key, path=out / rel, drafter=name, depth=hc["depth"], w_rej=hc["w_rej"],
                    label_transform=hc["label_transform"], threshold=hc["threshold"], k_max=hc["k_max"],
                    best=head == s["best_head"], simulated=hc.get("simulated", {}))
        drafters[name] = replace(drafters[name], head=f"{tags[0]}/{by_tag[tags[0]]['best_head']}")
        # the default head's acceptance summary (decoding/costs/throughput.py), what `specdraft predict` reads; heads
        # trained before train-heads wrote it have none (predict then asks for a re-run)
        if f"{name}/{tags[0]}/{ACCEPTANCE_FILE}" in heads_manifest.files:
            rel = f"acceptance/{name}"
            add(rel, copy_listed(heads_dir, heads_manifest, f"{name}/{tags[0]}", out / rel, only={ACCEPTANCE_FILE}))
            drafters[name] = replace(drafters[name], acceptance=out / rel)
    return heads, sweep


def export_fixed_k(ctx: Context, drafters: dict[str, DrafterEntry], heads: dict, sweep: dict, serving: SamplingConfig,
                   defaults, files: dict[str, str], add) -> None:
    """Step 3b: each drafter's best fixed K, as a number in bundle.json (the entries updated in place), in its
    generation_config, where transformers' assistant_model reads it, and in vLLM's speculative_config
    (method draft_model); beside it, for a drafter with an acceptance summary, the same config with vLLM's
    synthetic rejection sampling at the drafter's dev acceptance (its acceptance profile for simulators)."""
    from specdraft.decoding.costs.throughput import AcceptanceSummary
    from specdraft.pipelines.vllm_export import (synthetic_acceptance_rates, write_speculative_config,
                                                 write_synthetic_config)

    for name in sorted(drafters):
        default = heads.get(name, {}).get(drafters[name].head) if drafters[name].head else None
        k = best_fixed_k(sweep.get(name, {}), default, serving)
        drafters[name] = replace(drafters[name], fixed_k=k)
        served_k = k if k is not None else defaults.k
        rel = f"drafters/{name}/generation_config.json"
        files[rel] = write_assistant_config(ctx.out / rel, served_k)
        model = (ctx.root / ctx.spec.out / "drafters" / name).resolve()  # where it will be once the stage commits
        add(f"vllm/{name}", write_speculative_config(ctx.out / "vllm" / name, "draft_model", model, served_k))
        if drafters[name].acceptance is not None:
            summary = AcceptanceSummary.load(drafters[name].acceptance / ACCEPTANCE_FILE)
            add(f"vllm/{name}", write_synthetic_config(ctx.out / "vllm" / name, "draft_model", model, served_k,
                                                       synthetic_acceptance_rates(summary, served_k)))


def export_engine_schedules(bundle, defaults: DecodingDefaults) -> dict:
    """Step 5b: each drafter with an acceptance summary gets `specdraft predict`'s K per batch size in its
    vLLM configs (pipelines/vllm_export.py, `engine_config_files`), so that the bundle serves with a schedule
    as exported. The cost table is this machine's (the device auto resolves to, the target in the bundle's
    dtype), kept cheap: eager, uncalibrated, one timed pass, K <= SCHEDULE_K_MAX, on SCHEDULE_THREADS torch
    thread, through the cost-table cache, so drafters of one shape share one profile (12.5 s on the demo-shaped
    pair) and a re-export reads it. Where that profile would take minutes (`unpriced_reason`: a target of more
    than SCHEDULE_CPU_PARAMETERS parameters on a CPU, decided from the target and the device, never timed), the
    configs keep the best fixed K and engine_schedule.json says so (`unpriced_schedules`). Serving elsewhere,
    `specdraft predict --write-engine-config` rewrites it, as the printed line says. -> stage metrics."""
    import time

    import torch

    from specdraft.core.devices import device_name, resolve_device
    from specdraft.decoding.bundle.loading import dtype_of
    from specdraft.decoding.costs.profile import cached_cost_table
    from specdraft.pipelines.vllm_export import (SCHEDULE_BATCH_SIZES, SCHEDULE_K_MAX, SCHEDULE_REPEATS,
                                                 SCHEDULE_THREADS, engine_config_files, rewrite_bundle_files,
                                                 schedule_ks, schedule_ranges)

    names = [n for n, d in sorted(bundle.drafters.items()) if d.acceptance is not None]
    if not names:
        return {"engine_schedule": None}
    t0, device, threads = time.perf_counter(), resolve_device("auto"), SCHEDULE_THREADS
    where = f"{device_name(device)}, torch threads {threads}"
    target = bundle.load_target(device=device)
    reason = unpriced_reason(target, device)
    if reason is not None:
        return unpriced_schedules(bundle, names, where, threads, reason, dtype_of(target))
    width = min(SCHEDULE_K_MAX, defaults.k_max) + 1
    wanted, ranges, profiled, before = {}, {}, 0, torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for name in names:
            drafter = bundle.load_drafter(name, device=device, target=target)
            table, _, hit = cached_cost_table(target, drafter, SCHEDULE_BATCH_SIZES, width, "none",
                                              repeats=SCHEDULE_REPEATS, calibrate=False)
            profiled += not hit
            summary = bundle.acceptance_summary(name)
            ks = schedule_ks(summary, table, SCHEDULE_BATCH_SIZES, min(defaults.k_max, summary.k_max))
            wanted.update(engine_config_files(bundle, name, ks, table, summary, "export", threads))
            ranges[name] = schedule_ranges(ks)
    finally:
        torch.set_num_threads(before)
    rewrite_bundle_files(bundle, wanted)
    seconds = time.perf_counter() - t0
    print(f"[export] vLLM K per batch-size range, priced on {where} in {dtype_of(target)} ({profiled} cost table(s) "
          f"profiled, {seconds:.1f} s): " + "; ".join(f"{n} {r}" for n, r in ranges.items())
          + "; to serve elsewhere: `specdraft predict BUNDLE --drafter NAME --device ... --write-engine-config` there")
    return {"engine_schedule": {"device": where, "dtype": dtype_of(target), "seconds": round(seconds, 3),
                                "tables_profiled": profiled, "ranges": ranges}}


def unpriced_reason(target, device: str) -> str | None:
    """None where export prices the engine schedule, else why not. Decided from the target's size and the device
    alone, never from a timed probe, so the same inputs and config give the same bundle on a busy machine and a
    quiet one: on a CPU a target of more than SCHEDULE_CPU_PARAMETERS parameters is left to `specdraft predict`
    (export's one-pass profile took 12.9 s for the demo's 3.5M-parameter target and 620 s for SmolLM2-135M beside
    a 14M drafter on a 2-core box, a table whose single pass was noise); on a GPU every target is priced."""
    import torch

    from specdraft.pipelines.vllm_export import SCHEDULE_CPU_PARAMETERS

    if torch.device(device).type != "cpu":
        return None
    parameters = num_parameters(target)  # a packed target's linears hold no parameters
    if parameters <= SCHEDULE_CPU_PARAMETERS:
        return None
    return (f"its {parameters / 1e6:.3g}M-parameter target's cost table on a CPU would take minutes (export prices "
            f"targets of up to {SCHEDULE_CPU_PARAMETERS / 1e6:.3g}M parameters there)")


def unpriced_schedules(bundle, names: list[str], where: str, threads: int, reason: str, dtype: str) -> dict:
    """Export's schedule left to `specdraft predict`: each drafter's configs keep its best fixed K, and its
    engine_schedule.json says why and what to run, so a user reading the bundle learns both."""
    from specdraft.pipelines.vllm_export import ENGINE_SCHEDULE, rewrite_bundle_files, schedule_record, vllm_config_dir

    note = (f"not priced at export: {reason}; the configs serve the best fixed K. Where you serve, run `specdraft "
            "predict BUNDLE --drafter NAME --device ... --write-engine-config`")
    rewrite_bundle_files(bundle, {f"vllm/{n}/{ENGINE_SCHEDULE}": schedule_record(
        n, "export", where, threads, dtype=dtype, num_speculative_tokens_per_batch_size=None, note=note)
        for n in names if vllm_config_dir(bundle, n)})
    print(f"[export] vLLM K per batch-size range {note}")
    return {"engine_schedule": {"device": where, "dtype": dtype, "unpriced": reason, "ranges": None}}


def export_routers(ctx: Context, add) -> dict[str, RouterEntry]:
    """Step 4: train-router's routers, one subdirectory each (router_config.json inside)."""
    routers = {}
    if "train-router" in ctx.inputs:
        add("router", copy_listed(ctx.input("train-router"), ctx.manifests["train-router"], None, ctx.out / "router"))
        for rc_path in sorted((ctx.out / "router").glob("*/router_config.json")):
            rc = _json(rc_path)
            routers[rc_path.parent.name] = RouterEntry(path=rc_path.parent, kind=str(rc.get("kind", "unknown")))
    return routers


if __name__ == "__main__":
    from specdraft.pipelines.cli import stage_main

    stage_main("export")
