"""The decoder beside llama.cpp on the same target and drafter, batch 1, greedy: llama.cpp's plain decode
(`llama-bench`) and its speculative decode (`llama-speculative-simple --spec-type draft-simple --temp 0`) at its
4-bit GGUF weights and at bf16, against ours (AR, fixed K, and a bundle's default when one is given).

    python benchmarks/engines/bench_llamacpp.py --target-gguf T.gguf --drafter-gguf D.gguf --target DIR --drafter DIR
        [--build-dir DIR | --sdist llama_cpp_python-0.3.36.tar.gz] [--work runs/bench_llamacpp] [--ks 2,4,8]
        [--weights q4,bf16] [--dtype bfloat16] [--bundle DIR] [--tokens 64] [--prompts FILE] [--threads 1] [--no-append]

llama.cpp is built from the llama-cpp-python sdist's `vendor/llama.cpp` in this benchmark's own work directory
(cmake, Ninja, Release, -DLLAMA_CURL=OFF -DGGML_NATIVE=ON; targets llama-bench, llama-speculative-simple and
llama-quantize), never into the project's venv: --build-dir reuses a build (its missing targets are built there),
--sdist names the archive or its unpacked directory, and without either `pip download` fetches the sdist. The
section says how long the build took. bf16 weights: `llama-quantize --allow-requantize` of each 4-bit file to
BF16 (the same values the project's converted directories hold, which transformers dequantized from these files,
rounded to bf16). Where the CPU backend's repacked (AMX) kernels fault (SIGILL or SIGSEGV: the machine does not
let the process use AMX tiles, as on this box), every run goes `--no-repack`, decided by a probe run before
anything is timed, and the section says so.

Figures: llama.cpp's own (wall-clock tokens/s of the generation phase) and, robust on a shared box, CPU seconds per
generated token, from the process's CPU time at --tokens and at --short-tokens (the difference cancels loading and
the prompt). Ours: `generate_batch` on the HF directories in --dtype, the methods taking turns prompt by prompt
(harness `interleave`): CPU time and wall time per token. Acceptance: llama.cpp's n_accept / n_drafted, ours
accepted / drafted. Beside them the gaps' parts: weight bytes a token streams (a GGUF's tensors but the token
embedding; ours every parameter but an untied input embedding), our step's v(K + 1) and the loop's own work per
token (an AR token's CPU time less a one-token step's).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from benchmarks.harness.machine import box_load, machine  # noqa: E402
from benchmarks.harness.publish import add_section_flags, publish_for  # noqa: E402
from benchmarks.harness.tables import table  # noqa: E402
from benchmarks.harness.floor import streamed_bytes  # noqa: E402
from benchmarks.harness.timing import rotated, run_child, tail  # noqa: E402

SDIST = "llama-cpp-python==0.3.36"
TARGETS = ("llama-bench", "llama-speculative-simple", "llama-quantize")
CMAKE_FLAGS = ("-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=ON")
PROMPTS = ("def quicksort(arr):\n", "# Parse a CSV file and print the sum of its second column\nimport csv\n",
           "class LRUCache:\n    \"\"\"A least-recently-used cache of fixed capacity.\"\"\"\n")
FAULTS = {-signal.SIGILL: "SIGILL", -signal.SIGSEGV: "SIGSEGV"}  # a killed child's rc -> the signal's name


# ---- llama.cpp: build, weights, runs ----------------------------------------------------------------------------

def llama_source(args, work: Path) -> Path:
    """The vendored llama.cpp directory: --sdist (an archive or its unpacked directory), else the sdist fetched
    by pip into `work` (pip download only: nothing is installed)."""
    sdist = Path(args.sdist) if args.sdist else None
    if sdist is None:
        (work / "sdist").mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", SDIST,
                        "-d", str(work / "sdist")], check=True)
        sdist = next((work / "sdist").glob("llama_cpp_python-*.tar.gz"))
    if sdist.is_file():
        dest = work / "src"
        if not dest.is_dir():
            with tarfile.open(sdist) as tar:
                tar.extractall(dest, filter="data")
        sdist = next(dest.iterdir())
    vendored = sdist / "vendor" / "llama.cpp"
    if not (vendored / "CMakeLists.txt").is_file():
        raise SystemExit(f"bench_llamacpp: {vendored} holds no llama.cpp sources; give --sdist the llama-cpp-python "
                         "sdist (or its unpacked directory)")
    return vendored


def build_llamacpp(args, work: Path) -> tuple[Path, str]:
    """(the directory of llama.cpp's binaries, how they came to be): the targets missing from --build-dir (or
    from `work`/build) built there, configured first when it has no build.ninja; timed."""
    build = Path(args.build_dir) if args.build_dir else work / "build"
    missing = [t for t in TARGETS if not (build / "bin" / t).is_file()]
    if not missing:
        return build / "bin", f"reused {build} (no target to build)"
    start = time.monotonic()
    if not (build / "build.ninja").is_file():
        source = llama_source(args, work)
        run_or_stop(["cmake", "-S", str(source), "-B", str(build), *CMAKE_FLAGS], work / "cmake.log")
    run_or_stop(["cmake", "--build", str(build), "--target", *missing, "-j", str(os.cpu_count() or 1)],
                work / "build.log")
    return build / "bin", f"built {', '.join(missing)} in {build} in {time.monotonic() - start:.0f} s"


def run_or_stop(cmd: list[str], log: Path) -> dict:
    res = run_child(cmd, log)
    if res["rc"] != 0:
        raise SystemExit(f"bench_llamacpp: {' '.join(cmd[:3])} ... failed (exit {res['rc']}); {log}:\n{tail(log)}")
    return res


def bf16_gguf(bin_dir: Path, gguf: Path, work: Path) -> Path:
    """`gguf` requantized to BF16 by llama.cpp's own llama-quantize (kept in `work` for later runs)."""
    out = work / f"{gguf.stem}.bf16.gguf"
    if not out.is_file():
        partial = out.with_name(out.name + ".partial")
        run_or_stop([str(bin_dir / "llama-quantize"), "--allow-requantize", str(gguf), str(partial), "BF16"],
                    work / f"quantize-{gguf.stem}.log")
        partial.rename(out)
    return out


