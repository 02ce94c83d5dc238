"""Stage `train-router`: the routing baselines of MetaSD §4.3, which pick one drafter per prompt.

Both routers read the target's input embeddings mean-pooled over the prompt (routers/router.py says why).

Which drafters a router chooses among: the *specialised* drafters only (a non-empty strict subset of
the training domains). MetaSD's MoE-routing baseline routes among the domain experts; the OFA drafter
(trained on every domain) is the single-drafter baseline that routing is compared with, and the
general-only `base` drafter is no serving drafter at all. With acceptance labels OFA, trained on five
times the data, may beat the experts on many prompts, and a router that learned to answer "OFA" would
no longer be a routing baseline. The OFA drafter's acceptance is reported beside the routers instead.

  1. per training prompt, the acceptance 1 - TV(p, q) at T=1 of each specialised drafter, teacher-forced
     on that prompt's self-distilled responses (distill_data train, every temperature; the target runs
     once per batch, shared by all drafters); train_router.label_prompts caps how many prompts
  2. labels: `acceptance` = the drafter with the highest measured acceptance on the prompt;
     `domain` = the prompt's domain drafter (the specialised drafter with the fewest domains covering it)
  3. the classifier (routers/lit_router.py) trains on pooled embeddings; the centroid router fits one
     centroid per domain that has a drafter
  4. evaluation per prompt set: dev (distill_data dev responses), perturbed and ood (when present;
     they have no self-distilled responses, so the target answers them here, greedily, with
     distill_data.max_new_tokens). Per router: accuracy against the acceptance-best drafter and against
     the domain drafter, the mean acceptance of the routed drafter, next to the per-prompt oracle, the
     true-domain drafter and the OFA drafter(s)

Writes router/
  classifier/   router.safetensors + router_config.json (drafters, embedding size, label kind,
                target tokenizer fingerprint, metrics)
  centroid/     the same for the centroid router (+ domains and their drafters)
  eval.json     label statistics and every evaluation number above
"""
from __future__ import annotations

import json
from collections import Counter

import torch

from specdraft.data.chat import chat_format, row_messages
from specdraft.data.prompts import load_prompt_sets
from specdraft.decoding.bundle.chat import ChatFormat, end_of_turn_ids, format_prompt
from specdraft.core.tokenizers import tokenizer_fingerprint
from specdraft.core.devices import resolve_device
from specdraft.core.errors import InputError
from specdraft.core.hashing import derive_seed
from specdraft.decoding.bundle.loading import dtype_of, load_causal_lm, load_drafter, load_tokenizer
from specdraft.drafters.alignment import position_acceptance
from specdraft.drafters.data import CausalLMCollator
from specdraft.drafters.roles import DrafterRoles, drafter_roles
from specdraft.routers.lit_router import train_classifier
from specdraft.routers.router import CentroidRouter, Router, mean_pooled, save_router
from specdraft.data.prompts import fit_prompt
from specdraft.data.generation import generate_responses
from specdraft.pipelines.readers import load_distill_data, read_drafter_info
from specdraft.pipelines.stage import Context
from specdraft.pipelines.readers import BASE

POOLING = "mean of the target's input embeddings over the prompt tokens"


def routing_roles(infos: dict[str, dict], train_domains: list[str]) -> DrafterRoles:
    """The serving drafters' roles (drafter.json domains; `base` serves nothing); at least 2 to route among."""
    roles = drafter_roles({n: i["domains"] for n, i in infos.items() if n != BASE}, train_domains)
    if len(roles.special) < 2:
        raise InputError(f"train-router needs at least 2 specialised drafters to route among, found {roles.special}; "
                         "train one drafter per domain (train_drafters.drafters) or drop train-router from run.stages")
    return roles


