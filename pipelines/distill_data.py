"""Stage `distill-data`: the target answers every train/dev prompt at each configured temperature.

MetaSD App. F.2: drafters are finetuned on the target's own responses at temperatures {0, 0.3, 0.7, 1}.
Prompts are formatted as the target is served (its chat template, prompts.* keys; decoding/bundle/chat.py); a
conversation's earlier turns are context, and the target answers its last user turn.

Work is cut into chunks of (prompt, temperature) jobs with a fixed order; chunk i belongs to shard
i mod N, so N processes (Slurm array tasks, torchrun ranks, SPECDRAFT_SHARD=i/N, or the
`distill_data.processes` this one starts on its own machine, which then merges) split the work without
talking to each other. A finished chunk is one JSON file written atomically into the stage's
work dir; "done" is the set of chunk files present, so a killed run redoes only its unfinished chunk
and nothing is duplicated. Each batch is seeded from (run seed, chunk, batch), so a redone chunk is
identical. The shard that finds every chunk done merges them into the output dataset (one
claims the merge when several finish together).

Backends (distill_data.backend): `hf` runs transformers `generate` here, one seed per batch; `decoder` runs
the project's batched decoder here (decoding/generate.py `decode_batch`: static KV cache, ragged rows, one
StepCompiler for the stage under distill_data.compile), one seed per batch, the target alone or, with
distill_data.drafter, speculatively (lossless: the target's own answers, in fewer target forwards); `vllm`
starts a vLLM OpenAI-compatible server on the target from vLLM's own venv (make vllm) for the shard's
chunks and stops it; `openai` sends the requests to a server already running at distill_data.engine_url. The
engine backends get the same token-id prompts (chat template applied once, here), the same stop tokens
and one seed per request (run seed, chunk, prompt id), keep the response token ids as they come, and
write the same chunk files: a server that does not answer or dies stops the stage with one line, the
finished chunks stay, and a rerun resumes (data/engines.py).

Writes distill_data/
  data/   DatasetDict {train, dev}: id, prompt_id, domain, temperature, prompt_ids, response_ids
          (EOS included when the target stopped), finish_reason (eos | length), prompt_truncated
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import datasets
from tqdm.auto import tqdm

from specdraft.data.chat import chat_format, row_messages
from specdraft.data.engines import CompletionsClient, VllmServer, engine_python
from specdraft.data.generation import decode_responses, generate_responses
from specdraft.data.prompts import fit_prompt, load_prompt_sets
from specdraft.decoding.bundle.chat import ChatFormat, end_of_turn_ids, format_prompt
from specdraft.core.devices import resolve_device
from specdraft.core.errors import InputError
from specdraft.core.hashing import derive_seed
from specdraft.decoding.bundle.loading import load_causal_lm, load_tokenizer, resolve_dtype
from specdraft.decoding.compat import context_length
from specdraft.decoding.compilation import StepCompiler
from specdraft.decoding.defaults import DEFAULTS
from specdraft.decoding.generate import Plan, head_spec, load_drafter_dir
from specdraft.decoding.policies.spec import PolicySpec, build_policy
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.timing import timed_call
from specdraft.pipelines.shards import (Share, claim_merge, is_helper, processes_started_here, read_piece, this_share,
                                        threads_per_process, write_json_atomic)
from specdraft.pipelines.stage import Context, StageIncomplete


def plan_chunks(sets: datasets.DatasetDict, splits, temperatures, chunk_size: int) -> list[dict]:
    """Fixed, ordered chunks of jobs; one temperature and one split per chunk (one generate call
    setting per batch)."""
    chunks = []
    for split in splits:
        rows = sorted(sets[split], key=lambda r: r["id"])
        for t in temperatures:
            for start in range(0, len(rows), chunk_size):
                part = rows[start:start + chunk_size]
                name = f"{split}-t{t:g}-{start // chunk_size:05d}"
                chunks.append({"name": name, "split": split, "temperature": t, "rows": part})
    return chunks


CHUNK_ROW_KEYS = ("id", "prompt_id", "domain", "temperature", "prompt_ids", "response_ids", "finish_reason",
                  "prompt_truncated")


def check_chunk(rows) -> None:
    """A chunk file as run_chunk writes it: a list of rows with their keys, token ids as integer lists
    (the merged dataset's columns would otherwise take whatever a damaged file holds)."""
    if not isinstance(rows, list):
        raise TypeError("a chunk is a list of rows")
    for r in rows:
        if not isinstance(r, dict):
            raise TypeError("each row of a chunk is an object")
        missing = [k for k in CHUNK_ROW_KEYS if k not in r]
        if missing:
            raise KeyError(missing[0])
        for k in ("prompt_ids", "response_ids"):
            if not isinstance(r[k], list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in r[k]):
                raise TypeError(f"{k} must be a list of token ids")


def run_chunk(chunk: dict, generate, tok, dcfg, seed: int, chat: ChatFormat = ChatFormat()) -> list[dict]:
    """`generate(prompts, temperature, batch_seed, request_seeds)` -> [(response ids, finish)] (a backend)."""
    rows, out = chunk["rows"], []
    for b in range(0, len(rows), dcfg.batch_size):
        batch = rows[b:b + dcfg.batch_size]
        fitted = [fit_prompt(format_prompt(tok, row_messages(r), chat), dcfg.max_prompt_tokens, dcfg.long_prompts,
                             r["id"]) for r in batch]
        gens = generate([p for p, _ in fitted], chunk["temperature"], derive_seed(seed, chunk["name"], b),
                        [derive_seed(seed, chunk["name"], r["id"]) for r in batch])
        for r, (p, dropped), (resp, finish) in zip(batch, fitted, gens):
            out.append({"id": f"{r['id']}@t{chunk['temperature']:g}", "prompt_id": r["id"], "domain": r["domain"],
                        "temperature": float(chunk["temperature"]), "prompt_ids": p, "response_ids": resp,
                        "finish_reason": finish, "prompt_truncated": dropped})
    return out


def hf_backend(model, tok, dcfg):
    """transformers `generate` on left-padded batches, one seed per batch."""
    stops = end_of_turn_ids(tok, model)

    def generate(prompts, temperature, batch_seed, request_seeds):
        return generate_responses(model, prompts, tok.pad_token_id, stops, temperature, dcfg.top_k, dcfg.top_p,
                              dcfg.max_new_tokens, batch_seed)
    return generate


def decoder_backend(model, tok, dcfg, plan: Plan, compiler: StepCompiler, counts: dict | None = None):
    """The project's batched decoder under `plan`, one seed per batch; `compiler` is kept for the whole stage
    (graphs compile once). counts: summed answered tokens and per-row target forwards, when given (a drafter's
    MAT)."""
    stops = end_of_turn_ids(tok, model)

    def generate(prompts, temperature, batch_seed, request_seeds):
        check_fits(prompts, dcfg, context_length(model))
        sampling, rows = SamplingConfig(temperature, dcfg.top_k, dcfg.top_p), []
        out = decode_responses(model, prompts, stops, sampling, dcfg.max_new_tokens, batch_seed, plan, compiler, rows)
        if counts is not None:
            counts["tokens"] = counts.get("tokens", 0) + sum(m.n_generated for m in rows)
            counts["target_forwards"] = counts.get("target_forwards", 0) + sum(m.n_target for m in rows)
        return out
    return generate


def check_fits(prompts: list[list[int]], dcfg, context: int | None) -> None:
    """The decoder's cache holds a prompt and its whole answer within the target's context (transformers would
    run past it); refused in the stage's keys, before the batch (the chunks done before stay)."""
    longest = max(map(len, prompts))
    if context is not None and longest + dcfg.max_new_tokens > context:
        raise InputError(f"a prompt of {longest} tokens + distill_data.max_new_tokens ({dcfg.max_new_tokens}) exceeds "
                         f"the target's context ({context}); lower distill_data.max_prompt_tokens to at most "
                         f"{context - dcfg.max_new_tokens} (longer prompts are truncated) or max_new_tokens")


def drafting_plan(dcfg, target_dir: str, tok, model, dtype: str, device: str, draft_weights: str) -> Plan:
    """The decoder backend's Plan: the target alone, or distill_data.drafter (checked against the target's
    tokenizer and vocabulary) drafting fixed K (distill_data.k, else the decoder's default) or SpecDec++ rounds
    under distill_data.head at the head's own threshold; the drafter's weights as decoding.draft_weights says."""
    if dcfg.drafter is None:
        return Plan("target")
    drafter, head, head_config = load_drafter_dir(dcfg.drafter, target_dir, tok, model, dcfg.head, dtype, device,
                                                  draft_weights)
    spec = head_spec(None, head_config, DEFAULTS.k_max) if head is not None else \
        PolicySpec("fixed", k=dcfg.k if dcfg.k is not None else DEFAULTS.k)
    return Plan(dcfg.drafter, drafter, lambda: build_policy(spec, head=head), head=dcfg.head)


def engine_backend(client: CompletionsClient, stops: list[int], dcfg):
    """An OpenAI-compatible server, one request (and seed) per prompt."""
    def generate(prompts, temperature, batch_seed, request_seeds):
        return client.generate(prompts, stops, temperature, dcfg.top_k, dcfg.top_p, dcfg.max_new_tokens,
                               request_seeds)
    return generate


def engine_stops(tok, target: str) -> list[int]:
    """end_of_turn_ids without loading the weights: the tokenizer's EOS and the generation config's ids."""
    from transformers import GenerationConfig

    try:
        gen = GenerationConfig.from_pretrained(target)
    except OSError:  # no generation_config.json: the tokenizer's EOS alone
        gen = None
    return end_of_turn_ids(tok, SimpleNamespace(generation_config=gen))


@contextmanager
def open_backend(cfg, target: str, work: Path, tok):
    """The configured backend's generate function for the target model directory `target`, for the duration of
    the block (the vllm backend's server lives exactly that long and logs into `work`)."""
    dcfg = cfg.distill_data
    if dcfg.backend in ("decoder", "vllm") and cfg.target.quantization != "none":  # bitsandbytes loading is hf's
        raise InputError(f"distill_data.backend {dcfg.backend} runs the target unquantized, not "
                         f"{cfg.target.quantization}; set target.quantization: none or use backend hf")
    if dcfg.backend in ("hf", "decoder"):
        device = resolve_device(dcfg.device)
        model = load_causal_lm(target, cfg.target.dtype, device, cfg.target.device_map, cfg.target.quantization,
                               cfg.target.trust_remote_code)
        if dcfg.backend == "hf":
            yield hf_backend(model, tok, dcfg)
            return
        plan, counts = drafting_plan(dcfg, target, tok, model, cfg.target.dtype, device, cfg.decoding.draft_weights), {}
        yield decoder_backend(model, tok, dcfg, plan, StepCompiler(dcfg.compile), counts)
        if plan.drafter is not None and counts.get("target_forwards"):
            print(f"[distill-data] drafter {dcfg.drafter}: MAT {counts['tokens'] / counts['target_forwards']:.2f} "
                  f"over {counts['tokens']} answered tokens (tokens per target forward of a row)")
        return
    stops = engine_stops(tok, target)
    if dcfg.backend == "openai":
        client = CompletionsClient(dcfg.engine_url, dcfg.engine_model, dcfg.engine_timeout_s, dcfg.batch_size)
        client.check_model()
        yield engine_backend(client, stops, dcfg)
        return
    dtype = str(resolve_dtype(cfg.target.dtype, resolve_device(dcfg.device))).removeprefix("torch.")  # as hf would
    extra = ("--trust-remote-code",) if cfg.target.trust_remote_code else ()
    server = VllmServer(engine_python(dcfg.engine_python), target, "target", work / "vllm-server.log", dtype,
                        cfg.run.seed, dcfg.engine_timeout_s, extra)
    with server as url:
        yield engine_backend(CompletionsClient(url, "target", dcfg.engine_timeout_s, dcfg.batch_size), stops, dcfg)


def answer_rate(generate, prompts: list[list[int]], batch_size: int, temperature: float, seed: int) -> dict:
    """A backend's speed as the stage uses it (the measure a benchmark sets backends side by side with):
    `generate` (open_backend's) answers `prompts` in batches of `batch_size`, batch b seeded with seed + b (an
    engine's request i with seed + i) -> {answers, answered_tokens, wall_s, cpu_s, tokens_per_s (per wall
    second)}."""
    def answer_all():
        return [resp for b in range(0, len(prompts), batch_size)
                for resp, _ in generate(prompts[b:b + batch_size], temperature, seed + b,
                                        list(range(seed + b, seed + min(len(prompts), b + batch_size))))]
    answers, timing = timed_call(answer_all)
    tokens = sum(map(len, answers))
    return {"answers": answers, "answered_tokens": tokens, "wall_s": timing.wall, "cpu_s": timing.cpu,
            "tokens_per_s": tokens / timing.wall if timing.wall > 0 else 0.0}


def generate_chunks(ctx: Context, todo: list[dict], chunk_dir: Path, place: Share, done_before: int) -> None:
    """This process's chunks, each written atomically when done (a killed run redoes only unfinished ones)."""
    cfg, dcfg = ctx.cfg, ctx.cfg.distill_data
    tok = load_tokenizer(ctx.target_path(), cfg.target.trust_remote_code)
    i, n = place.shard, place.count
    print(f"[distill-data] shard {i}/{n}: {len(todo)} chunks to generate ({dcfg.backend} backend)"
          + (f" ({done_before} already done)" if done_before and n == 1 else ""))
    with open_backend(cfg, ctx.target_path(), ctx.work, tok) as generate, threads_per_process(place.side_by_side):
        for chunk in tqdm(todo, desc=f"distill-data shard {i}", unit="chunk"):
            rows = run_chunk(chunk, generate, tok, dcfg, cfg.run.seed, chat_format(cfg.prompts))
            write_json_atomic(chunk_dir / f"{chunk['name']}.json", rows)


def build(ctx: Context) -> dict:
    dcfg = ctx.cfg.distill_data
    sets = load_prompt_sets(ctx.input("prepare-data"))
    for split in dcfg.splits:
        if len(sets[split]) == 0:
            raise InputError(f"prompt split '{split}' is empty; add prompts for it or drop it from distill_data.splits")
    chunks = plan_chunks(sets, dcfg.splits, dcfg.temperatures, dcfg.chunk_size)
    chunk_dir = ctx.work / "chunks"
    chunk_dir.mkdir(parents=True, exist_ok=True)
    place = this_share(dcfg.processes)
    shard, n_shards, started_here = place.shard, place.count, place.started_here
    todo = [c for i, c in enumerate(chunks) if i % n_shards == shard and not (chunk_dir / f"{c['name']}.json").exists()]

    with processes_started_here(ctx, "distill-data", place):
        if todo:
            generate_chunks(ctx, todo, chunk_dir, place, done_before=len(chunks) - len(todo))
    if not started_here and is_helper():
        raise StageIncomplete(f"shard {shard}/{n_shards} is done; the process that started it merges")

    missing = [c["name"] for c in chunks if not (chunk_dir / f"{c['name']}.json").exists()]
    if missing:
        raise StageIncomplete(f"shard {shard}/{n_shards} is done; {len(missing)} chunks remain for other shards "
                              "(the shard that finishes last, or a rerun, writes the dataset)")
    if n_shards > 1 and not started_here and not claim_merge(ctx.work, shard):
        # shards finishing together all see every chunk done; one merges (its commit then removes the
        # work dir, which the others must not be reading from)
        raise StageIncomplete(f"shard {shard}/{n_shards} is done; another shard merges the dataset")

    by_split: dict[str, list[dict]] = {s: [] for s in dcfg.splits}
    for c in chunks:
        by_split[c["split"]] += read_piece(chunk_dir / f"{c['name']}.json", "distill-data chunk", check_chunk)
    ds = datasets.DatasetDict({s: datasets.Dataset.from_list(sorted(rows, key=lambda r: r["id"]))
                               for s, rows in by_split.items()})
    ds.save_to_disk(str(ctx.out / "data"))

    stats = {}
    for split, d in ds.items():
        lengths = [len(x) for x in d["response_ids"]]
        stats[split] = {"examples": len(d), "response_tokens": sum(lengths),
                        "eos_fraction": round(sum(f == "eos" for f in d["finish_reason"]) / max(1, len(d)), 4),
                        "prompts_truncated": sum(1 for x in d["prompt_truncated"] if x > 0)}
    print(f"[distill-data] {json.dumps(stats)}")
    return {"splits": stats, "chunks": len(chunks)}


if __name__ == "__main__":
    from specdraft.pipelines.cli import stage_main

    stage_main("distill-data")
