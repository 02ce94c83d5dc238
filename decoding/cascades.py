"""Speculative cascades (Faster Cascades via Speculative Decoding, Narasimhan et al.): target
distributions pi = T(q, p) that trade quality for speed, and the two sequential cascade baselines.

Every rule is a pure function of the drafter's q and the verifier's p at one position, on (..., V)
tensors of the same shape (a (V,) row or a (k, V) block). The speculative decoder turns any such pi into
an output distribution with the generic rule of Algorithm 4 (GenSpecSample), implemented once in
`decoding.rounds.verify.verify`: accept a draft token x when q(x) <= pi(x), else with probability pi(x)/q(x); on
rejection sample norm(max(0, pi - q)).

Rules (paper Table 1 / Table 3, section 4.4), each with the lenience alpha (larger = more drafter):
    chow      SpecCascade [Chow]   delta = 1(max q < 1 - alpha)                      Eq. 2
    diff      SpecCascade [Diff]   delta = 1(max q < max p - alpha)                  Eq. 5
    opt       SpecCascade [OPT]    delta = 1(max q < max p - alpha TV(p, q))         Eq. 10
              with pi = (1 - delta) q + delta p                                      Algorithm 5
    token_v1  pi(v) = q(v)(1 - r(v)) + p(v) eta, eta = sum_v' r(v') q(v'),           Algorithm 6
              r(v) = 1(q(v) < max p - alpha)                                         Eq. 13
    token_v2  r(v) = 1(p(v) < max p - alpha)                                         Eq. 14
    token_v3  r(v) = 1(p(v) < max p (1 - alpha))  -- the paper's SpecCascade [Token] Eq. 15
    lossy     SpecDecode [Lossy]   pi = max(min(q, p / (1 - alpha)), p / beta), beta >= 1 - alpha
              (Tran-Thien 2023; beta = 1 is the paper's SpecDecode [Lossy]). This pi is not normalised:
              it is the function that makes Algorithm 4 *be* lossy speculative sampling (paper Lemma 2);
              `emitted_distribution` gives the distribution that comes out.
    bild      BiLD*                pi = 1(D <= alpha) q + 1(D > alpha) p with the paper's D for
              sampling (App. E.1): D(q, p) = -sum_v q(v) log p(v), the cross-entropy of p under q.

Sequential baselines (no speculation; the small model decodes and defers by Chow's rule):
    token_chow  TokenCascade [Chow] (Algorithm 2): per token, sample from q unless max q < 1 - alpha, in
                which case the large model catches up on the prefix and samples the token.
    seq_chow    SeqCascade [Chow] (Eq. 1): the small model writes the whole response; if its confidence
                is below 1 - alpha, the large model writes a new one from scratch.

Choices made here (and why):
  * The bonus position (all k drafts accepted) samples from p, not from T(q_{k+1}, p_{k+1}): the drafter
    never computes q_{k+1} (that would cost one more drafter forward per round). Every drafted position
    follows the cascade exactly; the bonus token is the large model's own.
  * Greedy decoding is refused (one-line InputError): at T = 0 both q and p are one-hot, so max q = 1 and
    every confidence-based deferral degenerates. The paper's T -> 0 limit (App. C.3) reads the deferral
    from the untempered distributions instead; use a temperature > 0 here.
  * The neutral alpha (pi == p for every q, p: lossless speculative sampling) is `NEUTRAL_ALPHA[rule]`.
    For most rules it lies below the paper's sweep range [0, 1]: e.g. Diff at alpha = 0 still keeps q
    whenever max q >= max p.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import torch

from specdraft.decoding.rounds import kv
from specdraft.decoding.autoregressive import as_token_list, eos_set, generate_autoregressive
from specdraft.decoding.compat import check_pair, check_prompt
from specdraft.core.errors import InputError
from specdraft.decoding.metrics import GenerationMetrics, GenerationResult
from specdraft.decoding.rounds.sampling import SamplingConfig, probs, sample
from specdraft.decoding.speculative import generate_speculative
from specdraft.decoding.speculators.drafter import DrafterSpeculator
from specdraft.decoding.policies.spec import PolicySpec, build_policy
from specdraft.decoding.bandits.rewards import tv_distance

SPECULATIVE_RULES = ("chow", "diff", "opt", "token_v1", "token_v2", "token_v3", "lossy", "bild")
SEQUENTIAL_RULES = ("token_chow", "seq_chow")
RULES = SPECULATIVE_RULES + SEQUENTIAL_RULES
ALIASES = {"token": "token_v3"}  # the paper's SpecCascade [Token] is the V3 rule (Eq. 15)

# The paper's method names (Table 2 / Figure 2), for tables and plots.
DISPLAY_NAMES = {
    "chow": "SpecCascade [Chow]",
    "diff": "SpecCascade [Diff]",
    "opt": "SpecCascade [OPT]",
    "token_v1": "SpecCascade [TokenV1]",
    "token_v2": "SpecCascade [TokenV2]",
    "token_v3": "SpecCascade [Token]",
    "lossy": "SpecDecode [Lossy]",
    "bild": "BiLD*",
    "token_chow": "TokenCascade [Chow]",
    "seq_chow": "SeqCascade [Chow]",
}

# alpha at which pi == p for every (q, p), i.e. lossless speculative sampling (the deferral always fires).
# Diff/V1/V2: max q <= 1 < max p + 1; V3: p(v) <= max p < 2 max p; OPT: max q - max p <= TV(p, q) < 2 TV
# unless q == p; Chow: max q <= 1 < 2; BiLD: D = -sum q log p > 0 unless p == q is one-hot; lossy: p.
# The sequential baselines defer always at alpha = -1 too (they then decode the large model alone).
NEUTRAL_ALPHA = {"chow": -1.0, "diff": -1.0, "opt": -2.0, "token_v1": -1.0, "token_v2": -1.0, "token_v3": -1.0,
                 "lossy": 0.0, "bild": 0.0, "token_chow": -1.0, "seq_chow": -1.0}


def canonical_rule(rule: str) -> str:
    name = ALIASES.get(rule, rule)
    if name not in RULES:
        raise InputError(f"unknown cascade rule {rule!r}; use one of {', '.join(RULES)} (or 'token' for token_v3)")
    return name


# --- deferral decisions delta(q, p) in {0, 1}: (..., V) -> (...,) bool -------------------------------


def chow_defers(q: torch.Tensor, p: torch.Tensor, alpha: float) -> torch.Tensor:
    """Chow's rule (Eq. 2): defer when the drafter is not confident."""
    return q.amax(-1) < 1.0 - alpha


