"""What the stage loads before it plans: the bundle's routers and SpecDec++ heads, and the prompts."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from specdraft.core.errors import InputError
from specdraft.core.tokenizers import tokenizer_fingerprint
from specdraft.data.chat import row_messages
from specdraft.data.prompts import fit_prompt, load_prompt_sets
from specdraft.decoding.bundle.directory import Bundle
from specdraft.decoding.bundle.chat import ChatFormat, format_prompt
from specdraft.decoding.costs.model import CostTable
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.routers.router import load_router
from specdraft.pipelines.evaluate.plan import Head, Prompt
from specdraft.pipelines.schema import EvaluateSection, TargetSection


def load_target(bundle: Bundle, tcfg: TargetSection, device: str):
    """The target as the stages trained with it: the config's target.dtype, quantization and device_map,
    through the one loader every stage uses (decoding.bundle.loading.load_causal_lm, behind Bundle.load_target);
    a device_map places it (over several GPUs), else it sits on the evaluation device."""
    return bundle.load_target(dtype=tcfg.dtype, device=None if tcfg.device_map is not None else device,
                              device_map=tcfg.device_map, quantization=tcfg.quantization,
                              trust_remote_code=tcfg.trust_remote_code)


def target_placement(target, tcfg: TargetSection, bundle: Bundle) -> dict[str, Any]:
    """How the target was loaded here, for the report: the devices its weights sit on, its dtype (the
    floating point one of its weights; a quantized target's compute dtype), quantization and device_map,
    beside how the bundle says the stages loaded it."""
    from specdraft.decoding.bundle.loading import choose_draft_weights, choose_dtype

    params = list(target.parameters())
    devices = sorted({str(p.device) for p in params})
    floats = sorted({str(p.dtype).removeprefix("torch.") for p in params if p.dtype.is_floating_point})
    # why that dtype: target.dtype as configured, or what auto chose on this device (decoding/bundle/loading.py)
    weight = target.get_input_embeddings().weight
    reason = choose_dtype(tcfg.dtype, weight.device).reason
    # the drafters' weights as bundle.load_drafter took them (decoding.draft_weights in bundle.json)
    asked = bundle.spec.decoding.draft_weights
    drafters = {"int8": "int8", "dtype": "the target's dtype"}[choose_draft_weights(asked, weight.dtype,
                                                                                    weight.device.type)]
    return {"devices": devices, "dtype": ", ".join(floats), "dtype_reason": reason, "quantization": tcfg.quantization,
            "draft_weights": f"{drafters} (decoding.draft_weights {asked})",
            "device_map": tcfg.device_map,
            "bundle": {"dtype": bundle.spec.target.dtype, "quantization": bundle.spec.target.quantization,
                       "device_map": bundle.spec.target.device_map}}


def load_routers(bundle: Bundle, target, tok) -> tuple[dict[str, Any], list[str]]:
    """Each router of the bundle (bundle.routers: name -> entry), or a note on why there are none."""
    entries = {name: e.path for name, e in bundle.routers.items()}
    if not entries:
        return {}, ["no router in the bundle (train-router did not run before export): routing rows skipped"]
    fp = tokenizer_fingerprint(tok)
    return {name: load_router(path, target.get_input_embeddings(), fp) for name, path in sorted(entries.items())}, []


def load_heads(bundle: Bundle, drafters, modes: dict[str, SamplingConfig], device: str,
                notes: list[str]) -> dict[str, dict[str, Head]]:
    """Each mode uses the heads labelled under its own transform (SpecDec++ §4.4)."""
    heads: dict[str, dict[str, Head]] = {}
    for mode, transform in modes.items():
        heads[mode] = {}
        for n in drafters:
            name = bundle.head_for(n, transform)
            if name is not None:
                module, _ = bundle.load_head(n, name, device=device)
                h, k_max = bundle.head_rule(n, name)  # as `specdraft generate` serves it (Bundle.policy_spec)
                heads[mode][n] = Head(module, h, k_max, name)
        lacking = sorted(n for n in drafters if n not in heads[mode] and bundle.heads.get(n))
        if lacking:
            notes.append(f"no head labelled under {transform.tag} for {', '.join(lacking)}: their {mode} SpecDec++ "
                         f"rows are skipped (add {transform.as_dict()} to acceptance_data.label_transforms)")
    return heads


def load_prompts(prompts_dir: Path, ecfg: EvaluateSection, tok, max_prompt: int, notes: list[str],
                 chat: ChatFormat = ChatFormat()) -> list[Prompt]:
    """The first prompts_per_domain prompts per domain and set of prepare-data's output, formatted as the
    bundle serves them."""
    sets = load_prompt_sets(prompts_dir)
    prompts = []
    for s in ecfg.sets:
        if s not in sets:
            notes.append(f"prompt set '{s}' does not exist in prompts/sets: skipped")
            continue
        taken: dict[str, int] = {}
        for row in sets[s]:
            i = taken.get(row["domain"], 0)
            if i < ecfg.prompts_per_domain:
                taken[row["domain"]] = i + 1
                ids, _ = fit_prompt(format_prompt(tok, row_messages(row), chat), max_prompt, "truncate", row["id"])
                prompts.append(Prompt(s, row["domain"], row["id"], tuple(ids), i, row.get("response")))
    if not prompts:
        raise InputError(f"no prompts in sets {ecfg.sets} of {prompts_dir}; check evaluate.sets")
    return prompts



def throughput_costs(bundle: Bundle, target, drafters: dict, heads: dict, ofa: str | None, ecfg: EvaluateSection,
                     seed: int, notes: list[str], shared: Path, context: int = 64, longest: int | None = None):
    """(cost table, acceptance summary, prior) for the throughput rows' batch-aware policies, or (None, None, None)
    when they cannot run: the all-domain drafter's greedy head and the bundle's acceptance summary for it are needed.
    The table is the decoder's own steps timed here, eager as evaluate decodes, at every batch size of the rows
    and every width up to the head's K_max + 1, calibrated, with the head rules' own work priced
    (decoding/costs/profile.py) over prompts of
    `context` tokens (the test prompts' median: a call's start is mostly its prefill) in the cache a decode of the
    `longest` test prompt allocates (its steps attend over every slot), kept at `shared` (the stage's
    work directory): the first process to profile it fixes it for every shard and rerun, so their
    batch-aware decisions, which read it, are the decisions of one process."""
    from specdraft.decoding.costs.profile import cache_length_for, price_head_rules, profile_cost_table
    head = heads["greedy"].get(ofa) if ofa is not None else None
    if not ecfg.batch_sizes or head is None:
        return None, None, None
    summary = bundle.acceptance_summary(ofa)
    if summary is None:
        notes.append(f"the bundle ships no acceptance summary for '{ofa}' (exported before train-heads wrote one): "
                     "the batch-aware throughput rows and the predicted throughput are left out (re-export)")
        return None, None, None
    prior = bundle.prior_for(ofa, head.name, summary)
    if not shared.is_file():
        # calibrated: the loop's own work per round and a call's start, which the report's prediction prices
        # (short decodes: seconds at the rows' batch sizes)
        # over the cache the rows' decodes allocate (their longest prompt, the runs' new tokens, K_max)
        slots = cache_length_for(max(context, longest or context), ecfg.max_new_tokens, head.k_max, "none")
        table = profile_cost_table(target, drafters[ofa], sorted({1, *ecfg.batch_sizes}), head.k_max + 1, "none",
                                   seed=seed, calibrate=True, context=max(1, context), cache_length=slots)
        # the head's forward and each rule's decisions: what a head policy's rounds pay beyond fixed K's
        table = price_head_rules(table, head.module, drafters[ofa].config.hidden_size, prior, head.k_max,
                                 head.threshold)
        tmp = shared.with_name(f"{shared.name}.{os.getpid()}.tmp")
        table.save(tmp)
        try:
            os.link(tmp, shared)  # fails where another shard's table landed first: theirs is the one
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return CostTable.load(shared), summary, prior
