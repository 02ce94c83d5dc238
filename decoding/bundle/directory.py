"""The bundle: everything the decoder serves with, in one directory that can be moved or copied.

Written by the `export` stage (pipelines/export.py), read here:

  bundle/
    bundle.json             what is below, and the sha256 of every file
    target/                 the target's HF dir (absent when bundle.json references a path or hub id)
    drafters/<name>/        HF dirs (safetensors + tokenizer + drafter.json)
    heads/<drafter>/<transform tag>/<head>/ head.safetensors + head_config.json (head name "<tag>/<head>")
    acceptance/<drafter>/acceptance_summary.json  its default head's dev acceptance statistics, what
                            `specdraft predict` simulates from (optional; decoding/costs/throughput.py)
    router/                 the routing baseline (optional)
    datastore/              datastore.safetensors + datastore.json: the distilled responses' suffix array,
                            read by the REST and suffix-decoding arms (optional; decoding/speculators/datastore.py)

bundle.json is decoding/bundle/schema.py's BundleSpec, written with `to_json` and read with
`from_json`: target, drafters, heads, routers, decoding defaults, chat (prompt format), datastore,
eagle, and files (relative path -> sha256 of every file except bundle.json and the stage manifest).

Every path in bundle.json is relative to the bundle and must stay inside it, so a bundle copied
elsewhere loads unchanged. Loading checks paths before reading anything, then (verify=True) every
file's hash, and refuses files bundle.json does not list and weights that are not safetensors.
Nothing is unpickled; `trust_remote_code` is off unless the caller turns it on.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from specdraft.core.errors import InputError
from specdraft.core.hashing import content_hash, drafter_hash, file_sha256  # noqa: F401 (re-exported for callers)
from specdraft.decoding.bundle.schema import (BUNDLE_JSON, FORMAT, BundleSpec, DrafterEntry, EagleEntry, HeadEntry,
                                    RouterEntry, resolve_inside)

# Written by the pipeline's artifact store beside bundle.json; bookkeeping the decoder never reads.
STAGE_MANIFEST = "manifest.json"
# Suffixes of formats that unpickle (or may) when loaded: never part of a bundle.
UNSAFE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".joblib", ".npy", ".npz")


def subdir_files(files: dict[str, str], subdir: str) -> dict[str, str]:
    """The entries of `files` under `subdir`, keyed relative to it."""
    prefix = subdir.rstrip("/") + "/"
    return {k[len(prefix):]: v for k, v in files.items() if k.startswith(prefix)}


def bundle_files(root: Path) -> dict[str, str]:
    """relative posix path -> sha256 of every file under root except bundle.json and the manifest."""
    skip = {BUNDLE_JSON, STAGE_MANIFEST}
    return {p.relative_to(root).as_posix(): file_sha256(p)
            for p in sorted(root.rglob("*")) if p.is_file() and p.relative_to(root).as_posix() not in skip}


def check_safe_weights(rel_paths) -> None:
    for rel in rel_paths:
        if str(rel).lower().endswith(UNSAFE_SUFFIXES):
            raise InputError(f"'{rel}' is a pickle-based weight file; bundles hold safetensors only "
                             "(re-save it with save_pretrained(safe_serialization=True))")


def write_bundle(root: Path, spec: BundleSpec) -> dict[str, Any]:
    """Write spec as root/bundle.json; its files must name exactly the files on disk. Returns the JSON."""
    root = Path(root)
    on_disk = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} - {BUNDLE_JSON, STAGE_MANIFEST}
    if set(spec.files) != on_disk:
        raise InputError(f"bundle files and their hashes disagree ({sorted(set(spec.files) ^ on_disk)[:3]}); re-export")
    check_safe_weights(spec.files)
    data = spec.to_json(root)
    (root / BUNDLE_JSON).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return data


def write_bundle_json(root: Path, meta: dict[str, Any], files: dict[str, str] | None = None) -> dict[str, Any]:
    """Write bundle.json from its JSON form less format and files (hashed here unless given), read
    through the schema first. Returns what it wrote."""
    data = {"format": FORMAT, **meta, "files": bundle_files(Path(root)) if files is None else files}
    return write_bundle(root, BundleSpec.from_json(data, root))


@dataclass
class Bundle:
    root: Path
    meta: dict[str, Any]  # bundle.json as written
    spec: BundleSpec  # the same, read (content hashes computed from the listed files)
    verified: bool

    @property
    def drafters(self) -> dict[str, DrafterEntry]:
        return self.spec.drafters

    @property
    def heads(self) -> dict[str, dict[str, HeadEntry]]:  # drafter -> head name -> entry
        return self.spec.heads

    @property
    def routers(self) -> dict[str, RouterEntry]:  # name -> entry (train-router writes "classifier" and "centroid")
        return self.spec.routers

    @property
    def eagle(self) -> dict[str, EagleEntry]:  # EAGLE drafters by name
        return self.spec.eagle

    @property
    def defaults(self):
        """The decoding defaults the bundle serves with (decoding.defaults.DecodingDefaults; every number
        resolved, the cost ratio c included)."""
        return self.spec.decoding

    @property
    def decoding(self) -> dict[str, Any]:
        """`defaults` as a plain dict (older callers; read `defaults` instead)."""
        return asdict(self.spec.decoding)

    def fixed_k(self, drafter: str) -> int:
        """The draft length of fixed-K decoding with `drafter`: train-heads' best fixed K for it at the
        serving transform, else the bundle's decoding.k (an EAGLE drafter: decoding.k)."""
        k = self.drafters[drafter].fixed_k if drafter in self.drafters else None
        return k if k is not None else self.defaults.k

    def head_rule(self, drafter: str, head: str, threshold: float | None = None) -> tuple[float, int]:
        """(h, K_max) a head serves at: `threshold` when the caller gives one, else the bundle's pinned
        decoding.threshold, else the head's own h (train-heads' choice by simulation); K_max the head's,
        else decoding.k_max. The one place these are defaulted."""
        entry = self.heads[drafter][head]
        h = threshold if threshold is not None else (
            self.defaults.threshold if self.defaults.threshold is not None else entry.threshold)
        return h, entry.k_max or self.defaults.k_max

    def acceptance_summary(self, drafter: str):
        """The drafter's default head's dev acceptance statistics (decoding.costs.throughput.AcceptanceSummary), or
        None when the bundle ships none (exported before train-heads wrote them)."""
        from specdraft.decoding.costs.throughput import ACCEPTANCE_FILE, AcceptanceSummary

        entry = self.drafters.get(drafter)
        return AcceptanceSummary.load(entry.acceptance / ACCEPTANCE_FILE) if entry and entry.acceptance else None

    def policy_spec(self, drafter: str, head_name: str | None = None, k: int | None = None,
                    threshold: float | None = None, max_drafts: int | None = None, lockstep: bool = False):
        """How `drafter` drafts (decoding.policies.spec.PolicySpec): `k` given, or no head -> fixed K (`k`, else
        `fixed_k`); its head `head_name` -> SpecDec++ at `head_rule` (in `lockstep` when the batch stops
        together), or, with `max_drafts` (the widest round the caller's cost table prices), the lockstep
        batch-aware rule capped there. The one place `specdraft generate` resolves a drafter's policy."""
        from specdraft.decoding.policies.spec import PolicySpec

        # a threshold given with fixed K or the batch-aware rule is refused by the spec: neither reads an h
        if k is not None or head_name is None:
            return PolicySpec("fixed", k=k if k is not None else self.fixed_k(drafter), threshold=threshold)
        h, k_max = self.head_rule(drafter, head_name, threshold)
        if max_drafts is None:
            return PolicySpec("specdecpp", threshold=h, k_max=k_max, lockstep=lockstep)
        return PolicySpec("batch-aware", k_max=min(k_max, max_drafts), lockstep=True, threshold=threshold)

    def prior_for(self, drafter: str, head: str | None = None, summary=None):
        """The batch-aware rules' prior (decoding.policies.batch_aware.Prior) for `drafter` read through
        `head` (default: its default head, whose statistics the summary holds): the dev acceptance curve of the drafter's
        acceptance summary and the head's w_rej / w_acc (w_acc = 1 as train-heads trains), which undoes the
        weighting of the head's sigma. summary: the drafter's acceptance summary when the caller has read it."""
        from specdraft.decoding.costs.throughput import summary_prior

        summary = self.acceptance_summary(drafter) if summary is None else summary
        if summary is None:
            raise InputError(f"drafter '{drafter}' has no acceptance summary in the bundle, which the batch-aware rule "
                             "takes its prior from; re-export a run whose train-heads wrote one, or use --stop-rule specdecpp")
        head = self.drafter(drafter).head if head is None else head
        entry = self.heads.get(drafter, {}).get(head)
        if entry is None:
            raise InputError(f"drafter '{drafter}' has no head '{head}' in the bundle to price the batch-aware rule with; "
                             f"name one of {sorted(self.heads.get(drafter, {}))}")
        return summary_prior(summary, entry.w_rej)

    def general_drafter(self) -> str:
        """The bundle's all-domain (OFA) drafter: the one whose domains cover every other drafter's (an
        empty list means every domain, and is chosen only where no drafter names them all: a drafter trained
        on no domain, e.g. train-drafters' untouched init, is not the OFA drafter); InputError when none does
        (then name one with --drafter)."""
        if not self.drafters:
            raise InputError("the bundle has no drafters; decode with the target alone (--method ar)")
        every = set().union(*(d.domains for d in self.drafters.values()))
        covering = [n for n, d in self.drafters.items() if not d.domains or set(d.domains) >= every]
        if not covering:
            raise InputError(f"the bundle has no all-domain drafter among {', '.join(self.drafters)}; "
                             "name one with --drafter")
        return max(covering, key=lambda n: (len(self.drafters[n].domains), n))

    def default_router(self) -> str | None:
        """The router the bundle routes with when the caller names none: the trained classifier, else
        the first router by name; None when the bundle has none."""
        if not self.routers:
            return None
        return "classifier" if "classifier" in self.routers else sorted(self.routers)[0]

    @property
    def datastore(self) -> Path | None:
        """The datastore directory, absolute, inside the bundle (None: none shipped)."""
        return self.spec.datastore.path if self.spec.datastore is not None else None

    @property
    def target_in_bundle(self) -> bool:
        return self.spec.target.path is not None

    @property
    def target_path(self) -> str:
        """A directory (inside the bundle or referenced) or a hub id."""
        t = self.spec.target
        return str(t.path) if t.path is not None else t.reference

    def load_eagle(self, name: str, target, device: str | None = None):
        """An EAGLE drafter attached to `target` (eval mode). A bundled target must be the one it was
        trained on (content hash of its config and weights); a referenced one is checked by vocabulary."""
        from specdraft.decoding.speculators.eagle_model import load_eagle, target_hash_from_files

        if name not in self.eagle:
            raise InputError(f"the bundle has no EAGLE drafter '{name}'; it has {', '.join(self.eagle) or 'none'}")
        want = None
        if self.target_in_bundle:
            rel = str(Path(self.target_path).relative_to(self.root))
            want = target_hash_from_files(subdir_files(self.files, rel))
        return load_eagle(self.eagle[name].path, target=target, target_hash=want, device=device)

    @property
    def tokenizer_sha256(self) -> str:
        return self.spec.target.tokenizer_sha256

    @property
    def files(self) -> dict[str, str]:
        return self.spec.files

    def sampling_config(self):
        """The default sampling transform (decoding.rounds.sampling.SamplingConfig)."""
        return self.defaults.sampling()

    def load_datastore(self):
        """The REST / suffix-decoding datastore (decoding.speculators.datastore.SuffixIndex), or None when the bundle
        has none (see `unavailable_arms`)."""
        from specdraft.decoding.speculators.datastore import SuffixIndex

        return SuffixIndex.load(self.datastore) if self.datastore is not None else None

    def unavailable_arms(self) -> dict[str, str]:
        """Bandit arm kinds (decoding.speculators.arms) this bundle cannot serve -> why; empty when all can."""
        out = {}
        if self.datastore is None:
            out["rest"] = "the bundle has no datastore (export it with export.datastore: true)"
            out["suffix (global)"] = "no datastore: suffix decoding uses its per-request structure only"
        if not self.drafters:
            out["drafter"] = "the bundle has no drafters"
        return out

    @property
    def chat(self):
        """The prompt format the bundle was trained with (decoding.bundle.chat.ChatFormat)."""
        from specdraft.decoding.bundle.chat import ChatFormat

        return self.spec.chat or ChatFormat()

    def drafter(self, name: str) -> DrafterEntry:
        if name not in self.drafters:
            raise InputError(f"the bundle has no drafter '{name}'; it has {', '.join(self.drafters) or 'none'}")
        return self.drafters[name]

    def load_tokenizer(self, trust_remote_code: bool = False):
        """The target's tokenizer, checked against the fingerprint recorded at export."""
        from specdraft.core.tokenizers import tokenizer_fingerprint
        from specdraft.decoding.bundle.loading import load_tokenizer

        tok = load_tokenizer(self.target_path, trust_remote_code, self.spec.target.revision)
        got = tokenizer_fingerprint(tok)
        if got != self.tokenizer_sha256:
            raise InputError(f"the target tokenizer at '{self.target_path}' (sha256 {got[:12]}) is not the one the "
                             f"bundle was exported with ({self.tokenizer_sha256[:12]}); point to the original target")
        return tok

    def load_target(self, dtype: str | None = None, device: str | None = None, device_map=None,
                    quantization: str = "none", trust_remote_code: bool = False):
        """The target LM (eval mode); dtype defaults to the one recorded at export."""
        from specdraft.decoding.bundle.loading import load_causal_lm

        model = load_causal_lm(self.target_path, dtype or self.spec.target.dtype, device,
                               device_map, quantization, trust_remote_code, revision=self.spec.target.revision)
        want = self.spec.target.vocab_size
        if model.config.vocab_size != want:
            raise InputError(f"the target at '{self.target_path}' has vocabulary size {model.config.vocab_size}, "
                             f"the bundle's drafters expect {want}; point to the original target")
        return model

    def load_drafter(self, name: str, device: str | None = None, dtype: str | None = None, target=None,
                     draft_weights: str | None = None):
        """A drafter LM (eval mode). With `target` given, also checks the pair with decoding.compat. dtype
        defaults to the target's: the loaded target's weights', else the one recorded at export (a drafter
        runs in the precision its target runs in, as acceptance-data labelled it). draft_weights: the bundle's
        `decoding.draft_weights` unless given (a comparison with an engine that serves the dtype's weights asks
        for "dtype")."""
        from specdraft.decoding.compat import check_pair
        from specdraft.decoding.bundle.loading import dtype_of, load_drafter

        entry = self.drafter(name)
        if dtype is None:
            dtype = dtype_of(target) if target is not None else self.spec.target.dtype
        model = load_drafter(entry.path, dtype, device, draft_weights or self.spec.decoding.draft_weights)
        if model.config.vocab_size != self.spec.target.vocab_size:
            raise InputError(f"drafter '{name}' has vocabulary size {model.config.vocab_size}, the target "
                             f"{self.spec.target.vocab_size}; re-export with drafters trained on this target")
        if target is not None:
            check_pair(target, model)
        return model

    def head_for(self, drafter: str, sampling) -> str | None:
        """The drafter's best head labelled under `sampling` (a SamplingConfig), or None: a head's
        threshold and calibration hold only for the transform its labels were made under (SpecDec++ §4.4)."""
        matching = [h for h in self.heads.get(drafter, {}).values() if sampling.matches(h.label_transform)]
        matching.sort(key=lambda h: (not h.best, h.name != self.drafter(drafter).head, h.name))
        return matching[0].name if matching else None

    def load_head(self, drafter: str, head: str | None = None, device: str | None = None):
        """(AcceptanceHead in eval mode, its head_config dict). head=None: the drafter's default head.

        The head must read this drafter's hidden size and have been trained on exactly this drafter's
        files (its recorded drafter_hash)."""
        from specdraft.decoding.policies.acceptance_head import load_head

        entry = self.drafter(drafter)
        available = self.heads.get(drafter, {})
        name = head if head is not None else entry.head
        if name is None or name not in available:
            raise InputError(f"drafter '{drafter}' has no head {name!r} in the bundle; "
                             f"available: {', '.join(available) or 'none (export with train-heads)'}")
        module, config = load_head(available[name].path, expected_hidden_size=entry.hidden_size,
                                   expected_drafter_hash=entry.content_hash)
        # bundle.json indexes what the head's own config records (export copies it): every decode reads the
        # index, so a head whose files say otherwise is a damaged bundle, not a second opinion
        for key in ("threshold", "k_max", "w_rej"):
            if key in config and config[key] != getattr(available[name], key):
                raise InputError(f"head '{drafter}/{name}': bundle.json says {key} = {getattr(available[name], key)!r}, "
                                 f"its head_config.json {config.get(key)!r}; re-export the bundle")
        return (module.to(device) if device is not None else module), config


