"""The models and prompts the decoder benchmarks load, and transformers' own decoding beside ours.

A benchmark takes a pair from a run (`--target` / `--drafter` directories, `load`), or builds a random one of a
named shape (`demo_shaped_pair`): the target's first layer as the drafter, the deeper layers damped so that the
drafter agrees with it often (`early_exit_pair`). Its acceptance reflects that construction, not a trained
drafter; only the cost side (forwards, overheads, batching) carries over.
"""
from __future__ import annotations

import argparse
import copy
import pathlib

import torch

from specdraft.data.chat import row_messages
from specdraft.decoding.bundle.chat import format_prompt  # prompts as the pipeline serves them
from specdraft.decoding.rounds.packed_linear import pack_linears
from specdraft.decoding.rounds import kv
from specdraft.decoding.rounds.sampling import SamplingConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# the random pairs' shapes: the demo's target (16 x 128), and a bandwidth-bound ~1B target for a GPU (TinyLlama-1.1B's
# shape: 22 x 2048, 4 KV heads, vocabulary 32000; 1.03B parameters streamed a step, its 1-layer drafter 0.11 of them)
RANDOM_SHAPES = {
    "demo": dict(vocab_size=2048, hidden_size=128, intermediate_size=352, num_hidden_layers=16, num_attention_heads=4,
                 num_key_value_heads=4, initializer_range=0.1, tie_word_embeddings=True),
    "1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
               num_key_value_heads=4, initializer_range=0.02, tie_word_embeddings=False),
}


def add_device_flags(parser: argparse.ArgumentParser, dtypes=tuple(DTYPES), dtype_help: str | None = None) -> None:
    """--threads, --device and --dtype, as every decoder benchmark takes them."""
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: then CPU time is this process's compute, not idle "
                             "OpenMP workers spinning; 0: torch's choice)")
    parser.add_argument("--device", default="cpu", help="where the pair runs and is timed (cuda: CUDA events)")
    parser.add_argument("--dtype", default="float32", choices=list(dtypes), help=dtype_help)


def add_pair_flags(parser: argparse.ArgumentParser, required: bool = False) -> None:
    """--target and --drafter (model directories; `required`, or else a random pair stands in) and the prompts
    `load_prompts` reads: --prompt-set, --prompts, --domain, --n-prompts."""
    parser.add_argument("--target", required=required, help="the target's directory")
    parser.add_argument("--drafter", required=required, help="the drafter's directory")
    parser.add_argument("--prompt-set", help="a run's prompts/sets dir: use its test prompts of --domain")
    parser.add_argument("--prompts", help="text file, one prompt per line")
    parser.add_argument("--domain", default="math", help="domain of --prompt-set prompts (all: every domain)")
    parser.add_argument("--n-prompts", type=int, default=8, help="batch-1 prompts")


