"""`specdraft predict BUNDLE`: served throughput per batch size predicted before deployment, from the
bundle's acceptance summary (decoding/throughput.py) and the decoder's cost table on this device
(decoding/cost_profile.py: profiled here, or read from the on-disk cache a previous start left, or from
--cost-table FILE). Nothing is decoded: the prediction is a simulation of rounds priced with measured
step times (docs/decoder.md, "Predicting served throughput").

  specdraft predict runs/demo/bundle [--batch-sizes 1,2,4,8,16,32,64] [--device cpu] [--compile none]
      [--drafter NAME] [--cost-table FILE] [--cache-dir DIR] [--refresh] [--rounds 200] [--seed 0] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdraft.core.errors import InputError

DEFAULT_BATCH_SIZES = "1,2,4,8,16,32,64"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options (no heavy imports: `specdraft predict --help` answers at once)."""
    p.add_argument("bundle", help="an exported bundle directory (runs/<run>/bundle)")
    p.add_argument("--batch-sizes", default=DEFAULT_BATCH_SIZES, help=f"comma-separated (default {DEFAULT_BATCH_SIZES})")
    p.add_argument("--device", default="auto", help="where the cost table is measured: cpu, cuda, auto (default)")
    p.add_argument("--compile", default="none", help="the decoder's compile mode to price: none (default), default, "
                                                     "reduce-overhead")
    p.add_argument("--drafter", default=None, help="the drafter to predict for (default: the all-domain drafter)")
    p.add_argument("--cost-table", default=None, metavar="FILE",
                   help="a saved cost table (CostTable JSON) instead of profiling here")
    p.add_argument("--cache-dir", default=None, help="the cost-table cache (default $SPECDRAFT_COST_CACHE or "
                                                     "~/.cache/specdraft/cost_tables)")
    p.add_argument("--refresh", action="store_true", help="re-profile even when the cache holds a table")
    p.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                   help="time the model steps only, not the decode loop's own work per round (faster, less exact)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per step shape (median; default 5)")
    p.add_argument("--rounds", type=int, default=200, help="simulated rounds per (method, batch size) (default 200)")
    p.add_argument("--seed", type=int, default=0, help="seeds the simulated acceptance draws (default 0)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the prediction and the cost table as JSON")


def parse_batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--batch-sizes must be comma-separated integers, got {text!r}") from None
    if not sizes or any(b < 1 for b in sizes):
        raise InputError(f"--batch-sizes must be integers >= 1, got {text!r}")
    return sorted(set(sizes))


def run(args: argparse.Namespace) -> dict:
    import torch

    from specdraft.core.devices import resolve_device
    from specdraft.decoding.defaults import COMPILE_MODES
    from specdraft.decoding.bundle.directory import load_bundle
    from specdraft.decoding.cost_profile import cached_cost_table
    from specdraft.decoding.policies.cost_model import CostTable
    from specdraft.decoding.throughput import predict_throughput, render_prediction

    sizes = parse_batch_sizes(args.batch_sizes)
    if args.compile not in COMPILE_MODES:
        raise InputError(f"--compile must be one of {', '.join(COMPILE_MODES)}, got {args.compile!r}")
    bundle = load_bundle(args.bundle)
    with_summary = [n for n, d in bundle.drafters.items() if d.acceptance is not None]
    name = args.drafter
    if name is None:  # the all-domain drafter when it has a summary, else the first that has one
        general = bundle.general_drafter() if bundle.drafters else None
        name = general if general in with_summary or not with_summary else with_summary[0]
    entry = bundle.drafter(name)
    if entry.acceptance is None:
        raise InputError(f"drafter '{name}' has no acceptance summary in the bundle "
                         + (f"(drafters with one: {', '.join(with_summary)}; pick one with --drafter)" if with_summary
                            else "(exported before train-heads wrote it); re-run train-heads and export with --force"))
    summary = bundle.acceptance_summary(name)
    prior = bundle.prior_for(name, summary=summary)
    k_max = min(bundle.defaults.k_max, summary.k_max)
    if args.cost_table is not None:
        table = CostTable.load(args.cost_table)
        source = f"from {args.cost_table}"
    else:
        device = resolve_device(args.device)
        target = bundle.load_target(device=device)
        drafter = bundle.load_drafter(name, device=device, target=target)
        # the drafter's default head (the summary's): its forward and each rule's decisions priced in the table
        head = bundle.load_head(name, device=device)[0] if entry.head is not None else None
        # the k_max the policies run at, and fixed K up to 8: the widest verify the prediction prices
        table, path, hit = cached_cost_table(target, drafter, sizes, max(k_max, 8) + 1, args.compile,
                                             repeats=args.repeats, seed=args.seed, directory=args.cache_dir,
                                             refresh=args.refresh, calibrate=args.calibrate, head=head,
                                             prior=prior, threshold=summary.threshold)
        source = f"{'cached' if hit else 'profiled'}: {path}"
        del target, drafter
    result = predict_throughput(summary, table, sizes, prior, min(k_max, table.max_drafts),
                                args.rounds, args.seed)
    result.update(drafter=name, head=summary.head, cost_table=table.as_dict(), cost_table_source=source,
                  torch_threads=torch.get_num_threads())
    print(f"drafter {name}, head {summary.head or '-'} (h = {summary.threshold:g}; {summary.dev_sequences} dev "
          f"sequences, mean acceptance {summary.mean_accept:.3f}, mean head prediction {summary.mean_sigma:.3f})")
    print(f"{table.render()}\n({source})\n")
    print(render_prediction(result, table))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result
