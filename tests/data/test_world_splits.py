"""Every built-in world keeps its evaluation prompts' text out of its training prompts, across domains.

A world embeds source text in its prompts (a function's code, a docstring paragraph, a sentence); the check works
on the rendered prompts' fields alone, not on how the world split its sources: no sentence or code line of 30+
characters of a dev, test or held-out prompt of any domain is in a training prompt of any domain, nor in a prompt
of the other evaluation split. Domains a generator writes (word problems, counters) share their phrases across
splits by design ("How many apples does Ava have now?"); between two of those only whole prompts must differ.
"""
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from specdraft.data.prompts import WORLDS
from specdraft.data.source_split import split_sentences
from specdraft.pipelines.cli import main

SIZES = (("train", 160), ("dev", 20), ("test", 16))
REPO = Path(__file__).resolve().parents[2]


def embedded(fields: dict) -> set[str]:
    """The sentences and (stripped) lines of 30+ characters of a prompt's fields."""
    out = set()
    for value in map(str, fields.values()):
        out |= {line.strip() for line in value.splitlines()}
        out |= set(split_sentences(value.replace('"""', " ").replace("'''", " ")))
    return {piece for piece in out if len(piece) >= 30}


def leaks(world) -> list[str]:
    """Each piece of text (or, between generated domains, whole prompt) found in two splits, with where."""
    where: dict[str, set[tuple[str, str]]] = {}  # piece -> {(split, domain)}
    prompts: dict[tuple[str, str], set[str]] = {}  # (domain, split) -> prompts
    for domain in world.ALL_DOMAINS:
        for split, n in SIZES:
            examples = world.build_split(domain, split, n, 0)
            prompts[domain, split] = {e.prompt for e in examples}
            for e in examples:
                for piece in embedded(e.fields):
                    where.setdefault(piece, set()).add((split, domain))
    generated = set(world.GENERATED_DOMAINS)
    out = [f"{piece!r} in {sorted(places)}" for piece, places in where.items()
           if any(s1 != s2 and not {d1, d2} <= generated for s1, d1 in places for s2, d2 in places)]
    for domain in world.ALL_DOMAINS:
        for a, b in (("train", "dev"), ("train", "test"), ("dev", "test")):
            out += [f"{domain} prompt {p[:60]!r} in {a} and {b}" for p in prompts[domain, a] & prompts[domain, b]]
    return out


@pytest.mark.parametrize("name", sorted(WORLDS))
def test_no_text_of_an_evaluation_prompt_is_in_another_split(name):
    found = leaks(WORLDS[name])
    assert found == [], f"{len(found)} pieces in two splits, e.g. {found[:3]}"


def test_the_check_sees_a_leak():
    """A world whose dev sentence is also in a training paragraph of another domain fails the check."""

    sentence = "This sentence is in a training paragraph and a dev prompt."

    class Leaky:
        ALL_DOMAINS, GENERATED_DOMAINS = ("summarize", "translate"), ()

        @staticmethod
        def build_split(domain, split, n, seed):
            text = {("summarize", "train"): f"A paragraph. {sentence}", ("translate", "dev"): sentence}
            text = text.get((domain, split), f"The {domain} {split} prompt, in no other split.")
            return [SimpleNamespace(prompt=text, fields={"text": text})]

    assert leaks(Leaky) == ["'This sentence is in a training paragraph and a dev prompt.' in "
                            "[('dev', 'translate'), ('train', 'summarize')]"]


@pytest.mark.slow  # 9.5 CPU s of a fresh process's imports: the refusal is checked in process for every world
# below, the console script's exit code and one-line stderr in test_config.py's test_console_script_exit_code
def test_a_heldout_domain_that_also_trains_is_refused_in_one_line():
    r = subprocess.run([sys.executable, "-m", "specdraft.pipelines.cli", "validate", str(REPO / "configs/demo.yaml"),
                        "demo.heldout_domains=[code]"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("specdraft: error:")
    assert "demo.heldout_domains names code, also in demo.domains" in r.stderr


@pytest.mark.parametrize("name", sorted(WORLDS))
def test_every_world_refuses_a_heldout_domain_that_also_trains(name, capsys):
    world = WORLDS[name]
    base = [f"demo.world={name}", f"demo.domains=[{','.join(world.DOMAINS)}]"]
    assert main(["validate", str(REPO / "configs/demo.yaml"), *base, f"demo.heldout_domains=[{world.DOMAINS[-1]}]"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"demo.heldout_domains names {world.DOMAINS[-1]}, also in demo.domains" in err[0]
    # the world's own held-out domains beside its training domains are fine
    heldout = f"demo.heldout_domains=[{','.join(world.HELDOUT_DOMAINS)}]"
    assert main(["validate", str(REPO / "configs/demo.yaml"), *base, heldout]) == 0
