"""train-drafters, acceptance-data and train-heads on the tiny run (seconds each)."""
import dataclasses
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

import specdraft.pipelines.acceptance_data as ad
from specdraft.pipelines.readers import load_features
from specdraft.core.errors import InputError
from specdraft.decoding.policies.acceptance_head import load_head
from specdraft.pipelines.artifacts import read_manifest
from specdraft.pipelines.stage import run_stage
from tests.pipelines.conftest import FAST, tiny_config



@pytest.fixture
def drafted(drafted_run):
    return tiny_config(drafted_run, **FAST)


def test_drafters_export_and_alignment(drafted):
    root = drafted.run.root
    from pathlib import Path

    out = Path(root) / "drafters"
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["base", "math", "ofa", "translate"]
    model = AutoModelForCausalLM.from_pretrained(out / "math")
    assert model.config.vocab_size == AutoModelForCausalLM.from_pretrained(Path(root) / "target").config.vocab_size
    info = json.loads((out / "math" / "drafter.json").read_text())
    assert info["domains"] == ["math"] and info["finetune"]["steps"] > 0 and len(info["data_hash"]) == 64
    # the tiny drafter is under the size where bf16 autocast pays on a CPU, whatever this CPU's units
    assert info["finetune"]["precision"] == "32-true"
    table = json.loads((out / "alignment.json").read_text())
    for name in ("math", "translate", "ofa", "base"):
        for dom in ("math", "translate"):
            row = table[name][dom]
            assert 0 <= row["acceptance"] <= 1 and 0 <= row["agreement"] <= 1 and row["positions"] > 0
    # the specialists carry their paired margin over the best other serving drafter (base is not a rival)
    for dom in ("math", "translate"):
        own = table[dom][dom]
        best = max(("math", "translate", "ofa"), key=lambda n: -1 if n == dom else table[n][dom]["agreement"])
        assert own["agreement_vs_best_other"] == pytest.approx(own["agreement"] / table[best][dom]["agreement"],
                                                               rel=2e-3)
        assert own["agreement_vs_best_other_lo"] <= own["agreement_vs_best_other"] <= own["agreement_vs_best_other_hi"]
    assert "agreement_vs_best_other" not in table["ofa"]["math"]
    assert read_manifest(out).metrics["alignment"] == table


def test_specialist_margin_interval_separates_a_real_lead_from_a_tie():
    import numpy as np

    from specdraft.drafters.alignment import specialist_margins

    rng = np.random.default_rng(0)
    positions = rng.integers(20, 60, size=(80, 1)).astype(float)
    # 80 responses of one domain, drafters (math, ofa): per-response agreement counts, math ahead by 10%
    # in one domain and level (the same rates) in the other
    def sums(rate_own, rate_other):
        agree = np.concatenate([rng.binomial(positions.astype(int), rate_own), rng.binomial(positions.astype(int),
                                                                                             rate_other)], 1)
        return np.stack([agree, agree, np.repeat(positions, 2, 1)], -1)  # (S, D, 3)
    by_domain = {"math": sums(0.77, 0.70), "translate": sums(0.70, 0.70)}
    table = {n: {d: {m: float(s[:, j, i].sum() / s[:, j, 2].sum()) for i, m in enumerate(("acceptance", "agreement"))}
                 for d, s in by_domain.items()} for j, n in enumerate(("math", "ofa"))}
    table["translate"] = {d: dict(table["ofa"][d]) for d in by_domain}  # a third drafter, for translate's own row
    by_domain = {d: np.concatenate([s, s[:, 1:2]], 1) for d, s in by_domain.items()}
    specialist_margins(table, by_domain, rivals=["math", "ofa", "translate"], seed=0)
    lead = table["math"]["math"]
    assert lead["agreement_vs_best_other_lo"] > 1.0 and lead["agreement_vs_best_other"] == pytest.approx(1.1, abs=0.05)
    tie = table["translate"]["translate"]
    assert tie["agreement_vs_best_other"] == pytest.approx(1.0)  # its copy, the ofa column, is the best other
    assert tie["agreement_vs_best_other_lo"] <= 1.0 <= tie["agreement_vs_best_other_hi"]


