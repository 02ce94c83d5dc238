"""Stage `pretrain-target` (demo only): a BPE tokenizer and a small LlamaForCausalLM target.

1. train a byte-level BPE tokenizer on the demo corpus; it carries the demo chat template (data/demo_tokenizer.py)
2. tokenize documents as the chat-formatted prompt + response + EOS (prompt and response encoded
   separately, the way generation sees them) and pack them into blocks of seq_len tokens
3. pretrain with the shared causal-LM LightningModule (plain next-token cross-entropy)
4. report per-domain dev perplexity beside a unigram model's (add-one smoothed train counts)
5. save_pretrained (safetensors) + tokenizer, so AutoModelForCausalLM / AutoTokenizer load the dir

A real run names `target.name_or_path` instead and this stage is skipped.
"""
from __future__ import annotations

import dataclasses
import math
from collections import Counter

import torch

from specdraft.data.chat import chat_format
from specdraft.data.prompts import load_prompt_sets
from specdraft.data.demo_tokenizer import encode_document, pack, train_bpe
from specdraft.drafters.data import CausalLMCollator, CausalLMDataModule
from specdraft.drafters.lit_lm import CausalLMModule
from specdraft.drafters.model import build_causal_lm, num_parameters
from specdraft.pipelines.artifacts import load_dataset_dir
from specdraft.pipelines.stage import Context, leave_unless_rank_zero
from specdraft.training.trainer import build_trainer, fit


@torch.no_grad()
def perplexity(model, docs: list[list[int]], batch_size: int = 16) -> float:
    """exp(mean next-token NLL) over all tokens after BOS of the given documents."""
    model.eval()
    nll, count = 0.0, 0
    for i in range(0, len(docs), batch_size):
        chunk = docs[i : i + batch_size]
        T = max(map(len, chunk))
        ids = torch.zeros(len(chunk), T, dtype=torch.long)
        mask = torch.zeros(len(chunk), T, dtype=torch.long)
        for r, d in enumerate(chunk):
            ids[r, : len(d)] = torch.tensor(d)
            mask[r, : len(d)] = 1
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        tgt, m = ids[:, 1:], mask[:, 1:].bool()
        lp = torch.log_softmax(logits, -1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        nll -= lp[m].sum().item()
        count += int(m.sum())
    return math.exp(nll / max(count, 1))


def unigram_perplexity(counts: Counter, vocab_size: int, docs: list[list[int]]) -> float:
    total = sum(counts.values()) + vocab_size
    nll = sum(-math.log((counts[t] + 1) / total) for d in docs for t in d[1:])
    return math.exp(nll / max(1, sum(len(d) - 1 for d in docs)))


def build(ctx: Context) -> dict:
    cfg, pt = ctx.cfg, ctx.cfg.pretrain_target
    prompts_dir = ctx.input("prepare-data")
    corpus = load_dataset_dir(prompts_dir / "corpus", "prepare-data")
    sets = load_prompt_sets(prompts_dir)

    print(f"[pretrain-target] training a {pt.tokenizer.vocab_size}-token BPE tokenizer on {len(corpus)} documents")
    tok = train_bpe((p + r for p, r in zip(corpus["prompt"], corpus["response"])),
                    pt.tokenizer.vocab_size, pt.tokenizer.min_frequency)
    # documents are formatted as distill-data and the decoder will format prompts (the demo chat template)
    chat = chat_format(cfg.prompts)
    docs = [encode_document(tok, p, r, chat) for p, r in zip(corpus["prompt"], corpus["response"])]
    perm = torch.randperm(len(docs), generator=torch.Generator().manual_seed(cfg.run.seed)).tolist()
    blocks = pack([docs[i] for i in perm], pt.seq_len)
    print(f"[pretrain-target] {sum(map(len, docs))} tokens in {len(blocks)} blocks of {pt.seq_len}")

    model = build_causal_lm(pt.model, vocab_size=len(tok), seed=cfg.run.seed, bos_token_id=tok.bos_token_id,
                            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    print(f"[pretrain-target] LlamaForCausalLM with {num_parameters(model) / 1e6:.2f}M parameters")
    module = CausalLMModule(model, loss="ce", lr=pt.lr, warmup_ratio=pt.warmup_ratio,
                            weight_decay=pt.weight_decay, seed=cfg.run.seed)
    data = CausalLMDataModule([{"input_ids": b} for b in blocks],
                              CausalLMCollator(pad_token_id=tok.pad_token_id, max_length=pt.seq_len),
                              batch_size=pt.train.batch_size, seed=cfg.run.seed)
    # Checkpoints live in the stage's work dir (keyed by the cache key), so a killed run resumes.
    train_cfg = dataclasses.replace(pt.train, resume=True, seed=cfg.run.seed)
    trainer = build_trainer(train_cfg, ctx.work / "train", parameters=num_parameters(model))
    fit(trainer, module, data, train_cfg)
    leave_unless_rank_zero(trainer)
    model = module.model.float().eval()

    counts = Counter(t for d in docs for t in d[1:])
    table = {}
    for split in ("dev", "ood"):
        ds = sets[split]
        for domain in sorted(set(ds["domain"])):
            rows = ds.filter(lambda r: r["domain"] == domain)
            dev_docs = [encode_document(tok, p, r, chat) for p, r in zip(rows["prompt"], rows["response"])]
            table[domain] = {"target_ppl": round(perplexity(model, dev_docs), 3),
                             "unigram_ppl": round(unigram_perplexity(counts, len(tok), dev_docs), 3),
                             "docs": len(dev_docs)}
    print("[pretrain-target] dev perplexity (target vs unigram):")
    for domain, row in table.items():
        print(f"  {domain:<10} target {row['target_ppl']:8.2f}   unigram {row['unigram_ppl']:8.2f}")

    model.save_pretrained(ctx.out, safe_serialization=True)
    tok.save_pretrained(ctx.out)
    return {"dev_perplexity": table, "parameters": num_parameters(model), "train_tokens_seen":
            trainer.global_step * pt.train.batch_size * pt.seq_len, "steps": trainer.global_step,
            "vocab_size": len(tok), "corpus_tokens": sum(map(len, docs))}


if __name__ == "__main__":
    from specdraft.pipelines.cli import stage_main

    stage_main("pretrain-target")
