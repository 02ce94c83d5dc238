"""Our speculative decoder side by side with transformers assisted generation, batch 1, on CPU or GPU.

    python benchmarks/decoder/bench_decoder.py --target DIR --drafter DIR [--k 4] [--max-new-tokens 64]
        [--prompts FILE | --prompt-set runs/demo/prompts/sets --domain math] [--runs 5] [--temperature 0.7]
        [--head DIR --h 0.7] [--threads N] [--no-append]
    python benchmarks/decoder/bench_decoder.py --random-tiny          # smoke test on two random tiny models

For greedy and for sampling it measures, per prompt and method, the median over --runs timed runs
(after one warm-up run per method; the methods interleaved within each run, so a slow phase of a shared
machine hits them alike; times from `decoding.timing.timed_call`: this process's CPU time on CPU, CUDA
events on a GPU, wall time beside it): ours autoregressive (the baseline), ours speculative with fixed K,
transformers `generate` alone, and assisted generation with `num_assistant_tokens=K` (constant schedule)
and with its defaults. Reports tokens/s, MAT (tokens per target forward, counted with a forward hook for
transformers), the ratio ours / transformers at equal K, and the implementation efficiency: measured
speedup over our autoregressive baseline divided by the analytic fixed-K speedup at the measured
acceptance (inverted from MAT) and cost ratio c = t_draft / t_target (from autoregressive per-token
times of each model). A second table compares greedy stopping policies (fixed K, SpecDec++ with --head,
the hindsight oracle) by discard and verification rate, with the §5.2 cost fit (non-negative least squares
on counts and the same robust median times, with its R^2). The tables are printed
and written as this script's section of benchmarks/decoder/RESULTS.md, the machine named.
EOS is ignored so every method generates exactly --max-new-tokens tokens.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import pathlib
import os
import platform
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from specdraft.core.devices import device_name  # noqa: E402
from specdraft.data.chat import row_messages  # noqa: E402
from specdraft.decoding.bundle.chat import format_prompt  # noqa: E402  # prompts as the pipeline serves them
from specdraft.decoding.autoregressive import generate_autoregressive  # noqa: E402
from specdraft.decoding.rounds import kv  # noqa: E402
from specdraft.decoding.costs.model import acceptance_from_mat, analytic_speedup, implementation_efficiency  # noqa: E402
from specdraft.decoding.metrics import aggregate  # noqa: E402
from specdraft.decoding.rounds.sampling import SamplingConfig  # noqa: E402
from specdraft.decoding.costs.model import fit_costs  # noqa: E402
from specdraft.decoding.speculative import hindsight_oracle, generate_with_drafter  # noqa: E402
from specdraft.decoding.policies.stopping import FixedK, SpecDecPP  # noqa: E402
from specdraft.decoding.timing import timed_call  # noqa: E402
from benchmarks.harness.publish import publish  # noqa: E402



def early_exit_pair(target, nudge: float):
    """(target, drafter): the target with its deeper layers' output projections scaled by `nudge`, so
    they only nudge the residual stream and its first layer alone (the drafter: a copy cut to that layer,
    sharing embeddings, norm and head) agrees with it often."""
    with torch.no_grad():
        for layer in target.model.layers[1:]:
            layer.self_attn.o_proj.weight.mul_(nudge)
            layer.mlp.down_proj.weight.mul_(nudge)
    drafter = copy.deepcopy(target)
    drafter.model.layers = drafter.model.layers[:1]
    drafter.config.num_hidden_layers = 1
    return target, drafter


def random_tiny_pair(out_dir: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A 4-layer random target and a drafter made of its first layer (shared embeddings, norm and head),
    saved as safetensors: the drafter is cheaper and agrees with the target often."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=512, hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.1,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    target, drafter = early_exit_pair(LlamaForCausalLM(cfg).eval(), 0.25)
    paths = out_dir / "target", out_dir / "drafter"
    target.save_pretrained(paths[0], safe_serialization=True)
    drafter.save_pretrained(paths[1], safe_serialization=True)
    return paths


def load(path: str, device: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, use_safetensors=True, trust_remote_code=False, dtype=dtype)
    return model.to(device).eval()


def load_prompts(args, vocab: int) -> list[list[int]]:
    if args.prompt_set:
        from datasets import load_from_disk
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.target, trust_remote_code=False)
        rows = [r for r in load_from_disk(args.prompt_set)["test"] if r["domain"] == args.domain]
        return [format_prompt(tok, row_messages(r)) for r in rows[: args.n_prompts]]
    if args.prompts:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.target, trust_remote_code=False)
        # one prompt per line; a literal \n inside a line stands for a newline (multi-line prompts)
        lines = [l.strip().replace("\\n", "\n") for l in pathlib.Path(args.prompts).read_text().splitlines() if l.strip()]
        return [tok(line)["input_ids"] for line in lines[: args.n_prompts]]
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(4, 24, (args.n_prompts,), generator=gen).tolist()
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


class ForwardCounter:
    """Counts forward calls of a model (transformers' generate has no per-call counters)."""

    def __init__(self, model):
        self.calls = 0
        model.register_forward_hook(self._hook)

    def _hook(self, *_):
        self.calls += 1


def interleaved(fns: dict, runs: int, device: str) -> dict:
    """Each fn once to warm up, then `runs` passes over all of them in turn (interleaved, so load phases
    hit every method alike). Returns name -> (median robust seconds, median wall seconds, last result)."""
    for fn in fns.values():
        fn()
    times: dict = {name: [] for name in fns}
    out = {}
    for _ in range(runs):
        for name, fn in fns.items():
            out[name], t = timed_call(fn, device)
            times[name].append(t)
    return {name: (statistics.median(t.time for t in ts), statistics.median(t.wall for t in ts), out[name])
            for name, ts in times.items()}


def median_times(calls: dict, reset, reps: int, device: str, warmup: int = 5) -> dict:
    """name -> median robust seconds of `call()` over `reps` calls after `warmup` untimed ones, the calls
    alternating one by one (a load phase hits all alike), `reset()` (the cache back to its context) before
    each."""
    times: dict = {name: [] for name in calls}
    for i in range(reps + warmup):
        for name, call in calls.items():
            reset()
            _, t = timed_call(call, device)
            if i >= warmup:
                times[name].append(t.time)
    return {name: statistics.median(ts) for name, ts in times.items()}


@torch.inference_mode()
def forward_time(model, n_tokens: int, context: int = 64, reps: int = 60, device: str = "cpu") -> float:
    """The model alone (no decoder around it): median robust seconds of one n-token cached forward."""
    cache = kv.new_cache()
    kv.forward(model, cache, torch.randint(3, model.config.vocab_size, (context,)).tolist())
    call = lambda: kv.forward(model, cache, list(range(3, 3 + n_tokens)), last=n_tokens)  # noqa: E731
    return median_times({"forward": call}, lambda: kv.crop(cache, context), reps, device)["forward"]


@dataclasses.dataclass
class Pair:
    """What every decode of a run shares: the two models, the prompts and the lengths."""
    target: object
    drafter: object
    t_calls: ForwardCounter  # counts target forwards inside transformers generate
    prompts: list[list[int]]
    n: int  # new tokens per generation (EOS ignored: every method generates exactly n)
    k: int  # ours fixed K, and transformers' num_assistant_tokens at equal K


def hf_generate(pair: Pair, prompt, sampling: SamplingConfig, assistant_k: int | None, assisted: bool):
    """transformers generate, alone or assisted by the drafter -> (tokens generated, target forwards)."""
    target, drafter, n = pair.target, pair.drafter, pair.n
    kwargs = dict(max_new_tokens=n, min_new_tokens=n, do_sample=not sampling.greedy, eos_token_id=None, pad_token_id=0)
    if not sampling.greedy:
        kwargs.update(temperature=sampling.temperature, top_k=0, top_p=1.0)
    if assisted:
        kwargs["assistant_model"] = drafter
        # transformers reads these from the *assistant's* generation config (generate() kwargs do
        # not reach it); None restores its defaults: 20 tokens, constant, confidence stop at 0.4
        gc = drafter.generation_config
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = assistant_k, "constant" if assistant_k else None
        gc.assistant_confidence_threshold = 0.0 if assistant_k else None  # equal K: no early stop
    ids = torch.tensor([prompt], device=target.device)
    pair.t_calls.calls = 0
    # an explicit mask: otherwise prompt tokens equal to pad_token_id would be masked as padding
    out = target.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
    return out.shape[1] - len(prompt), pair.t_calls.calls


def decode_prompt(pair: Pair, i: int, prompt, sampling: SamplingConfig, runs: int, device: str) -> dict:
    """Every method on prompt i, interleaved over `runs` timed runs (`interleaved`), each seeded by i."""
    target, drafter, n, k = pair.target, pair.drafter, pair.n, pair.k
    gen = lambda: torch.Generator().manual_seed(i)  # noqa: E731

    def seeded_hf(assistant_k, assisted):
        torch.manual_seed(i)
        return hf_generate(pair, prompt, sampling, assistant_k, assisted)

    return interleaved({
        "ar": lambda: generate_autoregressive(target, prompt, n, sampling, generator=gen()),
        "ar_d": lambda: generate_autoregressive(drafter, prompt, n, sampling, generator=gen()),
        "spec": lambda: generate_with_drafter(target, drafter, prompt, n, sampling, k=k, generator=gen()),
        "hf": lambda: seeded_hf(None, False),
        "hf_k": lambda: seeded_hf(k, True),
        "hf_def": lambda: seeded_hf(None, True),
    }, runs, device)


def measure_mode(pair: Pair, sampling: SamplingConfig, runs: int, device: str) -> tuple[dict, dict, list, list]:
    """One sampling mode over every prompt: per method [(median seconds, tokens)], per drafting method
    [(tokens, target forwards)], our speculative decodes' metrics, and our AR's [(median wall seconds, tokens)]."""
    per = {key: [] for key in ("ar", "ar_d", "spec", "hf", "hf_k", "hf_def")}
    mats = {key: [] for key in ("spec", "hf_k", "hf_def")}
    spec_metrics = []
    ar_wall = []  # (median wall seconds, tokens): the decoder's own split (`mode_row`) is wall time
    for i, prompt in enumerate(pair.prompts):
        res = decode_prompt(pair, i, prompt, sampling, runs, device)
        for key in ("ar", "ar_d", "spec"):
            per[key].append((res[key][0], res[key][2].metrics.n_generated))
        ar_wall.append((res["ar"][1], res["ar"][2].metrics.n_generated))
        r = res["spec"][2]
        mats["spec"].append((r.metrics.n_generated, r.metrics.n_target))
        spec_metrics.append(r.metrics)
        for key in ("hf", "hf_k", "hf_def"):
            toks, calls = res[key][2]
            per[key].append((res[key][0], toks))
            if key != "hf":
                mats[key].append((toks, calls))
    return per, mats, spec_metrics, ar_wall


def mode_row(mode: str, k: int, per: dict, mats: dict, spec_metrics: list, ar_wall: list, v_model: float) -> tuple:
    """A mode's measurements as the table's quantities: tokens/s, MAT, c, acceptance, speedup against the
    analytic one, where our decoder's time goes, and its verify forward against its AR forward."""
    tps = {key: sum(tok for _, tok in v) / sum(t for t, _ in v) for key, v in per.items()}
    mat = {key: sum(a for a, _ in v) / sum(b for _, b in v) for key, v in mats.items()}
    t_target, t_draft = 1 / tps["ar"], 1 / tps["ar_d"]
    c = t_draft / t_target
    a = acceptance_from_mat(min(max(mat["spec"], 1.0), k + 1), k)
    speedup = tps["spec"] / tps["ar"]
    analytic = analytic_speedup(a, k, c)
    split = aggregate(spec_metrics)
    where = [t / split.time_total for t in (split.time_draft, split.time_target, split.time_other)]
    # K+1-token forward vs 1-token forward inside the decoder: both wall-clock (the loop's own split)
    verify_cost = (split.time_target / split.n_target) / (sum(t for t, _ in ar_wall) / sum(x for _, x in ar_wall))
    return (mode, tps, mat, c, a, speedup, analytic, where, verify_cost, v_model)


def bench(args) -> str:
    """Load the pair, time its bare forwards, measure greedy then sampled decoding, render both tables."""
    device = args.device
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    target, drafter = load(args.target, device, dtype), load(args.drafter, device, dtype)
    t_calls = ForwardCounter(target)
    prompts = load_prompts(args, target.config.vocab_size)
    pair = Pair(target, drafter, t_calls, prompts, args.max_new_tokens, args.k)
    # what the hardware charges for K+1 tokens at once, in units of its 1-token forward (both measured here)
    t_verify_model = forward_time(target, args.k + 1, device=device)
    t_one_model = forward_time(target, 1, device=device)
    v = t_verify_model / t_one_model  # the bare (K+1)-token forward in units of its 1-token forward
    rows = []
    for mode, sampling in (("greedy", SamplingConfig(0.0)), (f"T={args.temperature}", SamplingConfig(args.temperature))):
        rows.append(mode_row(mode, args.k, *measure_mode(pair, sampling, args.runs, device), v))
    lines = decoder_table(args, pair, rows)
    lines += policy_table(args, target, drafter, prompts)
    return "\n".join(lines)


def decoder_table(args, pair: Pair, rows: list) -> list[str]:
    """The first table: ours against transformers per mode, with the efficiency columns explained below it."""
    device, n, k = args.device, pair.n, pair.k
    machine = (
        f"{platform.machine()} {_cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
        f"device {device}, {args.dtype}"
    )
    lines = [
        f"## Decoder vs transformers assisted generation ({datetime.date.today()}, {machine})",
        "",
        f"`python benchmarks/decoder/bench_decoder.py {' '.join(args.argv)}`: {len(pair.prompts)} prompts, batch 1, "
        f"max_new_tokens={n}, K={k}, median of {args.runs} timed runs after one warm-up, the methods interleaved "
        f"within each run; times are this process's CPU time ({'CUDA events' if device.startswith('cuda') else 'CPU'}); "
        f"tokens/s over all prompts. "
        f"Load average at the end: {os.getloadavg()[0]:.1f} (a shared machine makes single runs noisy).",
        "",
        "| mode | ours AR tok/s | ours SD tok/s | ours MAT | HF tok/s | HF assisted K tok/s | HF MAT | ours/HF at K "
        "| HF assisted default tok/s | HF default MAT | c | a | speedup | analytic | efficiency "
        "| SD time draft/target/other | verify fwd / AR fwd | model-only v | analytic at v | efficiency at v |",
        "| --- " + "| ---: " * 19 + "|",
    ]
    for mode, tps, mat, c, a, speedup, analytic, where, verify_cost, v in rows:
        lines.append(
            f"| {mode} | {tps['ar']:.1f} | {tps['spec']:.1f} | {mat['spec']:.2f} | {tps['hf']:.1f} | {tps['hf_k']:.1f} | "
            f"{mat['hf_k']:.2f} | {tps['spec'] / tps['hf_k']:.2f} | {tps['hf_def']:.1f} | {mat['hf_def']:.2f} | "
            f"{c:.3f} | {a:.3f} | {speedup:.2f} | {analytic:.2f} | {implementation_efficiency(speedup, a, k, c):.2f} | "
            f"{where[0]:.0%} / {where[1]:.0%} / {where[2]:.0%} | {verify_cost:.2f} | {v:.2f} | "
            f"{analytic_speedup(a, k, c, v):.2f} | {implementation_efficiency(speedup, a, k, c, v):.2f} |"
        )
    return lines + [
        "",
        "c = t_draft / t_target from autoregressive per-token times; a = per-token acceptance whose fixed-K "
        "expected tokens per round equals our MAT; speedup = ours SD / ours AR; efficiency = speedup / analytic "
        "(the analytic model assumes a (K+1)-token verification forward costs one single-token forward; "
        "'verify fwd / AR fwd' shows how far that holds inside our decoder). v = the target model alone, outside any "
        "decoder: its median (K+1)-token cached forward over its median 1-token cached forward; "
        "'analytic at v' puts v in place of 1, so 'efficiency at v' is what is left for the decoder's own overhead "
        "(per-round sampling, verification, cache rollback, bookkeeping).",
        "",
    ]


def policy_table(args, target, drafter, prompts) -> list[str]:
    """Greedy stopping policies on the same prompts: fixed K, SpecDec++ (with --head), the hindsight
    oracle; hardware-independent rates, and the SpecDec++ §5.2 cost fit over all these generations."""
    greedy, n = SamplingConfig(0.0), args.max_new_tokens
    policies = [(f"fixed K={k}", lambda k=k: FixedK(k)) for k in (1, 2, 4, 6, 8)]
    if args.head:
        from specdraft.decoding.policies.acceptance_head import load_head

        head, _ = load_head(args.head, expected_hidden_size=drafter.config.hidden_size)
        head = head.to(next(drafter.parameters()).device)
        policies.append((f"SpecDec++ h={args.h}", lambda: SpecDecPP(head, args.h)))
    lines = [
        "| greedy policy | MAT | discard rate | verification rate | tok/s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    # per prompt, the policies interleaved and repeated; each generation's median robust time is its row of the fit
    results: dict[str, list] = {name: [] for name, _ in policies}
    fit_rows = []
    for p in prompts:
        res = interleaved({name: (lambda make=make: generate_with_drafter(target, drafter, p, n, greedy, stopping=make()))
                           for name, make in policies}, args.runs, args.device)
        for name, (t, _, r) in res.items():
            m = dataclasses.replace(r.metrics, time_total=t)  # tok/s below from the robust median time
            results[name].append(m)
            fit_rows.append((m.n_draft, m.n_target, t))
    for name, _ in policies:
        m = aggregate(results[name])
        lines.append(f"| {name} | {m.mat:.2f} | {m.discard_rate:.2f} | {m.verification_rate:.2f} | {m.tokens_per_s:.1f} |")
    m = aggregate(hindsight_oracle(target, drafter, p, n).metrics for p in prompts)
    lines.append(f"| hindsight oracle (Thm 4.1) | {m.mat:.2f} | {m.discard_rate:.2f} | {m.verification_rate:.2f} | - |")
    fit = fit_costs(fit_rows)
    lines += [
        "",
        f"Cost fit over these {fit.n_rows} generations (Eq. 3.1, non-negative least squares on counts and median "
        f"robust times): t_draft = {fit.t_draft * 1e3:.3f} ms, t_target = {fit.t_target * 1e3:.3f} ms, "
        f"R^2 = {fit.r2:.3f}.",
        "",
    ]
    return lines


def _cpu_name() -> str:
    return device_name("cpu").split(": ", 1)[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target")
    parser.add_argument("--drafter")
    parser.add_argument("--random-tiny", action="store_true", help="benchmark two random tiny models (smoke test)")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompts", help="text file, one prompt per line (tokenized with the target's tokenizer)")
    parser.add_argument("--prompt-set", help="a run's prompts/sets dir (prepare-data): use its test prompts of --domain")
    parser.add_argument("--domain", default="math", help="domain of --prompt-set prompts")
    parser.add_argument("--n-prompts", type=int, default=8)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--head", help="acceptance head dir (train-heads output) for a SpecDec++ row")
    parser.add_argument("--h", type=float, default=0.7, help="SpecDec++ stopping threshold")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: then CPU time is this process's compute, not idle "
                             "OpenMP workers spinning; 0: torch's choice)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--no-append", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        if args.random_tiny:
            args.target, args.drafter = map(str, random_tiny_pair(pathlib.Path(tmp)))
        elif not (args.target and args.drafter):
            parser.error("give --target and --drafter, or --random-tiny")
        table = bench(args)
    publish(table, write=not args.no_append)
    return 0


if __name__ == "__main__":
    sys.exit(main())