def _verify(root: Path, files: dict[str, str]) -> None:
    listed = set()
    for rel, want in files.items():
        p = resolve_inside(root, rel, "file")
        listed.add(p)
        if not p.is_file():
            raise InputError(f"bundle file '{rel}' is missing; copy the whole bundle directory or re-export it")
        if file_sha256(p) != want:
            raise InputError(f"bundle file '{rel}' does not match its sha256 in {BUNDLE_JSON} (corrupt or "
                             "modified); re-copy or re-export the bundle")
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and rel not in (BUNDLE_JSON, STAGE_MANIFEST) and p.resolve() not in listed:
            raise InputError(f"'{rel}' is in the bundle but not in {BUNDLE_JSON} (added after export); "
                             "remove it or re-export the bundle")


def load_bundle(path: str | os.PathLike, verify: bool = True) -> Bundle:
    """Read bundle.json, check every path stays inside, and (verify) every file's sha256.

    Raises InputError with a one-line reason: missing or corrupt file, tampered hash, bad path,
    unknown format, malformed entries, drafters whose tokenizer differs from the target's."""
    try:
        return _load_bundle(Path(path), verify)
    except InputError:
        raise
    except (AttributeError, TypeError, ValueError, KeyError) as e:  # wrong types in a hand-edited bundle.json
        raise InputError(f"{BUNDLE_JSON} in '{path}' is malformed ({type(e).__name__}: {e}); "
                         "re-export the bundle") from None


