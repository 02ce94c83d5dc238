"""Tiny GGUF models written here with the `gguf` package's GGUFWriter (the tests' stand-ins for a real pair): a
llama of a few thousand parameters whose tokenizer is a byte-level BPE of 300 tokens with a ChatML template, and
the same file split into parts inside a package made in a temp dir."""
from __future__ import annotations

import hashlib
import importlib
import sys
from pathlib import Path

import numpy as np

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PAIRS = ["e", "t", "a", "o", "i", "n", "s", "r", "h", "l", "d", "u", "c", "m"]  # merged pairwise: 196 merges


def byte_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet: one printable character per byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def vocabulary(swap: bool = False) -> tuple[list[str], list[str]]:
    """(tokens, merges): the specials, the 256 bytes, then one token per merge. `swap` exchanges two tokens' ids
    (the same strings, another tokenizer)."""
    merges = [f"{a} {b}" for a in PAIRS for b in PAIRS]
    tokens = SPECIAL + byte_alphabet() + [m.replace(" ", "") for m in merges]
    if swap:
        tokens[10], tokens[11] = tokens[11], tokens[10]
    return tokens, merges


def write_tiny_gguf(path: Path, layers: int = 1, hidden: int = 32, seed: int = 0, swap: bool = False) -> Path:
    """A llama GGUF (F32 weights of `seed`) that transformers' GGUF reader loads with its tokenizer."""
    import gguf

    tokens, merges = vocabulary(swap)
    heads, kv_heads, ffn = 4, 2, 2 * hidden
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hidden // heads)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL)))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    rng = np.random.default_rng(seed)

    def tensor(name, *shape):
        w.add_tensor(name, (rng.standard_normal(shape) * 0.2).astype(np.float32))

    tensor("token_embd.weight", len(tokens), hidden)
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        tensor(f"blk.{i}.attn_q.weight", hidden, hidden)
        tensor(f"blk.{i}.attn_k.weight", kv_heads * hidden // heads, hidden)
        tensor(f"blk.{i}.attn_v.weight", kv_heads * hidden // heads, hidden)
        tensor(f"blk.{i}.attn_output.weight", hidden, hidden)
        tensor(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        tensor(f"blk.{i}.ffn_up.weight", ffn, hidden)
        tensor(f"blk.{i}.ffn_down.weight", hidden, ffn)
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def package_parts(gguf_path: Path, site: Path, package: str, n: int) -> list[str]:
    """`gguf_path` cut into `n` parts as the files <package>/data/partNN.bin of a package under `site` (put on
    sys.path by the caller); -> the parts' <package>/<file> specs, in order."""
    data = Path(gguf_path).read_bytes()
    root = site / package
    (root / "data").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    cut = [len(data) * i // n for i in range(n + 1)]
    specs = []
    for i in range(n):
        (root / "data" / f"part{i + 1:02d}.bin").write_bytes(data[cut[i]:cut[i + 1]])
        specs.append(f"{package}/data/part{i + 1:02d}.bin")
    importlib.invalidate_caches()
    sys.modules.pop(package, None)
    return specs
