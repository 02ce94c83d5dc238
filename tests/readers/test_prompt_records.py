"""Prompt records (JSONL prompt sources of prepare-data, `specdraft generate --prompts`): one line reader
(core/jsonl.py) and one record reader (data/chat.py) for both, so the same damage gets the same line."""
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdraft.core.errors import InputError
from specdraft.data.chat import row_messages
from specdraft.data.prompts import load_user_prompts, user_prompt_sets
from specdraft.pipelines.generate import read_prompts
from specdraft.pipelines.cli import main
from tests.readers.fuzz import TRIED, check_refusal, damage, edits, fewer, json_values

REPO = Path(__file__).resolve().parents[2]
SPLITS = ("train", "dev", "test", "perturbed", "ood")
text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)
name = st.text("abcdefgh-_/", min_size=1, max_size=8).filter(str.strip)


@st.composite
def records(draw):
    """A valid record of one of the three kinds, with some of the optional keys."""
    kind = draw(st.sampled_from(["prompt", "messages", "conversations"]))
    question, answer = draw(text), draw(st.one_of(st.none(), text))
    if kind == "prompt":
        rec = {"prompt": question}
        if answer is not None:
            rec["response"] = answer
    elif kind == "messages":
        turns = ([{"role": "system", "content": draw(text)}] if draw(st.booleans()) else []) + \
                [{"role": "user", "content": question}]
        rec = {"messages": turns + ([{"role": "assistant", "content": answer}] if answer is not None else [])}
    else:
        turns = [{"from": "human", "value": question}]
        rec = {"conversations": turns + ([{"from": "gpt", "value": answer}] if answer is not None else [])}
    for key, values in (("domain", name), ("split", st.sampled_from(SPLITS))):
        if draw(st.booleans()):
            rec[key] = draw(values)
    return rec, question, answer or ""


def write(path: Path, recs, ascii_: bool = True) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=ascii_) + "\n" for r in recs), encoding="utf-8")
    return path


def outcome(load, path):
    try:
        return load(path), None
    except InputError as e:
        return None, e


@given(recs=st.lists(records(), min_size=1, max_size=5), ascii_=st.booleans(), ids=st.booleans())
def test_valid_records_round_trip_through_both_readers(tmp_path, recs, ascii_, ids):
    TRIED["prompt records"] += 1
    raw = [dict(r, id=f"x{i}") if ids else r for i, (r, _, _) in enumerate(recs)]
    path = write(tmp_path / "src.jsonl", raw, ascii_)
    rows = load_user_prompts(path)
    assert [r["prompt"] for r in rows] == [q for _, q, _ in recs]
    assert [r["response"] for r in rows] == [a for _, _, a in recs]
    assert [r["domain"] for r in rows] == [r.get("domain", "src") for r in raw]
    assert [r["split"] for r in rows if "split" in raw[0]][:1] == [raw[0]["split"]][:1] if "split" in raw[0] else True
    if ids:
        assert [r["id"] for r in rows] == [f"x{i}" for i in range(len(raw))]
    # generate --prompts reads the same file to the same conversations (less the reference answers)
    assert read_prompts(str(path)) == [row_messages(r) for r in rows]


@given(recs=st.lists(records(), min_size=1, max_size=4), ops=edits)
def test_damaged_bytes_load_or_name_the_file_and_line(tmp_path, recs, ops):
    TRIED["prompt records"] += 1
    path = tmp_path / "src.jsonl"
    path.write_bytes(damage(write(path, [r for r, _, _ in recs], False).read_bytes(), ops))
    rows, err = outcome(load_user_prompts, path)
    messages, gen_err = outcome(lambda p: read_prompts(str(p)), path)
    if err is None:  # damage that left valid records: both readers see the same prompts
        assert messages == [row_messages(r) for r in rows]
        return
    msg = check_refusal(err, path)
    assert "holds no prompts" in msg or f"{path}:" in msg, msg  # the line, wherever there is one
    # a line both readers refuse is the same line, with the same words up to the reader's name for the file
    if gen_err is not None and "holds no prompts" not in msg:
        assert str(gen_err).split(" ")[0] == msg.split(" ")[0]


# damage of one record that can only be refused: (how, what the refusal says)
WRONG = {
    "prompt": st.one_of(st.just(""), st.integers(), st.lists(text, max_size=2), st.booleans()),
    "domain": st.one_of(st.integers(), st.booleans(), st.lists(name, max_size=2), st.just(" ")),
    "id": st.one_of(st.integers(), st.floats(allow_nan=False), st.dictionaries(name, name, max_size=1), st.just("")),
    "split": st.one_of(name.filter(lambda s: s not in SPLITS), st.integers()),
    "response": st.one_of(st.integers(), st.lists(text, max_size=2), st.booleans()),
    "messages": st.one_of(st.just([]), json_values.filter(lambda v: v is not None and not isinstance(v, list))),
}


@given(recs=st.lists(records(), min_size=1, max_size=4), at=st.integers(0, 3), data=st.data(),
       damage_kind=st.sampled_from(sorted(WRONG) + ["near-miss key", "duplicate key", "not an object"]))
