"""The decoder's front door: load a pair, decode a batch with one plan, generate text for one prompt.

  tok, target, drafter, head, head_config = load_pair("runs/demo/bundle")          # or target=DIR, drafter=DIR
  text, metrics = generate_text(tok, target, drafter, "Question: ...", head=head, head_config=head_config)

`decode_batch` is where every batch meets the decoder: the batched loop (decoding/batched.py) for the target
alone and chain drafters, the one-prompt loop (decoding/speculative.py) for SpecTr drafts, cascades and
EAGLE trees. The `specdraft generate` command (pipelines/generate.py) reads prompts, picks drafters and
writes files around it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from specdraft.core.errors import InputError
from specdraft.core.tokenizers import check_same_vocabulary
from specdraft.decoding.batched import generate_batch
from specdraft.decoding.compilation import StepCompiler
from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.decoding.bundle.chat import ChatFormat, end_of_turn_ids, format_prompt, user_turn
from specdraft.decoding.compat import check_head, check_pair
from specdraft.decoding.defaults import DEFAULTS
from specdraft.decoding.cascades import DEFAULT_BLOCK as CASCADE_BLOCK
from specdraft.decoding.speculators.eagle_model import EagleDrafter  # loaded with the batched decoder anyway
from specdraft.decoding.bundle.loading import dtype_of, load_causal_lm, load_drafter, load_tokenizer
from specdraft.decoding.metrics import GenerationResult
from specdraft.decoding.speculators.spectr import check_drafts, drafter_speculator
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.rounds.shapes import decode_cache_length
from specdraft.decoding.rounds.static_cache import full_attention_over
from specdraft.decoding.speculative import generate_speculative
from specdraft.decoding.policies.spec import PolicySpec, build_policy



@dataclass
class Plan:
    """One way to decode: a drafter (None: the target alone) and how it drafts."""

    name: str  # the drafter's name (bundle) or directory; "target" for autoregressive decoding
    drafter: torch.nn.Module | None = None
    policy: Callable[[], Any] | None = None  # a fresh stopping policy (`build_policy` of a PolicySpec)
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
    policy: fixed K, SpecDec++, an EAGLE chain) decode together in `decoding.batched.generate_batch`,
    sampling from one device generator seeded with `seed`. The rest (SpecTr drafts, cascades, EAGLE
    trees) decode one prompt after another with the single-sequence decoder, prompt i with seed + i;
    they cannot be compiled. compile: a mode, or the `StepCompiler` a caller keeps over many batches."""
    compiler = compile if isinstance(compile, StepCompiler) else StepCompiler(compile)
    if batched_plan(plan) and full_attention_decode(target, plan, prompts, max_new_tokens, compiler.mode):
        policy = plan.policy() if plan.drafter is not None else None
        return generate_batch(target, prompts, max_new_tokens, drafter=plan.drafter, policy=policy, sampling=sampling,
                              eos_token_id=eos_token_id, seed=seed, compile=compiler)
    if not compiler.eager:
        raise InputError(f"--compile {compiler.mode} applies to the batched decoder (the target alone, fixed K, SpecDec++, "
                         "EAGLE chains, models attending over the whole decode); SpecTr drafts, cascades, EAGLE trees "
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
    an EAGLE drafter of any variant drafting a chain) with no SpecTr drafts and no cascade."""
    if plan.drafter is None:
        return True
    if plan.drafts != 1 or plan.cascade is not None:
        return False
    if isinstance(plan.drafter, EagleDrafter):
        return plan.tree is None
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


def head_spec(threshold: float | None, head_config: dict | None, k_max: int, lockstep: bool = False) -> PolicySpec:
    """SpecDec++ for a head loaded from its own directory (no bundle): at `threshold`, else the h recorded
    with the head, capped at the head's K_max, else `k_max`. A bundle's heads go through `Bundle.policy_spec`."""
    h = threshold if threshold is not None else (head_config or {}).get("threshold")
    if h is None:
        raise InputError("the head records no threshold; pass --threshold H (SpecDec++ h in (0, 1))")
    cap = (head_config or {}).get("k_max") or k_max
    return PolicySpec("specdecpp", threshold=h, k_max=cap, lockstep=lockstep)


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
    else:
        if head is not None and k is None:
            spec = head_spec(threshold, head_config, k_max)
        else:  # a threshold here is refused by the spec: fixed K reads none
            spec = PolicySpec("fixed", k=k if k is not None else DEFAULTS.k, threshold=threshold)
        plan = Plan("drafter", drafter, lambda: build_policy(spec, head=head), drafts=drafts, cascade=cascade,
                    cascade_block=cascade_block, tree=tree)
    ids = format_prompt(tok, user_turn(prompt), chat)
    res = decode_batch(target, [ids], max_new_tokens, plan, sampling, end_of_turn_ids(tok, target), seed)[0]
    return tok.decode(res.tokens, skip_special_tokens=True), res.metrics.summary()


# ---- loading -----------------------------------------------------------------------------------------


def load_pair(bundle: str | None = None, target: str | None = None, drafter: str | None = None,
              head: str | None = None, device: str = "cpu", dtype: str | None = None, device_map=None,
              drafter_device: str | None = None, sampling: SamplingConfig | None = None):
    """-> (tokenizer, target model, drafter model, head module or None, head config or None). dtype: None is the
    bundle's recorded target dtype (as its stages ran), "auto" without a bundle; the drafter runs in the target's.

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
    tgt = load_causal_lm(target, dtype or "auto", None if device_map else device, device_map)
    dft, h, hcfg = load_drafter_dir(drafter, target, tok, tgt, head, dtype_of(tgt), drafter_device)
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


def load_drafter_dir(drafter: str, target_dir: str, tok, target, head: str | None, dtype: str, device: str | None,
                     draft_weights: str = DEFAULTS.draft_weights):
    """(drafter model, head module or None, head config or None) from model directories; the drafter's weights as
    `draft_weights` says (`decoding.bundle.loading.choose_draft_weights`)."""
    from specdraft.decoding.speculators.eagle_model import is_eagle_dir, load_eagle, target_dir_hash

    if is_eagle_dir(drafter):  # an EAGLE drafter speaks the target's tokenizer (its embedding and LM head)
        return load_eagle(drafter, target, target_dir_hash(target_dir), device), None, None
    check_same_vocabulary(None, None, load_tokenizer(drafter), tok, name=f"drafter '{drafter}'")
    dft = load_drafter(drafter, dtype, device, draft_weights)
    check_pair(target, dft)
    if head is None:
        return dft, None, None
    from specdraft.decoding.policies.acceptance_head import load_head

    h, hcfg = load_head(head, expected_hidden_size=dft.config.hidden_size)
    h = h.to(device)
    check_head(h, dft)
    return dft, h, hcfg
