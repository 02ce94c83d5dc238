import json

import pytest
import torch

from specdraft.core.errors import InputError
from specdraft.routers.lit_router import train_classifier
from specdraft.routers.router import (CentroidRouter, PromptClassifierRouter, load_router, mean_pooled, save_router)
from specdraft.training.trainer import TrainerConfig, WandbConfig

H, PER_DOMAIN, COMMON = 16, 20, 20
DOMAINS = ["code", "math", "translate"]


def synthetic_world(seed=0):
    """An embedding table where each domain owns 20 tokens clustered around its own direction, plus 20
    common tokens with a large shared component (like BOS / punctuation), and prompts mixing them."""
    g = torch.Generator().manual_seed(seed)
    dirs = torch.randn(len(DOMAINS), H, generator=g)
    shared = 5 * torch.randn(H, generator=g)
    rows = [dirs[i] + 0.3 * torch.randn(PER_DOMAIN, H, generator=g) for i in range(len(DOMAINS))]
    rows.append(shared + 0.3 * torch.randn(COMMON, H, generator=g))
    table = torch.cat(rows)  # (V, H), V = 80
    common0 = len(DOMAINS) * PER_DOMAIN

    def prompts(n):
        out, doms = [], []
        for k in range(n):
            d = k % len(DOMAINS)
            own = torch.randint(d * PER_DOMAIN, (d + 1) * PER_DOMAIN, (4,), generator=g)
            common = torch.randint(common0, common0 + COMMON, (8,), generator=g)  # most tokens are common
            out.append(torch.cat([common[:1], own, common[1:]]).tolist())
            doms.append(DOMAINS[d])
        return out, doms

    return table, prompts


def test_mean_pooled_is_the_mean_of_the_prompt_embeddings():
    table = torch.randn(10, 4)
    pooled = mean_pooled(torch.nn.Embedding.from_pretrained(table), [[1, 2, 2], [7]])
    torch.testing.assert_close(pooled, torch.stack([(table[1] + 2 * table[2]) / 3, table[7]]))


def test_centroid_router_picks_the_domain_of_separable_prompts():
    table, prompts = synthetic_world()
    train, train_doms = prompts(60)
    test, test_doms = prompts(30)
    router = CentroidRouter(H, DOMAINS, [f"{d}-drafter" for d in DOMAINS])
    router.fit(mean_pooled(table, train), train_doms).bind(table)
    assert router.route_many(test) == [f"{d}-drafter" for d in test_doms]
    assert router.nearest_domain(mean_pooled(table, test)) == test_doms


def test_centroid_router_two_domains_can_share_a_drafter():
    table, prompts = synthetic_world()
    train, doms = prompts(30)
    router = CentroidRouter(H, DOMAINS, ["a", "a", "b"]).fit(mean_pooled(table, train), doms).bind(table)
    assert router.drafters == ["a", "b"]
    test, test_doms = prompts(9)
    assert router.route_many(test) == [{"code": "a", "math": "a", "translate": "b"}[d] for d in test_doms]


def test_centroid_fit_needs_every_domain():
    table, prompts = synthetic_world()
    train, doms = prompts(6)
    with pytest.raises(InputError, match="no training prompts for domain"):
        CentroidRouter(H, [*DOMAINS, "chat"], ["a", "b", "c", "d"]).fit(mean_pooled(table, train), doms)


@pytest.mark.parametrize("kind", ["classifier", "centroid"])
def test_save_load_round_trip(tmp_path, kind):
    table, prompts = synthetic_world()
    train, doms = prompts(30)
    if kind == "classifier":
        torch.manual_seed(0)
        router = PromptClassifierRouter(H, ["x", "y", "z"], hidden=8)
    else:
        router = CentroidRouter(H, DOMAINS, ["x", "y", "z"]).fit(mean_pooled(table, train), doms)
    save_router(router, tmp_path / kind, {"label_kind": "domain", "tokenizer_fingerprint": "f" * 64,
                                           "metrics": {"dev": {"accuracy": 0.5}}})
    assert {p.name for p in (tmp_path / kind).iterdir()} == {"router.safetensors", "router_config.json"}
    loaded = load_router(tmp_path / kind, torch.nn.Embedding.from_pretrained(table), tokenizer_fingerprint="f" * 64)
    assert type(loaded) is type(router)
    assert loaded.metadata["label_kind"] == "domain" and loaded.metadata["metrics"]["dev"]["accuracy"] == 0.5
    pooled = mean_pooled(table, train)
    torch.testing.assert_close(loaded.choice_scores(pooled), router.choice_scores(pooled))
    assert [loaded.route(p) for p in train] == router.pick(pooled)
    # the embedding table is not part of the router's file
    from safetensors.torch import load_file

    assert all(v.shape[0] != table.shape[0] for v in load_file(str(tmp_path / kind / "router.safetensors")).values())


