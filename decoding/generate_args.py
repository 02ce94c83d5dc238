"""The arguments of `specdraft generate`, in a module that imports nothing heavy.

`specdraft generate --help` must answer at once, so the parser is built here without torch or
transformers; `decoding.generate.run` consumes the parsed namespace. Every option of the subcommand is
added in `add_arguments`, the one place a new decoding option (drafts, cascades, ...) goes.
"""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", nargs="?", default=None,
                   help="an exported bundle directory (as for inspect-bundle); omit it with --target")
    p.add_argument("--bundle", dest="bundle_flag", default=None, help=argparse.SUPPRESS)  # deprecated spelling
    p.add_argument("--target", help="target model directory (without a bundle)")
    p.add_argument("--drafter", help="drafter name in the bundle, or a drafter model directory")
    p.add_argument("--head", help="head name in the bundle, or a head directory")
    p.add_argument("--prompt", required=True, help="one user turn, formatted with the target's chat template (if any)")
    p.add_argument("--raw-prompt", action="store_true",
                   help="feed the prompt text as is, without the chat template (a base model's continuation)")
    p.add_argument("--system-prompt", default=None, help="a system turn before the prompt ('' for none)")
    p.add_argument("--method", default="speculative", choices=["speculative", "ar"])
    p.add_argument("--k", type=int, default=None, help="fixed draft length (default: SpecDec++ with the head, else 4)")
    p.add_argument("--threshold", type=float, default=None, help="SpecDec++ h (default: the head's chosen h)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--device", default="cpu")
    p.add_argument("--drafter-device", default=None)
    p.add_argument("--device-map", default=None, help='"auto" to spread the target over the visible GPUs')
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--drafts", type=int, default=None,
                   help="K i.i.d. drafts per round, verified with SpecTr's k-Seq (default: the bundle's, else 1)")
    p.add_argument("--cascade", default=None, help="cascade rule (chow diff opt token token_v1 token_v2 lossy bild "
                   "token_chow seq_chow; 'none' ignores the bundle's); see decoding/cascades.py")
    p.add_argument("--alpha", type=float, default=None, help="the cascade's lenience alpha")
    p.add_argument("--beta", type=float, default=1.0, help="lossy speculative decoding's beta (>= 1 - alpha)")
    p.add_argument("--eagle-tree", default="bundle",
                   help="with an EAGLE drafter: DEPTH,TOP_K,NODES for an EAGLE-2 dynamic tree, none for chain drafts, "
                        "or bundle (default: the tree the bundle names)")


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