def gguf_stream_bytes(path: Path) -> int:
    """The bytes of a GGUF's tensors a decode step reads: all but the token embedding (a row a token)."""
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(path).tensors if t.name != "token_embd.weight")


def parse_speculative(text: str) -> dict:
    """llama-speculative-simple's summary: generated tokens, their wall seconds, drafted and accepted counts."""
    decoded = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", text)
    drafted, accepted = re.search(r"n_drafted\s*=\s*(\d+)", text), re.search(r"n_accept\s*=\s*(\d+)", text)
    if not (decoded and drafted and accepted):
        raise ValueError("no 'decoded N tokens in S seconds' / n_drafted / n_accept lines in llama-speculative-simple's "
                         "output")
    return {"tokens": int(decoded.group(1)), "seconds": float(decoded.group(2)), "drafted": int(drafted.group(1)),
            "accepted": int(accepted.group(1))}


def parse_bench(text: str) -> dict:
    """llama-bench's JSON (-o json): the tg run's mean tokens/s and its standard deviation."""
    found = re.search(r"^\[\s*$.*?^\]\s*$", text, flags=re.MULTILINE | re.DOTALL)  # its log lines go to the same file
    if found is None:
        raise ValueError("no JSON array in llama-bench's output")
    rows = json.loads(found.group(0))
    row = next(r for r in rows if r.get("n_gen", 0) > 0)
    return {"tokens": int(row["n_gen"]), "tokens_per_s": float(row["avg_ts"]), "stddev": float(row["stddev_ts"])}