def test_drafter_with_other_vocabulary_is_refused(tiny_run, tmp_path):
    from specdraft.drafters.model import build_causal_lm, preset

    other = tmp_path / "other"
    build_causal_lm(preset("demo-tiny"), vocab_size=77).save_pretrained(other)
    cfg = tiny_config(tiny_run, train_drafters={"init_from": str(other)})
    run_stage(cfg, "distill-data")
    with pytest.raises(InputError, match="vocab size 77 != target vocab size"):
        run_stage(cfg, "train-drafters")


@pytest.fixture
def seen(monkeypatch):
    """Every forward acceptance-data makes: (hidden size of the model, hidden states?, batch rows)."""
    calls = []
    real = ad.forward_at_response

    def counting(model, batch, hidden=False):
        calls.append((model.config.hidden_size, hidden, int(batch["input_ids"].shape[0])))
        return real(model, batch, hidden)

    monkeypatch.setattr(ad, "forward_at_response", counting)
    return calls


def test_acceptance_data_one_target_forward_per_sequence(drafted, seen):
    out = run_stage(drafted, "acceptance-data")
    target_h = drafted.pretrain_target.model.hidden
    m = read_manifest(out).metrics
    n_seqs = m["forwards"]["sequences"]
    per_drafter = {n: c["T1"]["train"]["sequences"] + c["T1"]["dev"]["sequences"] for n, c in m["drafters"].items()}
    # one drafter in memory at a time: the target sees each drafter's sequences once (a sequence shared by
    # several drafters once per drafter), never a drafter's sequence twice
    assert sum(b for h, hid, b in seen if h == target_h) == sum(per_drafter.values()) > n_seqs
    # each drafter: one teacher-forced forward for q and one for the cached features, per sequence
    drafter_rows = [(hid, b) for h, hid, b in seen if h != target_h]
    assert sum(b for hid, b in drafter_rows if not hid) == sum(per_drafter.values())
    assert sum(b for hid, b in drafter_rows if hid) == sum(per_drafter.values())
    feats = load_features(out / "math" / "T1", "train")
    assert feats["features"].dtype == torch.float16 and feats["features"].shape[1] == 16
    assert ((feats["labels"] >= 0) & (feats["labels"] <= 1)).all()


def test_label_transforms_share_the_logits_and_get_their_own_heads(drafted_run, seen):
    """Two label transforms: still one target forward and one q forward per drafter's sequence, one feature
    forward per transform; greedy labels are 0/1 agreement; train-heads exports a grid per transform
    and export makes the greedy one (the serving transform) each drafter's default head."""
    cfg = tiny_config(drafted_run, **{**FAST, "acceptance_data": {
        **FAST["acceptance_data"], "label_transforms": [{"temperature": 0.0}, {"temperature": 0.7, "top_k": 20}]}})
    out = run_stage(cfg, "acceptance-data")
    m = read_manifest(out).metrics
    per_drafter = sum(c["greedy"]["train"]["sequences"] + c["greedy"]["dev"]["sequences"] for c in m["drafters"].values())
    target_h = cfg.pretrain_target.model.hidden
    assert sum(b for h, hid, b in seen if h == target_h) == per_drafter
    assert sum(b for h, hid, b in seen if h != target_h and not hid) == per_drafter
    assert sum(b for h, hid, b in seen if h != target_h and hid) == 2 * per_drafter
    assert sorted(p.name for p in (out / "math").iterdir()) == ["T0.7_k20", "greedy"]
    greedy = load_features(out / "math" / "greedy", "train")["labels"]
    assert set(greedy.unique().tolist()) <= {0.0, 1.0}
    info = json.loads((out / "math" / "T0.7_k20" / "info.json").read_text())
    assert info["label_transform"] == {"temperature": 0.7, "top_k": 20, "top_p": 1.0}

    heads = run_stage(cfg, "train-heads")
    sweep = json.loads((heads / "sweep.json").read_text())
    assert set(sweep["math"]) == {"greedy", "T0.7_k20"}
    _, config = load_head(heads / "math" / "greedy" / sweep["math"]["greedy"]["best_head"], expected_hidden_size=16)
    assert config["label_transform"]["temperature"] == 0.0
    bundle = run_stage(cfg, "export")
    from specdraft.decoding.bundle.directory import load_bundle
    from specdraft.decoding.rounds.sampling import SamplingConfig

    b = load_bundle(bundle)
    assert b.drafter("math").head == "greedy/" + sweep["math"]["greedy"]["best_head"]  # decoding is greedy
    assert b.head_for("math", SamplingConfig(0.0)) == b.drafter("math").head
    assert b.head_for("math", SamplingConfig(0.7, 20)).startswith("T0.7_k20/")
    assert b.head_for("math", SamplingConfig(1.0)) is None
    # the default head's acceptance summary ships with the bundle: greedy labels, the exported head's name
    from specdraft.decoding.costs.throughput import ACCEPTANCE_FILE, AcceptanceSummary

    summary = AcceptanceSummary.load(b.drafter("math").acceptance / ACCEPTANCE_FILE)
    assert b.drafter("math").head == "greedy/" + summary.head and summary.label_transform["temperature"] == 0.0
    assert {x for seq in summary.accept for x in seq} <= {0.0, 1.0}
    assert summary.dev_sequences == sweep["math"]["greedy"]["dev_sequences"] >= len(summary.accept) > 0