def _load_bundle(path: Path, verify: bool) -> Bundle:
    root = path.resolve()
    meta_path = root / BUNDLE_JSON
    if not meta_path.is_file():
        raise InputError(f"'{path}' is not a bundle (no {BUNDLE_JSON}); run `specdraft export` or point to its bundle/ dir")
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{meta_path} is not valid JSON ({type(e).__name__}); re-copy or re-export the bundle") from None
    spec = BundleSpec.from_json(meta, root)  # every field and path checked before anything is read
    check_safe_weights(spec.files)
    target = spec.target

    def listed(entry) -> dict[str, str]:
        return subdir_files(spec.files, entry.path.relative_to(root).as_posix())

    drafters = {}
    for name, d in spec.drafters.items():
        if d.tokenizer_sha256 != target.tokenizer_sha256 or d.vocab_size != target.vocab_size:
            raise InputError(f"drafter '{name}' uses a tokenizer or vocabulary other than the target's; "
                             "re-export with drafters trained on this target")
        # the identity heads are checked against comes from the verified file list, not from what was written
        drafters[name] = replace(d, content_hash=drafter_hash(listed(d)))
    for drafter in spec.heads:
        if drafter not in drafters:
            raise InputError(f"{BUNDLE_JSON}: heads name drafter '{drafter}', which the bundle lacks; re-export")
    eagle = {}
    for name, e in spec.eagle.items():
        if e.vocab_size != target.vocab_size:
            raise InputError(f"EAGLE drafter '{name}' drafts in another vocabulary than the target's; re-export")
        eagle[name] = replace(e, content_hash=content_hash(listed(e)))

    if verify:
        _verify(root, spec.files)
    return Bundle(root=root, meta=meta, spec=replace(spec, drafters=drafters, eagle=eagle), verified=verify)


