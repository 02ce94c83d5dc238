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
rounded to bf16). Where the CPU backend's AMX kernels fault (SIGILL: the machine does not let the process use AMX
tiles, as on this box), the runs repeat with `--no-repack`, and the section says so.

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

from benchmarks.harness.machine import machine  # noqa: E402
from benchmarks.harness.publish import add_section_flags, publish_for  # noqa: E402
from benchmarks.harness.tables import table  # noqa: E402
from benchmarks.harness.timing import run_child, tail  # noqa: E402

SDIST = "llama-cpp-python==0.3.36"
TARGETS = ("llama-bench", "llama-speculative-simple", "llama-quantize")
CMAKE_FLAGS = ("-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=ON")
PROMPTS = ("def quicksort(arr):\n", "# Parse a CSV file and print the sum of its second column\nimport csv\n",
           "class LRUCache:\n    \"\"\"A least-recently-used cache of fixed capacity.\"\"\"\n")
SIGILL = -signal.SIGILL


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
    """llama.cpp's binaries at a thread count; `repack` False adds --no-repack (set once a run faults in AMX)."""

    def __init__(self, bin_dir: Path, threads: int, work: Path, reps: int = 3):
        self.bin_dir, self.threads, self.work, self.reps, self.repack = bin_dir, threads, work, reps, True

    def run(self, name: str, args: list[str], log: Path) -> tuple[dict, str]:
        """Run binary `name`; -> (run_child's figures, its output). A SIGILL with repacking on retries without."""
        for _ in range(2):
            extra = [] if self.repack else (["--repack", "0"] if name == "llama-bench" else ["--no-repack"])
            res = run_child([str(self.bin_dir / name), *args, *extra], log)
            if res["rc"] == SIGILL and self.repack:
                print("[bench_llamacpp] llama.cpp's AMX kernels fault here (SIGILL): --no-repack from now on",
                      file=sys.stderr, flush=True)
                self.repack = False
                continue
            break
        if res["rc"] != 0:
            raise SystemExit(f"bench_llamacpp: {name} failed (exit {res['rc']}); {log}:\n{tail(log)}")
        return res, log.read_text(errors="replace")

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


def llamacpp_runs(llama: Llama, weights: dict[str, tuple[Path, Path]], args, prompts: list[str]) -> list[dict]:
    """Every llama.cpp row: per weight format, plain decode of target and drafter (llama-bench) and speculative
    decode per K, each at --tokens and --short-tokens."""
    rows = []
    for fmt, (target, drafter) in weights.items():
        for who, gguf in (("target", target), ("drafter", drafter)):
            long, short = (llama.plain(gguf, n, f"{fmt}-{who}-{n}") for n in (args.tokens, args.short_tokens))
            rows.append({"engine": "llama.cpp", "weights": fmt, "method": f"plain ({who})",
                         "wall_tps": long["tokens_per_s"], "cpu_s_token": per_token_cpu(long, short),
                         "bytes": gguf_stream_bytes(gguf)})
        for k in args.ks:
            runs = []
            for i, prompt in enumerate(prompts):
                long, short = (llama.speculative(target, drafter, k, prompt, n, f"{fmt}-k{k}-p{i}-{n}")
                               for n in (args.tokens, args.short_tokens))
                runs.append((long, short))
            tokens = sum(lo["tokens"] for lo, _ in runs)
            drafted = sum(lo["drafted"] for lo, _ in runs)
            rows.append({"engine": "llama.cpp", "weights": fmt,
                         "method": f"speculative K = {k}",
                         "wall_tps": tokens / sum(lo["seconds"] for lo, _ in runs),
                         "cpu_s_token": statistics.median(per_token_cpu(lo, sh) for lo, sh in runs),
                         "accept": sum(lo["accepted"] for lo, _ in runs) / drafted if drafted else None,
                         "bytes": gguf_stream_bytes(target)})
    return rows


# ---- ours -------------------------------------------------------------------------------------------------------

def our_runs(args, prompts: list[str]) -> tuple[list[dict], dict]:
    """Our decoder's rows (AR and fixed K, batch 1, greedy, in --dtype) and its step's parts (v(K + 1), the loop's
    work per token), the methods taking turns prompt by prompt."""
    import torch

    from specdraft.decoding.batched import generate_batch
    from specdraft.decoding.policies.stopping import FixedK
    from benchmarks.harness.floor import streamed_bytes
    from benchmarks.harness.models import DTYPES, load
    from benchmarks.harness.timing import forward_time, interleave
    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    target, drafter = load(args.target, "cpu", dtype), load(args.drafter, "cpu", dtype)
    tok = AutoTokenizer.from_pretrained(args.target, trust_remote_code=False)
    ids = [tok(p)["input_ids"] for p in prompts]

    def method(k):
        def fn(prompt, seed):
            start = time.perf_counter()
            out = generate_batch(target, [prompt], args.tokens, drafter=drafter if k else None,
                                 policy=FixedK(k) if k else None)[0]
            return out.metrics, time.perf_counter() - start
        return fn
    fns = {k: method(k) for k in [0, *args.ks]}
    cpu, out = interleave(fns, ids, args.passes, "cpu")
    rows = []
    for k in fns:
        metrics = [m for m, _ in out[k][-1]]
        tokens = sum(m.n_generated for m in metrics)
        drafted = sum(m.n_draft for m in metrics)
        rows.append({"engine": "ours", "weights": args.dtype, "method": f"fixed K = {k}" if k else "AR",
                     "wall_tps": tokens / sum(w for _, w in out[k][-1]),
                     "cpu_s_token": min(sum(p) for p in cpu[k]) / tokens,
                     "accept": (drafted - sum(m.n_discarded for m in metrics)) / drafted if drafted else None,
                     "bytes": streamed_bytes(target)})
    steps = {n: forward_time(target, n, reps=10) for n in (1, *(k + 1 for k in args.ks))}
    parts = {"v": {k: steps[k + 1] / steps[1] for k in args.ks}, "step_s": steps[1],
             "loop_s": rows[0]["cpu_s_token"] - steps[1],
             "drafter_step_s": forward_time(drafter, 1, reps=10)}
    return rows, parts