def load(path: str, device: str, dtype: torch.dtype, packed: bool = True):
    """A causal LM directory (safetensors only, no remote code) on `device` in `dtype`, in eval mode; its linears
    packed (decoding/rounds/packed_linear.py: bf16 on a CPU with bf16 units) unless `packed` is False."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, use_safetensors=True, trust_remote_code=False, dtype=dtype)
    model = model.to(device).eval()
    if packed:
        pack_linears(model)
    return model


def random_prompts(n: int, vocab: int, lengths: tuple[int, int] = (4, 24), lowest_id: int = 0) -> list[list[int]]:
    """`n` prompts of random token ids in [lowest_id, vocab), of random lengths in [lengths), seeded."""
    gen = torch.Generator().manual_seed(0)
    sizes = torch.randint(*lengths, (n,), generator=gen).tolist()
    return [torch.randint(lowest_id, vocab, (size,), generator=gen).tolist() for size in sizes]


def load_prompts(args, vocab: int, lengths: tuple[int, int] = (4, 24), lowest_id: int = 0) -> list[list[int]]:
    """--n-prompts prompts: the prompts of --domain (None or "all": every domain) in a run's --prompt-set, of its --split
    where the benchmark has one (else its test set), formatted as the pipeline serves them; the lines of a --prompts
    file; or else random ids (`random_prompts`)."""
    if args.prompt_set:
        from datasets import load_from_disk
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.target, trust_remote_code=False)
        rows = [r for r in load_from_disk(args.prompt_set)[getattr(args, "split", "test")]
                if args.domain in (None, "all", r["domain"])]
        return [format_prompt(tok, row_messages(r)) for r in rows[: args.n_prompts]]
    if getattr(args, "prompts", None):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.target, trust_remote_code=False)
        # one prompt per line; a literal \n inside a line stands for a newline (multi-line prompts)
        lines = [l.strip().replace("\\n", "\n") for l in pathlib.Path(args.prompts).read_text().splitlines() if l.strip()]
        return [tok(line)["input_ids"] for line in lines[: args.n_prompts]]
    return random_prompts(args.n_prompts, vocab, lengths, lowest_id)


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


def demo_shaped_pair(vocab: int | None, nudge: float, device: str, dtype: torch.dtype, shape: str = "demo"):
    """A random target of `shape` (RANDOM_SHAPES; the demo's 16 x 128 by default; `vocab`: its vocabulary, None for
    the shape's own) and its first layer as the drafter; `nudge` damps the deeper layers (0.05: greedy MAT about
    2.7 at K = 4 on the demo shape, near the demo's math drafter). Built on `device` in `dtype` directly, so a 1B
    target never exists in float32 on the host."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    dims = {**RANDOM_SHAPES[shape], **({} if vocab is None else {"vocab_size": vocab})}
    cfg = LlamaConfig(**dims, max_position_embeddings=512, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    with torch.device(device):
        target = LlamaForCausalLM(cfg).to(dtype).eval()
    return early_exit_pair(target, nudge)


def ours(target, prompts: list[list[int]], n: int, sampling: SamplingConfig, seed: int, compile, drafter=None,
         policy=None, eos: int | None = None):
    """The project's decoder on a batch of prompts (`decoding.batched.generate_batch`): AR without a drafter."""
    from specdraft.decoding.batched import generate_batch

    return generate_batch(target, prompts, n, drafter=drafter, policy=policy, sampling=sampling, seed=seed,
                          compile=compile, eos_token_id=eos)


class ForwardCounter:
    """Counts forward calls of a model (transformers' generate has no per-call counters)."""

    def __init__(self, model):
        self.calls = 0
        model.register_forward_hook(self._hook)

    def _hook(self, *_):
        self.calls += 1


def hf_generate(target, drafter, counter: ForwardCounter, prompt: list[int], n: int, sampling: SamplingConfig,
                k: int | None, seed: int = 0, eos: int | None = None) -> tuple[list[int], int]:
    """transformers generate (assisted when k is given, K constant, no confidence stop) -> (generated tokens,
    target forwards, counted by `counter` on the target). eos None: exactly n tokens (min_new_tokens), else up to
    n, stopping at eos as ours does."""
    torch.manual_seed(seed)
    kwargs = dict(max_new_tokens=n, do_sample=not sampling.greedy, eos_token_id=eos, pad_token_id=0)
    if eos is None:
        kwargs["min_new_tokens"] = n
    if not sampling.greedy:
        kwargs.update(temperature=sampling.temperature, top_k=0, top_p=1.0)
    if k is not None:
        kwargs["assistant_model"] = drafter
        # transformers reads these from the assistant's generation config (generate() kwargs do not reach it)
        gc = drafter.generation_config
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = k, "constant", 0.0
    ids = torch.tensor([prompt], device=kv.input_device(target))
    counter.calls = 0
    # an explicit mask: otherwise prompt tokens equal to pad_token_id would be masked as padding
    out = target.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
    return out[0, len(prompt):].tolist(), counter.calls
