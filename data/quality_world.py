"""The quality world: three synthetic task domains with learnable rules, long answers and exact references.

The demo world (data/demo_world.py) is made of real text, and a tiny target pretrained for minutes stays at the
floor of task quality on it (exact match 0, BLEU 2-3), so quality-for-speed trade-offs (speculative cascades)
cannot be seen there. Here every answer follows from its prompt by a local rule, meant for a deep target to
learn on a CPU while a one-layer drafter, trained for fewer steps, does not fully (README, Quality world: one
800-step run learnt the counting, another not yet): a counter that starts at a three-digit number and adds a
one-digit step (7, 3 or 9: one per domain) 16 times, digits one token each, written three ways. Answers are
140-220 tokens, so a multi-drafter bandit's first pass over the drafters is a small part of a generation.

  math       "Add 7, 16 times. Where do you end, starting at 3 8 4?" -> a worked line per step
             ("Step 1: 3 8 4 + 7 = 3 9 1.") and "Answer: 4 9 6" (exact match of the number)
  translate  "Translate to Zorbic: count up by 3, 16 times, from 3 8 4 =>" -> the step numbers and the values in
             Zorbic digit words ("nul es tri-ok-kvar , un es tri-ok-sep , ...") (BLEU)
  summarize  a paragraph describing the counter (step 9, its start last) -> its log ("at start the counter shows
             3 8 4 ; at tick 1 the counter shows 3 9 3 ; ...") (ROUGE-2)

Why these and not a word-for-word translation of the prompt or an extractive summary (tried first, git log):
those need copying from a position that moves with the example (an induction head), and a 16 x 128 target
stayed at the floor on them after 400-600 pretraining steps on one core (exact match 0, BLEU 3-5, ROUGE-2
10-15): in-context retrieval forms only after far more tokens than a CPU run sees. Here every token follows
from the few before it: the step is fixed per domain and the start ends the prompt, so the answer copies it
from a few tokens back (a first version put the start mid-prompt: the target learnt the counting, carries
included, but not to copy a start 20 tokens back, and began every answer at a start of its own). Adding with
carries is still a composition (the hundreds digit depends on the tens digit and on the carry out of the
ones), which depth makes easy and one layer does not.

The prompts use the demo's templates (data/templates.py), so the perturbed set rewords them the same way and
data/quality.py scores them. The world is a pure function of its seed: each split draws from its own seeded
stream, and a candidate example is kept only when the stable hash of its prompt fields falls in the split's
bucket (source_split.stable_bucket: corpus and train share one pool; dev and test have their own), so no
evaluation prompt is ever seen in pretraining or distillation.
"""
from __future__ import annotations

import random
import re

from specdraft.core.errors import InputError
from specdraft.data.demo_world import Example
from specdraft.data.source_split import fields_bucket
from specdraft.data.templates import REPHRASINGS, render_prompt  # noqa: F401 (the world interface: data/prompts.py)

DOMAINS = ("math", "translate", "summarize")
HELDOUT_DOMAINS: tuple[str, ...] = ()
ALL_DOMAINS = DOMAINS + HELDOUT_DOMAINS
GENERATED_DOMAINS = DOMAINS  # every prompt is written from a drawn start (demo_world.GENERATED_DOMAINS)
CORPUS = True  # pretraining documents for the quality target

# --------------------------------------------------------------------------- a counter, three ways

# (why local rules: the module docstring)
STEPS = 16  # additions per answer (fixed: the answer's length, and so every offset, is the same every time)
START = (100, 999 - 9 * STEPS)  # the start: three digits, and the last value stays below 1000 (at the largest step)
# the step of each domain, fixed: the start is the answer's only input, so after the first line every token follows
# from the few before it (a step read from the prompt again on every line is a retrieval from a moving
# position). Three different steps make the domains differ for their drafters: each specialist learns its own.
STEP = {"math": 7, "translate": 3, "summarize": 9}
LANGUAGE = "Zorbic"
# Zorbic digit words: the translate task writes each digit of the count as one of these
ZORBIC_DIGITS = ("nul", "un", "du", "tri", "kvar", "kvin", "ses", "sep", "ok", "nau")
EVENTS = ("tick", "tock")  # the summarize task's log alternates these two words


def spaced(n: int) -> str:
    """A number with its digits separated by spaces ("4 8 2"): one BPE token per digit."""
    return " ".join(str(n))