def _fmt_params(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n / 1e3:.1f}k"


def describe(b: Bundle) -> str:
    """A readable summary: target, drafters (domains, size, alignment), heads, router, decoding defaults."""
    t = b.spec.target
    where = "in the bundle (target/)" if b.target_in_bundle else f"referenced: {b.target_path}"
    lines = [f"bundle {b.root} ({b.spec.format})",
             f"target: {where}; vocab {t.vocab_size}, dtype {t.dtype}, "
             f"tokenizer sha256 {t.tokenizer_sha256[:12]}", f"drafters ({len(b.drafters)}):"]
    for d in b.drafters.values():
        lines.append(f"  {d.name:<12} domains: {', '.join(d.domains) or 'all'}; {_fmt_params(d.parameters)} params, "
                     f"hidden {d.hidden_size}; default head: {d.head or 'none'}; fixed K {b.fixed_k(d.name)}")
        if d.alignment:
            align = ", ".join(f"{dom} {a['acceptance']:.3f}/{a['agreement']:.3f}" for dom, a in sorted(d.alignment.items()))
            lines.append(f"  {'':<12} alignment by domain (1-TV / greedy agreement): {align}")
    if b.eagle:
        lines.append(f"EAGLE drafters ({len(b.eagle)}; the target's embedding and LM head, attached at load):")
        for e in b.eagle.values():
            tree = "x".join(str(e.tree.get(k, "?")) for k in ("depth", "top_k", "nodes"))
            lines.append(f"  {e.name:<12} domains: {', '.join(e.domains) or 'all'}; {_fmt_params(e.parameters)} params; "
                         f"tree depth x top-k x nodes {tree}; target {str(e.target_hash)[:12]}")
    lines.append(f"heads ({sum(len(v) for v in b.heads.values())}):")
    for drafter, by_name in b.heads.items():
        for h in by_name.values():
            lt = h.label_transform
            sim = f", simulated speedup {h.simulated['speedup']:.3f}" if "speedup" in h.simulated else ""
            lines.append(f"  {drafter + '/' + h.name:<20} D={h.depth} w_rej={h.w_rej:g} h={h.threshold:g} "
                         f"k_max={h.k_max}; labels T={lt.get('temperature')} top_k={lt.get('top_k')} "
                         f"top_p={lt.get('top_p')}{sim}" + (" (default)" if h.best else ""))
    lines.append("routers: " + (", ".join(f"{n} ({r.kind}, {r.path.relative_to(b.root).as_posix()}/)"
                                          for n, r in b.routers.items()) or "none"))
    ds = b.spec.datastore
    built = _export_metrics(b.root).get("datastore") or {}
    took = f", built in {built['build_seconds']:.2f}s" if isinstance(built.get("build_seconds"), (int, float)) else ""
    lines.append(f"datastore: {ds.tokens} tokens in {ds.sequences} responses ({ds.bytes} bytes{took})" if ds else
                 "datastore: none (arms unavailable: " + "; ".join(f"{k}: {v}" for k, v in b.unavailable_arms().items()) + ")")
    lines.append("routes with: " + (f"router {b.default_router()}" if b.routers else "no router") + "; "
                 + _general_line(b))
    lines.append("decoding defaults: " + ", ".join(f"{k}={v}" for k, v in sorted(b.decoding.items())))
    n = len(b.files)
    lines.append(f"all {n} files verified (sha256)" if b.verified else f"{n} files (not verified)")
    return "\n".join(lines)


def _general_line(b: Bundle) -> str:
    try:
        return f"all-domain drafter {b.general_drafter()}"
    except InputError:
        return "no all-domain drafter"


def _export_metrics(root: Path) -> dict:
    """The export stage's metrics from the manifest.json beside bundle.json (absent in a copied bundle)."""
    try:
        metrics = json.loads((root / "manifest.json").read_text()).get("metrics", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return metrics if isinstance(metrics, dict) else {}


def inspect_bundle(path: str | os.PathLike) -> str:
    """Verify every file of a bundle (InputError otherwise) and summarise it."""
    return describe(load_bundle(path, verify=True))
