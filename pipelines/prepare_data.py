"""Stage `prepare-data`: the prompt sets every later stage reads, plus the demo pretraining corpus.

Demo run (no `prompts.sources`): builds the built-in world `demo.world` offline: the demo world from the
interpreter's standard library (data/demo_world.py), the quality world's rule tasks (data/quality_world.py), the
instruct world's chat requests for a real instruction model (data/instruct_world.py; no corpus), or the coder
world's requests for a coder-instruct model (data/coder_world.py; no corpus). Real run:
converts the user's JSONL files / datasets directories (records with a `prompt`, OpenAI `messages` or ShareGPT
`conversations`; data/chat.py).

Writes prompts/
  sets/     DatasetDict: train, dev, test, perturbed, ood (columns: id, domain, prompt, messages, response,
            split; data/prompts.py)
  corpus/   Dataset of pretraining documents (the demo and quality worlds; columns domain, prompt, response)
"""
from __future__ import annotations

import json

from specdraft.data.prompts import WORLDS, demo_corpus, demo_prompt_sets, domains_of, user_prompt_sets
from specdraft.pipelines.stage import Context


def build(ctx: Context) -> dict:
    cfg = ctx.cfg
    if cfg.prompts.sources:
        sets = user_prompt_sets(cfg.prompts.sources)
        ctx.input_hashes.update({f"prompt_source:{s}": {"path": s, "content_hash": _source_hash(s)}
                                 for s in cfg.prompts.sources})
    else:
        d = cfg.demo
        print(f"[prepare-data] building the {d.world} world (seed {d.seed}): {', '.join(d.domains)}"
              f" + held out {', '.join(d.heldout_domains) or 'none'}")
        sets = demo_prompt_sets(d.seed, d.domains, d.heldout_domains, d.train_per_domain, d.dev_per_domain,
                                d.test_per_domain, d.world)
        if WORLDS[d.world].CORPUS:
            corpus = demo_corpus(d.seed, [*d.domains, *d.heldout_domains], d.corpus_per_domain, d.world)
            corpus.save_to_disk(str(ctx.out / "corpus"))
    # one shard per split: datasets writes an empty split (a world without held-out domains has no ood
    # prompts, a user's sources may have no test ones) as zero shards, which load_from_disk cannot read back
    sets.save_to_disk(str(ctx.out / "sets"), num_shards={split: 1 for split in sets})
    counts = {split: {dom: ds["domain"].count(dom) for dom in domains_of(ds)} for split, ds in sets.items()}
    print("[prepare-data] prompts per split and domain: " + json.dumps(counts))
    return {"prompts": counts, "domains": domains_of(sets["train"])}


def _source_hash(path: str) -> str:
    from pathlib import Path

    from specdraft.pipelines.artifacts import dir_hashes
    from specdraft.core.hashing import content_hash, file_sha256

    p = Path(path)
    return content_hash(dir_hashes(p)) if p.is_dir() else file_sha256(p)


if __name__ == "__main__":
    from specdraft.pipelines.cli import stage_main

    stage_main("prepare-data")
