"""Greedy speculative decoding reproduces greedy decoding of the target token for token: ours
(autoregressive with KV cache) and transformers' `generate`, for fixed K, SpecDec++ stopping and the
hindsight oracle, over several prompts and lengths, with rollback and the bonus path exercised."""
import pytest
import torch

from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.decoding.metrics import aggregate
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.speculative import hindsight_oracle, generate_with_drafter
from specdraft.decoding.policies.stopping import FixedK, SpecDecPP

GREEDY = SamplingConfig(temperature=0.0)
# (prompt length, max_new_tokens) pairs; prompts drawn with a fixed seed
CASES = [(1, 9), (3, 24), (6, 40), (11, 17), (20, 33), (2, 50), (8, 5), (15, 28)]


def prompts(vocab: int):
    gen = torch.Generator().manual_seed(123)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n, _ in CASES]


def hf_greedy(model, prompt, n, **kwargs):
    # an explicit mask: otherwise generate() treats prompt tokens equal to pad_token_id as padding
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, pad_token_id=0, **kwargs)
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def references(llama_pair):
    target, _ = llama_pair
    out = []
    for prompt, (_, n) in zip(prompts(target.config.vocab_size), CASES):
        ours = generate_autoregressive(target, prompt, n, GREEDY).tokens
        out.append((prompt, n, ours, hf_greedy(target, prompt, n)))
    return out


def test_autoregressive_matches_transformers_generate(references):
    for _, n, ours, hf in references:
        assert len(ours) == n
        assert ours == hf


