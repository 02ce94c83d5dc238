"""An exported EAGLE-3 drafter inside vLLM (`method: eagle3`), from the speculative_config.json export
writes, at the bundle's K: greedy output equals vLLM's without speculation token for token (and the
project's greedy decode), and vLLM's acceptance counters agree with the project's EAGLE-3 chain on the
same prompts (docs/acceptance_length.md: both draft nothing in the prefill round, so vLLM's mean
acceptance length 1 + A/D is the chain's, the steps within K + 1 tokens of the limit aside). The same
comparison catches a drafter exported with its target layer ids off by one (the trap of vLLM's aux id
i = the input of layer i) or with random weights: vLLM then accepts almost nothing while the decoder,
reading the right layers and weights, accepts much more."""
import json

import pytest
import torch

from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.decoding.policies.stopping import FixedK
from specdraft.decoding.speculative import generate_speculative
from specdraft.decoding.speculators.eagle import EagleSpeculator
from specdraft.decoding.speculators.eagle_model import new_eagle_drafter
from specdraft.pipelines.vllm_export import SPECULATIVE_CONFIG, write_vllm_drafter
from tests.decoding.eagle_fixtures import trained_eagle3
from tests.engines.conftest import K, demo_shaped_llama, finish_offline, prompts, start_offline, word_tokenizer

pytestmark = pytest.mark.vllm

MAX_TOKENS = 40
N_PROMPTS = 4
TARGET_LAYERS = 4  # vLLM's aux ids (2, L // 2, L - 3) collide below 6 layers: the drafter reads (0, 2, 3)
TOLERANCE = 0.10  # mean acceptance lengths agree within 10%


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A demo-shaped target, an EAGLE-3 drafter fitted to its greedy continuations of the test prompts
    (and of random ones), and three vLLM exports of that drafter:
    right, with the layer ids off by one, and with random weights in its place."""
    root = tmp_path_factory.mktemp("eagle3_vllm")
    target = demo_shaped_llama(0, layers=TARGET_LAYERS)
    target.save_pretrained(root / "target")
    word_tokenizer().save_pretrained(root / "target")
    drafter = trained_eagle3(target, steps=150, greedy=True, n_rows=8, length=MAX_TOKENS + 4, prompts=prompts(N_PROMPTS),
                             ttt_steps=K)
    dirs = {name: root / name for name in ("eagle3", "shifted_layers", "random")}
    write_vllm_drafter(drafter, dirs["eagle3"], K, str(root / "target"), dirs["eagle3"])
    write_vllm_drafter(drafter, dirs["shifted_layers"], K, str(root / "target"), dirs["shifted_layers"])
    config = json.loads((dirs["shifted_layers"] / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in config["eagle_aux_hidden_state_layer_ids"]]
    (dirs["shifted_layers"] / "config.json").write_text(json.dumps(config))
    torch.manual_seed(1)
    random = new_eagle_drafter(target.config, variant="eagle3")
    write_vllm_drafter(random, dirs["random"], K, str(root / "target"), dirs["random"])
    return {"root": root, "target": target, "drafter": drafter.attach_target(target), "dirs": dirs}


@pytest.fixture(scope="module")
def runs(vllm_python, exported):
    """vLLM on the target without speculation and with each export (four engines at once)."""
    base = {"model": str(exported["root"] / "target"), "prompts": prompts(N_PROMPTS), "max_tokens": MAX_TOKENS,
            "temperature": 0.0, "dtype": "float32", "ignore_eos": True, "seed": 0}
    requests = {"plain": base}
    for name, d in exported["dirs"].items():  # the speculative config as export wrote it, unchanged
        requests[name] = {**base, "speculative_config": json.loads((d / SPECULATIVE_CONFIG).read_text())}
    started = {name: start_offline(vllm_python, req, exported["root"] / "vllm", name) for name, req in requests.items()}
    return {name: finish_offline(*s, timeout=600) for name, s in started.items()} | {"prompts": base["prompts"]}


@pytest.fixture(scope="module")
def ours(runs, exported):
    """The project's EAGLE-3 chain at K on the same prompts: outputs and (drafted, accepted) per round."""
    target, drafter = exported["target"], exported["drafter"]
    out = {"outputs": [], "steps": []}
    for p in runs["prompts"]:
        r = generate_speculative(target, EagleSpeculator(drafter, FixedK(K)), p, MAX_TOKENS)
        out["outputs"].append(r.tokens)
        out["steps"].append([(d, a) for d, a in zip(r.metrics.drafted, r.metrics.accepted) if d > 0])
    return out


