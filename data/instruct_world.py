"""The instruct world: prompts a real instruction-tuned model meets, built offline from text on the machine.

The demo and quality worlds are shaped for the tiny targets this project pretrains itself ("Question: ...
Answer:", completion style). A real chat model (configs/real.yaml: SmolLM2-135M-Instruct) is served user turns
through its chat template, so its prompts must read like requests a user writes. Nothing is downloaded, and no
packaged benchmark prompt set (HumanEval, MBPP, GSM8K, ...) is used: code tasks come from the running
interpreter's standard library, the rest from the demo world's generators and fixed templates.

  code       "Write a Python function `name(args)`. <its docstring's first sentence>" for documented
             standard-library functions; reference: the function's own source
  math       the demo world's grade-school word problems, asked to be solved step by step; reference: the
             worked solution
  summarize  a standard-library docstring paragraph to summarize in one sentence; reference: its first sentence
  chat       general instructions from templates: explain a concept, give tips, write a short text, compare two
             things, list things, write an email
  translate  (held out: no drafter is trained on it) an English docstring sentence to translate into French

The split is by source item (a function, a paragraph, a sentence) or by the prompt's fields (math, chat) through a
stable hash (~84% train, 8% dev, 8% test), so no dev or test prompt appears in training, and dev and test never
share a prompt. Source items take the demo world's splits, which give items that share text one split
(data/source_split.py): a sentence to translate lies in the split of every paragraph and docstring that holds it,
so no sentence of an evaluation prompt appears in a training prompt of any domain. Each domain has canonical
templates and rephrasings (the perturbed set).
"""
from __future__ import annotations

import ast
import random
from dataclasses import dataclass
from functools import lru_cache

from specdraft.core.errors import InputError
from specdraft.data import demo_world
from specdraft.data.source_split import fields_bucket
from specdraft.data.templates import render_from

DOMAINS = ("code", "math", "summarize", "chat")
HELDOUT_DOMAINS = ("translate",)
ALL_DOMAINS = DOMAINS + HELDOUT_DOMAINS
GENERATED_DOMAINS = ("math", "chat")  # written by generators from drawn values (demo_world.GENERATED_DOMAINS)
CORPUS = False  # its target is a real model: nothing to pretrain

# canonical template per domain (the `chat` domain's vary with its kind of request: CHAT_KINDS)
TEMPLATES: dict[str, str] = {
    "code": "Write a Python function `{signature}`. {doc}",
    "math": "Solve this math problem step by step.\n\n{question}",
    "summarize": "Summarize the following text in one sentence.\n\n{paragraph}",
    "chat": "{request}",
    "translate": "Translate the following sentence into French:\n{sentence}",
}
# the perturbed set: the same request in other words (a router keyed on the surface form should stumble)
REPHRASINGS: dict[str, list[str]] = {
    "code": ["Implement `{signature}` in Python. It should do this: {doc}",
             "I need a Python function with the signature `{signature}`. {doc} Can you write it?"],
    "math": ["{question} Show your reasoning and give the final answer.",
             "Here is a word problem for you:\n{question}\nPlease work it out."],
    "summarize": ["{paragraph}\n\nWhat is the main point of this text? Answer in one sentence.",
                  "Give me a one-sentence summary of this:\n{paragraph}"],
    "chat": ["Please help me with this. {request}", "{request} Keep it short, please."],
    "translate": ["How do you say this in French? \"{sentence}\"", "French translation of: {sentence}"],
}

# --------------------------------------------------------------------------- general instructions (chat)

CONCEPTS = ("photosynthesis", "gravity", "recursion", "inflation", "a hash table", "the water cycle", "compound interest",
            "machine learning", "a black hole", "the immune system", "supply and demand", "electricity",
            "a neural network", "climate change", "the stock market", "DNA", "an operating system", "democracy",
            "the internet", "a binary search", "vaccines", "renewable energy", "the French Revolution", "evolution",
            "a database index", "encryption", "the moon's phases", "a rainbow", "jet lag", "a mortgage", "caching",
            "version control", "the greenhouse effect", "plate tectonics", "a compiler", "probability", "entropy",
            "an API", "the placebo effect", "opportunity cost")
ACTIVITIES = ("learning a new language", "staying focused while studying", "sleeping better", "saving money",
              "starting to run", "writing clean code", "giving a presentation", "cooking on a budget",
              "keeping houseplants alive", "preparing for a job interview", "reducing stress", "learning to draw",
              "traveling on a budget", "making new friends in a new city", "staying productive at home",
              "debugging a program", "reading more books", "eating healthier", "organizing a small party",
              "taking better photos with a phone", "learning to play the guitar", "writing a good essay",
              "managing a team", "remembering names", "camping for the first time", "learning math",
              "keeping a journal", "negotiating a salary", "moving to a new home", "teaching a child to read")
