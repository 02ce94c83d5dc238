"""The quality world: three synthetic task domains with learnable rules, long answers and exact references.

The demo world (data/demo_world.py) is made of real text, and a tiny target pretrained for minutes stays at the
floor of task quality on it (exact match 0, BLEU 2-3), so quality-for-speed trade-offs (speculative cascades)
cannot be seen there. Here every answer follows from its prompt by a rule, so a deep target can learn the rules
in minutes on a CPU while a one-layer drafter cannot fully (each rule needs copying from a position that moves
with the example, which takes two attention layers composed: an induction head). Answers are 130-190 tokens,
so a multi-drafter bandit's first pass over the drafters is a small part of a generation.

  math       a running total: "Start with 17. Step 1: add 5. Step 2: subtract 3. ..." -> a worked line per
             step ("Step 1: 17 + 5 = 22.") and "Answer: N" (exact match of N)
  translate  a long sentence of clauses over a closed English lexicon -> the same sentence in "Zorbic", a fixed
             word-for-word cipher (BLEU)
  summarize  a paragraph of event sentences -> each sentence's core, adjective and place dropped
             ("Ava gave the red ball to Ben in the garden." -> "Ava gave the ball to Ben.") (ROUGE-2)

The prompts use the demo's templates (data/templates.py), so the perturbed set rewords them the same way and
data/quality.py scores them unchanged. The world is a pure function of its seed: each split draws from its own
seeded stream, and a candidate example is kept only when the stable hash of its prompt fields falls in the
split's bucket (demo_world.stable_bucket: corpus and train share one pool; dev and test have their own), so no
evaluation prompt is ever seen in pretraining or distillation.
"""
from __future__ import annotations

import random

from specdraft.data.demo_world import Example, stable_bucket

DOMAINS = ("math", "translate", "summarize")
HELDOUT_DOMAINS: tuple[str, ...] = ()
ALL_DOMAINS = DOMAINS + HELDOUT_DOMAINS

NAMES = ("Ava", "Ben", "Chloe", "Dev", "Ella", "Finn", "Grace", "Hugo", "Iris", "Jack", "Kai", "Lena")

# --------------------------------------------------------------------------- math: a running total

MATH_STEPS = (14, 17)  # steps per problem (inclusive): about 9 tokens each, 130-160 tokens per answer
MATH_RANGE = (0, 99)  # the running total stays here (numbers up to 99 are single tokens of the BPE)


def make_math(rng: random.Random) -> tuple[dict, str]:
    total = rng.randint(10, 90)
    question, lines = [f"Start with {total}."], []
    for step in range(1, rng.randint(*MATH_STEPS) + 1):
        n = rng.randint(2, 9)
        # a step that would leave the range goes the other way, so every total stays a two-digit-or-less number
        add = rng.random() < 0.5
        if add and total + n > MATH_RANGE[1]:
            add = False
        elif not add and total - n < MATH_RANGE[0]:
            add = True
        new = total + n if add else total - n
        question.append(f"Step {step}: {'add' if add else 'subtract'} {n}.")
        lines.append(f"Step {step}: {total} {'+' if add else '-'} {n} = {new}.")
        total = new
    question.append("What number do you end with?")
    return {"question": " ".join(question)}, " " + " ".join(lines) + f" We end with {total}.\nAnswer: {total}"


def running_total(question: str) -> int:
    """The true result of a math question of this world, computed from its text alone (tests check the
    worked answers against it)."""
    words = question.replace(".", " ").split()
    total = int(words[words.index("with") + 1])
    for i, w in enumerate(words):
        if w in ("add", "subtract"):
            total += int(words[i + 1]) * (1 if w == "add" else -1)
    return total


# --------------------------------------------------------------------------- translate: a word cipher