def per_depth(accepted: list[int]) -> list[int]:
    return [sum(a > j for a in accepted) for j in range(K)]


def check_acceptance(theirs: dict, ours: dict) -> tuple[float, float]:
    """vLLM's mean acceptance length 1 + A/D against the chain's on full-K rounds; fails when they differ
    by more than TOLERANCE or vLLM accepts (almost) nothing. -> (vLLM's, ours)."""
    accepted = [a for steps in ours["steps"] for d, a in steps if d == K]
    mal_ours = 1 + sum(accepted) / len(accepted)
    mal_vllm = 1 + theirs["num_accepted_tokens"] / max(theirs["num_drafts"], 1)
    assert theirs["num_accepted_tokens"] > 0.05 * theirs["num_draft_tokens"], \
        f"vLLM accepted {theirs['num_accepted_tokens']} of {theirs['num_draft_tokens']} drafted tokens"
    assert abs(mal_vllm - mal_ours) <= TOLERANCE * mal_ours, (mal_vllm, mal_ours)
    return mal_vllm, mal_ours


def test_greedy_output_with_the_eagle3_drafter_equals_vllm_without_speculation(runs, exported):
    assert all(len(o) == MAX_TOKENS for o in runs["plain"]["outputs"])
    for name in exported["dirs"]:
        assert runs[name]["outputs"] == runs["plain"]["outputs"], name  # lossless, whatever the drafter
    ours = [generate_autoregressive(exported["target"], p, MAX_TOKENS).tokens for p in runs["prompts"]]
    assert ours == runs["plain"]["outputs"]


def test_vllm_acceptance_agrees_with_the_project_eagle3_chain(runs, ours):
    theirs = runs["eagle3"]["spec"]
    assert ours["outputs"] == runs["plain"]["outputs"]
    assert theirs["num_drafts"] > 0 and theirs["num_draft_tokens"] == K * theirs["num_drafts"]
    assert len(theirs["accepted_per_pos"]) == K and sum(theirs["accepted_per_pos"]) == theirs["num_accepted_tokens"]
    full = [a for steps in ours["steps"] for d, a in steps if d == K]
    every = [a for steps in ours["steps"] for _, a in steps]
    mal_vllm, mal_ours = check_acceptance(theirs, ours)
    print(f"\nEAGLE-3, greedy, K={K}, {N_PROMPTS} prompts x {MAX_TOKENS} tokens")
    print(f"{'':40s} {'vLLM':>8s} {'ours':>8s}")
    print(f"{'drafts (verification steps, full K)':40s} {theirs['num_drafts']:8d} {len(full):8d}")
    for j, (v, o) in enumerate(zip(theirs["accepted_per_pos"], per_depth(full))):
        print(f"{f'accepted at depth {j + 1}':40s} {v:8d} {o:8d}")
    print(f"{'mean acceptance length 1 + A/D':40s} {mal_vllm:8.3f} {mal_ours:8.3f}")
    print(f"{'  ours over every round (short ones too)':40s} {'':8s} {1 + sum(every) / len(every):8.3f}")
    for name in ("shifted_layers", "random"):
        s = runs[name]["spec"]
        print(f"{f'{name}: accepted / drafted':40s} {s['num_accepted_tokens']:4d}/{s['num_draft_tokens']:<4d}")
    assert mal_ours > 1.5  # the drafter is worth serving: the comparison is not between two near-zero numbers


@pytest.mark.parametrize("name", ["shifted_layers", "random"])
def test_a_broken_export_is_caught(runs, ours, name):
    with pytest.raises(AssertionError):
        check_acceptance(runs[name]["spec"], ours)
