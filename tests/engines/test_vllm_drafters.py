"""An exported bundle drafter inside vLLM: vLLM loads it as its `draft_model` at the bundle's K, greedy
speculative output equals vLLM's own output without speculation (and the project's greedy decode), and
vLLM's speculative-decoding counters agree exactly with the project's decoder run on vLLM's schedule.

Acceptance length, one definition (docs/acceptance_length.md): vLLM's mean acceptance length is
1 + accepted / drafts over its verification steps; its first token comes from the prefill, which
verifies nothing. The project's decoder drafts in its first forward too, so its MAT (N / N_target) is
measured on another segmentation of the same greedy sequence. Run with vLLM's schedule (no draft in the
first round, K in every later one) the two decoders make the same rounds: same drafts, same accepted
count at every depth, same mean acceptance length."""
import pytest
import torch

from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.decoding.bundle.loading import load_causal_lm
from specdraft.decoding.speculative import generate_speculative, generate_with_drafter
from specdraft.decoding.speculators.drafter import DrafterSpeculator
from specdraft.decoding.policies.stopping import FixedK
from tests.engines.conftest import finish_offline, prompts, start_offline

pytestmark = pytest.mark.vllm

MAX_TOKENS = 40
N_PROMPTS = 4


class PrefillThenFixedK(FixedK):
    """vLLM's schedule: the prefill forward emits the first token with no draft, every later step
    verifies K drafts (fewer only at the length limit)."""

    def start(self, drafter) -> None:
        self._first = True

    def start_round(self, context) -> None:
        self._this_round_first, self._first = self._first, False

    def stop(self, k, hidden) -> bool:
        return k == 0 and self._this_round_first


@pytest.fixture(scope="module")
def runs(vllm_python, tiny_bundle, tmp_path_factory):
    """vLLM on the bundle's target, without and with the bundle's drafter at its K (two engines at once)."""
    work = tmp_path_factory.mktemp("vllm_runs")
    k = tiny_bundle.decoding["k"]
    base = {"model": str(tiny_bundle.target_path), "prompts": prompts(N_PROMPTS), "max_tokens": MAX_TOKENS,
            "temperature": 0.0, "dtype": "float32", "ignore_eos": True, "seed": 0}
    spec = {**base, "speculative_config": {"method": "draft_model", "model": str(tiny_bundle.drafter("d").path),
                                           "num_speculative_tokens": k}}
    started = {name: start_offline(vllm_python, req, work, name) for name, req in (("plain", base), ("spec", spec))}
    return {name: finish_offline(*s) for name, s in started.items()} | {"prompts": base["prompts"], "k": k}


@pytest.fixture(scope="module")
def pair(tiny_bundle):
    target = load_causal_lm(tiny_bundle.target_path, "float32", "cpu")
    drafter = load_causal_lm(tiny_bundle.drafter("d").path, "float32", "cpu")
    return target, drafter


def test_greedy_output_with_the_exported_drafter_equals_vllm_without_speculation(runs, pair):
    assert runs["spec"]["outputs"] == runs["plain"]["outputs"]
    assert all(len(o) == MAX_TOKENS for o in runs["spec"]["outputs"])
    # and vLLM's greedy decode is the project's (same weights, float32)
    target, _ = pair
    ours = [generate_autoregressive(target, p, MAX_TOKENS).tokens for p in runs["prompts"]]
    assert ours == runs["plain"]["outputs"]


def test_vllm_reads_the_drafter_counters(runs):
    s, k = runs["spec"]["spec"], runs["k"]
    assert runs["plain"]["spec"]["num_drafts"] == 0  # no speculation, no counts
    assert s["num_drafts"] > 0 and s["num_draft_tokens"] == k * s["num_drafts"]
    assert len(s["accepted_per_pos"]) == k and sum(s["accepted_per_pos"]) == s["num_accepted_tokens"]
    assert all(a >= b for a, b in zip(s["accepted_per_pos"], s["accepted_per_pos"][1:]))  # depth j needs j-1
    assert 0 < s["num_accepted_tokens"] < s["num_draft_tokens"]  # the noisy drafter is accepted, not always
    # every generated token is the prefill's, or an accepted draft, or one bonus/correction per step
    assert sum(map(len, runs["spec"]["outputs"])) <= N_PROMPTS + s["num_drafts"] + s["num_accepted_tokens"]


