"""Loading models and tokenizers for generation: dtype, device placement and bitsandbytes quantization.

The target may be spread over several GPUs (`device_map="auto"` or an explicit map, through
accelerate); drafters and heads sit on one named device. Weights load from safetensors only
(`use_safetensors=True`: nothing is unpickled) and `trust_remote_code` stays off unless asked for.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from specdraft.core.errors import InputError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device: str | None = None) -> torch.dtype:
    """"auto" is bf16 on a CUDA device that supports it, fp32 otherwise (CPU half precision is slow)."""
    if dtype == "auto":
        cuda = torch.cuda.is_available() and (device is None or str(device).startswith("cuda"))
        return torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float32
    if dtype not in DTYPES:
        raise InputError(f"dtype {dtype!r} is not one of auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def quantization_config(quantization: str, compute_dtype: torch.dtype):
    if quantization == "none":
        return None
    from transformers import BitsAndBytesConfig

    if quantization == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    if quantization == "nf4":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype)
    raise InputError(f"quantization {quantization!r} is not one of none, int8, nf4")


def _check_local_or_hub(name_or_path: str) -> bool:
    """True for a local model directory (checked: config.json and safetensors weights), False for a hub id."""
    p = Path(name_or_path)
    looks_local = p.is_absolute() or name_or_path.startswith((".", "~")) or p.exists()
    if not looks_local:
        return False
    if not (p / "config.json").is_file():
        raise InputError(f"'{name_or_path}' is not a model directory (no config.json); point to a save_pretrained dir")
    if not any(p.glob("*.safetensors")):
        raise InputError(f"'{name_or_path}' has no .safetensors weights; convert the checkpoint with "
                         "save_pretrained(safe_serialization=True)")
    return True


def load_causal_lm(
    name_or_path: str | Path,
    dtype: str = "auto",
    device: str | None = None,
    device_map: str | dict | None = None,
    quantization: str = "none",
    trust_remote_code: bool = False,
    max_memory: dict | None = None,
    revision: str | None = None,
) -> Any:
    """An eval-mode causal LM. `device_map` (multi-GPU) wins over `device`; quantized models are placed
    by bitsandbytes/accelerate (device_map defaults to the named device, else CPU). `max_memory`
    ({0: bytes or "10GiB", "cpu": ...}) caps what device_map="auto" puts on each device."""
    from transformers import AutoModelForCausalLM

    name_or_path = str(name_or_path)
    local = _check_local_or_hub(name_or_path)
    torch_dtype = resolve_dtype(dtype, device)
    kwargs: dict[str, Any] = dict(dtype=torch_dtype, trust_remote_code=trust_remote_code, use_safetensors=True,
                                  local_files_only=local)
    if revision is not None:  # a hub id's pinned commit
        kwargs["revision"] = revision
    qcfg = quantization_config(quantization, torch_dtype)
    if qcfg is not None:
        kwargs["quantization_config"] = qcfg
        kwargs["device_map"] = device_map or {"": device or "cpu"}
    elif device_map is not None:
        kwargs["device_map"] = device_map
    if max_memory is not None and "device_map" in kwargs:
        kwargs["max_memory"] = max_memory
    try:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, **kwargs)
    except OSError as e:
        raise InputError(f"cannot load a causal LM from '{name_or_path}' ({str(e).splitlines()[0][:160]}); "
                         "check the path and that it holds safetensors weights") from None
    if qcfg is None and device_map is None and device is not None:
        model = model.to(device)
    return model.eval()


# tokenizer_config.json classes meaning "the tokenizer.json as saved": loaded as such, whatever the model
# type. AutoTokenizer would pick the model family's class (e.g. Qwen2Tokenizer beside a Qwen2 config),
# which adds that family's default special tokens: a target and a drafter of different families would
# then disagree on a tokenizer they share.
def load_tokenizer(name_or_path: str | Path, trust_remote_code: bool = False, revision: str | None = None):
    from specdraft.core.tokenizers import tokenizer_class_for

    loader = tokenizer_class_for(name_or_path)
    try:
        tok = loader.from_pretrained(str(name_or_path), trust_remote_code=trust_remote_code,
                                            **({"revision": revision} if revision is not None else {}))
    except (OSError, ValueError) as e:
        raise InputError(f"cannot load a tokenizer from '{name_or_path}' ({str(e).splitlines()[0][:160]})") from None
    if tok.pad_token_id is None:  # batched generation needs one; EOS is the usual stand-in
        tok.pad_token = tok.eos_token
    return tok
