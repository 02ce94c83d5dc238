"""Prompt sets as `datasets` datasets: the demo world's, or a user's JSONL files / datasets directories.

Every prompt set has the same columns, so the stages never care where prompts came from:
  id        stable example id ("<domain>/<split>/<n>")
  domain    task domain (drafters specialise by it)
  prompt    the user turn the target answers (its text)
  messages  "" for a single user turn, else the conversation before the answer as JSON (data/chat.py)
  response  reference answer ("" when unknown); the demo corpus uses it, generation never does
  split     train | dev | test | perturbed | ood
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import datasets

from specdraft.data import coder_world, demo_world, instruct_world, quality_world
from specdraft.data.chat import encode_messages, record_messages
from specdraft.core.errors import InputError
from specdraft.core.jsonl import jsonl_objects

COLUMNS = ("id", "domain", "prompt", "messages", "response", "split")
# the built-in worlds (`demo.world`): each a module with DOMAINS, HELDOUT_DOMAINS, ALL_DOMAINS, GENERATED_DOMAINS
# (those written by a generator, whose phrases recur across splits; every other domain embeds source items, each in
# one split for all domains), CORPUS (whether it has pretraining documents), build_split(domain, split, n, seed),
# and render_prompt(domain, fields, rephrasing) and REPHRASINGS for the perturbed set
WORLDS = {"demo": demo_world, "quality": quality_world, "instruct": instruct_world, "coder": coder_world}
SPLITS = ("train", "dev", "test")


def _rows(examples: list[demo_world.Example], split: str) -> list[dict]:
    return [{"id": e.id, "domain": e.domain, "prompt": e.prompt, "messages": "", "response": e.response,
             "split": split} for e in examples]


def demo_prompt_sets(seed: int, domains, heldout, n_train: int, n_dev: int, n_test: int,
                     world: str = "demo") -> datasets.DatasetDict:
    """train/dev/test per in-domain task, plus `perturbed` (test prompts reworded by fixed rephrasing
    templates) and `ood` (test prompts of held-out domains no drafter is trained on), from the built-in
    world named `world` (WORLDS)."""
    build_split, rephrase = WORLDS[world].build_split, WORLDS[world].render_prompt
    n_rephrasings = WORLDS[world].REPHRASINGS
    rows = {s: [] for s in (*SPLITS, "perturbed", "ood")}
    for domain in domains:
        for split, n in zip(SPLITS, (n_train, n_dev, n_test)):
            rows[split] += _rows(build_split(domain, split, n, seed), split)
        for i, e in enumerate(build_split(domain, "test", n_test, seed)):
            rows["perturbed"].append({"id": f"{domain}/perturbed/{i:06d}", "domain": domain,
                                      "prompt": rephrase(domain, e.fields, rephrasing=i % len(n_rephrasings[domain])),
                                      "messages": "",
                                      "response": e.response, "split": "perturbed"})
    for domain in heldout:
        rows["ood"] += [dict(r, id=r["id"].replace("/test/", "/ood/"), split="ood")
                        for r in _rows(build_split(domain, "test", n_test, seed), "ood")]
    return datasets.DatasetDict({s: datasets.Dataset.from_list(r) if r else _empty() for s, r in rows.items()})


def demo_corpus(seed: int, domains, n_per_domain: int, world: str = "demo") -> datasets.Dataset:
    """Pretraining documents (prompt + reference response) for every domain, held-out ones included:
    the target is the general model and knows every domain; drafters never see the held-out ones."""
    rows = [{"domain": d, "prompt": e.prompt, "response": e.response}
            for d in domains for e in WORLDS[world].build_split(d, "corpus", n_per_domain, seed)]
    return datasets.Dataset.from_list(rows)


def _empty() -> datasets.Dataset:
    return datasets.Dataset.from_dict({c: [] for c in COLUMNS})


def _split_of(example_id: str, dev_frac: float = 0.1, test_frac: float = 0.1) -> str:
    u = int(hashlib.sha256(example_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "dev" if u < dev_frac else "test" if u < dev_frac + test_frac else "train"


# the keys a prompt record may carry; any other key is ignored (dumps from other tools carry their own)
RECORD_KEYS = ("id", "domain", "prompt", "messages", "conversations", "response", "split")


def load_user_prompts(path: str | Path) -> list[dict]:
    """A JSONL file (one object per line) or a `datasets` directory (Dataset or DatasetDict) of records
    with a `prompt` string, an OpenAI `messages` list or a ShareGPT `conversations` list (data/chat.py);
    optional `domain`, `response`, `split`, `id`. A malformed record is one line naming file and line."""
    return [row for _, row in _user_records(path)]


def _optional_text(r: dict, key: str, where: str) -> str | None:
    """r[key] as given (None when absent or null); a value of another type is refused, not str()-ed into
    a domain or id the user never wrote."""
    value = r.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{where} has {key} {str(value)[:40]!r} ({type(value).__name__}); give a non-empty "
                         f"string or leave '{key}' out")
    return value


def _check_keys(r: dict, where: str) -> None:
    # a misspelt optional key ('domian') would be ignored and its value replaced by the default: refuse
    # keys that look like one of ours, keep the rest (other tools' dumps carry their own)
    import difflib

    for key in r:
        if key not in RECORD_KEYS:
            near = difflib.get_close_matches(str(key), RECORD_KEYS, n=1, cutoff=0.8)
            if near:
                raise InputError(f"{where} has key '{key}'; did you mean '{near[0]}'? (rename it, or drop it)")


def _user_records(path: str | Path) -> list[tuple[str, dict]]:
    """(where, prompt-set row) of every record of one prompt source."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"prompt source '{path}' does not exist; give a JSONL file or a datasets directory")
    if path.is_dir():
        try:
            ds = datasets.load_from_disk(str(path))
        except Exception as e:  # datasets raises several types for a non-dataset dir
            raise InputError(f"'{path}' is not a datasets directory ({type(e).__name__}); save it with save_to_disk") from None
        parts = ds.items() if isinstance(ds, datasets.DatasetDict) else [(None, ds)]
        raw = [(f"{path} record {n}", dict(r, split=r.get("split") or split))
               for split, d in parts for n, r in enumerate(d)]
    else:
        raw = jsonl_objects(path, "prompt source", "{\"prompt\": \"...\"}")
    rows = []
    for n, (where, r) in enumerate(raw):
        _check_keys(r, where)
        messages, reference = record_messages(r, where)
        domain = _optional_text(r, "domain", where) or path.stem
        ex_id = _optional_text(r, "id", where) or f"{domain}/{path.stem}/{n:06d}"
        split = _optional_text(r, "split", where) or _split_of(ex_id)
        if split not in (*SPLITS, "perturbed", "ood"):
            raise InputError(f"{where} has split {split!r}; use train, dev, test, perturbed or ood")
        rows.append((where, {"id": ex_id, "domain": domain, "prompt": messages[-1]["content"],
                             "messages": encode_messages(messages), "response": reference, "split": split}))
    if not rows:
        raise InputError(f"prompt source '{path}' holds no prompts; write one JSON record per line")
    return rows


