"""`specdraft generate`: one prompt through the decoder, from a bundle or from model directories.

  specdraft generate runs/demo/bundle --drafter math --prompt "Question: ..."
  specdraft generate --target DIR --drafter DIR [--head DIR] --prompt "..." [--k 4 | --threshold 0.7]

With a head (the drafter's default head in a bundle, or --head) the round length follows SpecDec++;
`--k` forces fixed-K drafting; `--method ar` decodes with the target alone. `--drafts K` (K > 1) decodes
with SpecTr: K i.i.d. drafts per round verified as a tree with k-Seq selection (default: the bundle's
`decoding.drafts`, else 1). `--cascade RULE --alpha A` runs a speculative cascade or a sequential
baseline instead (decoding/cascades.py; block size --k, 5 by default; needs --temperature > 0); a bundle
whose decoding defaults name a cascade runs it when sampling (not under greedy decoding) unless
`--cascade none`. Prints the text and one line of metrics. The same pieces are the function API:
`load_pair` + `generate_text`. The prompt is one user turn, formatted as the bundle was trained (the
target's chat template unless the run chose otherwise); `--raw-prompt` feeds the text as is and
`--system-prompt TEXT` adds a system turn.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import torch

from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.decoding.chat import ChatFormat, end_of_turn_ids, format_prompt, user_turn
from specdraft.decoding.compat import check_head, check_pair
from specdraft.core.tokenizers import check_same_vocabulary
from specdraft.core.errors import InputError
from specdraft.decoding.generate_args import add_arguments, bundle_of
from specdraft.decoding.loading import load_causal_lm, load_tokenizer
from specdraft.decoding.sampling import SamplingConfig
from specdraft.decoding.multi_draft import check_drafts, drafter_speculator
from specdraft.decoding.speculative import generate_speculative
from specdraft.decoding.stopping import FixedK, SpecDecPP


def load_pair(bundle: str | None = None, target: str | None = None, drafter: str | None = None,
              head: str | None = None, device: str = "cpu", dtype: str = "auto", device_map=None,
              drafter_device: str | None = None, sampling: SamplingConfig | None = None):
    """-> (tokenizer, target model, drafter model, head module or None, head config or None).

    From a bundle without an explicit head: the drafter's best head labelled under `sampling` (when
    given and the bundle has one), else its default head.

    The target may be spread over GPUs (device_map="auto" or a map); the drafter and head sit on
    `drafter_device` (default: `device`)."""
    drafter_device = drafter_device or device
    if bundle is not None:
        from specdraft.decoding.bundle import load_bundle

        b = load_bundle(bundle)
        name = drafter or next(iter(b.drafters))
        tok = b.load_tokenizer()
        tgt = b.load_target(dtype=dtype, device=None if device_map else device, device_map=device_map)
        if name in b.eagle:  # an EAGLE drafter: the target's own embedding and LM head, no SpecDec++ head
            return tok, tgt, b.load_eagle(name, tgt, device=drafter_device), None, None
        dft = b.load_drafter(name, device=drafter_device, target=tgt)
        if head is None and sampling is not None:
            head = b.head_for(name, sampling)
        h, hcfg = (b.load_head(name, head, device=drafter_device) if b.drafter(name).head or head else (None, None))
        return tok, tgt, dft, h, hcfg
    if target is None or drafter is None:
        raise InputError("give --bundle DIR, or both --target DIR and --drafter DIR")
    from specdraft.decoding.eagle_model import is_eagle_dir, load_eagle, target_dir_hash

    tok = load_tokenizer(target)
    if is_eagle_dir(drafter):  # an EAGLE drafter speaks the target's tokenizer (its embedding and LM head)
        tgt = load_causal_lm(target, dtype, None if device_map else device, device_map)
        return tok, tgt, load_eagle(drafter, tgt, target_dir_hash(target), drafter_device), None, None
    dtok = load_tokenizer(drafter)
    check_same_vocabulary(None, None, dtok, tok, name=f"drafter '{drafter}'")
    tgt = load_causal_lm(target, dtype, None if device_map else device, device_map)
    dft = load_causal_lm(drafter, dtype, drafter_device)
    check_pair(tgt, dft)
    h = hcfg = None
    if head is not None:
        from specdraft.decoding.acceptance_head import load_head

        h, hcfg = load_head(head, expected_hidden_size=dft.config.hidden_size)
        h = h.to(drafter_device)
        check_head(h, dft)
    return tok, tgt, dft, h, hcfg


def generate_text(tok, target, drafter, prompt: str, max_new_tokens: int = 64, sampling=SamplingConfig(0.0),
                  head=None, threshold: float | None = None, k: int | None = None, k_max: int = 20,
                  method: str = "speculative", seed: int = 0, drafts: int = 1, cascade=None,
                  tree=None, chat: ChatFormat = ChatFormat()) -> tuple[str, dict]:
    """Decode one prompt -> (text, metrics summary). drafts > 1: SpecTr with that many drafts per round;
    cascade: a decoding.cascades.CascadeMethod; tree: an EAGLE drafter's decoding.eagle.TreeShape (None:
    chain drafts); chat: how the prompt is formatted (the bundle's format: the tokenizer's chat template
    unless the run chose otherwise)."""
    from specdraft.decoding.eagle import EagleSpeculator
    from specdraft.decoding.eagle_model import EagleDrafter

    check_drafts(drafts)
    ids = format_prompt(tok, user_turn(prompt), chat)
    eos = end_of_turn_ids(tok, target)
    gen = torch.Generator().manual_seed(seed)
    if cascade is not None and method != "ar":
        res = cascade.generate(target, drafter, ids, max_new_tokens, sampling, k or 5, eos, gen)
    elif method == "ar":
        res = generate_autoregressive(target, ids, max_new_tokens, sampling, eos, gen)
    elif method == "speculative":
        stopping = SpecDecPP(head, threshold, k_max) if head is not None and k is None else FixedK(k or 4)
        if isinstance(drafter, EagleDrafter):
            if drafts != 1 or cascade is not None:
                raise InputError("an EAGLE drafter drafts one chain or its own tree; leave out --drafts / --cascade")
            speculator = EagleSpeculator(drafter, stopping, tree)
        else:
            speculator = drafter_speculator(drafter, stopping, drafts)
        res = generate_speculative(target, speculator, ids, max_new_tokens, sampling, eos_token_id=eos,
                                   generator=gen)
    else:
        raise InputError(f"unknown method {method!r}; use speculative or ar")
    return tok.decode(res.tokens, skip_special_tokens=True), res.metrics.summary()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="specdraft generate", description=__doc__.split("\n")[0])
    add_arguments(p)
    run(p.parse_args(argv))
    return 0


def cascade_from(args):
    """--cascade/--alpha, else the bundle's default cascade, else None."""
    from specdraft.decoding.cascades import cascade_method

    if args.cascade == "none":
        return None
    if args.cascade is not None:
        if args.alpha is None:
            raise InputError(f"--cascade {args.cascade} needs --alpha (the lenience; e.g. --alpha 0.3)")
        return cascade_method(args.cascade, args.alpha, args.beta)
    if args.alpha is not None:
        raise InputError("--alpha is only read with --cascade RULE; add one (e.g. --cascade token)")
    if args.bundle is not None:  # load_pair verifies the bundle's files next
        from specdraft.decoding.cascades import method_from_spec

        return method_from_spec(_bundle_decoding(args.bundle).get("cascade"), "the bundle's decoding.cascade")
    return None