def test_load_rejects_a_different_target(tmp_path):
    router = PromptClassifierRouter(H, ["x", "y"], hidden=8)
    save_router(router, tmp_path, {"tokenizer_fingerprint": "a" * 64})
    with pytest.raises(InputError, match="embeddings of size 16 but the target's are 12"):
        load_router(tmp_path, torch.randn(50, 12))
    with pytest.raises(InputError, match="tokenizer"):
        load_router(tmp_path, torch.randn(50, H), tokenizer_fingerprint="b" * 64)
    load_router(tmp_path, torch.randn(50, H), tokenizer_fingerprint="a" * 64)  # the right one loads


def test_load_rejects_missing_or_corrupt_files(tmp_path):
    save_router(PromptClassifierRouter(H, ["x", "y"], hidden=8), tmp_path)
    cfg_path = tmp_path / "router_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "hidden": 9}))
    with pytest.raises(InputError, match="do not match its config"):
        load_router(tmp_path, torch.randn(50, H))
    cfg_path.write_text(json.dumps({**cfg, "kind": "bert"}))
    with pytest.raises(InputError, match="unknown router kind"):
        load_router(tmp_path, torch.randn(50, H))
    cfg_path.write_text("{not json")
    with pytest.raises(InputError, match="corrupt"):
        load_router(tmp_path, torch.randn(50, H))
    cfg_path.unlink()
    with pytest.raises(InputError, match="missing"):
        load_router(tmp_path, torch.randn(50, H))


def test_route_rejects_bad_prompts():
    router = PromptClassifierRouter(H, ["x", "y"], hidden=8).bind(torch.randn(50, H))
    with pytest.raises(InputError, match="empty prompt"):
        router.route([])
    with pytest.raises(InputError, match="token id 50 outside"):
        router.route([3, 50])
    with pytest.raises(InputError, match="no embedding table"):
        PromptClassifierRouter(H, ["x", "y"]).route([1])


def test_meta_cannot_override_architecture(tmp_path):
    with pytest.raises(InputError, match="architecture keys"):
        save_router(PromptClassifierRouter(H, ["x", "y"]), tmp_path, {"drafters": ["z"]})


def test_classifier_learns_separable_labels(tmp_path):
    table, prompts = synthetic_world(seed=1)
    train, doms = prompts(60)
    test, test_doms = prompts(30)
    labels = torch.tensor([DOMAINS.index(d) for d in doms])
    cfg = TrainerConfig(max_epochs=15, batch_size=16, accelerator="cpu", checkpoint_every_n_steps=0,
                        log_every_n_steps=1, wandb=WandbConfig(mode="disabled"))
    val = (mean_pooled(table, test), torch.tensor([DOMAINS.index(d) for d in test_doms]))
    router, stats = train_classifier(mean_pooled(table, train), labels, DOMAINS, tmp_path, cfg, hidden=16, lr=1e-2,
                                     val=val, seed=0)
    assert stats["steps"] == 15 * 4 and stats["train_accuracy"] == 1.0
    assert router.bind(table).route_many(test) == test_doms
    # same seed, same data: the same router
    again, _ = train_classifier(mean_pooled(table, train), labels, DOMAINS, tmp_path / "again", cfg, hidden=16,
                                lr=1e-2, seed=0)
    for a, b in zip(router.state_dict().values(), again.state_dict().values()):
        torch.testing.assert_close(a, b)


def test_classifier_rejects_labels_outside_the_drafters(tmp_path):
    with pytest.raises(InputError, match="labels must lie in 0..1"):
        train_classifier(torch.randn(4, H), torch.tensor([0, 1, 2, 0]), ["x", "y"], tmp_path, TrainerConfig())