def prompt_acceptance(target, drafters: dict[str, torch.nn.Module], rows: list[dict], pad_token_id: int,
                      batch_size: int, max_length: int | None) -> tuple[list[dict], torch.Tensor]:
    """Teacher-forced acceptance 1 - TV(p, q) at T=1 per prompt and drafter.

    rows: {"prompt_id", "domain", "prompt_ids", "response_ids"}; a prompt may have several responses
    (one per distillation temperature), whose positions are pooled. Returns (one row per prompt, in
    order of first appearance, with its "prompt_ids"; acceptance (P, len(drafters)) float64).
    """
    prompts: dict[str, dict] = {}
    for r in rows:
        prompts.setdefault(r["prompt_id"], {"prompt_id": r["prompt_id"], "domain": r["domain"],
                                            "prompt_ids": list(r["prompt_ids"])})
    index = {pid: i for i, pid in enumerate(prompts)}
    sums = torch.zeros(len(prompts), len(drafters), dtype=torch.float64)
    counts = torch.zeros(len(prompts), dtype=torch.float64)
    collate = CausalLMCollator(pad_token_id=pad_token_id, max_length=max_length)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]["prompt_ids"]) + len(rows[i]["response_ids"]))
    for start in range(0, len(order), batch_size):  # length-sorted batches: little padding
        chunk = [rows[i] for i in order[start:start + batch_size]]
        batch = collate([{"prompt_ids": r["prompt_ids"], "response_ids": r["response_ids"]} for r in chunk])
        owner = torch.tensor([index[r["prompt_id"]] for r in chunk]).repeat_interleave(batch["loss_mask"].sum(1))
        counts.index_add_(0, owner, torch.ones(len(owner), dtype=torch.float64))
        sums.index_add_(0, owner, position_acceptance(target, drafters, batch)[0])  # (N, D) 1 - TV per position
    if (counts == 0).any():
        empty = [pid for pid, c in zip(prompts, counts.tolist()) if c == 0]
        raise InputError(f"prompt {empty[0]} has no response tokens to measure acceptance on ({len(empty)} such); "
                         "rebuild distill-data")
    return list(prompts.values()), sums / counts[:, None]


def label_rows(rows: list[dict], label_prompts: int | None, seed: int) -> list[dict]:
    """The rows of the training prompts to label: all, or those of `label_prompts` prompts chosen by a seeded hash
    (every response of a chosen prompt), in their original order."""
    prompts = sorted({r["prompt_id"] for r in rows}, key=lambda p: derive_seed(seed, "router", p))
    if label_prompts is None or label_prompts >= len(prompts):
        return rows
    chosen = set(prompts[:label_prompts])
    return [r for r in rows if r["prompt_id"] in chosen]


def greedy_rows(target, tok, prompts, dcfg, seed: int, chat: ChatFormat = ChatFormat()) -> list[dict]:
    """The target's greedy answer to each prompt-set row, in the layout of distill_data rows."""
    rows = []
    for b in range(0, len(prompts), dcfg.batch_size):
        batch = prompts[b:b + dcfg.batch_size]
        ids = [fit_prompt(format_prompt(tok, row_messages(r), chat), dcfg.max_prompt_tokens, "truncate", r["id"])[0]
               for r in batch]
        gens = generate_responses(target, ids, tok.pad_token_id, end_of_turn_ids(tok, target), 0.0, 0, 1.0, dcfg.max_new_tokens, seed)
        rows += [{"prompt_id": r["id"], "domain": r["domain"], "prompt_ids": p, "response_ids": resp}
                 for r, p, (resp, _) in zip(batch, ids, gens)]
    return rows


def evaluate(routers: dict[str, Router], pooled: torch.Tensor, prompts: list[dict], acceptance: torch.Tensor,
             names: list[str], special: list[str], general: list[str], by_domain: dict[str, str]) -> dict:
    """Routing quality on one prompt set; acceptance (P, len(names)) per prompt and drafter."""
    col = {n: j for j, n in enumerate(names)}
    sp = acceptance[:, [col[n] for n in special]]  # (P, S)
    best = [special[j] for j in sp.argmax(-1).tolist()]
    dom = [by_domain.get(p["domain"]) for p in prompts]
    has_dom = [d is not None for d in dom]
    rows = range(len(prompts))

    def mean(xs):
        xs = list(xs)
        return round(sum(xs) / len(xs), 4) if xs else None

    out = {"prompts": len(prompts), "best_counts": dict(sorted(Counter(best).items())),
           "oracle_acceptance": mean(sp.max(-1).values.tolist()),
           "drafter_acceptance": {n: mean(acceptance[:, col[n]].tolist()) for n in names},
           "domain_drafter_acceptance": mean(float(acceptance[i, col[dom[i]]]) for i in rows if has_dom[i]),
           "routers": {}}
    out["best_fixed"] = max(special, key=lambda n: out["drafter_acceptance"][n])  # best single drafter in hindsight
    for kind, router in routers.items():
        routed = router.pick(pooled)
        out["routers"][kind] = {
            "accuracy_vs_best": mean(float(r == b) for r, b in zip(routed, best)),
            "accuracy_vs_domain": mean(float(routed[i] == dom[i]) for i in rows if has_dom[i]),
            "acceptance": mean(float(acceptance[i, col[routed[i]]]) for i in rows),
            "routed_counts": dict(sorted(Counter(routed).items())),
        }
    out["general_acceptance"] = {n: out["drafter_acceptance"][n] for n in general}
    return out


