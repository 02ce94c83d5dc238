"""A GGUF model written once as a Hugging Face model directory: convert-target's target, and train-drafters' GGUF
initialisation (`train_drafters.init_from`), converted by the same code.

transformers reads GGUF itself (`from_pretrained(dir, gguf_file=...)`): it dequantizes every tensor to fp32 and
builds the tokenizer and its chat template from the file's metadata, which takes half a minute for a 135M model.
Every later stage, the decoder and vLLM would pay that on each load; here it is paid once:

  1. check the file whole (pipelines/gguf_file.py): a truncated or foreign file stops before anything is written
  2. load model and tokenizer through transformers' GGUF loader; keep its logits on a probe
  3. rebuild the model from its config without the GGUF quantization marker (transformers refuses to
     save_pretrained a model it loaded from GGUF) and load the dequantized weights into it, all keys matched
  4. save_pretrained as safetensors, with the tokenizer, its chat template and the generation config
  5. check the directory: reloaded from safetensors (the GGUF-loaded model freed first, so a 1.5B model is held
     in fp32 once, not twice), its logits on the probe equal the GGUF-loaded model's
"""
from __future__ import annotations

import gc
import time
from pathlib import Path

import torch

from specdraft.core.errors import InputError
from specdraft.core.tokenizers import tokenizer_fingerprint
from specdraft.pipelines.gguf_file import check_gguf

PROBE = "The capital of France is"  # the reload check's input: any text the tokenizer encodes


def load_gguf(path: Path):
    """(model, tokenizer) as transformers' GGUF loader builds them (fp32, eval mode)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                     local_files_only=True)
    except (ValueError, KeyError, NotImplementedError) as e:  # an architecture or tensor type transformers lacks
        raise InputError(f"transformers cannot load '{path.name}' ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:120]}); give a GGUF of an architecture transformers reads "
                         "(llama, qwen2, mistral, ...)") from None
    return model.eval(), tok


def plain_copy(model):
    """The same weights in a fresh model of the same class, whose config no longer says 'GGUF-quantized'."""
    config = model.config
    config = type(config).from_dict({k: v for k, v in config.to_dict().items() if k != "quantization_config"})
    config.dtype = torch.float32
    with torch.device("meta"):
        plain = type(model)(config)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False, assign=True)
    if missing and not all(k in getattr(plain, "_tied_weights_keys", {}) for k in missing) or unexpected:
        raise InputError(f"the GGUF weights do not fit {type(model).__name__} (missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]}); this GGUF file's layout is not one transformers converts whole")
    plain.tie_weights()
    plain.generation_config = model.generation_config
    return plain.eval()


@torch.no_grad()
def check_reload(directory: Path, ids: torch.Tensor, expected: torch.Tensor) -> float:
    """The saved directory, loaded back from safetensors, gives the GGUF-loaded model's logits; -> max |diff|."""
    from specdraft.decoding.bundle.loading import load_causal_lm

    diff = float((load_causal_lm(directory, "float32", "cpu")(ids).logits - expected).abs().max())
    if diff > 0:
        raise InputError(f"the model converted into {directory} does not reproduce the GGUF model's logits (max "
                         f"|diff| {diff:.3g}); report this with the GGUF file's name")
    return diff


def convert_gguf(path: Path, out: Path, what: str, log: str) -> dict:
    """The GGUF file `path` (named `what` in messages) as a safetensors model directory `out`; -> what it is
    (architecture, sizes, tokenizer fingerprint, load time), for a stage's metrics. `log`: the stage's name."""
    architecture = check_gguf(path, what)
    print(f"[{log}] loading {path.name} ({path.stat().st_size / 1e6:.0f} MB, {architecture}) through "
          "transformers' GGUF reader")
    t0 = time.time()
    model, tok = load_gguf(path)
    load_s = time.time() - t0
    ids = torch.tensor([tok(PROBE)["input_ids"]])
    with torch.no_grad():
        expected = model(ids).logits
    plain = plain_copy(model)
    plain.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    parameters = sum(p.numel() for p in {id(p): p for p in plain.parameters()}.values())
    c = plain.config
    info = {"architecture": architecture, "model_class": type(plain).__name__, "parameters": parameters,
            "layers": c.num_hidden_layers, "hidden_size": c.hidden_size, "vocab_size": c.vocab_size,
            "tokenizer_sha256": tokenizer_fingerprint(tok), "chat_template": bool(tok.chat_template),
            "gguf_bytes": path.stat().st_size, "gguf_load_s": round(load_s, 1)}
    del model, plain  # the reload below is the only fp32 copy held
    gc.collect()
    info["reload_max_abs_diff"] = check_reload(out, ids, expected)
    print(f"[{log}] {info['model_class']}: {parameters / 1e6:.1f}M parameters, {c.num_hidden_layers} layers, "
          f"hidden {c.hidden_size}, vocabulary {c.vocab_size}; loaded in {load_s:.0f}s, written as safetensors "
          f"(the reload's logits equal the GGUF model's)")
    return info
