"""`specdraft predict BUNDLE`: served throughput per batch size predicted before deployment, from the
bundle's acceptance summary (decoding/costs/throughput.py) and the decoder's cost table on this device
(decoding/costs/profile.py: profiled here, or read from the on-disk cache a previous start left, or from
--cost-table FILE). Nothing is decoded: the prediction is a simulation of rounds priced with measured
step times (docs/predict.md).

With --write-engine-config the K it recommends per batch size (the "K per B" column) goes into the bundle's
vllm/<drafter>/ configs as vLLM's `num_speculative_tokens_per_batch_size` (pipelines/vllm_export.py,
`engine_config_files`): the schedule export wrote from its own machine's table, rewritten for this device.

  specdraft predict runs/demo/bundle [--batch-sizes 1,2,4,8,16,32,64] [--device cpu] [--dtype auto] [--compile none]
      [--drafter NAME] [--cost-table FILE] [--cache-dir DIR] [--refresh] [--rounds 200] [--seed 0] [--json FILE]
      [--write-engine-config]
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
    p.add_argument("--device", default="auto", help="where the cost table is measured: cpu, cuda, cuda:N, auto (default)")
    p.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16", "float16"],
                   help="what the target and drafter run in (default: the bundle's target dtype, as its stages ran); "
                        "a table is per dtype: one profiled in another is never used")
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
    p.add_argument("--write-engine-config", action="store_true",
                   help="write the K per batch size into the bundle's vllm/<drafter>/ speculative configs (vLLM's "
                        "num_speculative_tokens_per_batch_size), priced for this device")


def parse_batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--batch-sizes must be comma-separated integers, got {text!r}") from None
    if not sizes or any(b < 1 for b in sizes):
        raise InputError(f"--batch-sizes must be integers >= 1, got {text!r}")
    return sorted(set(sizes))


def pick_drafter(bundle, name: str | None) -> str:
    """The drafter to predict for: `name`, or the all-domain drafter when it has an acceptance summary, else
    the first that has one; one line when the one picked has none (nothing to predict from)."""
    with_summary = [n for n, d in bundle.drafters.items() if d.acceptance is not None]
    if name is None:
        general = bundle.general_drafter() if bundle.drafters else None
        name = general if general in with_summary or not with_summary else with_summary[0]
    if bundle.drafter(name).acceptance is None:
        raise InputError(f"drafter '{name}' has no acceptance summary in the bundle "
                         + (f"(drafters with one: {', '.join(with_summary)}; pick one with --drafter)" if with_summary
                            else "(exported before train-heads wrote it); re-run train-heads and export with --force"))
    return name


def write_engine_config(bundle, name: str, ks: dict[int, int], table, summary, torch_threads: int | None) -> dict:
    """--write-engine-config: the K per batch size just predicted, as vLLM's schedule in the bundle's
    vllm/<name>/ configs, hashes kept (pipelines/vllm_export.py); printed, and returned for --json."""
    from specdraft.pipelines.vllm_export import (ENGINE_SCHEDULE, engine_config_files, rewrite_bundle_files,
                                                 schedule_device, schedule_ranges, schedule_tokens)

    changed = rewrite_bundle_files(bundle, engine_config_files(bundle, name, ks, table, summary, "specdraft predict",
                                                               torch_threads))
    ranges = schedule_ranges(ks)
    where = schedule_device(table, torch_threads)
    print(f"\nengine config: vllm/{name}/ serves K by batch size {ranges} (num_speculative_tokens "
          f"{schedule_tokens(ranges)}), priced on {where}; "
          + (f"rewrote {', '.join(changed)}" if changed else f"unchanged (already this schedule, {ENGINE_SCHEDULE} included)"))
    return {"num_speculative_tokens_per_batch_size": ranges, "device": where, "changed": changed}


def run(args: argparse.Namespace) -> dict:
    import torch

    from specdraft.core.devices import resolve_device
    from specdraft.decoding.defaults import COMPILE_MODES
    from specdraft.decoding.bundle.directory import load_bundle
    from specdraft.decoding.bundle.loading import check_device, choose_dtype
    from specdraft.decoding.costs.profile import cached_cost_table
    from specdraft.decoding.costs.model import CostTable
    from specdraft.decoding.costs.throughput import predict_throughput, render_prediction

    sizes = parse_batch_sizes(args.batch_sizes)
    if args.compile not in COMPILE_MODES:
        raise InputError(f"--compile must be one of {', '.join(COMPILE_MODES)}, got {args.compile!r}")
    device = check_device(resolve_device(args.device))  # before the bundle's hashes are read or any model loads
    if args.dtype is not None:
        choose_dtype(args.dtype, device)
    bundle = load_bundle(args.bundle)
    choice = choose_dtype(args.dtype or bundle.spec.target.dtype, device)
    name = pick_drafter(bundle, args.drafter)
    entry, summary = bundle.drafter(name), bundle.acceptance_summary(name)
    if args.write_engine_config:  # before minutes of profiling: a bundle with no configs to rewrite stops here
        from specdraft.pipelines.vllm_export import vllm_config_dir

        vllm_config_dir(bundle, name)
    prior = bundle.prior_for(name, summary=summary)
    k_max = min(bundle.defaults.k_max, summary.k_max)
    if args.cost_table is not None:
        table = CostTable.load(args.cost_table)
        table.check_dtype(choice.name, args.cost_table)  # a table of another dtype prices another decoder
        source = f"from {args.cost_table}"
    else:
        target = bundle.load_target(dtype=choice.name, device=device)
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
                  torch_threads=torch.get_num_threads(), dtype={"name": choice.name, "reason": choice.reason})
    print(f"drafter {name}, head {summary.head or '-'} (h = {summary.threshold:g}; {summary.dev_sequences} dev "
          f"sequences, mean acceptance {summary.mean_accept:.3f}, mean head prediction {summary.mean_sigma:.3f})")
    print(choice.line())
    print(f"{table.render()}\n({source})\n")
    print(render_prediction(result, table))
    if args.write_engine_config:
        threads = None if args.cost_table is not None else torch.get_num_threads()  # a saved table's are unknown
        result["engine_config"] = write_engine_config(bundle, name, result["k_per_batch_size"], table, summary, threads)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return result
