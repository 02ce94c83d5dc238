"""`specdraft`: run one stage, a whole run, or validate a config.

  specdraft <stage> FILE [--force] [key.path=value ...]      (or --config FILE, as the Slurm scripts write it)
  specdraft run FILE [--force] [--from STAGE] [key.path=value ...]
  specdraft validate FILE [key.path=value ...]
  specdraft generate BUNDLE (--prompt TEXT | --prompts FILE.jsonl) [...]      specdraft inspect-bundle BUNDLE
  specdraft predict BUNDLE [--batch-sizes 1,2,...,64] [--device ...] [--compile ...]
  specdraft export-paths BUNDLE      (after moving or copying a bundle: its vLLM configs name where it is now)

Building the parser imports nothing heavy (no torch, transformers or Lightning), so `--help` on any
command answers at once; each command imports what it needs when it runs.

Bad input (config errors, missing or corrupt artifacts, mismatched models) prints one line starting
with "specdraft: error:" and exits with code 2, before anything is written. Anything else prints one
"specdraft: internal error:" line and exits 1; `--debug` (or SPECDRAFT_DEBUG=1) shows tracebacks.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from specdraft.core.errors import InputError

EXIT_BAD_INPUT = 2


def _load(path: str | None, overrides: list[str]):
    from specdraft.pipelines.config import load_config
    from specdraft.pipelines.schema import RunConfig

    return load_config(RunConfig, path, overrides)


def _stage_config(args) -> tuple[str, list[str]]:
    """A stage takes its config first, as `run` and `validate` do, or as --config; every override has an '='."""
    rest = list(args.overrides)
    if args.config is None:
        if not rest or "=" in rest[0]:
            raise InputError(f"no config: name one first, e.g. `specdraft {args.stage} configs/demo.yaml "
                             f"[key.path=value ...]`")
        return rest[0], rest[1:]
    if rest and "=" not in rest[0]:
        raise InputError(f"two configs ({args.config} and {rest[0]}): give one, first or as --config")
    return args.config, rest


def _run_one(args) -> None:
    from specdraft.pipelines.stage import run_stage

    if getattr(args, "shard", None):
        from specdraft.pipelines.shards import parse_shard

        parse_shard(args.shard, "--shard")
        os.environ["SPECDRAFT_SHARD"] = args.shard  # where the stage (and its lock's name) reads its shard
    if getattr(args, "merge", False):
        os.environ["SPECDRAFT_MERGE"] = "1"
    cfg = _load(*_stage_config(args))
    run_stage(cfg, args.stage, force=args.force)


def _run_all(args) -> None:
    from specdraft.pipelines.stage import get_spec, run_stage, stage_dir, stage_names

    cfg = _load(args.config, args.overrides)
    names = stage_names(cfg)
    if args.start:
        get_spec(args.start)
        names = names[names.index(args.start):] if args.start in names else []
    for name in names:
        run_stage(cfg, name, force=args.force and (args.start is None or name == args.start))
    metrics = stage_dir(cfg, "evaluate") / "metrics.json"
    if metrics.is_file():
        import json

        from specdraft.pipelines.evaluate.render import headline

        print(headline(json.loads(metrics.read_text())))
        print(f"report: {metrics.parent.resolve() / 'report.md'}")
    print(f"run outputs: {Path(cfg.run.root).resolve()}")


def _validate(args) -> None:
    from specdraft.pipelines.config import to_dict
    from specdraft.pipelines.stage import stage_names

    cfg = _load(args.config, args.overrides)
    names = stage_names(cfg)
    print(f"{args.config}: ok ({len(to_dict(cfg))} sections; stages: {', '.join(names)})")


def _config(args) -> None:
    from specdraft.pipelines.config_reference import defaults_reference
    from specdraft.pipelines.schema import RunConfig

    print(defaults_reference(RunConfig), end="")


def _inspect_bundle(args) -> None:
    from specdraft.decoding.bundle.directory import inspect_bundle

    print(inspect_bundle(args.bundle))


def _export_paths(args) -> None:
    from specdraft.pipelines.vllm_export import point_at

    changed = point_at(args.bundle)
    where = Path(args.bundle).resolve()
    print(f"{where}: rewrote {len(changed)} vLLM config(s) to name paths inside it" if changed
          else f"{where}: its vLLM configs already name paths inside it")


def _generate(args) -> None:
    from specdraft.pipelines.generate import run

    run(args)


def _add_generate(sub) -> None:
    """`specdraft generate BUNDLE ...`: its options live in pipelines.generate_args.add_arguments."""
    from specdraft.pipelines.generate_args import add_arguments, one_line_errors

    sp = sub.add_parser("generate", help="decode prompts with a bundle (or target + drafter [+ head])")
    add_arguments(sp)
    one_line_errors(sp)
    sp.set_defaults(func=_generate)


def _predict(args) -> None:
    from specdraft.pipelines.predict import run

    run(args)


def _add_predict(sub) -> None:
    """`specdraft predict BUNDLE ...`: its options live in pipelines.predict.add_arguments."""
    from specdraft.pipelines.generate_args import one_line_errors
    from specdraft.pipelines.predict import add_arguments

    sp = sub.add_parser("predict", help="predict served tokens/s per batch size from the bundle's acceptance "
                                        "statistics and this device's measured decoder costs")
    add_arguments(sp)
    one_line_errors(sp)
    sp.set_defaults(func=_predict)


def build_parser() -> argparse.ArgumentParser:
    from specdraft.pipelines.stage import STAGE_NAMES

    p = argparse.ArgumentParser(prog="specdraft", description="Train and evaluate speculative-decoding components.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in STAGE_NAMES:
        flags = {"distill-data": " [--shard I/N]", "teacher-data": " [--shard I/N]", "train-heads": " [--shard I/N]",
                 "evaluate": " [--shard I/N] [--merge]"}.get(name, "")
        sp = sub.add_parser(name, help=f"run the {name} stage",
                            usage=f"specdraft {name} CONFIG [--force]{flags} [key.path=value ...]")
        sp.add_argument("overrides", nargs="*", metavar="CONFIG key.path=value",
                        help="the run config YAML (see configs/), then dotted overrides, "
                             "e.g. pretrain_target.train.max_steps=50")
        sp.add_argument("--config", default=None, help="the run config, when not given first")
        sp.add_argument("--force", action="store_true", help="redo the stage even if its output is cached")
        if name in ("distill-data", "teacher-data", "train-heads", "evaluate"):  # the stages that split their work over processes
            sp.add_argument("--shard", default=None, metavar="I/N",
                            help="run this process's share (i of N); default: Slurm array or RANK/WORLD_SIZE")
        if name == "evaluate":
            sp.add_argument("--merge", action="store_true",
                            help="after every shard finished: merge their records into the report")
        sp.set_defaults(func=_run_one, stage=name)
    sp = sub.add_parser("run", help="run every stage of a run config in order (cache hits are skipped)")
    sp.add_argument("config")
    sp.add_argument("--force", action="store_true", help="redo the first stage run (with --from) or all")
    sp.add_argument("--from", dest="start", default=None, help="start at this stage")
    sp.add_argument("overrides", nargs="*")
    sp.set_defaults(func=_run_all)
    _add_generate(sub)
    _add_predict(sub)
    sp = sub.add_parser("inspect-bundle", help="summarise a bundle and verify every file's sha256")
    sp.add_argument("bundle")
    sp.set_defaults(func=_inspect_bundle)
    sp = sub.add_parser("export-paths", help="after moving or copying a bundle: rewrite the paths its vllm/*/ "
                                             "configs name for where it is now (and the hashes recorded)")
    sp.add_argument("bundle")
    sp.set_defaults(func=_export_paths)
    sp = sub.add_parser("config", help="print the annotated config reference: every key, its type, default and meaning")
    sp.add_argument("--defaults", action="store_true", required=True,
                    help="print every key at its default (a run config lists only what it changes)")
    sp.set_defaults(func=_config)
    sp = sub.add_parser("validate", help="check a config file without running anything")
    sp.add_argument("config")
    sp.add_argument("overrides", nargs="*")
    sp.set_defaults(func=_validate)
    from specdraft.pipelines.generate_args import one_line_errors

    for parser in (p, *sub.choices.values()):  # a refused argument is one line, as every other bad input
        one_line_errors(parser)
    return p


def parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """argparse, except that dotted overrides may follow options (`specdraft evaluate C.yaml --force
    evaluate.k=4`): argparse stops filling a positional list at the first option, and would refuse them."""
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "overrides") and not any(a.startswith("-") for a in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        sub = getattr(args, "command", None)
        print(f"specdraft{' ' + sub if sub else ''}: error: unrecognized arguments: {' '.join(extra)}; see "
              f"`specdraft{' ' + sub if sub else ''} --help`", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)
    return args


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    argv = list(sys.argv[1:] if argv is None else argv)
    # --debug anywhere on the line: print tracebacks instead of the one-line summaries
    debug = "--debug" in argv or os.environ.get("SPECDRAFT_DEBUG") == "1"
    argv = [a for a in argv if a != "--debug"]
    try:
        args = parse_args(build_parser(), argv)
    except SystemExit as e:  # argparse has printed --help (0) or the bad argument (2): main returns the code
        return e.code if isinstance(e.code, int) else EXIT_BAD_INPUT
    if "SLURM_JOB_ID" in os.environ:
        from specdraft.training.trainer import install_requeue_handler

        install_requeue_handler()  # from the first second: the requeue signal must never kill a job
    try:
        args.func(args)
    except InputError as e:
        if debug:
            raise
        print(f"specdraft: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("specdraft: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    except Exception as e:  # a bug, or damage no reader classified: still one line, the rest under --debug
        if debug:
            raise
        print(f"specdraft: internal error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
              f"(rerun with --debug for the traceback; finished stage outputs are untouched)", file=sys.stderr)
        return 1
    return 0


def stage_main(stage: str) -> None:
    """Entry point for `python -m specdraft.pipelines.<stage> FILE [...]`."""
    sys.exit(main([stage, *sys.argv[1:]]))


if __name__ == "__main__":
    sys.exit(main())