class Llama:
    """llama.cpp's binaries at a thread count; `repack` False adds --no-repack (`probe` sets it)."""

    def __init__(self, bin_dir: Path, threads: int, work: Path, reps: int = 3):
        self.bin_dir, self.threads, self.work, self.reps, self.repack = bin_dir, threads, work, reps, True

    def run(self, name: str, args: list[str], log: Path) -> tuple[dict, str]:
        """Run binary `name` (with --no-repack once `probe` found the repacked kernels fault); -> (run_child's
        figures, its output)."""
        extra = [] if self.repack else (["--repack", "0"] if name == "llama-bench" else ["--no-repack"])
        res = run_child([str(self.bin_dir / name), *args, *extra], log)
        if res["rc"] != 0:
            raise SystemExit(f"bench_llamacpp: {name} failed (exit {res['rc']}); {log}:\n{tail(log)}")
        return res, log.read_text(errors="replace")

    def probe(self, target: Path, drafter: Path) -> str:
        """Before anything is timed: one short speculative decode with llama.cpp's repacked CPU weights (its AMX
        kernels, where the CPU has AMX). Where the process is killed by SIGILL or SIGSEGV there (a machine that does
        not let a process use AMX tiles; on one Xeon here speculative decoding segfaulted at start with repacking
        and ran without), every run goes --no-repack, so that all of llama.cpp's figures share one kernel set;
        -> the section's note."""
        log = self.work / "probe.log"
        res = run_child([str(self.bin_dir / "llama-speculative-simple"), "-m", str(target), "-md", str(drafter),
                         "--spec-type", "draft-simple", "--spec-draft-n-max", "2", "-p", PROMPTS[0], "-n", "4",
                         "--temp", "0", "-t", str(self.threads), "-td", str(self.threads)], log)
        if res["rc"] in FAULTS:
            self.repack = False
            print(f"[bench_llamacpp] llama.cpp's repacked kernels fault here ({FAULTS[res['rc']]}): every run "
                  "--no-repack", file=sys.stderr, flush=True)
            return f"; its repacked (AMX) kernels fault on this machine ({FAULTS[res['rc']]} in a probe run): every run with --no-repack"
        if res["rc"] != 0:
            raise SystemExit(f"bench_llamacpp: the probe run of llama-speculative-simple failed (exit {res['rc']}); "
                             f"{log}:\n{tail(log)}")
        return ""

    def plain(self, gguf: Path, tokens: int, label: str) -> dict:
        """llama-bench's tg at `tokens` (its own repetitions, wall tokens/s)."""
        res, out = self.run("llama-bench", ["-m", str(gguf), "-p", "0", "-n", str(tokens), "-r", str(self.reps), "-t",
                                            str(self.threads), "-o", "json"], self.work / f"{label}.log")
        return {**parse_bench(out), "cpu_s": res["cpu_s"]}

    def speculative(self, target: Path, drafter: Path, k: int, prompt: str, tokens: int, label: str) -> dict:
        """One greedy decode of `prompt` by llama-speculative-simple, `drafter` drafting K = `k` (it runs no decode
        without a drafter: its plain decode is llama-bench's)."""
        res, out = self.run("llama-speculative-simple", [
            "-m", str(target), "-md", str(drafter), "--spec-type", "draft-simple", "--spec-draft-n-max", str(k),
            "-td", str(self.threads), "--temp", "0", "-n", str(tokens), "-t", str(self.threads), "-p", prompt,
            "-c", "1024", "--seed", "0"], self.work / f"{label}.log")
        return {**parse_speculative(out), "cpu_s": res["cpu_s"]}


def per_token_cpu(long: dict, short: dict) -> float:
    """CPU seconds per generated token from two runs of different lengths (loading and the prompt cancel)."""
    return (long["cpu_s"] - short["cpu_s"]) / max(1, long["tokens"] - short["tokens"])


Method = tuple[str, str, str]  # (engine, weights, method): a row of the section