def count(start: int, step: int) -> list[int]:
    """The STEPS values after start, each the one before plus step."""
    return [start + step * i for i in range(1, STEPS + 1)]


def _start_and_step(rng: random.Random, domain: str) -> tuple[int, int]:
    return rng.randint(*START), STEP[domain]


def make_math(rng: random.Random) -> tuple[dict, str]:
    start, step = _start_and_step(rng, "math")
    values, lines, prev = count(start, step), [], start
    for i, v in enumerate(values, 1):
        lines.append(f"Step {i}: {spaced(prev)} + {step} = {spaced(v)}.")
        prev = v
    # the start ends the prompt: the answer's first tokens copy it from a few tokens back
    question = f"Add {step}, {STEPS} times. Where do you end, starting at {spaced(start)}?"
    return {"question": question}, " " + " ".join(lines) + f" We end at {spaced(values[-1])}.\nAnswer: {spaced(values[-1])}"


def to_zorbic(n: int) -> str:
    """A number in Zorbic: its digits as Zorbic digit words, joined by hyphens."""
    return "-".join(ZORBIC_DIGITS[int(d)] for d in str(n))


def make_translate(rng: random.Random) -> tuple[dict, str]:
    start, step = _start_and_step(rng, "translate")
    sentence = f"count up by {step}, {STEPS} times, from {spaced(start)}"
    # pair 0 is the start, copied from the end of the prompt; each later value follows from the one before
    pairs = [f"{to_zorbic(i)} es {to_zorbic(v)}" for i, v in enumerate([start] + count(start, step))]
    return {"lang": LANGUAGE, "sentence": sentence}, " " + " , ".join(pairs) + " ."


def make_summarize(rng: random.Random) -> tuple[dict, str]:
    start, step = _start_and_step(rng, "summarize")
    paragraph = (f"A counter goes up by {step} at every {EVENTS[0]} and every {EVENTS[1]}. It runs for {STEPS} beats, "
                 f"{EVENTS[0]} first. It starts at {spaced(start)}.")
    log = [f"at start the counter shows {spaced(start)} ;"]  # copied from the end of the prompt
    log += [f"at {EVENTS[(i - 1) % 2]} {i} the counter shows {spaced(v)} ;" for i, v in enumerate(count(start, step), 1)]
    return {"paragraph": paragraph}, " " + " ".join(log)


def final_value(question: str) -> int:
    """The true end of a math question of this world, from its text alone (tests check the worked answers)."""
    m = re.search(r"Add (\d+), (\d+) times\. Where do you end, starting at ([\d ]+)\?", question)
    step, n, start = int(m.group(1)), int(m.group(2)), int(m.group(3).replace(" ", ""))
    return start + step * n


# --------------------------------------------------------------------------- splits

GENERATORS = {"math": make_math, "translate": make_translate, "summarize": make_summarize}


def build_split(domain: str, split: str, n: int, seed: int) -> list[Example]:
    """n examples of one domain for one split ('corpus', 'train', 'dev', 'test'), deterministic in seed. A
    candidate is kept when its prompt fields hash into the split's bucket (~84% 'train', which 'corpus' shares,
    8% each 'dev' / 'test'); dev and test prompts are also distinct (each is one measurement), while the corpus
    and the train prompts repeat theirs (a domain has 756 prompts, ~636 of them in the training pool)."""
    if domain not in GENERATORS:
        raise ValueError(f"unknown quality-world domain {domain!r}; choose from {', '.join(ALL_DOMAINS)}")
    rng = random.Random(f"specdraft-quality/{seed}/{domain}/{split}")
    bucket = "train" if split == "corpus" else split
    out, seen = [], set()
    for _ in range(200 * n + 1000):  # each domain has 756 distinct prompts (starts): ~60 in each of dev and test
        fields, response = GENERATORS[domain](rng)
        key = tuple(sorted(fields.items()))
        if (key not in seen or bucket == "train") and fields_bucket(domain, fields) == bucket:
            seen.add(key)
            out.append(Example(f"{domain}/{split}/{len(out):06d}", domain, fields, response))
            if len(out) == n:
                return out
    raise InputError(f"the quality world has fewer than {n} distinct {domain} prompts for split {split!r}; "
                     f"lower demo.{split}_per_domain")