@torch.inference_mode()
def vllm_counting(target, drafter, prompt: list[int], max_tokens: int, k: int) -> list[tuple[int, int]]:
    """vLLM's counters by their definition, replayed on the target's greedy sequence: the prefill gives
    token 1, then every step drafts K greedily from the drafter and counts the accepted prefix (the
    drafts matching the target's greedy continuation) before the output is cut at max_tokens.
    -> [(tokens generated before the step, accepted)]."""
    ref = generate_autoregressive(target, prompt, max_tokens + k + 1).tokens  # reaches past the cut
    steps, c = [], 1
    while c < max_tokens:
        ids = list(prompt) + ref[:c]
        for _ in range(k):
            ids.append(int(drafter(torch.tensor([ids])).logits[0, -1].argmax()))
        drafts, a = ids[-k:], 0
        while a < k and drafts[a] == ref[c + a]:
            a += 1
        steps.append((c, a))
        c += a + 1
    return steps


def per_depth(accepted: list[int], k: int) -> list[int]:
    return [sum(a > j for a in accepted) for j in range(k)]


def acceptance_rows(runs, pair) -> dict:
    """The project's decoder on vLLM's schedule and on its own (FixedK), and vLLM's counting replayed."""
    target, drafter = pair
    k = runs["k"]
    rows = {"outputs": [], "ours": [], "replay": [], "n": 0, "n_target": 0, "own_n": 0, "own_target": 0}
    for p in runs["prompts"]:
        r = generate_speculative(target, DrafterSpeculator(drafter, PrefillThenFixedK(k)), p, MAX_TOKENS)
        rows["outputs"].append(r.tokens)
        rows["ours"].append([(d, a) for d, a in zip(r.metrics.drafted, r.metrics.accepted) if d > 0])
        rows["n"], rows["n_target"] = rows["n"] + r.metrics.n_generated, rows["n_target"] + r.metrics.n_target
        rows["replay"].append(vllm_counting(target, drafter, p, MAX_TOKENS, k))
        own = generate_with_drafter(target, drafter, p, MAX_TOKENS, k=k).metrics
        rows["own_n"], rows["own_target"] = rows["own_n"] + own.n_generated, rows["own_target"] + own.n_target
    return rows


def test_acceptance_length_is_the_same_number_in_vllm_and_here(runs, pair):
    rows, theirs, k = acceptance_rows(runs, pair), runs["spec"]["spec"], runs["k"]
    assert rows["outputs"] == runs["spec"]["outputs"]
    replay = [a for steps in rows["replay"] for _, a in steps]
    ours = [a for steps in rows["ours"] for _, a in steps]
    mal_vllm = 1 + theirs["num_accepted_tokens"] / theirs["num_drafts"]
    print(f"\nacceptance length, greedy, K={k}, {N_PROMPTS} prompts x {MAX_TOKENS} tokens")
    print(f"{'':40s} {'vLLM':>8s} {'replay':>8s} {'ours':>8s}")
    print(f"{'drafts (verification steps)':40s} {theirs['num_drafts']:8d} {len(replay):8d} {len(ours):8d}")
    for j, (v, r, o) in enumerate(zip(theirs["accepted_per_pos"], per_depth(replay, k), per_depth(ours, k))):
        print(f"{f'accepted at depth {j + 1}':40s} {v:8d} {r:8d} {o:8d}")
    print(f"{'mean acceptance length 1 + acc/drafts':40s} {mal_vllm:8.3f} {1 + sum(replay) / len(replay):8.3f} "
          f"{1 + sum(ours) / len(ours):8.3f}")
    print(f"{'MAT N/N_target, vLLM schedule':40s} {'':8s} {'':8s} {rows['n'] / rows['n_target']:8.3f}")
    print(f"{'MAT N/N_target, own schedule (FixedK)':40s} {'':8s} {'':8s} {rows['own_n'] / rows['own_target']:8.3f}")
    # vLLM's counters are exactly their definition replayed on the greedy sequence
    assert (len(replay), per_depth(replay, k)) == (theirs["num_drafts"], theirs["accepted_per_pos"])
    # the project's decoder makes the same steps, except within K + 1 tokens of the length limit: there it
    # drafts only what can still be emitted (none with one token left), vLLM drafts K and counts accepted
    # drafts that the max_tokens cut then drops
    for ours_p, replay_p in zip(rows["ours"], rows["replay"]):
        full = [a for c, a in replay_p if c + k + 1 <= MAX_TOKENS]
        assert [a for d, a in ours_p if d == k] == full
        assert len(ours_p) <= len(replay_p)
