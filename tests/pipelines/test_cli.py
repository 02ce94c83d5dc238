"""`specdraft` parsing: --help imports nothing heavy, generate takes the bundle first, a stage its config."""
import subprocess
import sys

import pytest

from specdraft.core.errors import InputError
from specdraft.pipelines.generate_args import bundle_of
from specdraft.pipelines.cli import _stage_config, build_parser

HEAVY = ("torch", "transformers", "lightning", "datasets", "tokenizers")


def test_building_the_parser_imports_no_heavy_library():
    # a fresh interpreter: this test process has torch loaded already
    code = ("import sys; from pipelines.cli import build_parser; build_parser(); "
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_generate_takes_the_bundle_as_first_argument():
    args = build_parser().parse_args(["generate", "runs/demo/bundle", "--drafter", "math", "--prompt", "hi"])
    assert bundle_of(args) == "runs/demo/bundle" and args.drafter == "math"


def test_generate_old_bundle_flag_still_works_with_a_note():
    notes = []
    args = build_parser().parse_args(["generate", "--bundle", "b", "--prompt", "hi"])
    assert bundle_of(args, warn=notes.append) == "b"
    assert len(notes) == 1 and "deprecated" in notes[0]


def test_generate_two_different_bundles_is_bad_input():
    args = build_parser().parse_args(["generate", "a", "--bundle", "b", "--prompt", "hi"])
    with pytest.raises(InputError, match="two bundles"):
        bundle_of(args)


def test_generate_without_a_bundle_uses_target_dirs():
    args = build_parser().parse_args(["generate", "--target", "t", "--drafter", "d", "--prompt", "hi"])
    assert bundle_of(args) is None and args.target == "t"


@pytest.mark.parametrize("argv", [["train-heads", "c.yaml", "a.b=1", "--force"],
                                  ["train-heads", "--config", "c.yaml", "a.b=1", "--force"]])
def test_a_stage_takes_its_config_first_or_as_a_flag(argv):
    args = build_parser().parse_args(argv)
    assert _stage_config(args) == ("c.yaml", ["a.b=1"]) and args.force


@pytest.mark.parametrize("argv, message", [(["train-heads"], "no config"), (["train-heads", "a.b=1"], "no config"),
                                           (["train-heads", "a.yaml", "--config", "b.yaml"], "two configs")])
def test_a_stage_without_one_config_is_bad_input(argv, message):
    with pytest.raises(InputError, match=message):
        _stage_config(build_parser().parse_args(argv))
