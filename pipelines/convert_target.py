"""Stage `convert-target`: a target shipped as GGUF (`target.gguf`: one file, or a file split over package files),
written once as a Hugging Face model directory (pipelines/gguf_convert.py says how).

  1. find the bytes (pipelines/gguf_file.py): the file, or the parts streamed into the work dir, hashed while
     written; a sha256 the config gives is checked before anything parses them
  2. convert (pipelines/gguf_convert.py): load through transformers' GGUF reader, save as safetensors, reload and
     compare logits

Writes target/   config.json, generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
                 chat_template.jinja (each hashed in manifest.json; the GGUF's sha256 is an input)
"""
from __future__ import annotations

import json

from specdraft.pipelines.config import to_dict
from specdraft.pipelines.gguf_convert import convert_gguf
from specdraft.pipelines.gguf_file import describe, gguf_path
from specdraft.pipelines.stage import Context

KEY = "target.gguf"


def build(ctx: Context) -> dict:
    source = ctx.cfg.target.gguf
    path, sha256 = gguf_path(source, KEY, ctx.work / "gguf")
    # a manifest input holds strings: the config's source as one JSON line
    ctx.input_hashes["gguf"] = {"source": json.dumps(to_dict(source), sort_keys=True), "path": str(path),
                                "content_hash": sha256}
    return convert_gguf(path, ctx.out, describe(source, KEY), "convert-target")


if __name__ == "__main__":
    from specdraft.pipelines.cli import stage_main

    stage_main("convert-target")