def llamacpp_methods(llama: Llama, weights: dict[str, tuple[Path, Path]], args, prompts: list[str]) -> dict:
    """{(engine, weights, method): fn(prompt index) -> a unit's figures} for llama.cpp: per weight format its plain
    decode of the target (llama-bench's tg, one repetition: it takes no prompt, and a greedy step's cost does not
    depend on the tokens) and its speculative decode per K, each at --tokens and --short-tokens."""
    def plain(gguf, fmt):
        def fn(i):
            long, short = (llama.plain(gguf, n, f"{fmt}-plain-p{i}-{n}") for n in (args.tokens, args.short_tokens))
            return {"tokens": long["tokens"], "wall_s": long["tokens"] / long["tokens_per_s"],
                    "cpu_token_s": per_token_cpu(long, short), "drafted": 0, "accepted": 0}
        return fn

    def speculative(target, drafter, fmt, k):
        def fn(i):
            long, short = (llama.speculative(target, drafter, k, prompts[i], n, f"{fmt}-k{k}-p{i}-{n}")
                           for n in (args.tokens, args.short_tokens))
            return {"tokens": long["tokens"], "wall_s": long["seconds"], "cpu_token_s": per_token_cpu(long, short),
                    "drafted": long["drafted"], "accepted": long["accepted"]}
        return fn
    fns = {}
    for fmt, (target, drafter) in weights.items():
        fns[("llama.cpp", fmt, "plain")] = plain(target, fmt)
        ks = args.bf16_ks if fmt == "bf16" else args.ks
        fns.update({("llama.cpp", fmt, f"speculative K = {k}"): speculative(target, drafter, fmt, k) for k in ks})
    return fns


def our_methods(target, drafter, args, ids: list[list[int]]) -> dict:
    """{(engine, weights, method): fn(prompt index) -> a unit's figures} for our decoder: AR and fixed K, greedy,
    batch 1, this process's CPU time (every thread) and wall time of the decode."""
    from specdraft.decoding.batched import generate_batch
    from specdraft.decoding.policies.stopping import FixedK

    def method(k):
        def fn(i):
            cpu, start = time.process_time(), time.perf_counter()
            m = generate_batch(target, [ids[i]], args.tokens, drafter=drafter if k else None,
                               policy=FixedK(k) if k else None)[0].metrics
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            return {"tokens": m.n_generated, "wall_s": wall, "cpu_token_s": cpu / m.n_generated,
                    "drafted": m.n_draft, "accepted": m.n_draft - m.n_discarded}
        return fn
    return {("ours", args.dtype, f"fixed K = {k}" if k else "AR"): method(k) for k in [0, *args.ks]}


def load_ours(args, prompts: list[str]):
    """(target, drafter, prompt ids): the HF directories in --dtype, torch at --threads, the prompts tokenized raw."""
    import torch
    from transformers import AutoTokenizer

    from benchmarks.harness.models import DTYPES, load

    torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    tok = AutoTokenizer.from_pretrained(args.target, trust_remote_code=False)
    return load(args.target, "cpu", dtype), load(args.drafter, "cpu", dtype), [tok(p)["input_ids"] for p in prompts]


def take_turns(fns: dict, units: int, passes: int) -> dict:
    """{name: [[figures per unit] per pass]}: every method on a unit back to back, the order turning by one each
    unit and pass (the harness's `rotated`), so the box's load phases hit the engines alike; a pass's ratios are
    then taken between decodes minutes, not tens of minutes, apart."""
    out = {name: [[None] * units for _ in range(passes)] for name in fns}
    for p in range(passes):
        for u in range(units):
            for name in rotated(list(fns), p * units + u):
                out[name][p][u] = fns[name](u)
            print(f"[bench_llamacpp] pass {p + 1}/{passes}, prompt {u + 1}/{units} done", file=sys.stderr, flush=True)
    return out


def pass_figures(units: list[dict]) -> dict:
    """A pass's figures of one method: wall tokens/s (tokens over seconds), CPU tokens/s (per-token CPU seconds
    weighted by tokens), accepted / drafted."""
    tokens = sum(u["tokens"] for u in units)
    drafted = sum(u["drafted"] for u in units)
    return {"wall_tps": tokens / sum(u["wall_s"] for u in units),
            "cpu_tps": tokens / sum(u["cpu_token_s"] * u["tokens"] for u in units),
            "accept": sum(u["accepted"] for u in units) / drafted if drafted else None}