def test_acceptance_data_is_reproducible(drafted, tmp_path):
    out = run_stage(drafted, "acceptance-data")
    first = load_features(out / "translate" / "T1", "dev")
    out = run_stage(drafted, "acceptance-data", force=True)
    again = load_features(out / "translate" / "T1", "dev")
    assert all(torch.equal(first[k], again[k]) for k in first)


def test_train_heads_exports_grid_with_thresholds(drafted):
    run_stage(drafted, "acceptance-data")
    out = run_stage(drafted, "train-heads")
    sweep = json.loads((out / "sweep.json").read_text())
    for name in ("math", "translate", "ofa"):
        s = sweep[name]["T1"]
        assert len(s["heads"]) == 4 and {"kl", "auroc_reject", "ece", "brier"} <= set(s["heads"][0]["eval"])
        assert "best_fixed_k" in s and "oracle" in s
        # the oracle drafts no rejected token: its only discards are bonuses dropped after a final EOS
        assert 0 <= s["oracle"]["n_discarded"] <= s["dev_sequences"]
        for r in s["heads"]:
            head, config = load_head(out / name / "T1" / r["head"], expected_hidden_size=16)
            assert config["threshold"] in (0.1, 0.3, 0.5, 0.7, 0.9)
            assert config["drafter_hash"] and config["label_transform"]["temperature"] == 1.0
            assert head(torch.zeros(3, 16)).shape == (3,)
    with pytest.raises(InputError, match="hidden size"):
        load_head(out / "math" / "T1" / "D2_w6", expected_hidden_size=32)


def test_train_heads_prices_its_picks_with_evaluates_calibration(drafted, monkeypatch):
    """cost_ratio null: c is calibrated as evaluate calibrates it (the drafter timed over the bundle's
    default K forwards right after a target forward), once for drafters of one architecture."""
    import specdraft.decoding.costs.calibration as evaluate

    calls, real = [], evaluate.calibrate

    def spy(target, drafters, max_n, context, reps, device, seed, draft_run=4):
        calls.append((len(drafters), max_n, reps, draft_run))
        return real(target, drafters, max_n, context, 3, device, seed, draft_run)  # 3 passes: a test

    monkeypatch.setattr(evaluate, "calibrate", spy)
    cfg = dataclasses.replace(drafted, train_heads=dataclasses.replace(drafted.train_heads, cost_ratio=None))
    run_stage(cfg, "acceptance-data")
    sweep = json.loads((run_stage(cfg, "train-heads") / "sweep.json").read_text())
    k = cfg.decoding.k
    assert calls == [(1, 1, 60, k)]
    cost = sweep["math"]["T1"]["cost"]
    assert cost["source"] == "calibrated" and cost["draft_run"] == k
    assert cost["cost_ratio"] == pytest.approx(cost["t_draft_s"] / cost["t_target_s"]) and cost["cost_ratio"] > 0
    assert all(entry["cost"] == cost for per_tag in sweep.values() for entry in per_tag.values())


