"""decoding/bundle/directory.py on a hand-built bundle (tiny random models, no pipeline): it loads from anywhere,
and every kind of damage or escape attempt is refused with a one-line InputError before use."""
import json
import shutil

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import specdraft.decoding.bundle.directory as bundle_module
from specdraft.decoding.bundle.directory import BUNDLE_JSON, bundle_files, inspect_bundle, load_bundle, write_bundle_json
from specdraft.core.hashing import content_hash
from specdraft.pipelines.cli import main as cli_main
from specdraft.core.errors import InputError
from specdraft.decoding.policies.acceptance_head import AcceptanceHead, save_head
from tests.decoding.conftest import noisy_copy, tiny_llama

V = 64
WEIGHTS = ["target/model.safetensors", "drafters/d/model.safetensors", "heads/d/D1_w6/head.safetensors"]


def tiny_tokenizer(vocab: int = V) -> PreTrainedTokenizerFast:
    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(vocab - 3)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def _meta(root, tok_sha: str, drafter_tok_sha: str | None = None) -> dict:
    return {
        "target": {"path": "target", "tokenizer_sha256": tok_sha, "vocab_size": V, "dtype": "float32"},
        "drafters": {"d": {"path": "drafters/d", "domains": ["math"], "parameters": 1234, "hidden_size": 32,
                           "vocab_size": V, "tokenizer_sha256": drafter_tok_sha or tok_sha, "head": "D1_w6",
                           "alignment": {"math": {"acceptance": 0.8, "agreement": 0.7, "positions": 10}}}},
        "heads": {"d": {"D1_w6": {"path": "heads/d/D1_w6", "drafter": "d", "depth": 1, "w_rej": 6.0,
                                  "threshold": 0.7, "k_max": 20, "best": True,
                                  "label_transform": {"temperature": 1.0, "top_k": 0, "top_p": 1.0}}}},
        "routers": {},
        "decoding": {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "k": 4, "k_max": 20, "selector": "ucb", "cost_ratio": 0.25,
                     "max_new_tokens": 16},
    }


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    from specdraft.core.tokenizers import tokenizer_fingerprint

    root = tmp_path_factory.mktemp("bundle_template") / "bundle"
    tok = tiny_tokenizer()
    target = tiny_llama(0, vocab=V, layers=1)
    for model, d in ((target, root / "target"), (noisy_copy(target, 0.05, seed=1), root / "drafters" / "d")):
        model.save_pretrained(d)
        tok.save_pretrained(d)
    drafter_hash = bundle_module.drafter_hash(bundle_files(root / "drafters" / "d"))
    torch.manual_seed(0)
    save_head(AcceptanceHead(32, depth=1), root / "heads" / "d" / "D1_w6",
              {"drafter": "d", "drafter_hash": drafter_hash, "w_rej": 6.0, "threshold": 0.7})
    from specdraft.decoding.bundle.loading import load_tokenizer

    write_bundle_json(root, _meta(root, tokenizer_fingerprint(load_tokenizer(root / "target"))))
    return root


@pytest.fixture
def bundle(template, tmp_path):
    root = tmp_path / "bundle"
    shutil.copytree(template, root)
    return root


def _edit_json(root, fn):
    meta = json.loads((root / BUNDLE_JSON).read_text())
    fn(meta)
    (root / BUNDLE_JSON).write_text(json.dumps(meta))


def _refused(root, match, capsys):
    with pytest.raises(InputError, match=match) as e:
        load_bundle(root)
    assert "\n" not in str(e.value)
    capsys.readouterr()
    assert cli_main(["inspect-bundle", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specdraft: error:") and "\n" not in err


def test_moved_bundle_loads_and_runs(bundle, tmp_path):
    moved = tmp_path / "elsewhere" / "b"
    moved.parent.mkdir()
    shutil.move(bundle, moved)
    b = load_bundle(moved)
    assert b.verified and b.target_in_bundle and b.root == moved.resolve()
    assert b.drafters["d"].domains == ["math"] and b.heads["d"]["D1_w6"].threshold == 0.7
    assert b.sampling_config().greedy and b.decoding["k"] == 4
    tok = b.load_tokenizer()
    ids = torch.tensor([tok("w1 w2 w3 w4")["input_ids"]])
    target = b.load_target(device="cpu")
    drafter = b.load_drafter("d", device="cpu", dtype="float32", target=target)
    head, config = b.load_head("d")
    with torch.no_grad():
        out = drafter(ids, output_hidden_states=True)
        assert out.logits.shape == target(ids).logits.shape == (1, 4, V)
        sigma = torch.sigmoid(head(out.hidden_states[-1]))
    assert sigma.shape == (1, 4) and ((sigma > 0) & (sigma < 1)).all()
    assert config["w_rej"] == 6.0 and config["depth"] == 1


@pytest.mark.parametrize("weight", WEIGHTS)
def test_flipped_byte_in_any_weight_file_is_refused(bundle, weight, capsys):
    p = bundle / weight
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))
    _refused(bundle, f"'{weight}' does not match its sha256", capsys)
    load_bundle(bundle, verify=False)  # verify=False trusts the bytes (paths are still checked)


def test_tampered_hash_is_refused(bundle, capsys):
    _edit_json(bundle, lambda m: m["files"].update({"drafters/d/config.json": "0" * 64}))
    _refused(bundle, "'drafters/d/config.json' does not match", capsys)


def test_deleted_file_is_refused(bundle, capsys):
    (bundle / "heads/d/D1_w6/head_config.json").unlink()
    _refused(bundle, "'heads/d/D1_w6/head_config.json' is missing", capsys)


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "drafters/../../x", "..\\x", "C:/x", ""])
def test_paths_leaving_the_bundle_are_refused(bundle, bad, capsys):
    _edit_json(bundle, lambda m: m["files"].update({bad: "0" * 64}))
    _refused(bundle, "path", capsys)


