"""`specdraft generate` end to end on a hand-built bundle (tiny random models, a centroid router, one
SpecDec++ head): prompt files in, one JSON line per prompt out; the bundle's own drafter choice and
decoding defaults; every unusable argument or prompt record refused with one line and exit code 2."""
import json
import shutil

import pytest
import torch

import specdraft.decoding.bundle.directory as bundle_module
import specdraft.pipelines.generate as generate_module
from specdraft.decoding.policies.acceptance_head import AcceptanceHead, save_head
from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.decoding.bundle.directory import BUNDLE_JSON, bundle_files, load_bundle, write_bundle_json
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.routers.router import CentroidRouter, mean_pooled, save_router
from specdraft.pipelines.cli import main
from tests.decoding.conftest import noisy_copy, tiny_llama
from tests.decoding.test_bundle import V, bundle, tiny_tokenizer  # noqa: F401 (bundle: a copy of this module's template)

MATH, CODE = "w3 w4 w5 w6", "w50 w51 w52 w53"  # prompts the router sends to different drafters
DRAFTERS = {"code": (["code"], 0.05), "math": (["math"], 0.02), "ofa": (["code", "math"], 0.01)}


def _meta(tok_sha: str, threshold=None) -> dict:
    return {
        "target": {"path": "target", "tokenizer_sha256": tok_sha, "vocab_size": V, "dtype": "float32"},
        "drafters": {n: {"path": f"drafters/{n}", "domains": d, "parameters": 1, "hidden_size": 32, "vocab_size": V,
                         "tokenizer_sha256": tok_sha, "head": "T1/D1" if n == "math" else None,
                         "fixed_k": {"code": 2, "math": 3, "ofa": 5}[n]}
                     for n, (d, _) in DRAFTERS.items()},
        "heads": {"math": {"T1/D1": {"path": "heads/math/T1/D1", "drafter": "math", "depth": 1, "w_rej": 6.0,
                                     "threshold": 0.7, "k_max": 6, "best": True,
                                     "label_transform": {"temperature": 0.0, "top_k": 0, "top_p": 1.0}}}},
        "routers": {"centroid": {"path": "router/centroid", "kind": "centroid"}},
        "decoding": {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "k": 4, "k_max": 20, "selector": "ucb",
                     "max_new_tokens": 6, "cost_ratio": 0.3, "threshold": threshold},
    }


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    from specdraft.core.tokenizers import tokenizer_fingerprint
    from specdraft.decoding.bundle.loading import load_tokenizer

    root = tmp_path_factory.mktemp("generate_bundle") / "bundle"
    tok = tiny_tokenizer()
    target = tiny_llama(0, vocab=V, layers=1)
    target.save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    for i, (name, (_, noise)) in enumerate(DRAFTERS.items()):
        noisy_copy(target, noise, seed=i + 1).save_pretrained(root / "drafters" / name)
        tok.save_pretrained(root / "drafters" / name)
    torch.manual_seed(0)
    save_head(AcceptanceHead(32, depth=1), root / "heads" / "math" / "T1" / "D1",
              {"drafter": "math", "drafter_hash": bundle_module.drafter_hash(bundle_files(root / "drafters" / "math")),
               "w_rej": 6.0, "threshold": 0.7, "k_max": 6})
    fp = tokenizer_fingerprint(load_tokenizer(root / "target"))
    ids = [tok(t)["input_ids"] for t in (MATH, "w4 w5 w7", CODE, "w51 w54 w55")]
    router = CentroidRouter(32, ["math", "code"], ["math", "code"]).fit(
        mean_pooled(target.get_input_embeddings(), ids), ["math", "math", "code", "code"])
    save_router(router, root / "router" / "centroid", {"tokenizer_fingerprint": fp})
    write_bundle_json(root, _meta(fp))
    return root


def _set_decoding(root, **changes):
    meta = json.loads((root / BUNDLE_JSON).read_text())
    meta["decoding"].update(changes)
    for k in [k for k, v in changes.items() if v is ...]:
        meta["decoding"].pop(k)
    (root / BUNDLE_JSON).write_text(json.dumps(meta))


def _prompts(tmp_path, lines) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b"\n".join(x if isinstance(x, bytes) else json.dumps(x).encode() for x in lines) + b"\n")
    return str(path)


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _greedy_reference(root, prompt: str, n: int) -> list[int]:
    b = load_bundle(root)
    tok, target = b.load_tokenizer(), b.load_target(device="cpu")
    return generate_autoregressive(target, tok(prompt)["input_ids"], n, SamplingConfig(0.0), [tok.eos_token_id]).tokens