# English -> Zorbic, one word each way (a bijection: the cipher is invertible, every Zorbic word is distinct)
LEXICON = {
    "the": "lo", "a": "ka", "and": "su", "with": "mir", "near": "tavo", "under": "pesh",
    "red": "vermo", "old": "grat", "small": "pik", "green": "zelu", "happy": "joba", "quiet": "mun",
    "tall": "orso", "blue": "azun",
    "fox": "rinka", "owl": "hupo", "cat": "mesh", "dog": "vaku", "bird": "pilo", "horse": "drava",
    "farmer": "tolmi", "child": "bebo", "king": "rajo", "apple": "frutu", "river": "naba", "tree": "dendo",
    "sees": "vidas", "finds": "trovas", "follows": "sekvas", "helps": "helpas", "watches": "gardas",
    "likes": "amas", "carries": "portas", "calls": "vokas",
}
ADJECTIVES = ("red", "old", "small", "green", "happy", "quiet", "tall", "blue")
NOUNS = ("fox", "owl", "cat", "dog", "bird", "horse", "farmer", "child", "king", "apple", "river", "tree")
VERBS = ("sees", "finds", "follows", "helps", "watches", "likes", "carries", "calls")
PREPOSITIONS = ("with", "near", "under")
TRANSLATE_CLAUSES = (13, 16)  # clauses per sentence (inclusive): about 10 tokens each, 130-180 per answer
LANGUAGE = "Zorbic"


def _noun_phrase(rng: random.Random) -> list[str]:
    return [rng.choice(("the", "a")), rng.choice(ADJECTIVES), rng.choice(NOUNS)]


def _clause(rng: random.Random) -> list[str]:
    words = _noun_phrase(rng) + [rng.choice(VERBS)] + _noun_phrase(rng)
    if rng.random() < 0.5:
        words += [rng.choice(PREPOSITIONS)] + _noun_phrase(rng)
    return words


def to_zorbic(sentence: str) -> str:
    """Word-for-word through LEXICON; punctuation (a trailing comma or full stop) stays on its word."""
    out = []
    for word in sentence.split():
        core = word.rstrip(",.")
        out.append(LEXICON[core.lower()] + word[len(core):])
    return " ".join(out)


def make_translate(rng: random.Random) -> tuple[dict, str]:
    clauses = [" ".join(_clause(rng)) for _ in range(rng.randint(*TRANSLATE_CLAUSES))]
    sentence = ", ".join(clauses) + "."
    return {"lang": LANGUAGE, "sentence": sentence}, " " + to_zorbic(sentence)


# --------------------------------------------------------------------------- summarize: each event's core

GIVE_VERBS = ("gave", "sold", "showed", "sent", "threw", "lent")
THINGS = ("ball", "book", "kite", "lamp", "coin", "drum", "map", "hat", "cup", "key")
PLACES = ("in the garden", "at the market", "by the river", "in the kitchen", "on the hill", "at the school")
SUMMARY_SENTENCES = (19, 23)  # sentences per paragraph (inclusive): 7 tokens of summary each, 130-160 per answer


def make_summarize(rng: random.Random) -> tuple[dict, str]:
    full, core = [], []
    for _ in range(rng.randint(*SUMMARY_SENTENCES)):
        giver, taker = rng.sample(NAMES, 2)
        verb, thing = rng.choice(GIVE_VERBS), rng.choice(THINGS)
        full.append(f"{giver} {verb} the {rng.choice(ADJECTIVES)} {thing} to {taker} {rng.choice(PLACES)}.")
        core.append(f"{giver} {verb} the {thing} to {taker}.")
    return {"paragraph": " ".join(full)}, " " + " ".join(core)


# --------------------------------------------------------------------------- splits

GENERATORS = {"math": make_math, "translate": make_translate, "summarize": make_summarize}


def make_example(domain: str, rng: random.Random, bucket: str) -> tuple[dict, str]:
    """One example of the domain whose prompt fields fall in `bucket` ('train', 'dev' or 'test')."""
    if domain not in GENERATORS:
        raise ValueError(f"unknown quality-world domain {domain!r}; choose from {', '.join(ALL_DOMAINS)}")
    while True:  # rejection: ~84% of candidates are 'train', 8% each 'dev' / 'test'
        fields, response = GENERATORS[domain](rng)
        if stable_bucket(domain + "|" + "|".join(f"{k}={v}" for k, v in sorted(fields.items()))) == bucket:
            return fields, response


def build_split(domain: str, split: str, n: int, seed: int) -> list[Example]:
    """n examples of one domain for one split ('corpus', 'train', 'dev', 'test'), deterministic in seed."""
    rng = random.Random(f"specdraft-quality/{seed}/{domain}/{split}")
    bucket = "train" if split == "corpus" else split
    return [Example(f"{domain}/{split}/{i:06d}", domain, *make_example(domain, rng, bucket)) for i in range(n)]