def run(args) -> None:
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p)
    args.bundle = bundle_of(args, warn=lambda msg: print(msg, file=sys.stderr))
    cascade = cascade_from(args)  # bad cascade settings fail before any model is loaded
    if cascade is not None and args.cascade is None and sampling.greedy:
        print(f"note: the bundle's default cascade ({cascade.label}) needs temperature > 0; decoding without it")
        cascade = None
    if cascade is not None and args.method != "ar":
        from specdraft.decoding.cascades import check_sampling

        check_sampling(sampling)
    tok, tgt, dft, head, hcfg = load_pair(args.bundle, args.target, args.drafter, args.head, args.device, args.dtype,
                                         args.device_map, args.drafter_device, sampling)
    if head is not None and hcfg is not None:
        lt = hcfg.get("label_transform", {})
        if lt and not sampling.matches(lt):
            print(f"note: the head was trained on labels at {lt}; decoding at temperature={sampling.temperature} "
                  f"top_k={sampling.top_k} top_p={sampling.top_p} (SpecDec++ thresholds may transfer poorly)")
    drafts = args.drafts
    if drafts is None:
        drafts = int(_bundle_decoding(args.bundle).get("drafts", 1)) if args.bundle else 1
    threshold = args.threshold if args.threshold is not None else (hcfg or {}).get("threshold", 0.7)
    text, metrics = generate_text(tok, tgt, dft, args.prompt, args.max_new_tokens, sampling, head, threshold, args.k,
                                  (hcfg or {}).get("k_max", 20) or 20, args.method, args.seed, drafts=drafts,
                                  cascade=cascade, tree=eagle_tree(args) if _is_eagle(dft) else None,
                                  chat=chat_from(args))
    print(text)
    keys = ("N", "N_target", "N_draft", "N_discarded", "MAT", "discard_rate", "verification_rate", "tokens_per_s")
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items() if k in keys}))


def _is_eagle(drafter) -> bool:
    return getattr(getattr(drafter, "config", None), "model_type", None) == "eagle"


def eagle_tree(args):
    """--eagle-tree: "none" -> chain drafts; "D,K,M" -> that EAGLE-2 tree; "bundle" (default) -> the bundle's
    tree for its EAGLE drafter, else chain drafts."""
    from specdraft.decoding.eagle import TreeShape

    spec = getattr(args, "eagle_tree", "bundle")
    if spec == "none":
        return None
    if spec == "bundle":
        if args.bundle is None:
            return None
        from specdraft.decoding.bundle import load_bundle

        entry = load_bundle(args.bundle, verify=False).eagle.get(args.drafter)
        return TreeShape(**entry.tree) if entry is not None and entry.tree else None
    try:
        depth, top_k, nodes = (int(x) for x in spec.split(","))
    except ValueError:
        raise InputError(f"--eagle-tree {spec!r}: give DEPTH,TOP_K,NODES (e.g. 4,4,16), none or bundle") from None
    return TreeShape(depth, top_k, nodes)


def chat_from(args) -> ChatFormat:
    """The bundle's prompt format (or the tokenizer's template without a bundle), with --raw-prompt and
    --system-prompt applied on top."""
    chat = _bundle_chat(args.bundle) if args.bundle is not None else ChatFormat()
    if args.raw_prompt:
        chat = dataclasses.replace(chat, plain=True)
    if args.system_prompt is not None:
        chat = dataclasses.replace(chat, system_prompt=args.system_prompt or None)
    return chat


def _bundle_chat(bundle: str) -> ChatFormat:
    from specdraft.decoding.bundle import load_bundle

    return load_bundle(bundle, verify=False).chat


def _bundle_decoding(bundle: str) -> dict:
    from specdraft.decoding.bundle import load_bundle

    return load_bundle(bundle, verify=False).decoding