FORMS = ("poem", "story", "haiku", "paragraph", "limerick")
SUBJECTS = ("the ocean", "a lost cat", "autumn leaves", "a robot who learns to paint", "the city at night",
            "a rainy morning", "friendship", "a mountain village", "the first day of school", "a lighthouse keeper",
            "a dragon who is afraid of fire", "coffee", "the stars", "a long train journey", "a small garden",
            "a snowy forest", "an old library", "a time traveler", "the sea at dawn", "a busy market",
            "a forgotten key", "a summer storm", "a clever fox", "the last bus home", "a birthday cake",
            "a kite", "the desert", "a music box", "a bridge", "a quiet river")
PAIRS = (("a virus", "a bacterium"), ("weather", "climate"), ("a list", "a tuple in Python"), ("RAM", "storage"),
         ("a democracy", "a monarchy"), ("speed", "velocity"), ("a crocodile", "an alligator"),
         ("an asteroid", "a comet"), ("baking soda", "baking powder"), ("a lake", "a pond"),
         ("HTTP", "HTTPS"), ("a simile", "a metaphor"), ("mass", "weight"), ("a frog", "a toad"),
         ("a process", "a thread"), ("stocks", "bonds"), ("a novel", "a short story"), ("a hurricane", "a tornado"),
         ("a compiler", "an interpreter"), ("latitude", "longitude"), ("an atom", "a molecule"),
         ("a debit card", "a credit card"), ("a rabbit", "a hare"), ("a sea", "an ocean"),
         ("a stack", "a queue"), ("empathy", "sympathy"), ("a violin", "a viola"), ("a comet", "a meteor"))
THINGS = ("fruits that are high in vitamin C", "famous painters", "programming languages", "ways to save energy at home",
          "animals that live in the Arctic", "board games for families", "uses of a paper clip", "countries in Europe",
          "healthy breakfast ideas", "planets in the solar system", "musical instruments", "things to do on a rainy day",
          "common sorting algorithms", "types of clouds", "benefits of exercise", "hobbies to try", "kitchen tools",
          "famous scientists", "renewable energy sources", "ways to reduce plastic waste", "rivers in Africa",
          "tips for a good night's sleep", "types of trees", "words that rhyme with light", "popular sports")
PURPOSES = ("to thank them for their help", "to ask for a meeting next week", "to apologize for missing a call",
            "to invite them to a dinner party", "to ask about a late delivery", "to congratulate them on a new job",
            "to remind them about a deadline", "to request a day off", "to share the notes from today's class",
            "to ask for feedback on a report", "to cancel a reservation", "to welcome them to the team",
            "to ask for a recommendation letter", "to follow up after an interview", "to plan a weekend trip")
NAMES = ("Ava", "Ben", "Chloe", "Dev", "Ella", "Finn", "Grace", "Hugo", "Iris", "Jack", "Kai", "Lena", "Maya",
         "Noah", "Omar", "Pia", "Quinn", "Rosa", "Sam", "Tara", "my manager", "my landlord", "a colleague",
         "my teacher", "a customer")
# kind -> (template, the lists its fields a and b are drawn from; a pair fills both)
CHAT_KINDS: dict[str, tuple[str, tuple[tuple, ...]]] = {
    "explain": ("Explain {a} in simple terms.", (CONCEPTS,)),
    "tips": ("Give me three tips for {a}.", (ACTIVITIES,)),
    "write": ("Write a short {a} about {b}.", (FORMS, SUBJECTS)),
    "compare": ("What is the difference between {a} and {b}?", (PAIRS,)),
    "list": ("List five {a}.", (THINGS,)),
    "email": ("Write a short email to {a} {b}.", (NAMES, PURPOSES)),
}


def make_chat(rng: random.Random) -> tuple[dict, str]:
    template, lists = CHAT_KINDS[rng.choice(sorted(CHAT_KINDS))]
    picks = [rng.choice(items) for items in lists]
    a, b = picks[0] if isinstance(picks[0], tuple) else (picks[0], picks[1] if len(picks) > 1 else "")
    return {"request": template.format(a=a, b=b)}, ""


def make_math(rng: random.Random) -> tuple[dict, str]:
    fields, solution = demo_world.make_math(rng)
    return fields, solution.strip()


# --------------------------------------------------------------------------- standard-library items


