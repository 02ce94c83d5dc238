"""train-router on the tiny run, and its acceptance measurement against an unbatched reference."""
import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdraft.core.tokenizers import tokenizer_fingerprint
from specdraft.core.errors import InputError
from specdraft.decoding.bundle.loading import load_causal_lm, load_tokenizer
from specdraft.routers.router import load_router
from specdraft.pipelines.stage import run_stage
from specdraft.pipelines.train_router import prompt_acceptance, routing_roles
from tests.pipelines.conftest import FAST, tiny_config

ROUTER = {"hidden": 8, "label_batch_size": 4,
          "train": {"max_epochs": 2, "batch_size": 8, "checkpoint_every_n_steps": 0, "wandb": {"mode": "disabled"}}}


def test_train_router_writes_both_routers_that_load_and_route(drafted_run):
    cfg = tiny_config(drafted_run, **FAST, train_router=ROUTER)
    out = run_stage(cfg, "train-router")
    root = Path(cfg.run.root)
    target = load_causal_lm(root / "target")
    tok = load_tokenizer(root / "target")
    report = json.loads((out / "eval.json").read_text())
    # OFA and base are not routing choices; OFA is reported as the single-drafter reference
    assert report["drafters"] == ["math", "translate"] and report["general_drafters"] == ["ofa"]
    assert report["domain_drafters"] == {"math": "math", "translate": "translate"}
    assert set(report["sets"]) == {"dev", "perturbed", "ood"}
    assert report["sets"]["dev"]["prompts"] == 2 * 3 and report["sets"]["ood"]["prompts"] == 2
    for name, s in report["sets"].items():
        assert set(s["drafter_acceptance"]) == {"math", "translate", "ofa"}
        for r in s["routers"].values():
            assert 0 <= r["accuracy_vs_best"] <= 1 and sum(r["routed_counts"].values()) == s["prompts"]
            assert r["acceptance"] <= s["oracle_acceptance"] + 1e-9  # the oracle picks per prompt in hindsight
            assert (r["accuracy_vs_domain"] is None) == (name == "ood")  # no drafter knows the held-out domain
    assert sum(report["train"]["label_counts"].values()) == report["train"]["labelled"] == 2 * 6

    dev_prompt = tok("Solve: 2 + 3 = ?")["input_ids"]
    for kind in ("classifier", "centroid"):
        router = load_router(out / kind, target.get_input_embeddings(), tokenizer_fingerprint(tok))
        assert router.metadata["label_kind"] == "acceptance" and "dev" in router.metadata["metrics"]
        assert router.route(dev_prompt) in ("math", "translate")
        # the metrics stored with the router are the ones eval.json reports
        assert router.metadata["metrics"]["dev"] == report["sets"]["dev"]["routers"][kind]
    # a router trained for this target refuses another target's embedding table
    with pytest.raises(InputError, match="embeddings of size"):
        load_router(out / "classifier", torch.randn(10, target.config.hidden_size + 1))


def test_domain_labels_train_on_the_domain_drafter(drafted_run):
    cfg = tiny_config(drafted_run, **FAST, train_router={**ROUTER, "labels": "domain"})
    out = run_stage(cfg, "train-router")
    report = json.loads((out / "eval.json").read_text())
    assert report["label_kind"] == "domain"
    assert report["train"]["label_counts"] == {"math": 6, "translate": 6}


def test_drafter_roles_and_domain_map():
    infos = {"base": {"domains": []}, "ofa": {"domains": ["a", "b", "c"]}, "a": {"domains": ["a"]},
             "bc": {"domains": ["b", "c"]}, "c": {"domains": ["c"]}}
    roles = routing_roles(infos, ["a", "b", "c"])
    assert roles.special == ["a", "bc", "c"] and roles.general == ["ofa"] and roles.ofa == "ofa"
    assert roles.own == {"a": "a", "b": "bc", "c": "c"}  # the narrowest drafter wins
    with pytest.raises(InputError, match="at least 2 specialised drafters"):
        routing_roles({"base": {"domains": []}, "ofa": {"domains": ["a", "b"]}, "a": {"domains": ["a"]}}, ["a", "b"])


def _tiny_lm(seed, vocab=40):
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)).eval()


def test_prompt_acceptance_matches_an_unbatched_reference():
    target, drafter = _tiny_lm(0), _tiny_lm(1)
    g = torch.Generator().manual_seed(0)
    rows = []
    for k, (pid, n_resp) in enumerate([("p0", 2), ("p1", 1), ("p2", 3)]):
        prompt = torch.randint(1, 40, (3 + k,), generator=g).tolist()
        for t in range(n_resp):
            rows.append({"prompt_id": pid, "domain": "d", "prompt_ids": prompt,
                         "response_ids": torch.randint(1, 40, (2 + 2 * t + k,), generator=g).tolist()})
    prompts, acc = prompt_acceptance(target, {"self": target, "other": drafter}, rows, pad_token_id=0,
                                     batch_size=2, max_length=None)
    assert [p["prompt_id"] for p in prompts] == ["p0", "p1", "p2"]
    torch.testing.assert_close(acc[:, 0], torch.ones(3, dtype=torch.float64))  # the target accepts itself
    for i, pid in enumerate(["p0", "p1", "p2"]):  # pooled over every response position of the prompt
        total, n = 0.0, 0
        for r in (r for r in rows if r["prompt_id"] == pid):
            ids = torch.tensor([r["prompt_ids"] + r["response_ids"]])
            lo, hi = len(r["prompt_ids"]) - 1, ids.shape[1] - 1  # positions predicting response tokens
            with torch.no_grad():
                p = target(ids).logits[0, lo:hi].softmax(-1)
                q = drafter(ids).logits[0, lo:hi].softmax(-1)
            total += float(torch.minimum(p, q).sum(-1).sum())
            n += hi - lo
        assert abs(float(acc[i, 1]) - total / n) < 1e-5


def test_label_prompts_keeps_every_response_of_a_seeded_subset_of_prompts():
    from specdraft.pipelines.train_router import label_rows

    rows = [{"prompt_id": f"p{i}", "t": t} for i in range(20) for t in (0.0, 1.0)]
    assert label_rows(rows, None, 0) == rows and label_rows(rows, 20, 0) == rows
    some = label_rows(rows, 5, 0)
    assert len(some) == 10 and all(sum(r["prompt_id"] == p["prompt_id"] for r in some) == 2 for p in some)
    assert [r for r in rows if r in some] == some  # original order
    assert label_rows(rows, 5, 1) != some  # the run seed picks them
