"""benchmarks/real/bench_metasd_long.py: its decode on tiny models (the bandit over one arm is that arm) and its
table's hindsight picks and ratios on synthetic counts."""
from types import SimpleNamespace

import pytest

from tests.conftest import import_benchmark
from tests.decoding.conftest import noisy_copy, tiny_llama


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_metasd_long")


def row(domain: str, counts: dict[str, tuple[int, int]], same: bool = True) -> dict:
    return {"domain": domain, "id": f"{domain}/x", "counts": counts, "same_tokens": same}


def test_a_bandit_over_one_arm_decodes_as_that_arm_and_every_decode_gives_the_same_tokens(bench):
    target = tiny_llama(0)
    drafters = {"a": noisy_copy(target, 0.05, seed=1), "b": noisy_copy(target, 0.3, seed=2)}
    prompt = SimpleNamespace(domain="d", id="d/0", ids=(5, 9, 17, 3))
    one_arm = bench.decode_prompt(target, drafters, ["a"], prompt, 24, 4, 0.01, seed=0, eos=None)
    assert one_arm["same_tokens"]
    assert one_arm["counts"][bench.BANDIT] == one_arm["counts"]["a"]  # nothing to choose: the arm's every round
    assert all(made == 24 for made, _ in one_arm["counts"].values())  # no EOS: every method runs to the end
    two_arms = bench.decode_prompt(target, drafters, ["a", "b"], prompt, 24, 4, 0.01, seed=0, eos=None)
    assert two_arms["same_tokens"] and two_arms["counts"]["b"][1] > two_arms["counts"]["a"][1]  # noisier: more calls


def test_hindsight_picks_and_ratios_pool_counts_per_domain(bench):
    rows = [row("code", {"a": (40, 10), "b": (40, 20), bench.BANDIT: (40, 16)}),
            row("code", {"a": (40, 20), "b": (40, 10), bench.BANDIT: (40, 16)}),
            row("math", {"a": (30, 30), "b": (30, 10), bench.BANDIT: (30, 15)}, same=False)]
    assert bench.best_single(rows, ["a", "b"]) == {"code": "a", "math": "b"}  # code: a and b tie 80/30, a first
    assert bench.pooled_mat(rows, {"code": "a", "math": "b"}) == pytest.approx(110 / 40)
    assert [bench.best_arm(r, ["a", "b"]) for r in rows] == [(40, 10), (40, 10), (30, 10)]  # each prompt's 10-call arm
    one = bench.ratio_cell(rows[2:], lambda r: bench.counts_of(r, bench.BANDIT), lambda r: bench.counts_of(r, "b"))
    assert one == f"{10 / 15:.3f} [{10 / 15:.3f}, {10 / 15:.3f}]"  # one prompt: every resample is that prompt
    lines = bench.domain_rows(rows, ["a", "b"], ["a", "b"], own={"code": "a"}, ofa="b")
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")] for line in lines[2:]}
    assert cells["all"][-1] == "2/3 (divergences not judged)" and cells["code"][-1] == "2/2"
    rows[2]["divergences"] = [{"near_tie": True}, {"near_tie": False}]
    assert bench.same_tokens_cell(rows) == "2/3; 1 of 2 divergences near-ties"
    assert cells["all"][6] == "per domain" and cells["code"][6] == "a"
    assert cells["all"][7].startswith(f"{(110 / 47) / (110 / 40):.3f} [")  # bandit 110/47 over the picks' 110/40
    assert cells["code"][9] == "1.000 [0.500, 2.000]"  # own drafter a over OFA b: 80/30 each, prompts 2x / 0.5x
    assert cells["all"][9] == cells["code"][9] and cells["math"][9] == "-"  # only domains with their own drafter


def test_finished_prompts_are_kept_per_setting_and_each_complete_setting_gets_a_table(bench, tmp_path):
    stop, ignore = {"tokens": 8, "ignore_eos": False}, {"tokens": 8, "ignore_eos": True}
    counts = {"a": (8, 4), "b": (8, 8), bench.BANDIT: (8, 5)}
    store = tmp_path / "rows.jsonl"
    store.write_text("".join(bench.json.dumps(dict(row("code", counts), setting=s, seconds=1.0)) + "\n"
                             for s in (stop, ignore, dict(stop, tokens=16))))
    assert list(bench.finished_rows(store, stop)) == ["code/x"]
    assert bench.finished_rows(store, stop)["code/x"]["setting"] == stop
    assert bench.finished_rows(tmp_path / "none.jsonl", stop) == {}
    args = SimpleNamespace(run="runs/x", config="c.yaml", prompts=1, tokens=8, k=4, beta=0.01)
    tables = {False: [bench.finished_rows(store, stop)["code/x"]], True: [bench.finished_rows(store, ignore)["code/x"]]}
    text = bench.render(args, tables, ["a", "b"], ["a", "b"], {"code": "a"}, "b")
    assert "end at the end of turn" in text and "EOS ignored" in text and "2 s of decoding" in text
    assert text.count("| code | 1 | 8 | 2.000 | 1.000 | 1.600 | a |") == 2


def test_judging_a_store_finds_each_method_s_first_divergence_and_a_made_up_token_is_no_near_tie(bench, tmp_path):
    """An fp32 target rounds nothing, so a token other than its greedy choice is never a near-tie: the judgement
    catches a decoder that picks a wrong token. The store is rewritten with the verdicts, and judged rows are kept."""
    target = tiny_llama(0)
    drafters = {"a": noisy_copy(target, 0.05, seed=1)}
    prompt = SimpleNamespace(domain="d", id="d/0", ids=(5, 9, 17, 3))
    setting = {"tokens": 12, "k": 4}
    decoded = dict(bench.decode_prompt(target, drafters, ["a"], prompt, 12, 4, 0.01, seed=0, eos=None), setting=setting)
    assert decoded["same_tokens"] and set(decoded["outputs"]) == {"a", bench.BANDIT}
    wrong = list(decoded["outputs"][bench.BANDIT])
    wrong[5] = (wrong[5] + 1) % target.config.vocab_size
    bad = dict(decoded, id="d/1", same_tokens=False, outputs={"a": decoded["outputs"]["a"], bench.BANDIT: wrong})
    store = tmp_path / "rows.jsonl"
    store.write_text("".join(bench.json.dumps(r) + "\n" for r in (decoded, bad)))
    bench.judge_store(lambda: target, {"d/0": list(prompt.ids), "d/1": list(prompt.ids)}, 4, store, setting)
    judged = {r["id"]: r for r in map(bench.json.loads, store.read_text().splitlines())}
    assert judged["d/0"]["divergences"] == []
    (d,) = judged["d/1"]["divergences"]
    assert (d["method"], d["against"], d["position"], d["near_tie"]) == (bench.BANDIT, "a", 5, False)
    assert d["gap"] > 0