def diff_defers(q: torch.Tensor, p: torch.Tensor, alpha: float) -> torch.Tensor:
    """Diff (Eq. 5): defer when the verifier is more confident by more than alpha."""
    return q.amax(-1) < p.amax(-1) - alpha


def opt_defers(q: torch.Tensor, p: torch.Tensor, alpha: float) -> torch.Tensor:
    """OPT (Eq. 10): the plug-in optimal speculative deferral; the margin scales with the rejection
    probability TV(p, q) a deferral costs (Lemma 3)."""
    return q.amax(-1) < p.amax(-1) - alpha * tv_distance(p, q)


def bild_discrepancy(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """D(q, p) = -sum_v q(v) log p(v) (paper App. E.1, the sampling analogue of BiLD's -log p(argmax q)).
    Cells with q(v) = 0 contribute 0; q(v) > 0 with p(v) = 0 gives +inf (always defer)."""
    return -torch.xlogy(q, p).sum(-1)


def bild_defers(q: torch.Tensor, p: torch.Tensor, alpha: float) -> torch.Tensor:
    return bild_discrepancy(q, p) > alpha


DEFERRALS: dict[str, Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]] = {
    "chow": chow_defers, "diff": diff_defers, "opt": opt_defers, "bild": bild_defers}


def deferral_target(q: torch.Tensor, p: torch.Tensor, defer: torch.Tensor) -> torch.Tensor:
    """T_delta(q, p) = (1 - delta) q + delta p (Algorithm 5)."""
    return torch.where(defer.unsqueeze(-1), p, q)


