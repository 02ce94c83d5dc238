"""Stage `convert-target`: a target shipped as one GGUF file, written once as a Hugging Face model directory.

transformers reads GGUF itself (`from_pretrained(dir, gguf_file=...)`): it dequantizes every tensor to fp32 and
builds the tokenizer and its chat template from the file's metadata, which takes half a minute for a 135M model.
Every later stage, the decoder and vLLM would pay that on each load; here it is paid once:

  1. check the file whole (pipelines/gguf_file.py): a truncated or foreign file stops before anything is written
  2. load model and tokenizer through transformers' GGUF loader
  3. rebuild the model from its config without the GGUF quantization marker (transformers refuses to
     save_pretrained a model it loaded from GGUF) and load the dequantized weights into it, all keys matched
  4. save_pretrained as safetensors, with the tokenizer, its chat template and the generation config
  5. check the directory: reloaded from safetensors, its logits on a probe equal the GGUF-loaded model's

Writes target/   config.json, generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
                 chat_template.jinja (each hashed in manifest.json; the GGUF file's hash is an input)
"""
from __future__ import annotations

import time

import torch

from specdraft.core.errors import InputError
from specdraft.core.tokenizers import tokenizer_fingerprint
from specdraft.pipelines.gguf_file import check_gguf, resolve_gguf
from specdraft.pipelines.stage import Context, gguf_pin

PROBE = "The capital of France is"  # the reload check's input: any text the tokenizer encodes


def load_gguf(path):
    """(model, tokenizer) as transformers' GGUF loader builds them (fp32, eval mode)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                     local_files_only=True)
    except (ValueError, KeyError, NotImplementedError) as e:  # an architecture or tensor type transformers lacks
        raise InputError(f"transformers cannot load '{path.name}' ({type(e).__name__}: {str(e).splitlines()[0][:120]}); "
                         "give a GGUF of an architecture transformers reads (llama, qwen2, mistral, ...)") from None
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
def check_reload(directory, model, tok) -> float:
    """The saved directory, loaded back from safetensors, gives the GGUF-loaded model's logits; -> max |diff|."""
    from specdraft.decoding.bundle.loading import load_causal_lm

    ids = torch.tensor([tok(PROBE)["input_ids"]])
    again = load_causal_lm(directory, "float32", "cpu")
    diff = float((again(ids).logits - model(ids).logits).abs().max())
    if diff > 0:
        raise InputError(f"the converted target in {directory} does not reproduce the GGUF model's logits (max |diff| "
                         f"{diff:.3g}); report this with the GGUF file's name")
    return diff


def build(ctx: Context) -> dict:
    spec = ctx.cfg.target.gguf_file
    path = resolve_gguf(spec)
    architecture = check_gguf(path, spec)
    ctx.input_hashes["gguf"] = {"path": str(path), **gguf_pin(ctx.cfg)}
    print(f"[convert-target] loading {path.name} ({path.stat().st_size / 1e6:.0f} MB, {architecture}) through "
          "transformers' GGUF reader")
    t0 = time.time()
    model, tok = load_gguf(path)
    load_s = time.time() - t0
    plain = plain_copy(model)
    plain.save_pretrained(ctx.out, safe_serialization=True)
    tok.save_pretrained(ctx.out)
    diff = check_reload(ctx.out, model, tok)
    parameters = sum(p.numel() for p in {id(p): p for p in plain.parameters()}.values())
    c = plain.config
    print(f"[convert-target] {type(plain).__name__}: {parameters / 1e6:.1f}M parameters, {c.num_hidden_layers} layers, "
          f"hidden {c.hidden_size}, vocabulary {c.vocab_size}; loaded in {load_s:.0f}s, written as safetensors "
          f"(the reload's logits equal the GGUF model's)")
    return {"architecture": architecture, "model_class": type(plain).__name__, "parameters": parameters,
            "layers": c.num_hidden_layers, "hidden_size": c.hidden_size, "vocab_size": c.vocab_size,
            "tokenizer_sha256": tokenizer_fingerprint(tok), "chat_template": bool(tok.chat_template),
            "gguf_bytes": path.stat().st_size, "gguf_load_s": round(load_s, 1), "reload_max_abs_diff": diff}


if __name__ == "__main__":
    from specdraft.pipelines.cli import stage_main

    stage_main("convert-target")
