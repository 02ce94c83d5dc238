"""CLI arguments end to end (pipelines/cli.py, decoding/generate_args.py), in process: every generated
argument vector of every command is accepted, or refused with exit code 2 and one line on stderr, and
nothing is written before it is accepted.

"Accepted" stops where the work would start, so that hundreds of vectors fit the suite's budget: a stage
or run at run_stage (its config fully read and checked), generate at the target's tokenizer (bundle, its
decoding section, the prompts file and every option read and checked).
"""
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import specdraft.pipelines.generate as generate_module
import specdraft.pipelines.stage as stage_module
from specdraft.decoding.bundle.directory import Bundle
from specdraft.pipelines.cli import main
from specdraft.pipelines.stage import STAGE_NAMES
from tests.decoding.test_bundle import template  # noqa: F401  (the hand-built bundle fixture)
from tests.readers.fuzz import TRIED

REPO = Path(__file__).resolve().parents[2]
DEMO = str(REPO / "configs" / "demo.yaml")


class Accepted(BaseException):  # not an Exception: main's internal-error handler must not swallow it
    pass


def _accept(*_, **__):
    raise Accepted


@pytest.fixture
def stubbed(monkeypatch):
    monkeypatch.setattr(stage_module, "run_stage", _accept)
    monkeypatch.setattr(Bundle, "load_tokenizer", _accept)
    monkeypatch.setattr(generate_module, "load_tokenizer", _accept)
    for var in ("SPECDRAFT_SHARD", "SPECDRAFT_MERGE"):
        monkeypatch.delenv(var, raising=False)


def files_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def call(argv, capsys, watch: Path) -> str:
    """'accepted' or 'refused' (exit 2, one line, nothing new under `watch`); anything else fails."""
    before = files_under(watch)
    env = {k: os.environ.get(k) for k in ("SPECDRAFT_SHARD", "SPECDRAFT_MERGE")}
    capsys.readouterr()
    try:
        code = main(argv)
    except Accepted:
        code = None
    finally:
        for k, v in env.items():  # --shard / --merge hand their value to the stage through the environment
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    err = capsys.readouterr().err.strip()
    assert files_under(watch) == before, f"{argv} wrote {files_under(watch) - before}"
    if code is None or (code == 0 and argv[0] in ("validate", "config")):
        return "accepted"
    assert code == 2, f"{argv} exited {code}: {err}"
    lines = err.splitlines()
    assert len(lines) == 1 and "error:" in lines[0], f"{argv}: {err!r}"
    return "refused"


# ---- stages, run, validate, config ------------------------------------------------------------------------

OVERRIDES = st.sampled_from(["run.seed=1", "run.seed=x", "evaluate.ks=[]", "evaluate.ks=[2, 4]", "nope=1",
                             "decoding.k=99", "decoding.k=2", "run.seed", "=1", "run..seed=1",
                             "distill_data.top_p=0", "evaluate.sets=[test]", "demo.domains=[nope]", "x.y=[",
                             "train_heads.thresholds=[0.5]", "prompts.sources=[/nonexistent.jsonl]"])
FLAGS = st.sampled_from(["--force", "--merge", "--shard", "--from", "--config", "--defaults", "--nope", "-h"])
SHARDS = st.sampled_from(["0/2", "1/2", "2/2", "-1/2", "a/b", "0/0", "1", "", "0/1/2"])


@given(command=st.sampled_from([*STAGE_NAMES, "run", "validate", "config"]),
       config=st.sampled_from(["demo", "missing", "empty", "directory", "none"]),
       pieces=st.lists(st.one_of(OVERRIDES, FLAGS), max_size=4), shard=SHARDS,
       start=st.sampled_from([*STAGE_NAMES, "nope"]))
def test_stage_commands_accept_or_refuse_in_one_line(stubbed, tmp_path, capsys, command, config, pieces, shard, start):
    TRIED["cli: stages, run, validate, config"] += 1
    work = tmp_path / "w"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    (work / "empty.yaml").write_text("")
    cfg = {"demo": DEMO, "missing": str(work / "missing.yaml"), "empty": str(work / "empty.yaml"),
           "directory": str(work), "none": None}[config]
    argv = [command] + ([cfg] if cfg else [])
    for piece in pieces:
        argv.append(piece)
        if piece == "--shard":
            argv.append(shard)
        elif piece == "--from":
            argv.append(start)
        elif piece == "--config":
            argv.append(cfg or DEMO)
    if "-h" in argv:
        return  # help prints and exits 0 by design
    argv.append(f"run.root={work / 'run'}")  # anything a stage wrote would land here, under the watch
    if call(argv, capsys, work) == "accepted":
        TRIED["cli: stages, run, validate, config (of them accepted)"] += 1