@pytest.mark.parametrize("bad", ["../x", "/etc"])
def test_component_paths_leaving_the_bundle_are_refused(bundle, bad, capsys):
    _edit_json(bundle, lambda m: m["drafters"]["d"].update({"path": bad}))
    _refused(bundle, "leaves the bundle", capsys)


def test_symlink_out_of_the_bundle_is_refused(bundle, tmp_path, capsys):
    outside = tmp_path / "secret.txt"
    outside.write_text("not yours")
    (bundle / "drafters/d/notes.txt").symlink_to(outside)
    _edit_json(bundle, lambda m: m["files"].update({"drafters/d/notes.txt": content_hash({})}))
    _refused(bundle, "resolves outside the bundle", capsys)


def test_unknown_format_and_unlisted_or_pickle_files_are_refused(bundle, capsys):
    (bundle / "drafters/d/pytorch_model.bin").write_bytes(b"pickle")
    _refused(bundle, "not in bundle.json", capsys)
    _edit_json(bundle, lambda m: m["files"].update({"drafters/d/pytorch_model.bin": "0" * 64}))
    _refused(bundle, "safetensors only", capsys)
    _edit_json(bundle, lambda m: m.update({"format": "specdraft-bundle/99"}))
    _refused(bundle, "format 'specdraft-bundle/99' is not supported", capsys)
    (bundle / BUNDLE_JSON).write_text("{not json")
    _refused(bundle, "not valid JSON", capsys)
    (bundle / BUNDLE_JSON).write_text(json.dumps({"format": "specdraft-bundle/1", "files": {}, "target": [],
                                                  "drafters": {}, "heads": {}, "decoding": {}}))
    _refused(bundle, "target lacks", capsys)


def test_head_for_another_drafter_is_refused(bundle):
    cfg_path = bundle / "heads/d/D1_w6/head_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["drafter_hash"] = "f" * 64
    cfg_path.write_text(json.dumps(cfg))
    write_bundle_json(bundle, {k: v for k, v in json.loads((bundle / BUNDLE_JSON).read_text()).items()
                               if k not in ("files", "format")})
    b = load_bundle(bundle)
    with pytest.raises(InputError, match="was trained on drafter hash"):
        b.load_head("d")
    with pytest.raises(InputError, match="no head 'D9'"):
        b.load_head("d", "D9")
    with pytest.raises(InputError, match="no drafter 'nope'"):
        b.load_drafter("nope")


def test_a_head_whose_config_disagrees_with_bundle_json_is_refused(bundle):
    """h is bundle.json's (what every decode reads); the head's own head_config.json, which export copied it
    from, must say the same, or the bundle was edited by hand."""
    cfg_path = bundle / "heads/d/D1_w6/head_config.json"
    cfg = json.loads(cfg_path.read_text())
    assert load_bundle(bundle).load_head("d")[1]["threshold"] == 0.7
    cfg_path.write_text(json.dumps({**cfg, "threshold": 0.4}))
    write_bundle_json(bundle, {k: v for k, v in json.loads((bundle / BUNDLE_JSON).read_text()).items()
                               if k not in ("files", "format")})
    with pytest.raises(InputError, match=r"bundle.json says threshold = 0.7, its head_config.json 0.4; re-export"):
        load_bundle(bundle).load_head("d")


def test_drafter_with_another_tokenizer_is_refused(bundle):
    meta = json.loads((bundle / BUNDLE_JSON).read_text())
    write_bundle_json(bundle, _meta(bundle, meta["target"]["tokenizer_sha256"], drafter_tok_sha="e" * 64))
    with pytest.raises(InputError, match="drafter 'd' uses a tokenizer or vocabulary other than the target's"):
        load_bundle(bundle)
    meta = _meta(bundle, meta["target"]["tokenizer_sha256"])
    meta["drafters"]["d"]["vocab_size"] = V + 1
    write_bundle_json(bundle, meta)
    with pytest.raises(InputError, match="drafter 'd' uses a tokenizer or vocabulary"):
        load_bundle(bundle)


def test_inspect_summarises_and_counts_verified_files(bundle, capsys):
    text = inspect_bundle(bundle)
    n = len(json.loads((bundle / BUNDLE_JSON).read_text())["files"])
    assert f"all {n} files verified" in text and n == len(bundle_files(bundle))
    for expected in ("domains: math", "1.2k params", "math 0.800/0.700", "d/D1_w6", "D=1 w_rej=6 h=0.7",
                     "routers: none", "selector=ucb"):
        assert expected in text
    assert cli_main(["inspect-bundle", str(bundle)]) == 0
    assert capsys.readouterr().out.strip() == text


def test_heads_are_matched_to_the_decoding_transform(bundle):
    from specdraft.decoding.generate import load_pair
    from specdraft.decoding.rounds.sampling import SamplingConfig

    b = load_bundle(bundle)
    assert b.head_for("d", SamplingConfig(1.0)) == "D1_w6"  # labelled at T=1
    assert b.head_for("d", SamplingConfig(0.0)) is None and b.head_for("d", SamplingConfig(0.7)) is None
    # generate: the head of the decoding transform when there is one, else the drafter's default head
    for sampling in (SamplingConfig(1.0), SamplingConfig(0.0)):  # D1_w6 both times: matched, then the default
        *_, head, cfg = load_pair(bundle=str(bundle), drafter="d", sampling=sampling)
        assert head is not None and cfg["w_rej"] == 6.0