# --- token-specific rules (section 4.4): r(v) in {0, 1} per candidate token ---------------------------


def token_v1_rejects(q: torch.Tensor, p: torch.Tensor, alpha: float) -> torch.Tensor:
    return q < p.amax(-1, keepdim=True) - alpha  # Eq. 13


def token_v2_rejects(q: torch.Tensor, p: torch.Tensor, alpha: float) -> torch.Tensor:
    return p < p.amax(-1, keepdim=True) - alpha  # Eq. 14


def token_v3_rejects(q: torch.Tensor, p: torch.Tensor, alpha: float) -> torch.Tensor:
    return p < p.amax(-1, keepdim=True) * (1.0 - alpha)  # Eq. 15: keep q on Top_alpha of p


TOKEN_REJECTIONS = {"token_v1": token_v1_rejects, "token_v2": token_v2_rejects, "token_v3": token_v3_rejects}


def token_target(q: torch.Tensor, p: torch.Tensor, rejects: torch.Tensor) -> torch.Tensor:
    """pi(v) = q(v) (1 - r(v)) + p(v) eta, eta = sum_v' r(v') q(v') (section 4.4, Algorithm 6).
    When every token is rejected eta is exactly 1 (not a float sum of q), so pi == p bit for bit."""
    eta = torch.where(rejects.all(-1), torch.ones_like(q[..., 0]), (q * rejects).sum(-1))
    return torch.where(rejects, torch.zeros_like(q), q) + p * eta.unsqueeze(-1)


def lossy_target(q: torch.Tensor, p: torch.Tensor, alpha: float, beta: float = 1.0) -> torch.Tensor:
    """max(min(q, p / (1 - alpha)), p / beta) (Table 1; Tran-Thien 2023): Algorithm 4 with this function
    accepts x with probability min(1, p(x) / ((1 - alpha) q(x))) and resamples from norm((p / beta - q)_+)."""
    return torch.maximum(torch.minimum(q, p / (1.0 - alpha)), p / beta)


def check_alpha(rule: str, alpha: float, beta: float = 1.0) -> None:
    if not math.isfinite(alpha):
        raise InputError(f"alpha must be a finite number, got {alpha}")
    if rule == "lossy":
        if not (0.0 <= alpha < 1.0):
            raise InputError(f"lossy speculative decoding needs 0 <= alpha < 1, got {alpha}")
        if not (beta >= 1.0 - alpha and beta > 0):
            raise InputError(f"lossy speculative decoding needs beta >= 1 - alpha (= {1 - alpha:g}), got {beta}")


def target_distribution(rule: str, q: torch.Tensor, p: torch.Tensor, alpha: float, beta: float = 1.0) -> torch.Tensor:
    """pi = T(q, p) for a speculative rule; q and p: (..., V) of the same shape."""
    rule = canonical_rule(rule)
    check_alpha(rule, alpha, beta)
    if rule in DEFERRALS:
        return deferral_target(q, p, DEFERRALS[rule](q, p, alpha))
    if rule in TOKEN_REJECTIONS:
        return token_target(q, p, TOKEN_REJECTIONS[rule](q, p, alpha))
    if rule == "lossy":
        return lossy_target(q, p, alpha, beta)
    raise InputError(f"{rule!r} is a sequential cascade (no target distribution); run it with CascadeMethod")