@pytest.mark.slow  # a second interpreter trains half the grid (~55 s); the sharding is distill-data's, tested there in make test
def test_train_heads_in_two_processes_writes_the_files_of_one(drafted, capsys):
    """train_heads.processes = 2: this process starts `train-heads --shard 1/2` beside its own grids and merges:
    the files of one process; with c measured, it is measured once, here, and every grid (the other process's
    too) is priced with it."""
    run_stage(drafted, "acceptance-data")
    one = read_manifest(run_stage(drafted, "train-heads")).files
    two = dataclasses.replace(drafted, train_heads=dataclasses.replace(drafted.train_heads, processes=2))
    out = run_stage(two, "train-heads")
    assert "2 processes share the work" in capsys.readouterr().out
    assert read_manifest(out).files == one
    # forced over its own finished output: the started process redoes its share too (no cache hit for it)
    assert run_stage(two, "train-heads", force=True) == out and read_manifest(out).files == one
    measured = dataclasses.replace(two, train_heads=dataclasses.replace(two.train_heads, cost_ratio=None))
    sweep = json.loads((run_stage(measured, "train-heads") / "sweep.json").read_text())
    costs = [entry["cost"] for per_tag in sweep.values() for entry in per_tag.values()]
    assert len(costs) == 3 and costs[0]["source"] == "calibrated" and all(c == costs[0] for c in costs)
    with pytest.raises(InputError, match="train_heads.processes must be >= 1, got 0"):
        dataclasses.replace(drafted.train_heads, processes=0).check()


def test_nan_in_cached_features_names_the_example(drafted):
    from safetensors.torch import save_file

    out = run_stage(drafted, "acceptance-data")
    path = out / "math" / "T1" / "features_train.safetensors"
    feats = load_features(out / "math" / "T1", "train")
    feats["features"][5, 3] = float("nan")
    save_file(feats, str(path))
    # the input verification refuses the edited file first; with it off, the reader names the example
    with pytest.raises(InputError, match="features_train.safetensors' does not match its hash"):
        run_stage(drafted, "train-heads")
    unverified = dataclasses.replace(drafted, run=dataclasses.replace(drafted.run, verify_inputs="off"))
    with pytest.raises(InputError, match=r"example math/train/\d+@t[\d.]+ \(position \d+\) has NaN/inf"):
        run_stage(unverified, "train-heads")


def test_heads_train_online_without_a_feature_cache(drafted_run):
    """cache_features off: no hidden states on disk; train-heads reruns the frozen drafter each epoch
    and still exports scored heads. The recomputed dev features equal what the cache would hold."""
    from specdraft.heads.online import compute_features
    from datasets import load_from_disk
    from specdraft.decoding.bundle.loading import load_drafter

    cached = tiny_config(drafted_run, **FAST)
    out = run_stage(cached, "acceptance-data")
    want = load_features(out / "math" / "T1", "dev")["features"].float()
    rows = [dict(r) for r in load_from_disk(str(out / "math" / "T1" / "sequences"))["dev"]]
    # in the target's dtype and the served weights, as acceptance-data and train-heads run the drafter (bf16 and
    # int8 weights under auto on a CPU with bf16 units)
    got = compute_features(load_drafter(out.parent / "drafters" / "math", cached.target.dtype, "cpu",
                                        cached.decoding.draft_weights), rows, pad_token_id=0)
    assert torch.allclose(got, want, atol=1e-2)  # the cache is fp16

    online = tiny_config(drafted_run, **{**FAST, "acceptance_data": {**FAST["acceptance_data"], "cache_features": False}})
    out = run_stage(online, "acceptance-data")
    assert "features" not in load_features(out / "math" / "T1", "train")
    heads = run_stage(online, "train-heads")
    sweep = json.loads((heads / "sweep.json").read_text())
    for r in sweep["math"]["T1"]["heads"]:
        assert 0 <= r["eval"]["kl"] < 5 and 0 <= r["train"]["kl"] < 5
    load_head(heads / "math" / "T1" / sweep["math"]["T1"]["best_head"], expected_hidden_size=16)