def summarize(runs: dict) -> dict:
    """{name: {"wall_tps": [per pass], "cpu_tps": [...], "accept": float | None, "vs_base": [per pass],
    "vs_llamacpp": [per pass]}}: vs_base over the same engine and weights' plain decode (llama.cpp) or AR (ours),
    vs_llamacpp over llama.cpp's plain 4-bit decode (wall), each within a pass."""
    per = {name: [pass_figures(units) for units in passes] for name, passes in runs.items()}
    out = {}
    for (engine, fmt, method), figs in per.items():
        base = per[(engine, fmt, "plain" if engine == "llama.cpp" else "AR")]
        peer = per.get(("llama.cpp", "q4", "plain"))
        accepts = [f["accept"] for f in figs if f["accept"] is not None]
        out[(engine, fmt, method)] = {
            "wall_tps": [f["wall_tps"] for f in figs], "cpu_tps": [f["cpu_tps"] for f in figs],
            "accept": statistics.median(accepts) if accepts else None,
            "vs_base": [f["wall_tps"] / b["wall_tps"] for f, b in zip(figs, base)],
            "vs_llamacpp": [f["wall_tps"] / q["wall_tps"] for f, q in zip(figs, peer)] if peer else None}
    return out


def spread(xs: list[float] | None, digits: int = 1) -> str:
    if not xs:
        return "-"
    return f"{statistics.median(xs):.{digits}f} ({min(xs):.{digits}f}-{max(xs):.{digits}f})"


def our_parts(target, drafter, ks: list[int]) -> dict:
    """Our step's parts at batch 1: the one-token step's CPU seconds, v(K + 1) and the drafter's step over the
    target's (transformers' forward over a cache of 64 tokens, no decoder around it)."""
    from benchmarks.harness.timing import forward_time

    steps = {n: forward_time(target, n, reps=8) for n in (1, *(k + 1 for k in ks))}
    return {"v": {k: steps[k + 1] / steps[1] for k in ks}, "step_s": steps[1],
            "drafter_step_s": forward_time(drafter, 1, reps=8)}


def bundle_rows(args, prompts: list[str], work: Path) -> list[list]:
    """`specdraft generate BUNDLE` with its defaults on the prompts (raw, as llama.cpp gets them), in a child process
    after the interleaved passes: its records' wall tokens/s (the first prompt's left out: it loads and warms)."""
    if not args.bundle:
        return []
    pfile = work / "prompts.jsonl"
    pfile.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in [prompts[0], *prompts]))
    out = work / "bundle.jsonl"
    res = run_child([str(Path(sys.executable).with_name("specdraft")), "generate", args.bundle, "--prompts", str(pfile),
                     "--raw-prompt", "--max-new-tokens", str(args.tokens), "--dtype", args.dtype, "--output", str(out)],
                    work / "bundle.log")
    if res["rc"] != 0:
        raise SystemExit(f"bench_llamacpp: specdraft generate failed (exit {res['rc']}):\n{tail(work / 'bundle.log')}")
    records = [json.loads(line) for line in out.read_text().splitlines()][1:]
    tokens = sum(r["N"] for r in records)
    return [["ours", args.dtype, "bundle default (not interleaved)",
             f"{tokens / sum(r['N'] / r['tokens_per_s'] for r in records):.1f}", "-", "-", "-", "-", "-"]]


# ---- the section ------------------------------------------------------------------------------------------------

