"""The arguments of `specdraft generate`, in a module that imports nothing heavy.

`specdraft generate --help` must answer at once, so the parser is built here without torch or
transformers; `pipelines.generate.run` consumes the parsed namespace. Every option of the subcommand is
added in `add_arguments`, the one place a new decoding option (drafts, cascades, ...) goes.

Every number is checked as it is parsed: a draft length, temperature, top-p, top-k, threshold, batch
size or token budget that cannot work stops with one line and exit code 2 (`one_line_errors`), never
replaced by a default. An option left out takes the bundle's value (decoding/defaults.py, as export
wrote it), or the library's without a bundle.
"""
from __future__ import annotations

import argparse
import math
import sys

from specdraft.decoding.defaults import COMPILE_MODES, is_threshold  # imports no torch: `--help` stays instant


def checked(kind: type, ok, what: str):
    """An argparse type: `kind(text)` (a finite number) for which ok(value) holds, else "<what>, got TEXT"."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or (kind is float and not math.isfinite(value)) or not ok(value):
            raise argparse.ArgumentTypeError(f"{what}, got {text!r}")
        return value

    return parse


positive_int = checked(int, lambda v: v >= 1, "must be an integer >= 1")
non_negative_int = checked(int, lambda v: v >= 0, "must be an integer >= 0 (0 disables it)")
temperature = checked(float, lambda v: v >= 0, "must be a number >= 0 (0: greedy)")
top_p = checked(float, lambda v: 0 < v <= 1, "must be a number in (0, 1] (1 disables it)")
threshold = checked(float, is_threshold, "must be a number in (0, 1)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", nargs="?", default=None,
                   help="an exported bundle directory (as for inspect-bundle); omit it with --target")
    p.add_argument("--bundle", dest="bundle_flag", default=None, help=argparse.SUPPRESS)  # deprecated spelling
    p.add_argument("--target", help="target model directory (without a bundle)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="one user turn, formatted with the bundle's chat template")
    source.add_argument("--prompts", metavar="FILE.jsonl",
                        help="one prompt record per line: {\"prompt\": TEXT}, or a \"messages\" / \"conversations\" "
                             "list (the formats of prompts.sources)")
    p.add_argument("--output", metavar="OUT.jsonl", default=None,
                   help="write one JSON line per prompt (text, token ids, MAT, counts), atomically; default: stdout")
    p.add_argument("--batch-size", type=positive_int, default=1,
                   help="prompts decoded together (grouped by the drafter each is decoded with)")
    p.add_argument("--drafter", help="drafter name in the bundle, or a drafter model directory "
                                     "(default: the bundle's router per prompt, else its all-domain drafter)")
    p.add_argument("--router", default=None,
                   help="router name in the bundle, or none for the all-domain drafter (default: the bundle's router)")
    p.add_argument("--head", help="head name in the bundle, or a head directory")
    p.add_argument("--raw-prompt", action="store_true",
                   help="feed the prompt text as is, without the chat template (a base model's continuation)")
    p.add_argument("--system-prompt", default=None, help="a system turn before the prompt ('' for none)")
    p.add_argument("--method", default="speculative", choices=["speculative", "ar"])
    p.add_argument("--k", type=positive_int, default=None,
                   help="fixed draft length (default: SpecDec++ with a head, else the bundle's best fixed K); "
                        "a cascade's is --cascade-block")
    p.add_argument("--stop-rule", choices=["specdecpp", "batch-aware"], default=None,
                   help="how a head stops drafting: batch-aware, the lockstep rule that maximises expected tokens per "
                        "second of the decoder's own step times at the batch's size (profiled at start, cached per "
                        "device, model and mode; docs/decoder.md), the default for a bundle's drafter whose acceptance "
                        "summary it ships; or specdecpp, SpecDec++'s fixed h (the default otherwise)")
    p.add_argument("--verbose", action="store_true",
                   help="say which dtype runs and why, and print the cost table the batch-aware rule uses")
    p.add_argument("--threshold", type=threshold, default=None,
                   help="SpecDec++ h in (0, 1) (default: the bundle's, else the head's chosen h)")
    p.add_argument("--temperature", type=temperature, default=None, help="0 = greedy (default: the bundle's)")
    p.add_argument("--top-k", type=non_negative_int, default=None, help="0 disables (default: the bundle's)")
    p.add_argument("--top-p", type=top_p, default=None, help="1 disables (default: the bundle's)")
    p.add_argument("--max-new-tokens", type=positive_int, default=None, help="per prompt (default: the bundle's)")
    p.add_argument("--compile", choices=COMPILE_MODES, default=None,
                   help="torch.compile mode of the decoder's steps (default: the bundle's)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, mps or auto")
    p.add_argument("--drafter-device", default=None)
    p.add_argument("--device-map", default=None, help='"auto" to spread the target over the visible GPUs')
    p.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16", "float16"],
                   help="what the target and its drafters run in (default: the bundle's target dtype, as its stages "
                        "ran; auto without a bundle): auto is bf16 on a GPU with bf16 and on a CPU with bf16 units "
                        "(avx512_bf16 or AMX), else float32; --verbose says which and why")
    p.add_argument("--seed", type=int, default=0, help="prompt i samples with seed + i")
    p.add_argument("--drafts", type=positive_int, default=None,
                   help="K i.i.d. drafts per round, verified with SpecTr's k-Seq (default: the bundle's, else 1)")
    p.add_argument("--cascade", default=None, help="cascade rule (chow diff opt token token_v1 token_v2 lossy bild "
                   "token_chow seq_chow; 'none' ignores the bundle's); see decoding/cascades.py")
    p.add_argument("--alpha", type=float, default=None, help="the cascade's lenience alpha")
    p.add_argument("--beta", type=float, default=1.0, help="lossy speculative decoding's beta (>= 1 - alpha)")
    p.add_argument("--cascade-block", type=positive_int, default=None, metavar="N",
                   help="a speculative cascade's block size gamma, the drafts per round (default: 5, the paper's; "
                        "--k is a drafter's fixed K and is refused with a cascade)")
    p.add_argument("--eagle-tree", default="bundle",
                   help="with an EAGLE drafter: DEPTH,TOP_K,NODES for an EAGLE-2 dynamic tree, none for chain drafts, "
                        "or bundle (default: the tree the bundle names)")


def one_line_errors(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make `p` report a bad argument as one line (no usage block), exit code 2."""
    def error(message: str):
        print(f"{p.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)

    p.error = error
    return p


def bundle_of(args: argparse.Namespace, warn=print) -> str | None:
    """The bundle directory from the positional argument, or from the deprecated `--bundle` flag (with a
    note). Both at once is bad input."""
    from specdraft.core.errors import InputError

    flag = getattr(args, "bundle_flag", None)
    if flag is None:
        return args.bundle
    if args.bundle is not None and args.bundle != flag:
        raise InputError(f"two bundles given ({args.bundle} and --bundle {flag}); name the bundle once, first")
    warn(f"note: --bundle is deprecated; write `specdraft generate {flag} ...` (the bundle first)")
    return flag