@lru_cache(maxsize=1)
def documented_functions() -> tuple[tuple[str, str, str, str], ...]:
    """(signature, first docstring sentence, source, the function's demo_world.function_key) of public,
    documented module-level standard-library functions (4-40 lines, one per name and sentence): each a "write
    this function" task with its answer."""
    seen, out = set(), []
    for function in demo_world.stdlib_functions():
        _, name, source = function
        if name.startswith("_"):
            continue
        try:  # a dedented method can break a multi-line string literal: skip it
            node = ast.parse(source).body[0]
        except SyntaxError:
            continue
        args = [a.arg for a in node.args.posonlyargs + node.args.args]
        doc = ast.get_docstring(node)
        if not doc or (args and args[0] in ("self", "cls")):
            continue
        sents = demo_world.split_sentences(doc.split("\n\n")[0])
        if not sents or not 4 <= len(sents[0].split()) <= 30 or sents[0][-1] != "." or (name, sents[0]) in seen:
            continue
        seen.add((name, sents[0]))
        out.append((f"{name}({ast.unparse(node.args)})", sents[0], source, demo_world.function_key(function)))
    return tuple(out)


# the domains drawn from a pool of source items: where the items come from and each one's key among the demo
# world's source items (demo_world.bucket_of gives its split, shared with every item it shares text with)
POOL_SOURCES = {"code": (documented_functions, lambda x: x[3]),
                "summarize": (demo_world.docstring_paragraphs, str),
                "translate": (demo_world.english_sentences, str)}


@lru_cache(maxsize=None)
def pool(domain: str, bucket: str) -> tuple:
    """The source items of a pooled domain in one split's bucket (cached: drawing a prompt is then a choice from
    a tuple, not a pass over the standard library)."""
    items, key = POOL_SOURCES[domain]
    return tuple(x for x in items() if demo_world.bucket_of(key(x)) == bucket)


def make_code(rng: random.Random, bucket: str) -> tuple[dict, str]:
    signature, doc, source, _ = rng.choice(pool("code", bucket))
    return {"signature": signature, "doc": doc}, f"```python\n{source}\n```"


def make_summarize(rng: random.Random, bucket: str) -> tuple[dict, str]:
    paragraph = rng.choice(pool("summarize", bucket))
    return {"paragraph": paragraph}, demo_world.split_sentences(paragraph)[0]


def make_translate(rng: random.Random, bucket: str) -> tuple[dict, str]:
    return {"sentence": rng.choice(pool("translate", bucket))}, ""


def render_prompt(domain: str, fields: dict, rephrasing: int | None = None) -> str:
    return render_from(TEMPLATES, REPHRASINGS, domain, fields, rephrasing)


@dataclass(frozen=True)
class Example:
    id: str
    domain: str
    fields: dict  # template fields
    response: str  # reference answer ("" where the world knows none)
    render = staticmethod(render_prompt)  # (domain, fields) -> prompt text: the world's templates

    @property
    def prompt(self) -> str:
        return self.render(self.domain, self.fields)


# --------------------------------------------------------------------------- splits

# domains drawn from a pool of source items already split by bucket, and those whose prompt fields are hashed
POOLED = {"code": make_code, "summarize": make_summarize, "translate": make_translate}
GENERATED = {"math": make_math, "chat": make_chat}


def build_split(domain: str, split: str, n: int, seed: int) -> list[Example]:
    """n distinct examples of one domain for one split ('train', 'dev', 'test'; 'corpus' is the train pool),
    deterministic in seed. A candidate is kept when its source item (code, summarize, translate) or its prompt
    fields (math, chat) hash into the split's bucket, so no two splits share a prompt."""
    if domain not in ALL_DOMAINS:
        raise ValueError(f"unknown instruct-world domain {domain!r}; choose from {', '.join(ALL_DOMAINS)}")
    rng = random.Random(f"specdraft-instruct/{seed}/{domain}/{split}")
    bucket = "train" if split == "corpus" else split
    too_few = InputError(f"the instruct world has fewer than {n} distinct {domain} prompts for split {split!r}; "
                         f"lower demo.{split}_per_domain")
    if domain in POOLED and len(pool(domain, bucket)) < n:  # a pool of distinct items bounds its prompts
        raise too_few
    out, seen = [], set()
    for _ in range(50 * n + 1000):
        if domain in POOLED:
            fields, response = POOLED[domain](rng, bucket)
        else:
            fields, response = GENERATED[domain](rng)
            if fields_bucket(domain, fields) != bucket:
                continue
        key = tuple(sorted(fields.items()))
        if key in seen:
            continue
        seen.add(key)
        out.append(Example(f"{domain}/{split}/{len(out):06d}", domain, fields, response))
        if len(out) == n:
            return out
    raise too_few
