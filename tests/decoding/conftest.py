"""Tiny models for the decoder tests: random Llama pairs that agree often, and table stubs whose
next-token distributions are known exactly."""
import itertools
import copy
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 96


def tiny_llama(seed: int, vocab: int = VOCAB, layers: int = 2, context: int = 256) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
        initializer_range=0.2,  # peaked next-token distributions, so a noisy copy agrees often
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return LlamaForCausalLM(cfg).eval()


def noisy_copy(model: torch.nn.Module, noise: float, seed: int) -> torch.nn.Module:
    """The model with relative Gaussian noise on every weight matrix: a drafter that agrees with the
    target about half the time, so full acceptance, rejection and rollback all happen."""
    gen = torch.Generator().manual_seed(seed)
    drafter = copy.deepcopy(model)
    with torch.no_grad():
        for param in drafter.parameters():
            if param.dim() > 1:
                param.add_(torch.randn(param.shape, generator=gen) * noise * param.std())
    return drafter


@pytest.fixture(scope="session")
def make_llama():
    return tiny_llama


@pytest.fixture(scope="module")
def llama_pair():
    target = tiny_llama(0)
    return target, noisy_copy(target, 0.05, seed=1)


class TableLM(torch.nn.Module):
    """A stub causal LM whose next-token logits depend on the last two tokens: table[prev, cur] (V, V, V).

    It speaks the same interface the decoder uses for HF models (input_ids, a DynamicCache, logits_to_keep,
    output_hidden_states), storing the token ids themselves in the cache, so cropping works unchanged.
    Hidden state at a position: hidden_table[prev, cur] (V, V, H).
    """

    def __init__(self, table: torch.Tensor, hidden_table: torch.Tensor, context: int = 1024):
        super().__init__()
        self.table = torch.nn.Parameter(table, requires_grad=False)
        self.hidden_table = torch.nn.Parameter(hidden_table, requires_grad=False)
        vocab, hidden = table.shape[-1], hidden_table.shape[-1]
        self.config = SimpleNamespace(vocab_size=vocab, hidden_size=hidden, max_position_embeddings=context)

    def forward(self, input_ids, past_key_values, use_cache=True, logits_to_keep=1, output_hidden_states=False, **_):
        ids = input_ids[0]  # (T,)
        if past_key_values.get_seq_length() > 0:
            past = past_key_values.layers[0].keys[0, 0, :, 0].long()
        else:
            past = ids[:0]
        as_kv = ids.float().view(1, 1, -1, 1)
        past_key_values.update(as_kv, as_kv, 0)
        full = torch.cat([past, ids])  # (L,)
        prev = torch.cat([full.new_zeros(1), full[:-1]])  # token 0 stands in before the first position
        cur, prev = full[-logits_to_keep:], prev[-logits_to_keep:]
        logits = self.table[prev, cur][None]  # (1, n, V)
        hidden = (self.hidden_table[prev, cur][None],) if output_hidden_states else None
        return SimpleNamespace(logits=logits, hidden_states=hidden)


@pytest.fixture(scope="session")
def table_lm():
    return TableLM


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models on a shared 2-core machine: intra-op threads only add synchronisation (up to 10x
    slower when the other core is busy)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def chi2_pvalue(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit over the cells with nonzero expected probability."""
    keep = expected_probs > 0
    n = counts.sum()
    expected = expected_probs[keep].double() * n
    stat = ((counts[keep].double() - expected) ** 2 / expected).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def shifted(exact: torch.Tensor, mass: float = 0.02) -> torch.Tensor:
    """`exact` with `mass` moved from its most to its least likely cell of those above 0.03: a wrong distribution the
    statistical tests' samples must reject (their power)."""
    wrong = exact.clone()
    kept = (exact > 0.03).nonzero().flatten()
    hi, lo = kept[exact[kept].argmax()], kept[exact[kept].argmin()]
    wrong[hi] -= mass
    wrong[lo] += mass
    return wrong


def exact_distribution(table: torch.Tensor, cfg, prompt: list[int], n_tokens: int) -> torch.Tensor:
    """P(x_1..x_n | prompt) of autoregressive sampling from a TableLM (next token depends on the last two),
    enumerated over every sequence: (V ** n_tokens,), cells in itertools.product order."""
    from specdraft.decoding.rounds.sampling import probs

    vocab = table.shape[-1]
    out = torch.zeros(vocab**n_tokens, dtype=torch.float64)
    for cell, seq in enumerate(itertools.product(range(vocab), repeat=n_tokens)):
        ctx, prob = list(prompt), 1.0
        for x in seq:
            prob *= float(probs(table[ctx[-2], ctx[-1]], cfg)[x])
            ctx.append(x)
        out[cell] = prob
    return out



def sample_sequences(generate_one, n_samples: int, vocab: int, n_tokens: int) -> tuple[torch.Tensor, dict[str, int]]:
    """Counts of `n_samples` generations of `n_tokens` tokens over the vocab ** n_tokens cells (the order of
    `exact_distribution`), and how often each verification path was taken: rounds whose drafts were all
    accepted ("full": the bonus token), rounds with a rejection ("rejected": the residual), generations that
    discarded drafted tokens ("branched"). generate_one() -> a decoding.metrics.GenerationResult."""
    counts = torch.zeros(vocab**n_tokens)
    paths = {"full": 0, "rejected": 0, "branched": 0}
    for _ in range(n_samples):
        out = generate_one()
        cell = 0
        for x in out.tokens:
            cell = cell * vocab + x
        counts[cell] += 1
        m = out.metrics
        paths["full"] += sum(a == d > 0 for a, d in zip(m.accepted, m.drafted))
        paths["rejected"] += sum(a < d for a, d in zip(m.accepted, m.drafted))
        paths["branched"] += m.n_discarded > 0
    return counts, paths