def test_wrong_records_are_refused_at_their_line(tmp_path, recs, at, data, damage_kind):
    TRIED["prompt records"] += 1
    raw = [dict(r) for r, _, _ in recs]
    at = at % len(raw)
    path = tmp_path / "src.jsonl"
    lines = [json.dumps(r) for r in raw]
    if damage_kind in WRONG:
        raw[at] = {k: v for k, v in raw[at].items() if k not in ("messages", "conversations")} \
            if damage_kind == "prompt" else raw[at]
        raw[at][damage_kind] = data.draw(WRONG[damage_kind])
        if damage_kind == "prompt":
            raw[at].pop("conversations", None)
        lines[at] = json.dumps(raw[at])
    elif damage_kind == "near-miss key":
        key = data.draw(st.sampled_from(["domian", "promt", "splt", "respone", "mesages"]))
        lines[at] = json.dumps({**raw[at], key: "x"})
    elif damage_kind == "duplicate key":
        lines[at] = lines[at][:-1] + f', {json.dumps(next(iter(raw[at])))}: "again"}}'
    else:
        lines[at] = json.dumps(data.draw(json_values.filter(lambda v: not isinstance(v, dict))))
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as e:
        load_user_prompts(path)
    check_refusal(e.value, path, line=at + 1)


@given(recs=st.lists(records(), min_size=2, max_size=4), data=st.data())
def test_duplicate_ids_are_refused_naming_both_records(tmp_path, recs, data):
    TRIED["prompt records"] += 1
    raw = [dict(r, id=f"x{i}") for i, (r, _, _) in enumerate(recs)]
    i, j = data.draw(st.lists(st.integers(0, len(raw) - 1), min_size=2, max_size=2, unique=True))
    raw[j]["id"] = raw[i]["id"]
    path = write(tmp_path / "src.jsonl", raw)
    with pytest.raises(InputError) as e:
        user_prompt_sets([path])
    msg = check_refusal(e.value, path)
    assert f"src.jsonl:{min(i, j) + 1}" in msg and f"src.jsonl:{max(i, j) + 1}" in msg


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"])
def test_empty_sources_are_refused(tmp_path, content):
    path = tmp_path / "src.jsonl"
    path.write_bytes(content)
    for load in (load_user_prompts, lambda p: read_prompts(str(p))):
        with pytest.raises(InputError, match="holds no prompts") as e:
            load(path)
        check_refusal(e.value, path)


def test_a_bom_is_not_damage(tmp_path):
    path = tmp_path / "src.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"prompt": "q"}).encode() + b"\n")
    assert [r["prompt"] for r in load_user_prompts(path)] == ["q"]


# ---- the named bug: prepare-data and generate --prompts, one behaviour for non-UTF-8 bytes ----------------


@pytest.mark.parametrize("bad", [b"\xff\xfe", b"caf\xe9", b"\x80"])
def test_prepare_data_stops_on_non_utf8_source_with_file_and_line(tmp_path, capsys, bad):
    source = tmp_path / "mine.jsonl"
    source.write_bytes(b'{"prompt": "one"}\n{"prompt": "' + bad + b'"}\n')
    root = tmp_path / "run"
    code = main(["prepare-data", str(REPO / "configs" / "demo.yaml"), f"run.root={root}",
                 f"prompts.sources=[{json.dumps(str(source))}]"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("specdraft: error:") and "\n" not in err
    assert f"{source}:2 is not UTF-8 text" in err and "save the prompt source as UTF-8" in err
    assert not (root / "prompts").exists()  # nothing written: not even a partial stage output
    # and generate --prompts names the same line for the same bytes
    with pytest.raises(InputError, match=f"{source}:2 is not UTF-8 text"):
        read_prompts(str(source))


# ---- the other kind of prompt source: a `datasets` directory, read by the same record reader ---------------


@fewer(8)  # each example saves an Arrow dataset
@given(prompts=st.lists(text, min_size=1, max_size=4), domains=st.one_of(st.none(), st.lists(name, min_size=4, max_size=4)),
       wrong=st.sampled_from([None, "domain", "split", "prompt"]))
def test_datasets_directories_round_trip_or_name_the_record(tmp_path, prompts, domains, wrong):
    import datasets

    TRIED["prompt records"] += 1
    columns = {"prompt": list(prompts)}
    if domains is not None:
        columns["domain"] = domains[:len(prompts)]
    if wrong == "domain":
        columns["domain"] = list(range(len(prompts)))  # an int column: str() would invent domain names
    elif wrong == "split":
        columns["split"] = ["holdout"] * len(prompts)
    elif wrong == "prompt":
        columns["prompt"][-1] = ""
    d = tmp_path / "ds"
    datasets.Dataset.from_dict(columns).save_to_disk(str(d))
    if wrong is None:
        rows = load_user_prompts(d)
        assert [r["prompt"] for r in rows] == prompts
        assert [r["domain"] for r in rows] == (columns.get("domain") or ["ds"] * len(prompts))
        return
    with pytest.raises(InputError) as e:
        load_user_prompts(d)
    msg = check_refusal(e.value, d)
    assert "record" in msg