def render(summary: dict, extra: list[list], parts: dict, stream: dict, build_note: str, repack_note: str, args,
           argv: list[str], loads: list[str]) -> str:
    """The section: one row per method (medians over passes, their min-max), then what explains the gaps."""
    body = [[engine, fmt, method, spread(s["wall_tps"]), spread(s["cpu_tps"]),
             "-" if s["accept"] is None else f"{s['accept']:.2f}", spread(s["vs_base"], 2),
             spread(s["vs_llamacpp"], 2), f"{stream[(engine, fmt)] / 1e6:.0f}"]
            for (engine, fmt, method), s in summary.items()]
    lines = [f"## Ours beside llama.cpp, batch 1, greedy ({datetime.date.today()}, {machine()})", "",
             f"`python benchmarks/engines/bench_llamacpp.py {' '.join(argv)}`: {args.threads} thread(s) each, "
             f"{args.n_prompts if not args.prompts else 'the given'} prompt(s) x {args.tokens} tokens, {args.passes} "
             f"passes; every method decodes a prompt back to back with the others, the order turning each prompt and "
             f"pass, so each ratio is taken within a pass (median over passes, min-max in parentheses). llama.cpp "
             f"{build_note}{repack_note}. "
             "tokens/s: wall clock (llama.cpp's own figure for its generation phase; ours the whole decode, prefill "
             "included) and from CPU time (llama.cpp: the CPU seconds between a run of --tokens and one of "
             "--short-tokens, per token; ours the decode's). x plain: over the same engine's plain decode (ours: AR) "
             "at the same weights; x llama.cpp q4: over llama.cpp's plain 4-bit decode. MB a step: the weight bytes one "
             f"token's forward streams. The machine was shared ({loads[0]} at the start, {loads[-1]} at the end): "
             "absolute tokens/s are this box's on that day; the ratios within a pass are the usable figures.", "",
             *table(["engine", "weights", "method", "tokens/s (wall)", "tokens/s (CPU time)", "accepted / drafted",
                     "x plain", "x llama.cpp q4", "MB a step"], body + extra, "lllrrrrrr"), "",
             *gap_lines(summary, parts, stream, args), ""]
    return "\n".join(lines)


def gap_lines(summary: dict, parts: dict, stream: dict, args) -> list[str]:
    """What explains the gaps: weight bytes, our verify's cost per row, the loop's own work, the drafter's cost."""
    ar = summary[("ours", args.dtype, "AR")]
    ar_cpu = statistics.median(ar["cpu_tps"])
    ours_mb = stream[("ours", args.dtype)]
    lines = ["What explains the gaps:"]
    for (engine, fmt, method), s in summary.items():
        if engine == "llama.cpp" and method == "plain":
            b = stream[(engine, fmt)]
            lines.append(f"- llama.cpp {fmt}: {b / 1e6:.0f} MB a step against our {ours_mb / 1e6:.0f} MB in "
                         f"{args.dtype} ({ours_mb / b:.2f}x the bytes); at equal weight bytes our AR would run "
                         f"{ar_cpu * ours_mb / b:.1f} tokens/s (CPU time), llama.cpp's plain decode "
                         f"{statistics.median(s['cpu_tps']):.1f}.")
    v = ", ".join(f"v({k + 1}) {x:.2f}" for k, x in parts["v"].items())
    loop = 1 / ar_cpu - parts["step_s"]
    lines += [f"- our verify (B = 1, cache of 64 tokens, CPU time): {v} one-token steps of {parts['step_s'] * 1e3:.1f} "
              f"ms; the drafter's step {parts['drafter_step_s'] / parts['step_s']:.2f} of the target's.",
              f"- our loop's own work per AR token: {loop * 1e3:.1f} ms of CPU time ({loop * ar_cpu:.0%} of a token) "
              f"beyond the one-token step."]
    return lines


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target-gguf", required=True, help="the target's 4-bit GGUF file")
    ap.add_argument("--drafter-gguf", required=True, help="the drafter's 4-bit GGUF file")
    ap.add_argument("--target", required=True, help="the same target as a model directory (ours)")
    ap.add_argument("--drafter", required=True, help="the same drafter as a model directory (ours)")
    ap.add_argument("--bundle", help="a bundle of this pair: its default decode is timed too")
    ap.add_argument("--build-dir", help="a llama.cpp build directory to reuse")
    ap.add_argument("--sdist", help="the llama-cpp-python sdist (archive or unpacked); default: pip download")
    ap.add_argument("--work", default="runs/bench_llamacpp", help="build, converted weights and logs")
    ap.add_argument("--weights", default="q4,bf16", help="llama.cpp weight formats: q4 (the files given), bf16")
    ap.add_argument("--ks", default="2,4,8", help="draft lengths, both engines")
    ap.add_argument("--bf16-ks", help="llama.cpp's draft lengths at bf16 weights (default: --ks; they read three times "
                    "the 4-bit runs' bytes a step, so a shorter list keeps a run's time in bounds)")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"], help="our decoder's dtype")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--short-tokens", type=int, default=16, help="the shorter run the CPU time per token is taken from")
    ap.add_argument("--prompts", help="text file, one prompt per line (a literal \\n stands for a newline)")
    ap.add_argument("--n-prompts", type=int, default=len(PROMPTS), help="the first N prompts")
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp's threads (-t, -td) and torch's")
    add_section_flags(ap)
    ap.add_argument("--passes", type=int, default=2, help="passes over the prompts, every method taking turns")
    ap.add_argument("--bench-reps", type=int, default=1, help="llama-bench's repetitions (-r) in each plain run")
    return ap


