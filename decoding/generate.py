"""`specdraft generate`: prompts through the decoder, from a bundle or from model directories.

  specdraft generate runs/demo/bundle --prompt "Question: ..."
  specdraft generate runs/demo/bundle --prompts prompts.jsonl --batch-size 8 --output out.jsonl
  specdraft generate --target DIR --drafter DIR [--head DIR] --prompt "..." [--k 4 | --threshold 0.7]

Which drafter: `--drafter NAME`, else the bundle's own choice per prompt: its router (the trained
classifier unless `--router` names another; `--router none` skips it), else its all-domain drafter.
With a SpecDec++ head for that drafter (labelled under the decoding transform when the bundle has one,
else its default head) the round length follows SpecDec++ at the bundle's threshold (its
decoding.threshold, else the head's chosen h); `--k` forces fixed-K drafting; without a head a drafter
drafts its best fixed K from the bundle. `--method ar` decodes with the target alone. `--drafts K`
(K > 1) decodes with SpecTr; `--cascade RULE --alpha A` runs a speculative cascade (decoding/cascades.py;
block size --cascade-block, 5 by default; needs temperature > 0; --k, a drafter's fixed K, is refused with
one); a bundle whose defaults name a cascade runs it when sampling unless `--cascade none`. Every option
left out takes the bundle's default (decoding/defaults.py).

A prompt is one user turn (or a record's messages), formatted as the bundle was trained (decoding/bundle/chat.py:
the target's chat template unless the run chose otherwise); `--raw-prompt` feeds the text as is and
`--system-prompt TEXT` adds a system turn. One prompt prints its text and a line of metrics; with
`--prompts` (or `--output`) every prompt becomes one JSON line: text, token ids, MAT and counts.

Every prompt goes through `decode_batch`, one (drafter, policy) pair and a batch of prompt id lists at a
time. The function API: `load_pair` + `generate_text` for one prompt.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from specdraft.core.errors import InputError
from specdraft.core.jsonl import jsonl_objects
from specdraft.core.tokenizers import check_same_vocabulary
from specdraft.decoding.batched import generate_batch
from specdraft.decoding.compilation import StepCompiler
from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.decoding.bundle.chat import ChatFormat, end_of_turn_ids, format_prompt, user_turn
from specdraft.decoding.compat import check_head, check_pair
from specdraft.decoding.defaults import DEFAULTS, DecodingDefaults
from specdraft.decoding.cascades import DEFAULT_BLOCK as CASCADE_BLOCK
from specdraft.decoding.speculators.eagle_model import EagleDrafter, is_eagle  # loaded with the batched decoder anyway
from specdraft.decoding.generate_args import bundle_of
from specdraft.decoding.bundle.loading import load_causal_lm, load_tokenizer
from specdraft.decoding.metrics import GenerationResult
from specdraft.decoding.speculators.spectr import check_drafts, drafter_speculator
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.rounds.shapes import decode_cache_length
from specdraft.decoding.rounds.static_cache import full_attention_over
from specdraft.decoding.speculative import generate_speculative
from specdraft.decoding.policies.stopping import FixedK, LockstepSpecDecPP, SpecDecPP

METRIC_KEYS = ("N", "N_target", "N_draft", "N_discarded", "rounds", "MAT", "discard_rate", "verification_rate",
               "tokens_per_s")


@dataclass(frozen=True)
class Services:
    """What the decoder layer may not import itself (it sits below `data` and `heads`), handed in by the
    CLI (pipelines/cli.py): reading a prompt record in every format the stages read, and loading a router."""

    # (record, "file:line") -> (messages ending with the user turn, reference); data.chat.record_messages
    messages_of: Callable[[dict, str], tuple[list[dict], str]] | None = None
    # (router dir, target input embeddings, tokenizer fingerprint) -> router; routers.router.load_router
    load_router: Callable[..., Any] | None = None


@dataclass
class Plan:
    """One way to decode: a drafter (None: the target alone) and how it drafts."""

    name: str  # the drafter's name (bundle) or directory; "target" for autoregressive decoding
    drafter: torch.nn.Module | None = None
    policy: Callable[[], Any] | None = None  # a fresh stopping policy (FixedK / SpecDecPP)
    head: str | None = None  # the SpecDec++ head's name, if one drafts
    drafts: int = 1
    cascade: Any = None  # a decoding.cascades.CascadeMethod
    cascade_block: int = CASCADE_BLOCK  # a speculative cascade's drafts per round (gamma)
    tree: Any = None  # an EAGLE drafter's decoding.speculators.eagle.TreeShape


# ---- decoding ----------------------------------------------------------------------------------------


def decode_batch(target, prompts: list[list[int]], max_new_tokens: int, plan: Plan, sampling: SamplingConfig,
                 eos_token_id, seed: int, compile: str | StepCompiler = "none") -> list[GenerationResult]:
    """Decode a batch of prompts (token id lists) with one plan: the one place batches meet the decoder.

    Plans the batched decoder serves (the target alone, or one drafter drafting a chain under a stopping
    policy: fixed K, SpecDec++, an EAGLE-1 chain) decode together in `decoding.batched.generate_batch`,
    sampling from one device generator seeded with `seed`. The rest (SpecTr drafts, cascades, EAGLE
    trees) decode one prompt after another with the single-sequence decoder, prompt i with seed + i;
    they cannot be compiled. compile: a mode, or the `StepCompiler` a caller keeps over many batches."""
    compiler = compile if isinstance(compile, StepCompiler) else StepCompiler(compile)
    if batched_plan(plan) and full_attention_decode(target, plan, prompts, max_new_tokens, compiler.mode):
        policy = plan.policy() if plan.drafter is not None else None
        if type(policy) is SpecDecPP and len(prompts) > 1:
            # the batch stops drafting together (the same decisions at batch 1): per-row stops save no verify
            # work in a lockstep batch (RESULTS.md bench_batch_decoder, demo pair, h = 0.7: lockstep 1.17 / 1.00 /
            # 0.90 / 0.88 of batched AR at B = 4 / 8 / 16 / 32 against 1.07 / 0.87 / 0.78 / 0.72 per row)
            policy = LockstepSpecDecPP(policy.head, policy.threshold, policy.max_tokens)
        return generate_batch(target, prompts, max_new_tokens, drafter=plan.drafter, policy=policy, sampling=sampling,
                              eos_token_id=eos_token_id, seed=seed, compile=compiler)
    if not compiler.eager:
        raise InputError(f"--compile {compiler.mode} applies to the batched decoder (the target alone, fixed K, SpecDec++, "
                         "EAGLE-1 chains, models attending over the whole decode); SpecTr drafts, cascades, EAGLE trees "
                         "and sliding-window models decode uncompiled: use --compile none")
    return [decode_one(target, ids, max_new_tokens, plan, sampling, eos_token_id,
                       torch.Generator().manual_seed(seed + i)) for i, ids in enumerate(prompts)]


def full_attention_decode(target, plan: Plan, prompts: list[list[int]], max_new_tokens: int, mode: str) -> bool:
    """Whether the target and a causal-LM drafter attend over every position of the batched decoder's static cache
    for these prompts (`full_attention_over`): a model with sliding-window layers, or a window shorter than the
    decode, goes to the one-prompt decoder, whose cache keeps its window (Mistral-style models)."""
    k_max = plan.policy().max_tokens if plan.drafter is not None else 0
    slots = decode_cache_length(max(len(p) for p in prompts), max_new_tokens, k_max, mode)
    models = [target] + ([plan.drafter] if plan.drafter is not None and not isinstance(plan.drafter, EagleDrafter) else [])
    return all(full_attention_over(m.config, slots) for m in models)


def batched_plan(plan: Plan) -> bool:
    """Whether `decoding.batched` decodes this plan: no drafter, or one chain drafter (a causal LM, or
    an EAGLE-1 drafter drafting a chain) with no SpecTr drafts and no cascade."""
    if plan.drafter is None:
        return True
    if plan.drafts != 1 or plan.cascade is not None:
        return False
    if isinstance(plan.drafter, EagleDrafter):
        return plan.tree is None and plan.drafter.variant == "eagle1"
    return True


def decode_one(target, ids: list[int], max_new_tokens: int, plan: Plan, sampling: SamplingConfig, eos_token_id,
               generator: torch.Generator) -> GenerationResult:
    from specdraft.decoding.speculators.eagle import EagleSpeculator

    if plan.drafter is None:
        return generate_autoregressive(target, ids, max_new_tokens, sampling, eos_token_id, generator)
    if plan.cascade is not None:
        return plan.cascade.generate(target, plan.drafter, ids, max_new_tokens, sampling, plan.cascade_block,
                                     eos_token_id, generator)
    if isinstance(plan.drafter, EagleDrafter):
        if plan.drafts != 1:
            raise InputError("an EAGLE drafter drafts one chain or its own tree; leave out --drafts / --cascade")
        speculator = EagleSpeculator(plan.drafter, plan.policy(), plan.tree)
    else:
        speculator = drafter_speculator(plan.drafter, plan.policy(), plan.drafts)
    return generate_speculative(target, speculator, ids, max_new_tokens, sampling, eos_token_id=eos_token_id,
                                generator=generator)


def head_policy(head, threshold: float | None, head_config: dict | None, k_max: int) -> Callable[[], SpecDecPP]:
    """SpecDec++ with a head loaded from its own directory (no bundle): at `threshold`, else the h recorded
    with the head, capped at the head's K_max, else `k_max`. A bundle's heads go through `Bundle.policy_for`."""
    h = threshold if threshold is not None else (head_config or {}).get("threshold")
    if h is None:
        raise InputError("the head records no threshold; pass --threshold H (SpecDec++ h in (0, 1))")
    cap = (head_config or {}).get("k_max") or k_max
    return lambda: SpecDecPP(head, h, cap)


def generate_text(tok, target, drafter, prompt: str, max_new_tokens: int = DEFAULTS.max_new_tokens,
                  sampling=SamplingConfig(0.0), head=None, threshold: float | None = None, k: int | None = None,
                  head_config: dict | None = None,
                  k_max: int = DEFAULTS.k_max, method: str = "speculative", seed: int = 0, drafts: int = 1,
                  cascade=None, cascade_block: int = CASCADE_BLOCK, tree=None,
                  chat: ChatFormat = ChatFormat()) -> tuple[str, dict]:
    """Decode one prompt -> (text, metrics summary). With `head` and no `k`: SpecDec++ at `threshold`
    (None: the h recorded in `head_config`, the head's own; without one, an InputError); else fixed K (`k`,
    default the library's). drafts > 1: SpecTr; cascade: a decoding.cascades.CascadeMethod drafting
    `cascade_block` tokens a round (`k` with a cascade is an InputError); tree: an EAGLE drafter's
    decoding.speculators.eagle.TreeShape; chat: how the prompt is formatted."""
    check_drafts(drafts)
    if method not in ("speculative", "ar"):
        raise InputError(f"unknown method {method!r}; use speculative or ar")
    if cascade is not None and k is not None and method != "ar":
        raise InputError("k is a drafter's fixed K; a cascade drafts cascade_block tokens a round: pass cascade_block")
    if method == "ar":
        plan = Plan("target")
    elif head is not None and k is None:
        plan = Plan("drafter", drafter, head_policy(head, threshold, head_config, k_max), drafts=drafts,
                    cascade=cascade, cascade_block=cascade_block, tree=tree)
    else:
        kk = k if k is not None else DEFAULTS.k
        plan = Plan("drafter", drafter, lambda: FixedK(kk), drafts=drafts, cascade=cascade,
                    cascade_block=cascade_block, tree=tree)
    ids = format_prompt(tok, user_turn(prompt), chat)
    res = decode_batch(target, [ids], max_new_tokens, plan, sampling, end_of_turn_ids(tok, target), seed)[0]
    return tok.decode(res.tokens, skip_special_tokens=True), res.metrics.summary()


# ---- loading -----------------------------------------------------------------------------------------


def load_pair(bundle: str | None = None, target: str | None = None, drafter: str | None = None,
              head: str | None = None, device: str = "cpu", dtype: str = "auto", device_map=None,
              drafter_device: str | None = None, sampling: SamplingConfig | None = None):
    """-> (tokenizer, target model, drafter model, head module or None, head config or None).

    From a bundle: `drafter` by name (default: the bundle's all-domain drafter), and without an explicit
    head the drafter's best head labelled under `sampling` (when given and the bundle has one), else its
    default head. The target may be spread over GPUs (device_map="auto" or a map); the drafter and head
    sit on `drafter_device` (default: `device`)."""
    drafter_device = drafter_device or device
    if bundle is not None:
        from specdraft.decoding.bundle.directory import load_bundle

        b = load_bundle(bundle)
        tok = b.load_tokenizer()
        tgt = b.load_target(dtype=dtype, device=None if device_map else device, device_map=device_map)
        dft, h, hcfg = load_bundle_drafter(b, drafter or b.general_drafter(), tgt, head, sampling, drafter_device)
        return tok, tgt, dft, h, hcfg
    if target is None or drafter is None:
        raise InputError("give a bundle directory, or both --target DIR and --drafter DIR")
    tok = load_tokenizer(target)
    tgt = load_causal_lm(target, dtype, None if device_map else device, device_map)
    dft, h, hcfg = load_drafter_dir(drafter, target, tok, tgt, head, dtype, drafter_device)
    return tok, tgt, dft, h, hcfg


def load_bundle_drafter(b, name: str, target, head: str | None, sampling: SamplingConfig | None,
                        device: str | None):
    """(drafter model, head module or None, head config or None) of a loaded bundle's drafter `name`."""
    if name in b.eagle:  # an EAGLE drafter: the target's own embedding and LM head, no SpecDec++ head
        if head is not None:
            raise InputError(f"EAGLE drafter '{name}' has no SpecDec++ heads; leave out --head")
        return b.load_eagle(name, target, device=device), None, None
    dft = b.load_drafter(name, device=device, target=target)
    if head is None and sampling is not None:
        head = b.head_for(name, sampling)
    if head is None and b.drafter(name).head is None:
        return dft, None, None
    h, hcfg = b.load_head(name, head, device=device)
    return dft, h, hcfg


def load_drafter_dir(drafter: str, target_dir: str, tok, target, head: str | None, dtype: str, device: str | None):
    """(drafter model, head module or None, head config or None) from model directories."""
    from specdraft.decoding.speculators.eagle_model import is_eagle_dir, load_eagle, target_dir_hash

    if is_eagle_dir(drafter):  # an EAGLE drafter speaks the target's tokenizer (its embedding and LM head)
        return load_eagle(drafter, target, target_dir_hash(target_dir), device), None, None
    check_same_vocabulary(None, None, load_tokenizer(drafter), tok, name=f"drafter '{drafter}'")
    dft = load_causal_lm(drafter, dtype, device)
    check_pair(target, dft)
    if head is None:
        return dft, None, None
    from specdraft.decoding.policies.acceptance_head import load_head

    h, hcfg = load_head(head, expected_hidden_size=dft.config.hidden_size)
    h = h.to(device)
    check_head(h, dft)
    return dft, h, hcfg


# ---- the command -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One prompt of the command: its messages, its token ids, and what it is reported as."""

    index: int
    messages: list[dict[str, str]]
    ids: list[int]


def read_prompts(path: str, messages_of: Callable | None) -> list[list[dict[str, str]]]:
    """The messages of every record of a JSONL file; InputError naming the file and line of a record that
    cannot be read (encoding, JSON, missing field). The lines are read by core.jsonl, as prepare-data's
    prompt sources are."""
    out = []
    for where, record in jsonl_objects(path, "prompts file", '{"prompt": "..."}'):
        if messages_of is not None:
            messages, _ = messages_of(record, where)
        elif isinstance(record.get("prompt"), str) and record["prompt"]:
            messages = user_turn(record["prompt"])
        else:
            raise InputError(f"{where} has no non-empty 'prompt' string; every record needs one")
        out.append(messages)
    if not out:
        raise InputError(f"prompts file '{path}' holds no prompts; write one JSON record per line")
    return out


def check_output(path: str | None, prompts: str | None) -> Path | None:
    """Where the JSON lines go (None: stdout), checked before any model loads."""
    if path is None:
        return None
    out = Path(path)
    if not out.parent.is_dir():
        raise InputError(f"--output '{path}': directory '{out.parent}' does not exist; create it first")
    if out.is_dir():
        raise InputError(f"--output '{path}' is a directory; name a file, e.g. {out / 'out.jsonl'}")
    if prompts is not None and out.resolve() == Path(prompts).resolve():
        raise InputError("--output is the prompts file; write the results elsewhere")
    return out


def write_jsonl_atomically(path: Path, records: list[dict]) -> None:
    """All lines or none: a temporary file beside `path`, renamed over it once complete."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@dataclass(frozen=True)
class Settings:
    """The command's decoding settings: each the user's value, else the bundle's default."""

    sampling: SamplingConfig
    max_new_tokens: int
    drafts: int
    compile: str
    cascade: Any
    cascade_block: int  # the cascade's drafts per round (--cascade-block)


def settings_from(args, defaults: DecodingDefaults, has_bundle: bool) -> Settings:
    def given(name):
        value = getattr(args, name)
        return value if value is not None else getattr(defaults, name)

    sampling = SamplingConfig(given("temperature"), given("top_k"), given("top_p"))
    if args.k is not None and args.threshold is not None:
        raise InputError("--k (fixed K) and --threshold (SpecDec++) choose different policies; give one")
    cascade = cascade_from(args, defaults if has_bundle else None)
    if cascade is not None and args.cascade is None and sampling.greedy:
        print(f"note: the bundle's default cascade ({cascade.label}) needs temperature > 0; decoding without it",
              file=sys.stderr)
        cascade = None
    if cascade is not None and args.method != "ar":
        from specdraft.decoding.cascades import check_sampling

        check_sampling(sampling)
        if args.k is not None:
            raise InputError(f"--k is a drafter's fixed K; the cascade ({cascade.label}) drafts --cascade-block tokens "
                             "a round: give --cascade-block N (or --cascade none for fixed K)")
    if cascade is None and args.cascade_block is not None and args.method != "ar":
        raise InputError("--cascade-block is a cascade's block size, and no cascade decodes: add --cascade RULE "
                         "--alpha A (temperature > 0), or leave it out")
    drafts = args.drafts if args.drafts is not None else (defaults.drafts if has_bundle else 1)
    block = args.cascade_block if args.cascade_block is not None else CASCADE_BLOCK
    return Settings(sampling, given("max_new_tokens"), drafts, given("compile"), cascade, block)


def cascade_from(args, defaults: DecodingDefaults | None):
    """--cascade/--alpha, else the bundle's default cascade, else None."""
    from specdraft.decoding.cascades import cascade_method, method_from_spec

    if args.cascade == "none":
        return None
    if args.cascade is not None:
        if args.alpha is None:
            raise InputError(f"--cascade {args.cascade} needs --alpha (the lenience; e.g. --alpha 0.3)")
        return cascade_method(args.cascade, args.alpha, args.beta)
    if args.alpha is not None:
        raise InputError("--alpha is only read with --cascade RULE; add one (e.g. --cascade token)")
    return method_from_spec(defaults.cascade, "the bundle's decoding.cascade") if defaults is not None else None


def run(args, services: Services = Services()) -> None:
    """`specdraft generate` on parsed arguments (decoding/generate_args.py)."""
    from specdraft.decoding.bundle.directory import load_bundle

    bundle_dir = bundle_of(args, warn=lambda msg: print(msg, file=sys.stderr))
    if bundle_dir is None and args.target is None:
        raise InputError("give a bundle directory (specdraft generate BUNDLE ...), or --target DIR with --drafter DIR")
    if bundle_dir is None and args.drafter is None and args.method != "ar":
        raise InputError("without a bundle, name the drafter directory (--drafter DIR) or decode with --method ar")
    out_path = check_output(args.output, args.prompts)
    b = load_bundle(bundle_dir) if bundle_dir is not None else None  # read (and verified) once
    settings = settings_from(args, b.defaults if b is not None else DEFAULTS, b is not None)
    if b is not None:
        check_choice(args, b)
    messages = read_prompts(args.prompts, services.messages_of) if args.prompts else [user_turn(args.prompt)]
    chat = chat_from(args, b)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stderr holds our progress bar and one-line errors only

    if b is not None:
        tok = b.load_tokenizer()
        target = b.load_target(dtype=args.dtype, device=None if args.device_map else args.device,
                               device_map=args.device_map)
    else:
        tok = load_tokenizer(args.target)
        target = load_causal_lm(args.target, args.dtype, None if args.device_map else args.device, args.device_map)
    requests = [Request(i, m, format_prompt(tok, m, chat)) for i, m in enumerate(messages)]
    choices = choose_drafters(args, b, target, requests, services)
    plans: dict[str, Plan] = {}
    results: dict[int, tuple[GenerationResult, Plan]] = {}
    eos = end_of_turn_ids(tok, target)
    compiler = StepCompiler(settings.compile)  # one for the command: each graph compiles once
    from tqdm import tqdm

    with tqdm(total=len(requests), desc="generate", unit="prompt", file=sys.stderr,
              disable=args.prompts is None) as bar:
        for name in dict.fromkeys(choices):  # by drafter, in order of first use: each loads once
            group = [r for r, c in zip(requests, choices) if c == name]
            if name not in plans:
                plans[name] = make_plan(args, b, name, target, tok, settings,
                                        note=lambda msg: bar.write(msg, file=sys.stderr),
                                        longest_prompt=max(len(r.ids) for r in group))
            for start in range(0, len(group), args.batch_size):
                batch = group[start:start + args.batch_size]
                # a batch samples from seed + its first prompt's index (one prompt per batch: seed + i)
                decoded = decode_batch(target, [r.ids for r in batch], settings.max_new_tokens, plans[name],
                                       settings.sampling, eos, args.seed + batch[0].index, compiler)
                for r, res in zip(batch, decoded):
                    results[r.index] = (res, plans[name])
                bar.update(len(batch))
    records = [record(r, *results[r.index], tok) for r in requests]
    if out_path is not None:
        write_jsonl_atomically(out_path, records)
        print(f"wrote {len(records)} generations to {out_path}", file=sys.stderr)
    elif args.prompts is not None:
        for r in records:
            print(json.dumps(r, ensure_ascii=False))
    else:
        print(records[0]["text"])
        print(json.dumps({k: records[0][k] for k in METRIC_KEYS}))


def record(r: Request, res: GenerationResult, plan: Plan, tok) -> dict[str, Any]:
    """One output line: the prompt, who drafted, the text and token ids, MAT and the counts."""
    m = res.metrics.summary()
    prompt = r.messages[-1]["content"] if len(r.messages) == 1 else None
    return {"index": r.index, **({"prompt": prompt} if prompt is not None else {"messages": r.messages}),
            "drafter": plan.name if plan.drafter is not None else None, "head": plan.head,
            "text": tok.decode(res.tokens, skip_special_tokens=True), "token_ids": list(res.tokens),
            "prompt_tokens": len(r.ids),
            **{k: round(m[k], 4) if isinstance(m[k], float) else m[k] for k in METRIC_KEYS}}


def check_choice(args, b) -> None:
    """The drafter and router the arguments name exist in the bundle (checked before any model loads)."""
    if args.method == "ar":
        return
    if args.drafter is not None:
        if args.drafter not in b.drafters and args.drafter not in b.eagle:
            raise InputError(f"the bundle has no drafter '{args.drafter}'; it has "
                             f"{', '.join([*b.drafters, *b.eagle]) or 'none'}")
        if args.router not in (None, "none"):
            raise InputError("--router picks a drafter per prompt; leave it out with --drafter")
        if args.threshold is not None and args.head is None and not b.heads.get(args.drafter):
            raise InputError(f"--threshold sets a SpecDec++ head's h, but drafter '{args.drafter}' has none; "
                             "give --head, or --k for fixed K")
    elif args.router not in (None, "none") and args.router not in b.routers:
        raise InputError(f"the bundle has no router '{args.router}'; it has {', '.join(b.routers) or 'none'} "
                         "(or --router none)")
    elif args.router is None and not b.routers:
        b.general_drafter()  # InputError now when there is none


def choose_drafters(args, b, target, requests: list[Request], services: Services) -> list[str]:
    """The drafter each prompt decodes with: --drafter, else the bundle's router, else its all-domain
    drafter; "target" for --method ar."""
    if args.method == "ar":
        return ["target"] * len(requests)
    if args.drafter is not None:
        return [args.drafter] * len(requests)
    router_name = None if args.router == "none" else (args.router or b.default_router())
    if router_name is None:
        return [b.general_drafter()] * len(requests)
    if services.load_router is None:
        raise InputError("routing needs the router module; run `specdraft generate` (or pass --router none)")
    router = services.load_router(b.routers[router_name].path, target.get_input_embeddings(), b.tokenizer_sha256)
    names = router.route_many([r.ids for r in requests])
    unknown = sorted(set(names) - set(b.drafters))
    if unknown:
        raise InputError(f"router '{router_name}' picks drafter '{unknown[0]}', which the bundle lacks; re-export it")
    return names


def make_plan(args, b, name: str, target, tok, settings: Settings,
              note: Callable[[str], Any] = lambda msg: print(msg, file=sys.stderr), *, longest_prompt: int) -> Plan:
    """Load drafter `name` (and its head) and decide how it drafts: --k, else its head's rule (the batch-aware
    rule, priced for decodes of prompts up to `longest_prompt` tokens: `batch_aware_table`; else SpecDec++ at
    the bundle's threshold, else the head's own h), else the bundle's best fixed K for it."""
    if name == "target":
        return Plan("target")
    device = args.drafter_device or args.device
    if b is not None:
        dft, head, hcfg = load_bundle_drafter(b, name, target, args.head, settings.sampling, device)
    else:
        dft, head, hcfg = load_drafter_dir(name, args.target, tok, target, args.head, args.dtype, device)
    head_name = None
    if head is not None and hcfg is not None:
        lt = hcfg.get("label_transform", {})
        s = settings.sampling
        if lt and not s.matches(lt):
            note(f"note: the head of drafter '{name}' was trained on labels at {lt}; decoding at temperature="
                 f"{s.temperature} top_k={s.top_k} top_p={s.top_p} (SpecDec++ thresholds may transfer poorly)")
        head_name = args.head or (b.head_for(name, s) or b.drafter(name).head if b is not None else None)
    if args.threshold is not None and head is None:
        raise InputError(f"--threshold sets a SpecDec++ head's h, but drafter '{name}' has none; "
                         "give --head, or --k for fixed K")
    table, prior = batch_aware_table(args, b, name, target, dft, head, head_name, hcfg, settings, note, longest_prompt)
    if b is not None:
        policy = b.policy_for(name, head if args.k is None else None, head_name, args.k, args.threshold, table, prior)
    elif args.k is None and head is not None:
        policy = head_policy(head, args.threshold, hcfg, DEFAULTS.k_max)
    else:
        k = args.k if args.k is not None else DEFAULTS.k
        policy = lambda: FixedK(k)  # noqa: E731
    if args.k is not None:
        head_name = None
    tree = eagle_tree(args, b, name) if is_eagle(dft) else None
    return Plan(name, dft, policy, head_name, settings.drafts, settings.cascade, settings.cascade_block, tree)


def batch_aware_table(args, b, name: str, target, drafter, head, head_name: str | None, head_config: dict | None,
                      settings: Settings, note: Callable[[str], Any], longest_prompt: int):
    """(cost table, prior) the batch-aware rule prices drafter `name`'s rounds with, or (None, None): its head stops at
    SpecDec++'s fixed h. --stop-rule batch-aware asks for the rule (an InputError where it cannot run); left unset,
    the rule is the default for a bundle's causal-LM drafter drafting chains whose acceptance summary (its prior)
    the bundle ships and no --threshold (SpecDec++'s h) is given."""
    rule = getattr(args, "stop_rule", None)
    if rule == "specdecpp" or head is None or args.k is not None or (rule is None and args.threshold is not None):
        return None, None  # a --threshold given is SpecDec++'s h: that rule, as asked
    # the table times the batched decoder's rounds of a causal-LM drafter: SpecTr drafts, cascades and EAGLE
    # drafters decode otherwise
    if is_eagle(drafter) or settings.drafts != 1 or settings.cascade is not None:
        if rule == "batch-aware":
            how = "as an EAGLE drafter" if is_eagle(drafter) else "with SpecTr drafts or a cascade"
            raise InputError(f"--stop-rule batch-aware prices the batched decoder's rounds of a causal-LM drafter; "
                             f"drafter '{name}' decodes {how}: use --stop-rule specdecpp")
        return None, None
    if b is None:
        if rule == "batch-aware":
            raise InputError("--stop-rule batch-aware takes its prior from a bundle's acceptance summary; give a bundle")
        return None, None
    summary = b.acceptance_summary(name)
    if summary is None and rule is None:
        note(f"note: drafter '{name}' has no acceptance summary in the bundle (exported before train-heads wrote one): "
             "its head stops drafting at SpecDec++'s fixed h")
        return None, None
    prior = b.prior_for(name, head_name, summary)  # before any profiling: without a summary an explicit rule stops here
    return cost_table_for(args, target, drafter, settings, head_config, note, head, prior, longest_prompt=longest_prompt), prior


def cost_table_for(args, target, drafter, settings: Settings, head_config: dict | None, note: Callable[[str], Any],
                   head=None, prior=None, *, longest_prompt: int):
    """The decoder's own step times for the batch-aware rule: batch sizes 1..--batch-size, widths up to the
    head's K_max + 1, in the command's compile mode, calibrated, profiled once per device, models and mode
    and cached (decoding/cost_profile.py); with `head` and `prior`, the head rules' own work priced on top
    (`price_head_rules`, cached with the table)."""
    from specdraft.decoding.cost_profile import LOOP_SPAN, cache_length_for, cached_cost_table

    k_max = int((head_config or {}).get("k_max") or DEFAULTS.k_max)
    sizes = sorted({1, args.batch_size})
    # calibrated: the loop's own work per round and per draft is part of what a longer round costs
    # over the cache the command's decodes allocate (its steps attend over every slot; cached per length), with
    # room for the calibration's decodes of LOOP_SPAN new tokens
    slots = cache_length_for(longest_prompt, max(settings.max_new_tokens, LOOP_SPAN), k_max, settings.compile)
    table, path, hit = cached_cost_table(target, drafter, sizes, k_max + 1, settings.compile, calibrate=True,
                                         head=head, prior=prior, context=longest_prompt, cache_length=slots)
    note(f"cost table {'read from' if hit else 'profiled into'} {path}")
    if args.verbose:
        note(table.render())
    return table


def eagle_tree(args, b, name: str):
    """--eagle-tree: "none" -> chain drafts; "D,K,M" -> that EAGLE-2 tree; "bundle" (default) -> the bundle's
    tree for its EAGLE drafter, else chain drafts."""
    from specdraft.decoding.speculators.eagle import TreeShape

    spec = getattr(args, "eagle_tree", "bundle")
    if spec == "none":
        return None
    if spec == "bundle":
        entry = b.eagle.get(name) if b is not None else None
        return TreeShape(**entry.tree) if entry is not None and entry.tree else None
    try:
        depth, top_k, nodes = (int(x) for x in spec.split(","))
    except ValueError:
        raise InputError(f"--eagle-tree {spec!r}: give DEPTH,TOP_K,NODES (e.g. 4,4,16), none or bundle") from None
    return TreeShape(depth, top_k, nodes)


def chat_from(args, b) -> ChatFormat:
    """The bundle's prompt format (or the tokenizer's template without a bundle), with --raw-prompt and
    --system-prompt applied on top."""
    chat = b.chat if b is not None else ChatFormat()
    if args.raw_prompt:
        chat = dataclasses.replace(chat, plain=True)
    if args.system_prompt is not None:
        chat = dataclasses.replace(chat, system_prompt=args.system_prompt or None)
    return chat