def bundle_rows(args, prompts: list[str], work: Path) -> list[dict]:
    """`specdraft generate BUNDLE` with its defaults on the prompts (raw, as llama.cpp gets them): its records'
    tokens/s (wall, per generation, the first prompt's left out: it loads and warms), in a child process."""
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
    return [{"engine": "ours", "weights": args.dtype, "method": "bundle default",
             "wall_tps": tokens / sum(r["N"] / r["tokens_per_s"] for r in records), "cpu_s_token": None,
             "accept": None, "bytes": None}]


# ---- the section ------------------------------------------------------------------------------------------------

def render(rows: list[dict], parts: dict, build_note: str, repack: bool, args, argv: list[str]) -> str:
    plain = {r["weights"]: r for r in rows if r["method"] == "plain (target)"}
    ar = next(r for r in rows if r["engine"] == "ours" and r["method"] == "AR")

    def cell(x, fmt):
        return "-" if x is None else format(x, fmt)
    body = [[r["engine"], r["weights"], r["method"], cell(r["wall_tps"], ".1f"),
             cell(1 / r["cpu_s_token"] if r["cpu_s_token"] else None, ".1f"),
             cell(r.get("accept"), ".2f"), cell(r["bytes"] / 1e6 if r["bytes"] else None, ".0f")] for r in rows]
    lines = [f"## Ours beside llama.cpp, batch 1, greedy ({datetime.date.today()}, {machine()})", "",
             f"`python benchmarks/engines/bench_llamacpp.py {' '.join(argv)}`: {args.threads} thread(s), "
             f"{args.n_prompts if not args.prompts else 'the given'} prompt(s) x {args.tokens} tokens; llama.cpp "
             f"{build_note}{'' if repack else '; its AMX kernels fault on this machine (SIGILL): run with --no-repack'}. "
             "tokens/s: wall clock (llama.cpp's own figure for its generation phase; ours the decode's) and from CPU "
             "time (llama.cpp: the CPU seconds between a run of --tokens and one of --short-tokens, per token). "
             "MB a step: the weight bytes one token's forward streams.", "",
             *table(["engine", "weights", "method", "tokens/s (wall)", "tokens/s (CPU time)", "accepted / drafted",
                     "MB a step"], body, "lllrrrr"), "", "What explains the gaps:"]
    for fmt, r in plain.items():
        lines.append(f"- llama.cpp {fmt}: {r['bytes'] / 1e6:.0f} MB a step against our {ar['bytes'] / 1e6:.0f} MB in "
                     f"{args.dtype} ({ar['bytes'] / r['bytes']:.2f}x the bytes); at equal weight bytes our AR would run "
                     f"{1 / ar['cpu_s_token'] * ar['bytes'] / r['bytes']:.1f} tokens/s (CPU time), llama.cpp's plain "
                     f"decode {1 / r['cpu_s_token']:.1f}.")
    v = ", ".join(f"v({k + 1}) {x:.2f}" for k, x in parts["v"].items())
    lines += [f"- our verify (B = 1, cache of 64 tokens): {v} one-token steps of {parts['step_s'] * 1e3:.1f} ms; "
              f"the drafter's step {parts['drafter_step_s'] / parts['step_s']:.2f} of the target's.",
              f"- our loop's own work per AR token: {parts['loop_s'] * 1e3:.1f} ms of CPU time "
              f"({parts['loop_s'] / ar['cpu_s_token']:.0%} of a token) beyond the one-token step.", ""]
    return "\n".join(lines)


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
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"], help="our decoder's dtype")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--short-tokens", type=int, default=16, help="the shorter run the CPU time per token is taken from")
    ap.add_argument("--prompts", help="text file, one prompt per line (a literal \\n stands for a newline)")
    ap.add_argument("--n-prompts", type=int, default=len(PROMPTS), help="the first N prompts")
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp's threads (-t, -td) and torch's")
    add_section_flags(ap)
    ap.add_argument("--passes", type=int, default=2, help="our decodes' passes over the prompts")
    ap.add_argument("--bench-reps", type=int, default=3, help="llama-bench's repetitions (-r)")
    return ap


def parse(argv) -> argparse.Namespace:
    ap = build_parser()
    args = ap.parse_args(argv)
    if not re.fullmatch(r"\d+(,\d+)*", args.ks):
        ap.error("--ks takes comma-separated integers")
    args.ks = [int(k) for k in args.ks.split(",")]
    args.weight_formats = [w.strip() for w in args.weights.split(",") if w.strip()]
    if set(args.weight_formats) - {"q4", "bf16"} or not args.weight_formats:
        ap.error(f"--weights takes q4 and/or bf16, got {args.weights!r}")
    if min(args.ks) < 1 or args.short_tokens < 1 or args.tokens <= args.short_tokens or args.passes < 1:
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
    rows = llamacpp_runs(llama, weights, args, prompts)
    ours, parts = our_runs(args, prompts)
    rows += ours + bundle_rows(args, prompts, work)
    publish_for(render(rows, parts, build_note, llama.repack, args, argv), not args.no_append, Path(__file__), args.section, args.page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
