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

A prompt is one user turn (or a record's messages in any format the stages read), formatted as the bundle
was trained (decoding/bundle/chat.py: the target's chat template unless the run chose otherwise);
`--raw-prompt` feeds the text as is and `--system-prompt TEXT` adds a system turn. One prompt prints its
text and a line of metrics; with `--prompts` (or `--output`) every prompt becomes one JSON line: text,
token ids, MAT and counts.

This module is the command (arguments in pipelines/generate_args.py, files, printing, the router); the
decoding it runs is the library's: `decoding.generate.decode_batch`, one (drafter, policy) pair and a batch
of prompt id lists at a time.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from specdraft.core.errors import InputError
from specdraft.core.jsonl import jsonl_objects
from specdraft.data.chat import record_messages
from specdraft.decoding.bundle.chat import ChatFormat, end_of_turn_ids, format_prompt, user_turn
from specdraft.decoding.bundle.loading import check_device, choose_dtype, dtype_of, load_causal_lm, load_tokenizer
from specdraft.decoding.cascades import DEFAULT_BLOCK as CASCADE_BLOCK
from specdraft.decoding.compilation import StepCompiler
from specdraft.decoding.defaults import DEFAULTS, DecodingDefaults
from specdraft.decoding.generate import Plan, decode_batch, head_spec, load_bundle_drafter, load_drafter_dir
from specdraft.decoding.metrics import GenerationResult
from specdraft.decoding.policies.spec import PolicySpec, build_policy
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.speculators.eagle_model import is_eagle
from specdraft.pipelines.generate_args import bundle_of

START_REPEATS = 3  # timed passes of a cost table profiled at a decoder's start (cost_table_for)
METRIC_KEYS = ("N", "N_target", "N_draft", "N_discarded", "rounds", "MAT", "discard_rate", "verification_rate",
               "tokens_per_s")

@dataclass(frozen=True)
class Request:
    """One prompt of the command: its messages, its token ids, and what it is reported as."""

    index: int
    messages: list[dict[str, str]]
    ids: list[int]


def read_prompts(path: str) -> list[list[dict[str, str]]]:
    """The messages of every record of a JSONL file, in every format the stages read (data.chat.record_messages);
    InputError naming the file and line of a record that cannot be read (encoding, JSON, missing field). The
    lines are read by core.jsonl, as prepare-data's prompt sources are."""
    out = [record_messages(record, where)[0]
           for where, record in jsonl_objects(path, "prompts file", '{"prompt": "..."}')]
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
    rule = getattr(args, "stop_rule", None)
    if rule is not None and args.method == "ar":
        raise InputError(f"--stop-rule {rule} is how a head stops a drafter's rounds, and --method ar drafts nothing; "
                         "give one")
    if rule is not None and args.k is not None:
        raise InputError(f"--stop-rule {rule} lets a head choose each round's length, and --k {args.k} fixes it; "
                         "give one")
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


def run(args) -> None:
    """`specdraft generate` on parsed arguments (pipelines/generate_args.py)."""
    from specdraft.decoding.bundle.directory import load_bundle

    bundle_dir = bundle_of(args, warn=lambda msg: print(msg, file=sys.stderr))
    if bundle_dir is None and args.target is None:
        raise InputError("give a bundle directory (specdraft generate BUNDLE ...), or --target DIR with --drafter DIR")
    if bundle_dir is None and args.drafter is None and args.method != "ar":
        raise InputError("without a bundle, name the drafter directory (--drafter DIR) or decode with --method ar")
    check_machine(args)
    out_path = check_output(args.output, args.prompts)
    b = load_bundle(bundle_dir) if bundle_dir is not None else None  # read (and verified) once
    settings = settings_from(args, b.defaults if b is not None else DEFAULTS, b is not None)
    args.dtype = args.dtype or (b.spec.target.dtype if b is not None else "auto")  # the bundle's, as its stages ran
    if args.verbose:
        print(choose_dtype(args.dtype, None if args.device_map else args.device).line(), file=sys.stderr)
    if b is not None:
        check_choice(args, b)
    messages = read_prompts(args.prompts) if args.prompts else [user_turn(args.prompt)]
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
    choices = choose_drafters(args, b, target, requests)
    plans: dict[str, Plan] = {}
    results: dict[int, tuple[GenerationResult, Plan]] = {}
    eos = end_of_turn_ids(tok, target)
    compiler = StepCompiler(settings.compile)  # one for the command: each graph compiles once
    from tqdm import tqdm

    longest = max(len(r.ids) for r in requests)  # every drafter's table priced for the same decodes: one key
    with tqdm(total=len(requests), desc="generate", unit="prompt", file=sys.stderr,
              disable=args.prompts is None) as bar:
        for name in dict.fromkeys(choices):  # by drafter, in order of first use: each loads once
            group = [r for r, c in zip(requests, choices) if c == name]
            if name not in plans:
                plans[name] = make_plan(args, b, name, target, tok, settings,
                                        note=lambda msg: bar.write(msg, file=sys.stderr),
                                        longest_prompt=longest)
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


def check_machine(args) -> None:
    """The devices (auto resolved in place) and a dtype given are ones this machine runs, checked before the
    bundle is read or any model loads (decoding/bundle/loading.py: `check_device`, `choose_dtype`)."""
    from specdraft.core.devices import resolve_device

    args.device = check_device(resolve_device(args.device))
    if args.drafter_device is not None:
        args.drafter_device = check_device(resolve_device(args.drafter_device), "--drafter-device")
    if args.dtype is not None:
        choose_dtype(args.dtype, None if args.device_map else args.device)


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


def choose_drafters(args, b, target, requests: list[Request]) -> list[str]:
    """The drafter each prompt decodes with: --drafter, else the bundle's router, else its all-domain
    drafter; "target" for --method ar."""
    if args.method == "ar":
        return ["target"] * len(requests)
    if args.drafter is not None:
        return [args.drafter] * len(requests)
    router_name = None if args.router == "none" else (args.router or b.default_router())
    if router_name is None:
        return [b.general_drafter()] * len(requests)
    from specdraft.routers.router import load_router

    router = load_router(b.routers[router_name].path, target.get_input_embeddings(), b.tokenizer_sha256)
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
        dft, head, hcfg = load_drafter_dir(name, args.target, tok, target, args.head, dtype_of(target), device)
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
    lockstep = args.batch_size > 1  # a batch stops drafting together (the same decisions at batch 1)
    if b is not None:
        spec = b.policy_spec(name, head_name if args.k is None else None, args.k, args.threshold,
                             table.max_drafts if table is not None else None, lockstep)
    elif args.k is None and head is not None:
        spec = head_spec(args.threshold, hcfg, DEFAULTS.k_max, lockstep)
    else:
        spec = PolicySpec("fixed", k=args.k if args.k is not None else DEFAULTS.k)
    policy = lambda: build_policy(spec, head=head, table=table, prior=prior)  # noqa: E731  (fresh per decode)
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
    and cached (decoding/costs/profile.py); with `head` and `prior`, the head rules' own work priced on top
    (`price_head_rules`, cached with the table)."""
    from specdraft.decoding.costs.profile import LOOP_SPAN, cache_length_for, cached_cost_table
    from specdraft.decoding.rounds.shapes import static_length

    k_max = int((head_config or {}).get("k_max") or DEFAULTS.k_max)
    sizes = sorted({1, args.batch_size})
    # timed over a context of the longest prompt rounded up as caches are (64 tokens): starts whose prompts round
    # alike share one table, and drafters of one shape share it within a start (the table is per shape, not weights)
    context = static_length(longest_prompt)
    # calibrated: the loop's own work per round and per draft is part of what a longer round costs
    # over the cache the command's decodes allocate (its steps attend over every slot; cached per length), with
    # room for the calibration's decodes of LOOP_SPAN new tokens
    slots = cache_length_for(context, max(settings.max_new_tokens, LOOP_SPAN), k_max, settings.compile)
    # 3 timed passes, not predict's 5: a decoder start waits for them, and its rule compares costs with costs
    table, path, hit = cached_cost_table(target, drafter, sizes, k_max + 1, settings.compile, calibrate=True, on_wait=note,
                                         repeats=START_REPEATS, head=head, prior=prior, context=context,
                                         cache_length=slots)
    note(f"cost table {'read from' if hit else 'profiled into'} {path}")
    if args.verbose:
        note(table.render())
        if table.extends_prefill(table.cache_length):  # the calibration's prompts, near the cache's length, reach there
            note(f"note: prefills past {table.prefill_widths[-1]} positions (up to the cache's {table.cache_length}) "
                 "are priced by extending the two widest timed ones linearly; the stop rule reads round costs only")
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
