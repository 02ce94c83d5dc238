"""The papers' verdicts (pipelines/evaluate/claims.py, in words by render.py) on hand-made metrics: each verdict follows the numbers, and
no verdict is drawn from fewer than MIN_PROMPTS prompts."""
from specdraft.pipelines.evaluate.claims import MIN_PROMPTS, banditspec, cascades, metaeagle, paper_verdicts, spectr
from specdraft.pipelines.evaluate.verdicts import render_verdicts


def run(prompt, family, n_target, mode="greedy", n=12, domain="x", counted_per_call=0.01, **key):
    return {"family": family, "mode": mode, "drafter": key.pop("drafter", None), "k": key.pop("k", 4),
            "bandit": key.pop("bandit", None), "params": key.pop("params", {}), "set": "test", "domain": domain,
            "prompt": f"{domain}/{prompt}", "N": n, "N_target": n_target, "N_draft": key.pop("n_draft", 0),
            "counted_s": n_target * counted_per_call, "time_s": n_target * counted_per_call * 1.2,
            "quality": key.pop("quality", None), "stream": False, "policy": None, "router": None, "reward": None}


def metrics(runs, **extra):
    return {"runs": runs, "rows": [], "k": 4, "drafters": {"own": {"x": "dx"}, "ofa": None},
            "config": {"ks": [2, 4]}, **extra}


def test_spectr_rise_needs_enough_prompts():
    def world(n_prompts):
        runs = []
        for p in range(n_prompts):
            runs.append(run(p, "ar", 12, mode="sampling", k=None))
            runs.append(run(p, "spectr", 6, mode="sampling", drafter="dx", params={"drafts": 1}))
            runs.append(run(p, "spectr", 3 + p % 2, mode="sampling", drafter="dx", params={"drafts": 4}))
        return spectr(metrics(runs))

    v = world(MIN_PROMPTS + 1)
    assert v["ks"] == [1, 4] and v["per_domain"]["all"]["by_k"][1]["MAT"] == 2.0
    rise = v["per_domain"]["all"]["rise"]
    assert rise["verdict"] == "above" and rise["lo"] > 1 and v["per_domain"]["all"]["monotone"]
    assert world(MIN_PROMPTS - 1)["per_domain"]["all"]["rise"]["verdict"] == "too few prompts"


def test_spectr_rise_is_the_ratio_of_the_tables_pooled_mats():
    # sampled generations differ in length; one K=1 generation ended after a single token
    runs = []
    for p in range(MIN_PROMPTS + 2):
        short = p == 0
        runs.append(run(p, "ar", 12, mode="sampling", k=None))
        runs.append(run(p, "spectr", 1 if short else 6, mode="sampling", n=1 if short else 12, drafter="dx",
                        params={"drafts": 1}))
        runs.append(run(p, "spectr", 4, mode="sampling", n=12, drafter="dx", params={"drafts": 4}))
    v = spectr(metrics(runs))["per_domain"]["all"]
    assert v["rise"]["ratio"] == round(v["by_k"][4]["MAT"] / v["by_k"][1]["MAT"], 3)


def test_banditspec_best_arm_regret_and_verdict():
    runs = []
    for p in range(4):
        runs += [run(p, "ar", 12, k=None),
                 run(p, "model_free", 10, params={"arm": "lookup"}),
                 run(p, "model_free", 5, params={"arm": "rest"}),
                 run(p, "fixed", 8, drafter="dx", n_draft=20),
                 run(p, "model_free", 6, bandit="ucbspec", params={"arm": "ucbspec(lookup,rest,dx)"})]
    v = banditspec(metrics(runs))
    x = v["per_domain"]["x"]
    assert x["best_arm"] == "rest" and set(x["arms"]) == {"lookup", "rest", "drafter"}
    b = x["bandits"]["ucbspec"]
    assert b["regret"] == 1.0 and b["MAT"] == 2.0
    assert b["vs_best_counted"]["verdict"] == "below" and abs(b["vs_best_counted"]["ratio"] - 5 / 6) < 1e-3