# ---- generate ---------------------------------------------------------------------------------------------

# valid values more often than not, so that accepted vectors are common enough to mean something
NUMBERS = st.one_of(st.sampled_from(["1", "2", "4", "0.5"]), st.sampled_from(["0", "-1", "1.5", "nan", "inf", "x", "", "1e9", "21"]))
OPTIONS = {
    "--k": NUMBERS, "--threshold": NUMBERS, "--temperature": NUMBERS, "--top-k": NUMBERS, "--top-p": NUMBERS,
    "--max-new-tokens": NUMBERS, "--batch-size": NUMBERS, "--drafts": NUMBERS, "--alpha": NUMBERS,
    "--beta": NUMBERS, "--seed": NUMBERS,
    "--compile": st.sampled_from(["none", "default", "max", ""]),
    "--dtype": st.sampled_from(["auto", "float32", "int4"]),
    "--method": st.sampled_from(["speculative", "ar", "greedy"]),
    "--cascade": st.sampled_from(["token", "opt", "none", "nope"]),
    "--drafter": st.sampled_from(["d", "nope"]), "--head": st.sampled_from(["D1_w6", "nope"]),
    "--router": st.sampled_from(["none", "classifier", "nope"]),
    "--eagle-tree": st.sampled_from(["bundle", "none", "4,4,16", "x"]),
    "--system-prompt": st.sampled_from(["", "be brief"]),
}
SWITCHES = ["--raw-prompt", "--nope"]


@given(bundle=st.one_of(st.just("bundle"), st.sampled_from(["bundle", "missing", "file", "none"])),
       source=st.one_of(st.sampled_from(["prompt", "prompts"]), st.sampled_from(["bad-prompts", "both", "neither"])),
       output=st.one_of(st.sampled_from(["file", "none"]), st.sampled_from(["directory", "missing-dir", "prompts"])),
       options=st.dictionaries(st.sampled_from(sorted(OPTIONS)), st.just(None), max_size=3),
       switches=st.lists(st.sampled_from(SWITCHES), max_size=1, unique=True), data=st.data())
def test_generate_accepts_or_refuses_in_one_line(stubbed, template, tmp_path, capsys, bundle, source, output,  # noqa: F811
                                                 options, switches, data):
    TRIED["cli: generate"] += 1
    work = tmp_path / "w"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    prompts = work / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "w1 w2"}) + "\n")
    (work / "bad.jsonl").write_bytes(b'{"prompt": "w1"}\n\xff\n')
    argv = ["generate"] + {"bundle": [str(template)], "missing": [str(work / "nope")], "file": [str(prompts)],
                           "none": []}[bundle]
    argv += {"prompt": ["--prompt", "w1"], "prompts": ["--prompts", str(prompts)],
             "bad-prompts": ["--prompts", str(work / "bad.jsonl")],
             "both": ["--prompt", "w1", "--prompts", str(prompts)], "neither": []}[source]
    argv += {"file": ["--output", str(work / "out.jsonl")], "directory": ["--output", str(work)],
             "missing-dir": ["--output", str(work / "no" / "out.jsonl")], "prompts": ["--output", str(prompts)],
             "none": []}[output]
    for opt in options:
        argv += [opt, data.draw(OPTIONS[opt], label=opt)]
    argv += switches
    outcome = call(argv, capsys, work)
    if outcome == "accepted":  # what was accepted is what the user could run: each value as it parses
        TRIED["cli: generate (of them accepted)"] += 1
        assert bundle == "bundle" and source in ("prompt", "prompts") and "--nope" not in switches


def test_the_stubs_see_a_plain_accepted_vector(stubbed, template, tmp_path, capsys):  # noqa: F811
    """Power check: a vector that must be accepted reaches the stub (else every vector would be refused)."""
    assert call(["generate", str(template), "--prompt", "w1", "--k", "2"], capsys, tmp_path) == "accepted"
    assert call(["prepare-data", DEMO, f"run.root={tmp_path / 'run'}"], capsys, tmp_path) == "accepted"
    assert call(["generate", str(template), "--prompt", "w1", "--k", "0"], capsys, tmp_path) == "refused"