def random_head(hidden: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    head = torch.nn.Sequential(torch.nn.Linear(hidden, 16), torch.nn.SiLU(), torch.nn.Linear(16, 1))
    with torch.no_grad():
        head[2].bias.fill_(1.5)  # sigmoid around 0.8: rounds of a few tokens, varying with the context
    return head


@pytest.mark.parametrize(
    "make_stopping",
    [
        pytest.param(lambda h: FixedK(1), id="K1"),
        pytest.param(lambda h: FixedK(2), id="K2"),
        pytest.param(lambda h: FixedK(4), id="K4"),
        pytest.param(lambda h: FixedK(7), id="K7"),
        pytest.param(lambda h: SpecDecPP(random_head(h, 0), threshold=0.5), id="specdecpp-h0.5"),
        pytest.param(lambda h: SpecDecPP(random_head(h, 1), threshold=0.9, k_max=6), id="specdecpp-h0.9"),
    ],
)
def test_greedy_speculative_equals_greedy_target(llama_pair, references, make_stopping):
    target, drafter = llama_pair
    runs = []
    for prompt, n, ours, hf in references:
        stopping = make_stopping(drafter.config.hidden_size)
        result = generate_with_drafter(target, drafter, prompt, n, GREEDY, stopping=stopping)
        assert result.tokens == ours == hf
        m = result.metrics
        assert m.n_generated == n == sum(m.accepted) + m.n_rounds
        assert m.n_discarded == sum(m.drafted) - sum(m.accepted)
        runs.append((stopping, m))
    total = aggregate(m for _, m in runs)
    cap = runs[0][0].max_tokens
    # every path was taken: full acceptance with a bonus token, and rejection with rollback
    assert any(a == d > 0 for a, d in zip(total.accepted, total.drafted))
    assert any(a < d for a, d in zip(total.accepted, total.drafted))
    assert 1.0 < total.mat
    if isinstance(runs[0][0], SpecDecPP):
        assert len(set(total.drafted)) > 2  # the head really varies the round length
        assert max(total.drafted) <= cap
    else:
        assert max(total.drafted) == cap


def test_eos_stops_both_decoders_at_the_same_token(llama_pair, references):
    target, drafter = llama_pair
    checked = 0
    for prompt, n, ours, _ in references:
        if len(set(ours)) < 3:
            continue
        eos = ours[len(ours) // 2]  # a token the target emits mid-generation
        expected = ours[: ours.index(eos) + 1]
        assert generate_autoregressive(target, prompt, n, GREEDY, eos_token_id=eos).tokens == expected
        for k in (1, 3, 6):
            got = generate_with_drafter(target, drafter, prompt, n, GREEDY, k=k, eos_token_id=eos)
            assert got.tokens == expected
            assert got.metrics.n_generated == len(expected)
        assert hf_greedy(target, prompt, n, eos_token_id=eos)[: len(expected)] == expected
        checked += 1
    assert checked >= 2


def test_hindsight_oracle_has_no_discards_and_theorem_4_1_target_calls(llama_pair, references):
    target, drafter = llama_pair
    for prompt, n, ours, _ in references:
        result = hindsight_oracle(target, drafter, prompt, n)
        assert result.tokens == ours
        assert result.metrics.n_discarded == 0
        # S: positions where the drafter's greedy token, teacher-forced on the target's tokens, disagrees
        seq = torch.tensor([prompt + ours[:-1]])
        with torch.no_grad():
            draft_greedy = drafter(seq).logits[0, len(prompt) - 1 :].argmax(-1).tolist()
        S = {i for i, (y, x) in enumerate(zip(draft_greedy, ours), start=1) if y != x}
        assert result.metrics.n_target == len(S | {n})  # every disagreement, plus the last token
        for k in (1, 4):
            fixed = generate_with_drafter(target, drafter, prompt, n, GREEDY, k=k).metrics
            assert result.metrics.n_target <= fixed.n_target


class Alternating:
    """A stand-in for a bandit: switches drafter every round, so each drafter must roll back and catch
    up on context it never saw (several tokens at once) through the same seam."""

    def __init__(self, *speculators):
        self.speculators = speculators
        self.rounds = 0
        self.observed = []

    def start(self, target, eos):
        for s in self.speculators:
            s.start(target, eos)
        self.rounds = 0

    def propose(self, context, max_tokens, sampling, generator):
        active = self.speculators[self.rounds % len(self.speculators)]
        self.rounds += 1
        return active.propose(context, max_tokens, sampling, generator)

    def observe(self, outcome):
        self.observed.append((outcome.verification.n_accepted, len(outcome.draft.tokens), len(outcome.context)))


def test_switching_drafters_catch_up_through_the_seam(llama_pair, references):
    from specdraft.decoding.speculative import generate_speculative
    from specdraft.decoding.speculators.drafter import DrafterSpeculator

    target, drafter = llama_pair
    for prompt, n, ours, _ in references:
        spec = Alternating(DrafterSpeculator(drafter, FixedK(3)), DrafterSpeculator(target, FixedK(2)))
        result = generate_speculative(target, spec, prompt, n, GREEDY)
        assert result.tokens == ours
        assert len(spec.observed) == result.metrics.n_rounds
        assert spec.observed[-1][2] == len(prompt) + n  # the observed context is the committed one
        # the target drafting for itself is always accepted: its rounds emit k + 1 tokens
        assert all(acc == k for acc, k, _ in spec.observed[1::2])


def test_verification_distribution_hook_reaches_verify(llama_pair, references):
    from specdraft.decoding.speculative import generate_speculative
    from specdraft.decoding.speculators.drafter import DrafterSpeculator

    target, drafter = llama_pair
    prompt, n, ours, _ = references[2]
    seen = []

    def identity(p, q):
        seen.append((p.shape, q.shape))
        return p

    speculator = DrafterSpeculator(drafter, FixedK(3))
    result = generate_speculative(target, speculator, prompt, n, GREEDY, verification_distribution=identity)
    assert result.tokens == ours and len(seen) == result.metrics.n_rounds
    assert all(ps[0] == qs[0] + 1 for ps, qs in seen)


@pytest.mark.gpu
def test_target_on_gpu_drafter_on_cpu(llama_pair):
    target, drafter = llama_pair
    gpu_target = __import__("copy").deepcopy(target).to("cuda")
    prompt = list(range(1, 9))
    expected = generate_autoregressive(gpu_target, prompt, 20, GREEDY).tokens  # GPU numerics may differ from CPU
    result = generate_with_drafter(gpu_target, drafter, prompt, 20, GREEDY, k=3)
    assert result.tokens == expected and result.metrics.n_target < 20