def emitted_distribution(q: torch.Tensor, pi: torch.Tensor) -> torch.Tensor:
    """What one verification step of Algorithm 4 emits at a drafted position, (..., V):
    min(q, pi) + (1 - sum min(q, pi)) norm((pi - q)_+). Equals pi whenever pi is a distribution."""
    kept = torch.minimum(q, pi)
    rest = (pi - q).clamp_min(0.0)
    mass = rest.sum(-1, keepdim=True)
    return kept + (1.0 - kept.sum(-1, keepdim=True)) * torch.where(mass > 0, rest / mass.clamp_min(1e-30), 0.0)


def verification_distribution(rule: str, alpha: float, beta: float = 1.0):
    """The callable `generate_speculative(..., verification_distribution=...)` takes:
    (p (k+1, V), q (k, V)) -> pi (k+1, V); drafted rows get T(q, p), the bonus row keeps p."""
    rule = canonical_rule(rule)
    if rule not in SPECULATIVE_RULES:
        raise InputError(f"{rule!r} is a sequential cascade; it has no verification distribution")
    check_alpha(rule, alpha, beta)

    def pi(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        k = q.shape[0]
        if k == 0:
            return p
        return torch.cat([target_distribution(rule, q, p[:k], alpha, beta), p[k:]])

    return pi


def check_sampling(sampling: SamplingConfig) -> None:
    if sampling.greedy:
        raise InputError("speculative cascades need temperature > 0 (under greedy decoding q and p are one-hot "
                         "and the deferral rules see no confidence); pass e.g. --temperature 1")


# --- sequential baselines ----------------------------------------------------------------------------


def _sequential_inputs(rule: str, alpha: float, sampling: SamplingConfig, prompt_ids, max_new_tokens: int,
                       eos_token_id, target, drafter) -> tuple[list[int], set[int]]:
    """The prompt as token ids and the EOS set, once the inputs of a sequential cascade are checked."""
    check_sampling(sampling)
    check_alpha(rule, alpha)
    prompt = as_token_list(prompt_ids)
    check_prompt(prompt, max_new_tokens, target, drafter)
    check_pair(target, drafter)
    return prompt, eos_set(eos_token_id)


@torch.inference_mode()
def generate_token_cascade(
    target: torch.nn.Module,
    drafter: torch.nn.Module,
    prompt_ids,
    max_new_tokens: int,
    alpha: float,
    sampling: SamplingConfig = SamplingConfig(temperature=1.0),
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
) -> GenerationResult:
    """TokenCascade [Chow] (Algorithm 2 with Eq. 2): the drafter computes q_t for every token; when
    max q_t >= 1 - alpha the token is sampled from q_t, otherwise the target catches up on everything it
    has not seen in one forward and the token is sampled from p_t. N_target counts the deferrals."""
    prompt, eos = _sequential_inputs("token_chow", alpha, sampling, prompt_ids, max_new_tokens, eos_token_id,
                                     target, drafter)
    m = GenerationMetrics()
    start = time.perf_counter()
    d_cache, t_cache = kv.new_cache(), kv.new_cache()
    d_dev, t_dev = kv.input_device(drafter), kv.input_device(target)
    context = list(prompt)
    while len(context) - len(prompt) < max_new_tokens:
        t0 = time.perf_counter()
        logits, _ = kv.forward(drafter, d_cache, context[kv.cache_length(d_cache):], device=d_dev)
        q = probs(logits[-1], sampling).cpu()
        m.n_draft += 1
        t1 = time.perf_counter()
        m.time_draft += t1 - t0
        if bool(chow_defers(q, q, alpha)):
            logits, _ = kv.forward(target, t_cache, context[kv.cache_length(t_cache):], device=t_dev)
            dist = probs(logits[-1], sampling).cpu()
            m.n_target += 1
            m.time_target += time.perf_counter() - t1
        else:
            dist = q
        token = int(sample(dist, generator))
        context.append(token)
        if token in eos:
            break
    m.time_total = time.perf_counter() - start
    m.n_generated = len(context) - len(prompt)
    return GenerationResult(tokens=context[len(prompt):], metrics=m)


@torch.inference_mode()
def generate_seq_cascade(
    target: torch.nn.Module,
    drafter: torch.nn.Module,
    prompt_ids,
    max_new_tokens: int,
    alpha: float,
    sampling: SamplingConfig = SamplingConfig(temperature=1.0),
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    confidence: str = "joint",
) -> GenerationResult:
    """SeqCascade [Chow] (Eq. 1): the drafter samples a whole response; if its confidence is below
    1 - alpha the target samples a new response from the prompt. confidence: "joint" is Eq. 1's
    q(x_m..x_{m+n} | x_<m); "mean" the per-token geometric mean of it (a length-normalised variant of the
    kind the paper cites from Gupta et al. 2024; the joint probability of a long response is ~0, so the
    joint rule defers almost always unless alpha is very close to 1)."""
    if confidence not in ("joint", "mean"):
        raise InputError(f"SeqCascade confidence must be 'joint' or 'mean', got {confidence!r}")
    prompt, eos = _sequential_inputs("seq_chow", alpha, sampling, prompt_ids, max_new_tokens, eos_token_id,
                                     target, drafter)
    m = GenerationMetrics()
    start = time.perf_counter()
    cache = kv.new_cache()
    device = kv.input_device(drafter)
    out: list[int] = []
    log_q = 0.0
    pending = prompt
    while True:
        logits, _ = kv.forward(drafter, cache, pending, device=device)
        q = probs(logits[-1], sampling).cpu()
        m.n_draft += 1
        token = int(sample(q, generator))
        log_q += math.log(float(q[token]))
        out.append(token)
        if len(out) == max_new_tokens or token in eos:
            break
        pending = [token]
    m.time_draft = time.perf_counter() - start
    score = math.exp(log_q if confidence == "joint" else log_q / len(out))
    if score < 1.0 - alpha:  # defer the whole response
        res = generate_autoregressive(target, prompt, max_new_tokens, sampling, eos_token_id, generator)
        out = res.tokens
        m.n_target = res.metrics.n_target
        m.time_target = res.metrics.time_total
    m.time_total = time.perf_counter() - start
    m.n_generated = len(out)
    return GenerationResult(tokens=out, metrics=m)


# --- one method = rule + alpha (+ beta): what an evaluation plan entry names -------------------------


@dataclass(frozen=True)
class CascadeMethod:
    """A cascade setting the evaluation can run like any other method:
    `CascadeMethod("opt", 0.3).generate(target, drafter, ids, 64, SamplingConfig(1.0), k=5)`."""

    rule: str
    alpha: float
    beta: float = 1.0  # lossy only
    seq_confidence: str = "joint"  # seq_chow only

    def __post_init__(self):
        object.__setattr__(self, "rule", canonical_rule(self.rule))
        check_alpha(self.rule, self.alpha, self.beta)

    @property
    def name(self) -> str:
        return DISPLAY_NAMES[self.rule]

    @property
    def label(self) -> str:
        return f"{self.name} a={self.alpha:g}"

    @property
    def speculative(self) -> bool:
        return self.rule in SPECULATIVE_RULES

    def verification_distribution(self):
        return verification_distribution(self.rule, self.alpha, self.beta)

    def generate(self, target, drafter, prompt_ids, max_new_tokens: int,
                 sampling: SamplingConfig = SamplingConfig(temperature=1.0), k: int | None = None,
                 eos_token_id=None, generator: torch.Generator | None = None) -> GenerationResult:
        """Decode one prompt; k is the block size gamma of the speculative rules (None: `DEFAULT_BLOCK`)."""
        check_sampling(sampling)
        k = DEFAULT_BLOCK if k is None else k
        if self.rule == "token_chow":
            return generate_token_cascade(target, drafter, prompt_ids, max_new_tokens, self.alpha, sampling,
                                          eos_token_id, generator)
        if self.rule == "seq_chow":
            return generate_seq_cascade(target, drafter, prompt_ids, max_new_tokens, self.alpha, sampling,
                                        eos_token_id, generator, self.seq_confidence)
        return generate_speculative(target, DrafterSpeculator(drafter, build_policy(PolicySpec("fixed", k=k))), prompt_ids, max_new_tokens,
                                    sampling, eos_token_id, generator, self.verification_distribution())


# the block size gamma a speculative cascade drafts per round when the caller names no K (the paper's 5)
DEFAULT_BLOCK = 5


def cascade_method(rule: str, alpha: float, beta: float = 1.0, seq_confidence: str = "joint") -> CascadeMethod:
    """Factory for evaluation plans: rule (a name in RULES or 'token') + alpha -> a runnable method."""
    return CascadeMethod(rule, float(alpha), float(beta), seq_confidence)


def method_from_spec(spec, where: str = "decoding.cascade") -> CascadeMethod | None:
    """A config / bundle entry {rule, alpha[, beta]} (or null) -> CascadeMethod | None."""
    if not spec:
        return None
    if not isinstance(spec, dict) or "rule" not in spec or "alpha" not in spec or set(spec) - {"rule", "alpha", "beta"}:
        raise InputError(f"{where} must be {{rule, alpha[, beta]}}, got {spec!r}")
    for key in ("alpha", "beta"):  # float("0.3") would turn a quoted string into a lenience
        if key in spec and (isinstance(spec[key], bool) or not isinstance(spec[key], (int, float))):
            raise InputError(f"{where}.{key} must be a number, got {spec[key]!r}")
    if not isinstance(spec["rule"], str):
        raise InputError(f"{where}.rule must be a rule name (e.g. token), got {spec['rule']!r}")
    try:
        return cascade_method(spec["rule"], spec["alpha"], spec.get("beta", 1.0))
    except InputError as e:
        raise InputError(f"{where}: {e}") from None


# A few lenience values per rule spanning "almost the large model" to "almost the small model" (the paper
# sweeps alpha over [0, 1] for the probability thresholds and over [0, 10] for BiLD's D).
DEFAULT_ALPHAS = {
    "chow": (0.0, 0.2, 0.4, 0.6, 0.8),
    "diff": (0.0, 0.1, 0.2, 0.4, 0.8),
    "opt": (0.0, 0.25, 0.5, 1.0, 2.0),
    "token_v1": (0.0, 0.1, 0.2, 0.4, 0.8),
    "token_v2": (0.0, 0.1, 0.2, 0.4, 0.8),
    "token_v3": (0.0, 0.2, 0.4, 0.6, 0.8),
    "lossy": (0.0, 0.2, 0.4, 0.6, 0.8),
    "bild": (0.5, 1.0, 2.0, 3.0, 5.0),
    "token_chow": (0.0, 0.2, 0.4, 0.6, 0.8),
    "seq_chow": (0.1, 0.2, 0.3, 0.4, 0.5),  # with seq_confidence="mean"
}


def sweep(rules=None, alphas: dict | None = None, temperatures=(1.0, 0.5), seq_confidence: str = "mean"):
    """Plan entries for a quality-latency sweep: [(CascadeMethod, SamplingConfig)] for every rule, alpha
    (DEFAULT_ALPHAS unless given per rule) and temperature (the paper's Figure 2: T = 1 and T = 0.5)."""
    out = []
    for temperature in temperatures:
        sampling = SamplingConfig(float(temperature))
        check_sampling(sampling)
        for rule in rules or RULES:
            rule = canonical_rule(rule)
            for alpha in (alphas or {}).get(rule, DEFAULT_ALPHAS[rule]):
                out.append((cascade_method(rule, alpha, seq_confidence=seq_confidence), sampling))
    return out