def test_prompt_file_to_jsonl_with_the_bundles_router_and_batches(bundle, tmp_path, capsys):
    records = [{"prompt": MATH}, {"messages": [{"role": "user", "content": CODE}]}, {"prompt": "w4 w5"},
               {"conversations": [{"from": "human", "value": "w52 w50"}]}, {"prompt": MATH}]
    prompts = _prompts(tmp_path, records)
    outs = {}
    for b in (1, 2):
        out = tmp_path / f"out{b}.jsonl"
        assert main(["generate", str(bundle), "--prompts", prompts, "--batch-size", str(b), "--output", str(out)]) == 0
        outs[b] = _lines(out)
    capsys.readouterr()
    rows = outs[1]
    assert [r["index"] for r in rows] == list(range(len(records)))
    # the router's choice per prompt (never the first drafter in the bundle, "code", for a math prompt)
    assert [r["drafter"] for r in rows] == ["math", "code", "math", "code", "math"]
    assert rows[0]["head"] == "T1/D1" and rows[1]["head"] is None  # math has a SpecDec++ head, code does not
    tok = load_bundle(bundle).load_tokenizer()
    for r in rows:
        assert r["N"] == len(r["token_ids"]) <= 6  # the bundle's max_new_tokens
        assert r["text"] == tok.decode(r["token_ids"], skip_special_tokens=True)
        assert r["MAT"] > 0 and r["N_target"] >= 1 and {"N_draft", "N_discarded", "rounds"} <= set(r)
    # greedy: speculative output is the target's own, whatever the drafter and the batch
    assert rows[0]["token_ids"] == _greedy_reference(bundle, MATH, 6)
    assert rows[1]["prompt"] == CODE  # a single user turn is reported as its text
    assert [r["token_ids"] for r in outs[2]] == [r["token_ids"] for r in rows]
    assert [r["drafter"] for r in outs[2]] == [r["drafter"] for r in rows]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle", "out1.jsonl", "out2.jsonl", "prompts.jsonl"]


