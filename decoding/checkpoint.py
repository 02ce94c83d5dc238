"""Small self-describing checkpoints (acceptance heads, routers): `<name>.safetensors` + a JSON config.

The config holds the module's architecture (what rebuilds it) plus free-form metadata the stages add
(metrics, hashes, transforms). Loading checks every file before use and fails with one InputError line
that names the file and the stage to rerun; weights are never unpickled. Pure PyTorch + safetensors:
the decoder imports this through decoding.policies.acceptance_head.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from specdraft.core.errors import InputError


@dataclass(frozen=True)
class CheckpointFormat:
    what: str  # "acceptance head", "router": how errors name the thing
    stage: str  # the stage that writes it, named in every error's fix
    weights_name: str
    config_name: str
    format: str  # the config's "format" value
    arch_keys: tuple[str, ...]  # config keys owned by the module; metadata may not set them

    def save(self, module: torch.nn.Module, arch: dict[str, Any], out_dir, meta: dict[str, Any] | None = None) -> Path:
        """Write the weights and {**arch, **meta} as the config (arch must include "format")."""
        meta = dict(meta or {})
        clash = sorted(set(meta) & set(self.arch_keys))
        if clash:
            raise InputError(f"{self.what} meta must not set architecture keys {clash}; "
                             f"they come from the {self.what} itself")
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
        save_file(tensors, str(out / self.weights_name), metadata={"format": self.format})
        (out / self.config_name).write_text(json.dumps({**arch, **meta}, indent=2, sort_keys=True) + "\n")
        return out

    def read_config(self, directory) -> dict[str, Any]:
        """The config dict, after checking both files exist and the config parses."""
        d = Path(directory)
        for p in (d / self.config_name, d / self.weights_name):
            if not p.is_file():
                raise InputError(f"{self.what} file {p} is missing; re-run the {self.stage} stage")
        try:
            config = json.loads((d / self.config_name).read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise self.corrupt_config(directory, e) from None
        if not isinstance(config, dict):
            raise self.corrupt_config(directory, TypeError("not a JSON object"))
        return config

    def corrupt_config(self, directory, e: Exception) -> InputError:
        return InputError(f"{self.what} config {Path(directory) / self.config_name} is corrupt "
                          f"({type(e).__name__}: {e}); re-run {self.stage}")

    def arch(self, directory, config: dict[str, Any], **kinds: str) -> list[Any]:
        """The architecture values of `config` named by `kinds` (key=int | bool | names), as written:
        int("3"), bool("false") or list("ab") would build a module its weights were never trained as."""
        ok = {"int": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
              "bool": lambda v: isinstance(v, bool),
              "names": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)}
        want = {"int": "an integer >= 0", "bool": "true or false", "names": "a list of names"}
        out = []
        for key, kind in kinds.items():
            if key not in config:
                raise self.corrupt_config(directory, KeyError(key))
            if not ok[kind](config[key]):
                raise self.corrupt_config(directory, TypeError(f"'{key}' is {str(config[key])[:30]!r}, not {want[kind]}"))
            out.append(config[key])
        return out

    def check_format(self, directory, config: dict[str, Any]) -> None:
        if config.get("format") != self.format:
            raise InputError(f"{Path(directory) / self.config_name} has format {config.get('format')!r}, expected "
                             f"{self.format!r}; re-run {self.stage}")

    def load_weights(self, module: torch.nn.Module, directory) -> None:
        """Load the weights into `module` (built from the config), strictly: every key, every shape."""
        w_path = Path(directory) / self.weights_name
        try:
            state = load_file(str(w_path))
        except (SafetensorError, OSError, ValueError) as e:
            raise InputError(f"{self.what} weights {w_path} are corrupt ({e}); re-run {self.stage}") from None
        expected = module.state_dict()
        missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        bad_shape = [k for k in expected if k in state and state[k].shape != expected[k].shape]
        if missing or unexpected or bad_shape:
            raise InputError(f"{self.what} weights {w_path} do not match its config (missing {missing}, unexpected "
                             f"{unexpected}, wrong shape {bad_shape}); re-run {self.stage}")
        module.load_state_dict(state, strict=True)