def user_prompt_sets(paths) -> datasets.DatasetDict:
    records = [rec for p in paths for rec in _user_records(p)]
    first: dict[str, str] = {}
    for where, r in records:
        if r["id"] in first:
            raise InputError(f"prompt id {r['id']!r} appears twice ({first[r['id']]} and {where}); ids must be "
                             "unique across the prompt sources")
        first[r["id"]] = where
    rows = [r for _, r in records]
    by_split = {s: [r for r in rows if r["split"] == s] for s in (*SPLITS, "perturbed", "ood")}
    return datasets.DatasetDict({s: datasets.Dataset.from_list(r) if r else _empty() for s, r in by_split.items()})


def load_prompt_sets(prompts_dir: str | Path) -> datasets.DatasetDict:
    """The `prompts/` stage output."""
    path = Path(prompts_dir) / "sets"
    try:
        return datasets.load_from_disk(str(path))
    except Exception as e:  # pyarrow's damage errors (OSError, ArrowInvalid) and a missing directory
        raise InputError(f"'{path}' is not a readable prompt set ({type(e).__name__}); rerun stage "
                         f"'prepare-data' with --force") from None


def domains_of(ds: datasets.Dataset) -> list[str]:
    return sorted(set(ds["domain"]))


def fit_prompt(ids: list[int], max_tokens: int, policy: str, ex_id: str) -> tuple[list[int], int]:
    """Truncate a long prompt from the left (keeping BOS) or refuse it."""
    if len(ids) <= max_tokens:
        return ids, 0
    if policy == "refuse":
        raise InputError(f"prompt {ex_id} has {len(ids)} tokens > distill_data.max_prompt_tokens={max_tokens}; "
                         "raise the limit or set distill_data.long_prompts: truncate")
    dropped = len(ids) - max_tokens
    return ids[:1] + ids[1 + dropped:], dropped