def test_cascades_table2_and_ordering():
    runs = []
    for p in range(4):
        runs += [run(p, "ar", 12, mode="sampling", k=None, quality=50.0),
                 run(p, "cascade", 4, mode="sampling", drafter="dx", quality=60.0,
                     params={"rule": "token_v3", "alpha": 0.5}),
                 run(p, "cascade", 3, mode="sampling", drafter="dx", quality=40.0,
                     params={"rule": "opt", "alpha": 0.5}),
                 run(p, "cascade", 6, mode="sampling", drafter="dx", quality=50.0,
                     params={"rule": "opt", "alpha": 0.0}),
                 # a sequential baseline whose name also starts with "token": not the paper's Token rule
                 run(p, "cascade", 6, mode="sampling", drafter="dx", quality=30.0,
                     params={"rule": "token_chow", "alpha": 0.5})]
    v = cascades(metrics(runs))
    x = v["per_domain"]["x"]
    # the frontier by the means: Token (60, 3x) and OPT a=0.5 (40, 4x); Token beats OPT a=0 (50, 2x) and the baseline
    assert x["frontier"] == [["opt", 0.5], ["token_v3", 0.5]]
    assert x["beaten_by_token"] == {"opt": [1, 2], "token_chow": [1, 1]}
    assert x["target_quality"] == 50.0
    assert x["table2"]["token_v3"]["speedup_at_target_quality"] == 3.0  # 12 / 4 target calls
    assert x["table2"]["opt"]["alpha_at_target_quality"] == 0.0  # alpha 0.5 loses quality
    assert x["table2"]["opt"]["best_quality_within_target_latency"] == 50.0
    assert x["ranking"] == ["token_v3", "opt", "token_chow"]
    text = "\n".join(render_verdicts(metrics(runs, verdicts=paper_verdicts(metrics(runs)))))
    assert "ordering (SpecCascade [Token] first, [OPT] second at the target's quality):** shows" in text
    assert "SpecCascade [Token]" in text and "floor" not in text  # the target scores 50: quality can tell rules apart
    assert "frontier SpecCascade [OPT] a=0.5, SpecCascade [Token] a=0.5; beaten by it SpecCascade [OPT] 1/2, " \
           "TokenCascade [Chow] 1/1" in text


def test_metaeagle_own_drafter_ucb_near_best_and_bd_vs_be():
    """Domain x: its own EAGLE drafter (eagle-dx, 4 target calls per prompt) beats eagle-dy (6) and the
    all-domain eagle-ofa (5); MetaEagle-UCB (BD) needs 4.1 (within 95% of the best), BE 5; SpS: BD 6, BE 7."""
    runs = []
    for p in range(4):
        chain = {"draft": "chain"}
        runs += [run(p, "eagle", 4, drafter="eagle-dx", params=chain),
                 run(p, "eagle", 6, drafter="eagle-dy", params=chain),
                 run(p, "eagle", 5, drafter="eagle-ofa", params=chain),
                 run(p, "eagle", 4, drafter="eagle-dx", params={"draft": "tree 3x2x6"}),  # not a chain: ignored
                 run(p, "eagle", 4 + (p == 0) * 0.1, bandit="ucb-bd", params={"draft": "bandit"}),
                 run(p, "eagle", 5, bandit="ucb-be", params={"draft": "bandit"}),
                 run(p, "bandit", 6, bandit="ucb-bd"), run(p, "bandit", 7, bandit="ucb-be")]
    v = metaeagle(metrics(runs))
    x = v["per_domain"]["x"]
    assert v["drafters"] == ["eagle-dx", "eagle-dy", "eagle-ofa"] and x["best"] == "eagle-dx"
    assert x["best_other"] == "eagle-ofa" and x["own_vs_best_other"]["verdict"] == "above"
    assert abs(x["own_vs_best_other"]["ratio"] - 5 / 4) < 1e-3
    assert x["ucb_vs_best"]["verdict"] == "above" and x["ucb_vs_best"]["ratio"] < 1  # near, not above 1
    assert x["bd_vs_be"]["verdict"] == "above" and abs(x["sps_bd_vs_be"]["ratio"] - 7 / 6) < 1e-3
    text = "\n".join(render_verdicts(metrics(runs)))
    assert "MetaEagle" in text and "x vs eagle-ofa" in text
    one_drafter = [r for r in runs if r.get("drafter") in (None, "eagle-dx")]
    assert metaeagle(metrics(one_drafter)) is None  # nothing to compare


def test_nothing_to_say_renders_nothing():
    assert render_verdicts(metrics([])) == []