def parse(argv) -> argparse.Namespace:
    ap = build_parser()
    args = ap.parse_args(argv)
    if not re.fullmatch(r"\d+(,\d+)*", args.ks):
        ap.error("--ks takes comma-separated integers")
    if args.bf16_ks is not None and not re.fullmatch(r"\d+(,\d+)*", args.bf16_ks):
        ap.error("--bf16-ks takes comma-separated integers")
    args.ks = [int(k) for k in args.ks.split(",")]
    args.bf16_ks = args.ks if args.bf16_ks is None else [int(k) for k in args.bf16_ks.split(",")]
    args.weight_formats = [w.strip() for w in args.weights.split(",") if w.strip()]
    if set(args.weight_formats) - {"q4", "bf16"} or not args.weight_formats:
        ap.error(f"--weights takes q4 and/or bf16, got {args.weights!r}")
    if min(args.ks + args.bf16_ks) < 1 or args.short_tokens < 1 or args.tokens <= args.short_tokens or args.passes < 1:
        ap.error("--ks must be >= 1, --passes >= 1, and --tokens more than --short-tokens (>= 1)")
    for flag in ("target_gguf", "drafter_gguf", "target", "drafter"):
        if not Path(getattr(args, flag)).exists():
            ap.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: no such file or directory")
    if shutil.which("cmake") is None and not (args.build_dir and Path(args.build_dir, "bin", TARGETS[0]).is_file()):
        ap.error("cmake is not on PATH (and no --build-dir holds a build); install cmake and ninja")
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    prompts = (list(PROMPTS) if not args.prompts else [
        line.replace("\\n", "\n") for line in Path(args.prompts).read_text().splitlines() if line.strip()])[:args.n_prompts]
    bin_dir, build_note = build_llamacpp(args, work)
    print(f"[bench_llamacpp] llama.cpp: {build_note}", file=sys.stderr, flush=True)
    q4 = (Path(args.target_gguf), Path(args.drafter_gguf))
    weights = {"q4": q4} if "q4" in args.weight_formats else {}
    if "bf16" in args.weight_formats:
        weights["bf16"] = tuple(bf16_gguf(bin_dir, g, work) for g in q4)
    llama = Llama(bin_dir, args.threads, work, args.bench_reps)
    repack_note = llama.probe(*q4)
    target, drafter, ids = load_ours(args, prompts)
    fns = {**llamacpp_methods(llama, weights, args, prompts), **our_methods(target, drafter, args, ids)}
    for name, fn in fns.items():
        if name[0] == "ours":
            fn(0)  # warm-up: torch's first calls; llama.cpp starts cold in every run alike
    loads = [box_load()]
    summary = summarize(take_turns(fns, len(prompts), args.passes))
    loads.append(box_load())
    stream = {("llama.cpp", fmt): gguf_stream_bytes(t) for fmt, (t, _) in weights.items()}
    stream[("ours", args.dtype)] = streamed_bytes(target)
    parts = our_parts(target, drafter, args.ks)
    extra = bundle_rows(args, prompts, work)
    publish_for(render(summary, extra, parts, stream, build_note, repack_note, args, argv, loads), not args.no_append,
                Path(__file__), args.section, args.page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