def build(ctx: Context) -> dict:
    cfg, rcfg = ctx.cfg, ctx.cfg.train_router
    target_path = ctx.target_path()
    tok = load_tokenizer(target_path, cfg.target.trust_remote_code)
    device = resolve_device(rcfg.device)
    target = load_causal_lm(target_path, cfg.target.dtype, device, cfg.target.device_map, cfg.target.quantization,
                            cfg.target.trust_remote_code)
    embeddings = target.get_input_embeddings().weight.detach()

    distill = load_distill_data(ctx.input("distill-data"))
    train_rows = label_rows([dict(r) for r in distill["train"]], rcfg.label_prompts, cfg.run.seed)
    if not train_rows:
        raise InputError("distill_data has no train rows; the router needs labelled training prompts")
    train_domains = sorted({r["domain"] for r in train_rows})
    roles, models = load_routing_drafters(ctx.input("train-drafters"), train_domains, device, dtype_of(target),
                                          cfg.decoding.draft_weights)
    special, general, by_domain = roles.special, roles.general, roles.own
    names = special + general
    measure = dict(pad_token_id=tok.pad_token_id, batch_size=rcfg.label_batch_size,
                   max_length=cfg.train_drafters.finetune.max_length)

    # 1-2. labels on the training prompts
    print(f"[train-router] measuring {len(names)} drafters on {len(train_rows)} train responses "
          f"(routing among {', '.join(special)}; labels: {rcfg.labels})")
    train_prompts, train_acc = prompt_acceptance(target, models, train_rows, **measure)
    keep, labels = train_labels(train_prompts, train_acc, special, by_domain, rcfg.labels)
    train_pooled = mean_pooled(embeddings, [p["prompt_ids"] for p in train_prompts])
    label_counts = dict(sorted(Counter(special[i] for i in labels.tolist()).items()))
    print(f"[train-router] {len(keep)} labelled train prompts: {label_counts}")

    sets = evaluation_sets(ctx, target, tok, models, distill, measure)
    pooled = {s: mean_pooled(embeddings, [p["prompt_ids"] for p in ps]) for s, (ps, _) in sets.items()}

    # 3. the two routers
    val = None
    if "dev" in sets:
        dev_prompts, dev_acc = sets["dev"]
        dev_keep, dev_labels = train_labels(dev_prompts, dev_acc, special, by_domain, rcfg.labels)
        val = (pooled["dev"][dev_keep], dev_labels)
    classifier, train_stats = train_classifier(train_pooled[keep], labels, special, ctx.work / "classifier",
                                               rcfg.train, rcfg.hidden, rcfg.lr, val=val, seed=cfg.run.seed)
    routers: dict[str, Router] = {"classifier": classifier,
                                  "centroid": fit_centroid(embeddings, train_pooled, train_prompts, by_domain,
                                                           train_domains)}

    # 4. evaluation
    results = {s: evaluate(routers, pooled[s], ps, acc, names, special, general, by_domain)
               for s, (ps, acc) in sets.items()}
    train_eval = evaluate(routers, train_pooled, train_prompts, train_acc, names, special, general, by_domain)
    report = {"label_kind": rcfg.labels, "drafters": special, "general_drafters": general,
              "domain_drafters": by_domain, "pooling": POOLING,
              "train": {"prompts": len(train_prompts), "labelled": len(keep), "label_counts": label_counts,
                        "classifier": train_stats, **{k: train_eval[k] for k in ("oracle_acceptance", "best_fixed")},
                        "routers": train_eval["routers"]},
              "sets": results}
    write_routers(ctx, tok, routers, report, train_stats)
    print("[train-router] routing on prompt sets (acceptance = mean 1 - TV of the chosen drafter at T=1)\n"
          + router_table(results))
    return {"label_kind": rcfg.labels, "drafters": special, "label_counts": label_counts, "classifier": train_stats,
            "eval": {s: {k: {m: v for m, v in r.items() if m != "routed_counts"} for k, r in res["routers"].items()}
                     for s, res in results.items()}}