def test_train_drafters_killed_midway_resumes_to_identical_drafters(tiny_run, tmp_path, monkeypatch):
    """Killed while finetuning the second drafter: the rerun keeps base and the first drafter, redoes
    the rest, and ends with exactly the drafters of an uninterrupted run."""
    import shutil

    import specdraft.pipelines.train_drafters as td

    reference = tmp_path / "reference"
    shutil.copytree(tiny_run, reference)
    cfg_ref = tiny_config(reference)
    run_stage(cfg_ref, "distill-data")
    run_stage(cfg_ref, "train-drafters")

    cfg = tiny_config(tiny_run)
    run_stage(cfg, "distill-data")
    real_train, calls = td._train, {"n": 0}

    def killed_on_third_fit(*args, **kwargs):  # base, math, then killed inside translate
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real_train(*args, **kwargs)

    monkeypatch.setattr(td, "_train", killed_on_third_fit)
    with pytest.raises(KeyboardInterrupt):
        run_stage(cfg, "train-drafters")
    assert not (tiny_run / "drafters").exists()
    monkeypatch.setattr(td, "_train", real_train)
    out = run_stage(cfg, "train-drafters")
    assert json.loads((out / "alignment.json").read_text()) == json.loads(
        (reference / "drafters" / "alignment.json").read_text())
    for name in ("math", "translate", "ofa"):
        a = AutoModelForCausalLM.from_pretrained(out / name).state_dict()
        b = AutoModelForCausalLM.from_pretrained(reference / "drafters" / name).state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_teacher_cache_holds_every_row_when_it_fits_and_nothing_when_it_does_not(capsys):
    from specdraft.drafters.model import build_causal_lm
    from specdraft.pipelines.schema import PhaseSection
    from specdraft.pipelines.train_drafters import teacher_cache

    teacher = build_causal_lm("demo-tiny", 48, seed=1).eval()
    rows = [{"id": f"r{i}", "prompt_ids": [3, 4, 5], "response_ids": [6, 7, 8, 9]} for i in range(5)]  # 4 positions
    phase = PhaseSection(loss="fkl", max_length=16)
    cache = teacher_cache(teacher, rows, phase, batch_size=2)
    assert sorted(cache) == [r["id"] for r in rows] and all(x.shape == (4, 48) for x in cache.values())
    need_gb = 5 * 4 * 48 * 4 / 1e9
    assert teacher_cache(teacher, rows, dataclasses.replace(phase, teacher_cache_gb=need_gb / 2), 2) == {}
    assert "runs at every step" in capsys.readouterr().out
    assert teacher_cache(teacher, rows, dataclasses.replace(phase, teacher_cache_gb=0), 2) == {}
    with pytest.raises(InputError, match="teacher_cache_gb must be >= 0"):
        dataclasses.replace(phase, teacher_cache_gb=-1).check()


def test_an_all_domain_drafters_acceptance_rows_are_among_the_specialists_rows():
    from specdraft.pipelines.acceptance_data import select_rows

    rows = [{"id": f"{d}/{i:03d}", "domain": d} for d in "abc" for i in range(30)]
    own = {d: select_rows(rows, [d], 10, 0, "train") for d in "abc"}
    ofa = select_rows(rows, list("abc"), 10, 0, "train")
    assert [len(v) for v in own.values()] == [10, 10, 10] and len(ofa) == 10
    assert {r["id"] for r in ofa} <= {r["id"] for v in own.values() for r in v}  # one target forward serves both
    assert select_rows(rows, ["a"], 10, 1, "train") != own["a"]  # the run seed picks them
    assert select_rows(rows, ["a"], 40, 0, "train") == rows[:30]  # all, in id order, when they fit


def test_the_general_phase_can_train_on_the_distilled_mixture(tiny_run):
    """general_on: distilled (a real target has no corpus): the base drafter trains on every training domain's
    self-distilled responses, and each drafter finetunes from it; without a corpus, `corpus` is one line."""
    cfg = tiny_config(tiny_run, train_drafters={"general_on": "distilled"})
    run_stage(cfg, "distill-data")
    out = run_stage(cfg, "train-drafters")
    base = json.loads((out / "base" / "drafter.json").read_text())
    rows = read_manifest(tiny_run / "distill_data").metrics["splits"]["train"]["examples"]
    assert base["general"]["examples"] == rows and base["general"]["steps"] > 0
    (tiny_run / "prompts" / "corpus").rename(tiny_run / "corpus-moved")
    with pytest.raises(InputError, match="general_on: distilled"):
        run_stage(tiny_config(tiny_run, run={"verify_inputs": "off"}), "train-drafters", force=True)