def test_without_a_router_the_all_domain_drafter_serves_not_the_first(bundle, tmp_path, capsys, monkeypatch):
    seen = []
    real = generate_module.decode_batch
    monkeypatch.setattr(generate_module, "decode_batch", lambda target, prompts, n, plan, *a: seen.append(
        plan.policy().max_tokens) or real(target, prompts, n, plan, *a))
    out = tmp_path / "o.jsonl"
    assert main(["generate", str(bundle), "--prompts", _prompts(tmp_path, [{"prompt": MATH}]), "--router", "none",
                 "--output", str(out)]) == 0
    assert _lines(out)[0]["drafter"] == "ofa" and seen == [5]  # the bundle's best fixed K for ofa
    meta = json.loads((bundle / BUNDLE_JSON).read_text())
    meta["routers"] = {}
    shutil.rmtree(bundle / "router")
    meta.pop("files")
    write_bundle_json(bundle, meta)
    assert main(["generate", str(bundle), "--prompt", CODE]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["N"] >= 1 and seen[-1] == 5
    assert main(["generate", str(bundle), "--prompt", CODE, "--drafter", "code", "--k", "3"]) == 0 and seen[-1] == 3


@pytest.mark.parametrize("threshold, want", [(None, 0.7), (0.4, 0.4)])
def test_specdecpp_runs_at_the_bundles_threshold_else_the_heads(bundle, tmp_path, monkeypatch, capsys,
                                                                threshold, want):
    _set_decoding(bundle, threshold=threshold)
    seen = []
    real = generate_module.decode_batch
    monkeypatch.setattr(generate_module, "decode_batch", lambda target, prompts, n, plan, *a: seen.append(
        (plan.policy().threshold, plan.policy().max_tokens)) or real(target, prompts, n, plan, *a))
    assert main(["generate", str(bundle), "--prompt", MATH, "--drafter", "math"]) == 0
    assert seen and set(seen) == {(want, 6)}  # k_max: the head's own cap
    assert main(["generate", str(bundle), "--prompt", MATH, "--drafter", "math", "--threshold", "0.2"]) == 0
    assert seen[-1] == (0.2, 6)


@pytest.mark.parametrize("argv, message", [
    (["--k", "0"], "argument --k: must be an integer >= 1, got '0'"),
    (["--k", "two"], "argument --k: must be an integer >= 1, got 'two'"),
    (["--temperature", "-1"], "argument --temperature: must be a number >= 0"),
    (["--temperature", "nan"], "argument --temperature: must be a number >= 0"),
    (["--top-p", "0"], "argument --top-p: must be a number in (0, 1]"),
    (["--top-p", "1.5"], "argument --top-p: must be a number in (0, 1]"),
    (["--top-k", "-2"], "argument --top-k: must be an integer >= 0"),
    (["--batch-size", "0"], "argument --batch-size: must be an integer >= 1"),
    (["--max-new-tokens", "0"], "argument --max-new-tokens: must be an integer >= 1"),
    (["--threshold", "1"], "argument --threshold: must be a number in (0, 1)"),
    (["--compile", "max"], "argument --compile: invalid choice: 'max'"),
    (["--k", "2", "--threshold", "0.5"], "--k (fixed K) and --threshold (SpecDec++) choose different policies"),
    (["--drafter", "nope"], "the bundle has no drafter 'nope'"),
    (["--router", "nope"], "the bundle has no router 'nope'"),
    (["--drafter", "code", "--threshold", "0.5"], "drafter 'code' has none"),
    (["--output", "/nonexistent/dir/o.jsonl"], "directory '/nonexistent/dir' does not exist"),
])
def test_unusable_arguments_stop_with_one_line(bundle, capsys, argv, message):
    assert main(["generate", str(bundle), "--prompt", MATH, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err


@pytest.mark.parametrize("lines, message", [
    ([{"prompt": "w1"}, b"\xff\xfe w1"], "prompts.jsonl:2 is not UTF-8 text"),
    ([{"prompt": "w1"}, {"prompt": "w2"}, b"{\"prompt\": "], "prompts.jsonl:3 is not valid JSON"),
    ([{"text": "w1"}], "prompts.jsonl:1 has no non-empty 'prompt' string"),
    ([{"prompt": "w1"}, ["w1"]], "prompts.jsonl:2 is a JSON list, not an object"),
    ([{"messages": [{"role": "robot", "content": "w1"}]}], "prompts.jsonl:1: messages[0] has role 'robot'"),
    ([b""], "holds no prompts"),
])
def test_unreadable_prompt_records_name_the_file_and_line(bundle, tmp_path, capsys, lines, message):
    out = tmp_path / "o.jsonl"
    assert main(["generate", str(bundle), "--prompts", _prompts(tmp_path, lines), "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err
    assert not out.exists()


def test_a_bundle_without_the_cost_ratio_asks_for_a_re_export(bundle, capsys):
    _set_decoding(bundle, cost_ratio=...)
    assert main(["generate", str(bundle), "--prompt", MATH]) == 2
    err = capsys.readouterr().err.strip()
    assert "decoding lacks 'cost_ratio'" in err and "specdraft export" in err and "\n" not in err


def test_options_left_out_take_the_bundles_defaults(bundle, monkeypatch, capsys):
    _set_decoding(bundle, temperature=0.5, top_k=3, top_p=0.9, max_new_tokens=4)
    seen = []
    real = generate_module.decode_batch
    monkeypatch.setattr(generate_module, "decode_batch",
                        lambda target, prompts, n, plan, sampling, *a: seen.append((n, sampling)) or
                        real(target, prompts, n, plan, sampling, *a))
    assert main(["generate", str(bundle), "--prompt", MATH, "--drafter", "ofa"]) == 0
    assert seen[-1] == (4, SamplingConfig(0.5, 3, 0.9))
    assert main(["generate", str(bundle), "--prompt", MATH, "--drafter", "ofa", "--temperature", "0",
                 "--max-new-tokens", "2"]) == 0
    assert seen[-1] == (2, SamplingConfig(0.0, 3, 0.9))
    capsys.readouterr()


def test_help_imports_no_torch():
    import subprocess
    import sys

    code = ("import sys, specdraft.pipelines.generate_args, specdraft.pipelines.cli as c; c.build_parser(); "
            "print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_the_bundle_is_read_once_per_call(bundle, tmp_path, monkeypatch, capsys):
    calls = []
    real = bundle_module.load_bundle
    monkeypatch.setattr(bundle_module, "load_bundle", lambda *a, **k: calls.append(a) or real(*a, **k))
    out = tmp_path / "o.jsonl"
    assert main(["generate", str(bundle), "--prompts", _prompts(tmp_path, [{"prompt": MATH}, {"prompt": CODE}]),
                 "--output", str(out)]) == 0
    assert len(calls) == 1 and len(_lines(out)) == 2


def test_compile_is_refused_where_the_batched_decoder_does_not_decode(bundle, capsys):
    """SpecTr drafts decode one prompt at a time, uncompiled: asking to compile them is an error, not a
    silent eager run."""
    assert main(["generate", str(bundle), "--prompt", MATH, "--drafter", "math", "--drafts", "2",
                 "--temperature", "1.0", "--compile", "default"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--compile default applies to the batched decoder" in err[0]


@pytest.mark.slow
def test_compiled_batches_give_the_eager_tokens(bundle, tmp_path, capsys):
    prompts = _prompts(tmp_path, [{"prompt": MATH}, {"prompt": "w4 w5"}, {"prompt": CODE}])
    outs = {}
    for mode in ("none", "default"):
        out = tmp_path / f"{mode}.jsonl"
        assert main(["generate", str(bundle), "--prompts", prompts, "--batch-size", "3", "--drafter", "math",
                     "--compile", mode, "--output", str(out)]) == 0
        outs[mode] = _lines(out)
    capsys.readouterr()
    assert [r["token_ids"] for r in outs["default"]] == [r["token_ids"] for r in outs["none"]]
    assert [r["N_target"] for r in outs["default"]] == [r["N_target"] for r in outs["none"]]


def test_each_decoding_value_walks_from_the_cli_and_the_bundle_to_the_policy(bundle, monkeypatch, capsys):
    """K, K_max and h: given on the command line they decide; left out, the bundle decides, each defaulted in
    one place (`Bundle.policy_spec`: K -> the drafter's fixed_k; h -> the pinned decoding.threshold, else the
    head's own; K_max -> the head's). Evaluate's heads serve at the same (h, K_max) (`Bundle.head_rule`)."""
    from specdraft.decoding.policies.stopping import FixedK, LockstepSpecDecPP, SpecDecPP
    from specdraft.pipelines.evaluate.load import load_heads

    seen = []
    real = generate_module.decode_batch
    monkeypatch.setattr(generate_module, "decode_batch", lambda target, prompts, n, plan, *a: seen.append(
        plan.policy() if plan.policy is not None else None) or real(target, prompts, n, plan, *a))

    def policy(*argv):
        assert main(["generate", str(bundle), "--prompt", MATH, *argv]) == 0, capsys.readouterr().err
        return seen[-1]

    for name, fixed in (("code", 2), ("ofa", 5)):  # no head: the drafter's own fixed K
        p = policy("--drafter", name)
        assert type(p) is FixedK and p.max_tokens == fixed
    assert policy("--drafter", "code", "--k", "3").max_tokens == 3
    p = policy("--drafter", "math")  # its head, at the head's h and K_max
    assert type(p) is SpecDecPP and (p.threshold, p.max_tokens) == (0.7, 6)
    p = policy("--drafter", "math", "--batch-size", "2")  # a batch stops drafting together (lockstep in the spec)
    assert type(p) is LockstepSpecDecPP and (p.threshold, p.max_tokens) == (0.7, 6)
    p = policy("--drafter", "math", "--threshold", "0.4")
    assert (p.threshold, p.max_tokens) == (0.4, 6)
    assert type(policy("--drafter", "math", "--k", "2")) is FixedK
    _set_decoding(bundle, threshold=0.55)  # pinned in the bundle: every head serves at it, unless the CLI says
    assert policy("--drafter", "math").threshold == 0.55
    assert policy("--drafter", "math", "--threshold", "0.4").threshold == 0.4
    b = load_bundle(bundle)
    heads = load_heads(b, ["math", "code"], {"greedy": SamplingConfig(0.0)}, "cpu", [])
    assert (heads["greedy"]["math"].threshold, heads["greedy"]["math"].k_max) == (0.55, 6)
    assert "code" not in heads["greedy"]
    capsys.readouterr()


def _ship_acceptance_summary(bundle) -> None:
    """Give the bundle's math drafter an acceptance summary (the batch-aware rule's prior), as export copies it."""
    from specdraft.decoding.costs.throughput import ACCEPTANCE_FILE, summarize_acceptance

    gen = torch.Generator().manual_seed(0)
    accept = [torch.rand(12, generator=gen) for _ in range(3)]
    (bundle / "acceptance" / "math").mkdir(parents=True)
    summarize_acceptance(accept, accept, head="T1/D1", threshold=0.7, k_max=6,
                         label_transform={"temperature": 0.0, "top_k": 0, "top_p": 1.0}).save(
        bundle / "acceptance" / "math" / ACCEPTANCE_FILE)
    meta = json.loads((bundle / BUNDLE_JSON).read_text())
    meta["drafters"]["math"]["acceptance"] = "acceptance/math"
    meta.pop("files")
    write_bundle_json(bundle, meta)


def test_the_batch_aware_stop_rule_decodes_losslessly_with_the_decoders_own_cost_table(bundle, tmp_path, monkeypatch,
                                                                                       capsys):
    """--stop-rule batch-aware: the cost table is profiled once (then read from the cache), printed with
    --verbose, and the greedy output is the target's own; without the bundle's acceptance summary (its
    prior) it is one line and exit 2."""
    monkeypatch.setenv("SPECDRAFT_COST_CACHE", str(tmp_path / "costs"))
    argv = ["generate", str(bundle), "--prompt", MATH, "--drafter", "math", "--stop-rule", "batch-aware"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "no acceptance summary" in err and "\n" not in err
    _ship_acceptance_summary(bundle)
    assert main(argv + ["--verbose"]) == 0
    captured = capsys.readouterr()
    assert "profiled into" in captured.err and "cost table (ms per step" in captured.err
    assert json.loads(captured.out.strip().splitlines()[-1])["N"] >= 1
    out = tmp_path / "o.jsonl"
    assert main(argv[:2] + ["--prompts", _prompts(tmp_path, [{"prompt": MATH}]), "--output", str(out)] + argv[4:]) == 0
    assert "read from" in capsys.readouterr().err  # the second start reuses the table
    assert _lines(out)[0]["token_ids"] == _greedy_reference(bundle, MATH, 6)


def test_the_batch_aware_rule_is_the_default_where_the_bundle_holds_its_prior(bundle, tmp_path, monkeypatch, capsys):
    """Left unset, --stop-rule is batch-aware for a drafter with a head and an acceptance summary (issue 44's
    default), SpecDec++ without a summary (said in a note) or when the user gives --threshold (SpecDec++'s h),
    and specdecpp or --k as asked; an explicit batch-aware rule for a SpecTr decode is one line and exit 2."""
    from specdraft.decoding.policies.batch_aware import LockstepBatchAwareSpecDec
    from specdraft.decoding.policies.stopping import FixedK, SpecDecPP
    monkeypatch.setenv("SPECDRAFT_COST_CACHE", str(tmp_path / "costs"))
    seen = []
    real = generate_module.decode_batch
    monkeypatch.setattr(generate_module, "decode_batch", lambda target, prompts, n, plan, *a: seen.append(
        plan.policy() if plan.policy is not None else None) or real(target, prompts, n, plan, *a))

    def policy(*argv):
        assert main(["generate", str(bundle), "--prompt", MATH, "--drafter", "math", *argv]) == 0, capsys.readouterr().err
        return seen[-1]

    assert type(policy()) is SpecDecPP
    assert "no acceptance summary" in capsys.readouterr().err
    _ship_acceptance_summary(bundle)
    p = policy()
    assert type(p) is LockstepBatchAwareSpecDec and p.max_tokens == 6
    assert "profiled into" in capsys.readouterr().err
    assert type(policy("--stop-rule", "specdecpp")) is SpecDecPP
    p = policy("--threshold", "0.4")
    assert type(p) is SpecDecPP and p.threshold == 0.4
    assert type(policy("--k", "3")) is FixedK
    assert main(["generate", str(bundle), "--prompt", MATH, "--drafter", "math", "--stop-rule", "batch-aware",
                 "--drafts", "2", "--temperature", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "SpecTr drafts or a cascade" in err and "\n" not in err


def test_starts_whose_prompts_round_alike_share_one_cost_table(bundle, tmp_path, monkeypatch, capsys):
    """The batch-aware rule's table is timed over the longest prompt rounded up as caches are: a second start
    with a longer (but similarly short) prompt reads the first one's table instead of profiling again; the
    command's fewer timed passes are part of the key, so `specdraft predict`'s tables stay apart."""
    monkeypatch.setenv("SPECDRAFT_COST_CACHE", str(tmp_path / "costs"))
    _ship_acceptance_summary(bundle)
    argv = ["generate", str(bundle), "--drafter", "math", "--stop-rule", "batch-aware", "--prompt"]
    assert main(argv + [MATH]) == 0
    assert "profiled into" in capsys.readouterr().err
    assert main(argv + [MATH + " Show each step."]) == 0
    assert "read from" in capsys.readouterr().err
    tables = list((tmp_path / "costs").glob("*.json"))
    assert len(tables) == 1 and json.loads(tables[0].read_text())["repeats"] == 3