def load_routing_drafters(drafters_dir, train_domains: list[str], device, dtype: str,
                          draft_weights: str) -> tuple[DrafterRoles, dict[str, torch.nn.Module]]:
    """The serving drafters' roles, and the specialised and general drafters themselves (in that order)."""
    infos = {p.name: read_drafter_info(p) for p in sorted(drafters_dir.iterdir()) if (p / "drafter.json").is_file()}
    roles = routing_roles(infos, train_domains)
    names = roles.special + roles.general
    # in the target's precision and the served weights, as the decoder runs the pair (the labels are the served
    # acceptance)
    return roles, {n: load_drafter(drafters_dir / n, dtype, device, draft_weights).eval() for n in names}


def train_labels(prompts: list[dict], acceptance: torch.Tensor, special: list[str], by_domain: dict[str, str],
                 kind: str) -> tuple[list[int], torch.Tensor]:
    """(the prompts that get a label, their labels as indices into `special`): with `acceptance` labels every
    prompt's most accepted specialised drafter; with `domain` labels the domain drafter of each prompt whose
    domain has one."""
    if kind == "acceptance":
        return list(range(len(prompts))), acceptance[:, :len(special)].argmax(-1)
    keep = [i for i, p in enumerate(prompts) if p["domain"] in by_domain]
    return keep, torch.tensor([special.index(by_domain[prompts[i]["domain"]]) for i in keep], dtype=torch.long)


def evaluation_sets(ctx: Context, target, tok, models: dict[str, torch.nn.Module], distill,
                    measure: dict) -> dict[str, tuple[list[dict], torch.Tensor]]:
    """Set -> (prompts, acceptance per prompt and drafter): dev from distill_data's responses; perturbed and
    ood answered here by the target, greedily."""
    cfg = ctx.cfg
    sets: dict[str, tuple[list[dict], torch.Tensor]] = {}
    if "dev" in distill and len(distill["dev"]):
        sets["dev"] = prompt_acceptance(target, models, [dict(r) for r in distill["dev"]], **measure)
    prompt_sets = load_prompt_sets(ctx.input("prepare-data"))
    for split in ("perturbed", "ood"):
        if split in prompt_sets and len(prompt_sets[split]):
            rows = greedy_rows(target, tok, [dict(r) for r in prompt_sets[split]], cfg.distill_data, cfg.run.seed,
                               chat_format(cfg.prompts))
            sets[split] = prompt_acceptance(target, models, rows, **measure)
    return sets


def fit_centroid(embeddings: torch.Tensor, train_pooled: torch.Tensor, train_prompts: list[dict],
                 by_domain: dict[str, str], train_domains: list[str]) -> CentroidRouter:
    """One centroid per training domain that has a drafter, over its prompts' pooled embeddings."""
    domains = sorted(d for d in by_domain if d in train_domains)
    rows = [i for i, p in enumerate(train_prompts) if p["domain"] in by_domain]
    return CentroidRouter(embeddings.shape[1], domains, [by_domain[d] for d in domains]).fit(
        train_pooled[rows], [train_prompts[i]["domain"] for i in rows])


def write_routers(ctx: Context, tok, routers: dict[str, Router], report: dict, train_stats: dict) -> None:
    """eval.json, and each router with its config (label kind, tokenizer fingerprint, its metrics per set)."""
    (ctx.out / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    fingerprint = tokenizer_fingerprint(tok)
    for kind, router in routers.items():
        metrics = {s: r["routers"][kind] for s, r in report["sets"].items()}
        save_router(router, ctx.out / kind, {"label_kind": report["label_kind"], "tokenizer_fingerprint": fingerprint,
                                             "pooling": POOLING, "metrics": metrics,
                                             **({"train": train_stats} if kind == "classifier" else {})})


def router_table(results: dict[str, dict]) -> str:
    def f(x):
        return f"{x:.4f}" if x is not None else "-"

    lines = [f"{'set':<10}{'router':<12}{'acc/best':>9}{'acc/dom':>9}{'accept':>8}{'oracle':>8}{'domain':>8}"
             f"{'general':>9}"]
    for s, r in results.items():
        gen = max(r["general_acceptance"].values()) if r["general_acceptance"] else None
        for kind, m in r["routers"].items():
            lines.append(f"{s:<10}{kind:<12}{f(m['accuracy_vs_best']):>9}{f(m['accuracy_vs_domain']):>9}"
                         f"{f(m['acceptance']):>8}{f(r['oracle_acceptance']):>8}{f(r['domain_drafter_acceptance']):>8}"
                         f"{f(gen):>9}")
    return "\n".join(lines)


if __name__ == "__main__":
    from specdraft.pipelines.cli import stage_main

    stage_main("train-router")
