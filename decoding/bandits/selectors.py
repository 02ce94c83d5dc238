"""Arm selectors for multi-drafter / multi-setting speculative decoding (MetaSD Alg. 2; BanditSpec Alg. 4-5).

One speculative-decoding round is one bandit round. Every selector has the same small protocol:

    arm = selector.select()          # which drafter / speculation setting to use this round
    ... run one round with that arm, compute its reward (decoding.bandits.rewards) ...
    selector.update(arm, reward)     # arm must be the one select() just returned

plus `reset()` (forget everything), `start_query()` (call at the start of every prompt: resets unless
the selector was built with `persistent=True`, which keeps what it learnt across a stream of prompts;
MetaSD re-initialises per query, the default) and inspectable state: `t` (rounds so far), `counts`,
`means`, and per-algorithm values (`index()` for the UCBs, `probabilities()` for the EXP3s,
`survivors` for Sequential Halving).

Arms are numbered 0..K-1 here; the papers number them 1..K. Rewards:
- MetaSD-UCB, EXP3, Sequential Halving: rewards in [0, 1] (block divergence or block efficiency).
- UCBSpec, EXP3Spec: accepted length Y in [1, L + 1] (bonus counted), L = `max_len`; or, for
  speculation-length arms, the round's throughput mapped onto [1, L + 1] (`decoding.bandits.rewards`).

Every random choice (EXP3 sampling, uniform arms, breaking exact ties) draws from a `random.Random`
seeded by the `seed` argument, so runs repeat exactly. Exact ties in an argmax are broken uniformly at
random rather than towards arm 0: with integer-valued rewards (Y, or BE's frequent zeros) ties are
common and a fixed tie-break would bias the comparison between arms.
"""
from __future__ import annotations

import difflib
import inspect
import math
import random

from specdraft.core.errors import InputError, require_int


class Selector:
    """Shared bookkeeping: pull counts, reward sums, the round counter and the select/update handshake."""

    def __init__(self, n_arms: int, seed: int = 0, persistent: bool = False):
        require_int(n_arms, "n_arms", hint="give the selector at least one arm")
        self.n_arms = n_arms
        self.seed = seed
        self.persistent = persistent
        self.reset()

    def reset(self) -> None:
        """Forget all observations and reseed the random stream."""
        self.rng = random.Random(self.seed)
        self.t = 0  # completed rounds (updates) so far
        self.counts = [0] * self.n_arms  # n_i
        self.sums = [0.0] * self.n_arms  # sum of rewards of arm i
        self._pending: int | None = None  # arm returned by select() and not yet updated

    def start_query(self) -> None:
        """Call at the start of each prompt: per-query reset (MetaSD) unless `persistent`."""
        if not self.persistent:
            self.reset()

    @property
    def means(self) -> list[float]:
        """Empirical mean reward per arm (0.0 for an arm never pulled)."""
        return [s / n if n else 0.0 for s, n in zip(self.sums, self.counts)]

    def select(self) -> int:
        """The arm (0..K-1) to use for the coming round."""
        arm = self._choose()
        self._pending = arm
        return arm

    def update(self, arm: int, reward: float) -> None:
        """Record the reward of the round just run with `arm` (the arm select() returned)."""
        if self._pending is None or arm != self._pending:
            raise RuntimeError(
                f"update(arm={arm}) must follow select() returning that arm (last select: {self._pending})"
            )
        reward = float(reward)
        if not math.isfinite(reward):
            raise InputError(f"reward must be a finite number, got {reward}")
        self._check_reward(reward)
        self._observe(arm, reward)  # before the counters move: EXP3Spec needs the round's p_t
        self.counts[arm] += 1
        self.sums[arm] += reward
        self.t += 1
        self._pending = None

    # --- what subclasses provide ---
    def _choose(self) -> int:
        raise NotImplementedError

    def _observe(self, arm: int, reward: float) -> None:
        """Algorithm-specific state update for one observed reward (counts/sums are kept by the base)."""

    def _check_reward(self, reward: float) -> None:
        """Raise InputError for a reward outside the range the algorithm assumes."""

    def _argmax(self, values: list[float]) -> int:
        best = max(values)
        tied = [i for i, v in enumerate(values) if v == best]
        return tied[0] if len(tied) == 1 else self.rng.choice(tied)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_arms={self.n_arms}, t={self.t}, counts={self.counts})"


def _check_unit_reward(reward: float) -> None:
    if not 0.0 <= reward <= 1.0:
        raise InputError(f"reward must be in [0, 1] (block divergence or block efficiency), got {reward}")


class MetaSDUCB(Selector):
    """MetaSD-UCB (MetaSD Alg. 2): one round-robin pass, then argmax_i mu_i + beta sqrt(2 ln t / n_i).

    t is the number of rounds completed so far (Alg. 2 increments t after each round, so the first UCB
    choice uses t = K). beta = 0.01 is the paper's setting for BD rewards in [0, 1]; it makes the rule
    nearly greedy once every arm has been tried.
    """

    def __init__(self, n_arms: int, beta: float = 0.01, seed: int = 0, persistent: bool = False):
        if not (math.isfinite(beta) and beta > 0):
            raise InputError(f"beta (UCB exploration strength) must be > 0, got {beta}; the paper uses 0.01")
        self.beta = beta
        super().__init__(n_arms, seed, persistent)

    def index(self) -> list[float]:
        """mu_i + beta sqrt(2 ln t / n_i) per arm; +inf for an arm not yet pulled."""
        return [
            m + self.beta * math.sqrt(2 * math.log(self.t) / n) if n else math.inf
            for m, n in zip(self.means, self.counts)
        ]

    def _choose(self) -> int:
        if 0 in self.counts:
            return self.counts.index(0)  # the round-robin pass, in arm order
        return self._argmax(self.index())

    def _check_reward(self, reward: float) -> None:
        _check_unit_reward(reward)


class EXP3(Selector):
    """MetaSD-EXP3 (MetaSD Alg. 7, Auer et al. 2002): p_i = (1 - gamma) w_i / sum w + gamma / K.

    After pulling arm a with reward r in [0, 1]: w_a <- w_a exp(gamma r / (p_a K)). Weights are kept as
    logarithms so that long streams cannot overflow.
    """

    def __init__(self, n_arms: int, gamma: float = 0.4, seed: int = 0, persistent: bool = False):
        if not (0.0 < gamma <= 1.0):
            raise InputError(f"gamma (EXP3 exploration) must be in (0, 1], got {gamma}; the paper uses 0.4")
        self.gamma = gamma
        super().__init__(n_arms, seed, persistent)

    def reset(self) -> None:
        super().reset()
        self.log_weights = [0.0] * self.n_arms

    def probabilities(self) -> list[float]:
        top = max(self.log_weights)
        w = [math.exp(lw - top) for lw in self.log_weights]
        total = sum(w)
        return [(1 - self.gamma) * wi / total + self.gamma / self.n_arms for wi in w]

    def _choose(self) -> int:
        self._p = self.probabilities()
        return self.rng.choices(range(self.n_arms), weights=self._p)[0]

    def _observe(self, arm: int, reward: float) -> None:
        self.log_weights[arm] += self.gamma * (reward / self._p[arm]) / self.n_arms

    def _check_reward(self, reward: float) -> None:
        _check_unit_reward(reward)


class SequentialHalving(Selector):
    """Sequential Halving (MetaSD Alg. 5, Karnin et al. 2013), then commit to the survivor (Alg. 4, PETC).

    Phase r pulls every surviving arm n_r times (interleaved, arm order), ranks the survivors by the sum
    of the rewards they got *in this phase*, and keeps the best ceil(|S_r| / 2); after ceil(log2 K)
    phases one arm is left and is selected for the rest of the query.

    The number of rounds of a query is unknown in advance (it depends on acceptance), so by default
    n_r = `period` for every phase: MetaSD runs SH with period 1, one pull per surviving arm between
    eliminations, i.e. K + ceil(K/2) + ... rounds of exploration. Given a `budget` T of exploration rounds
    instead, n_r = max(1, floor(T / (|S_r| ceil(log2 K)))) as in Karnin et al.

    Two departures from the text of MetaSD Alg. 5, both typos there: it keeps the arms whose sums are
    *at most* the median (the worse half), and it runs floor(log2 K) phases, which leaves two arms when
    K is not a power of two; we keep the better half and run ceil(log2 K) phases, as Karnin et al. do.
    """

    def __init__(
        self, n_arms: int, period: int = 1, budget: int | None = None, seed: int = 0, persistent: bool = False
    ):
        require_int(period, "period (pulls per arm per halving phase)")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise InputError(f"budget (exploration rounds) must be an integer >= 1 or None, got {budget!r}")
        self.period = period
        self.budget = budget
        super().__init__(n_arms, seed, persistent)

    def reset(self) -> None:
        super().reset()
        self.survivors = list(range(self.n_arms))
        self.phase = 0
        self._start_phase()

    @property
    def n_phases(self) -> int:
        return math.ceil(math.log2(self.n_arms)) if self.n_arms > 1 else 0

    def pulls_per_arm(self) -> int:
        """n_r for the current phase."""
        if self.budget is None:
            return self.period
        return max(1, self.budget // (len(self.survivors) * self.n_phases))

    def _start_phase(self) -> None:
        self.phase_sums = {i: 0.0 for i in self.survivors}
        # the phase's pulls in order: survivors round-robin, n_r passes
        self._schedule = self.survivors * self.pulls_per_arm() if len(self.survivors) > 1 else []

    def _choose(self) -> int:
        return self._schedule[0] if self._schedule else self.survivors[0]

    def _observe(self, arm: int, reward: float) -> None:
        if not self._schedule:
            return  # committed
        self._schedule.pop(0)
        self.phase_sums[arm] += reward
        if not self._schedule:  # phase over: keep the better half, ties broken at random
            order = list(self.survivors)
            self.rng.shuffle(order)
            order.sort(key=lambda i: self.phase_sums[i], reverse=True)  # stable: shuffle decides ties
            self.survivors = sorted(order[: math.ceil(len(order) / 2)])
            self.phase += 1
            self._start_phase()

    def _check_reward(self, reward: float) -> None:
        _check_unit_reward(reward)


class UCBSpec(Selector):
    """BanditSpec UCBSpec (Alg. 4 / 8, Eq. 5-7): round-robin for the first K rounds, then argmax of

        mu_i + cr_i,  cr_i = (L / 2) sqrt( (1 + n_i) / n_i^2 * (1 + 2 ln(K t^2 sqrt(1 + n_i) / delta)) )

    with t the rounds completed so far, n_i the pulls of arm i and rewards the accepted lengths
    Y in [1, L + 1]. delta = 1/2 is the value the paper's regret bound (Theorem 4.3) takes. Unlike the
    released reference code, n_i is the arm's own count, not the total.
    """

    def __init__(
        self, n_arms: int, max_len: int, delta: float = 0.5, seed: int = 0, persistent: bool = False
    ):
        _check_max_len(max_len)
        if not (0.0 < delta < 1.0):
            raise InputError(f"delta (UCBSpec confidence) must be in (0, 1), got {delta}; the paper's bound uses 0.5")
        self.max_len = max_len
        self.delta = delta
        super().__init__(n_arms, seed, persistent)

    def radius(self) -> list[float]:
        """cr_i per arm (Eq. 6); +inf for an arm not yet pulled."""
        K, t, L = self.n_arms, self.t, self.max_len
        return [
            (L / 2) * math.sqrt((1 + n) / n**2 * (1 + 2 * math.log(K * t**2 * math.sqrt(1 + n) / self.delta)))
            if n
            else math.inf
            for n in self.counts
        ]

    def index(self) -> list[float]:
        return [m + r for m, r in zip(self.means, self.radius())]

    def _choose(self) -> int:
        if 0 in self.counts:
            return self.counts.index(0)  # round-robin: I_t = t for t <= K
        return self._argmax(self.index())

    def _check_reward(self, reward: float) -> None:
        _check_accepted_length(reward, self.max_len)


class EXP3Spec(Selector):
    """BanditSpec EXP3Spec (Alg. 5 / 9, Eq. 13-14): anytime EXP3 on the loss (L + 1 - Y) / L.

    Round t (1-based) samples I_t ~ p_t with p_t,i proportional to exp(-eta_t sum_{s<t} Z_i,s),
    eta_t = sqrt(ln K / (t K)), and then records Z_I_t,t = (L + 1 - Y_t) / (L p_t,I_t) (zero for the
    other arms). The learning rate shrinks with t, so no horizon is needed. p_t is computed as a
    softmax with the maximum subtracted (log-sum-exp), so large cumulative losses cannot overflow.
    """

    def __init__(self, n_arms: int, max_len: int, seed: int = 0, persistent: bool = False):
        _check_max_len(max_len)
        self.max_len = max_len
        super().__init__(n_arms, seed, persistent)

    def reset(self) -> None:
        super().reset()
        self.cum_loss = [0.0] * self.n_arms  # sum_{s<t} Z_i,s

    @property
    def eta(self) -> float:
        """eta_t for the coming round t = self.t + 1."""
        return math.sqrt(math.log(self.n_arms) / ((self.t + 1) * self.n_arms))

    def probabilities(self) -> list[float]:
        """p_t for the coming round t = self.t + 1."""
        logits = [-self.eta * z for z in self.cum_loss]
        top = max(logits)
        w = [math.exp(x - top) for x in logits]
        total = sum(w)
        return [wi / total for wi in w]

    def _choose(self) -> int:
        self._p = self.probabilities()
        return self.rng.choices(range(self.n_arms), weights=self._p)[0]

    def _observe(self, arm: int, reward: float) -> None:
        L = self.max_len
        self.cum_loss[arm] += (L + 1 - reward) / (L * self._p[arm])

    def _check_reward(self, reward: float) -> None:
        _check_accepted_length(reward, self.max_len)


def _check_max_len(max_len) -> None:
    require_int(max_len, "max_len (L, the maximum speculation length)")


def _check_accepted_length(reward: float, max_len: int) -> None:
    if not 1.0 <= reward <= max_len + 1:
        raise InputError(
            f"reward must be the accepted length Y in [1, L + 1 = {max_len + 1}] (bonus counted), got {reward}"
        )


class FixedArm(Selector):
    """Static baseline: always the same arm (a single-drafter run)."""

    def __init__(self, n_arms: int, arm: int = 0, seed: int = 0, persistent: bool = False):
        super().__init__(n_arms, seed, persistent)
        self.arm = self._check_arm(arm)

    def _check_arm(self, arm) -> int:
        if isinstance(arm, bool) or not isinstance(arm, int) or not 0 <= arm < self.n_arms:
            raise InputError(f"arm must be an integer in [0, {self.n_arms - 1}], got {arm!r}")
        return arm

    def _choose(self) -> int:
        return self.arm


class OracleFixedArm(FixedArm):
    """Hindsight-best fixed arm: the evaluation measures every arm on a prompt, then `tell`s the best.

    The told arm survives `reset()` / `start_query()`; tell it again for every prompt.
    """

    def __init__(self, n_arms: int, best_arm: int | None = None, seed: int = 0, persistent: bool = False):
        Selector.__init__(self, n_arms, seed, persistent)
        self.arm = None if best_arm is None else self._check_arm(best_arm)

    def tell(self, best_arm: int) -> None:
        self.arm = self._check_arm(best_arm)

    def _choose(self) -> int:
        if self.arm is None:
            raise RuntimeError("OracleFixedArm.select() before tell(best_arm): measure the arms on the prompt first")
        return self.arm


class OnePassOracle(OracleFixedArm):
    """The ceiling of any bandit that starts with one round-robin pass (MetaSD-UCB, UCBSpec): that pass,
    then the prompt's hindsight-best arm for every later round. Its gap to the best fixed arm is the
    price of trying every arm once, which a short generation cannot amortise."""

    def _choose(self) -> int:
        if 0 in self.counts:
            return self.counts.index(0)  # the same pass, in the same arm order, as MetaSDUCB
        return super()._choose()


class UniformRandom(Selector):
    """Static baseline: a uniformly random arm every round (MetaSD's 'Rand')."""

    def _choose(self) -> int:
        return self.rng.randrange(self.n_arms)


SELECTORS: dict[str, type[Selector]] = {
    "ucb": MetaSDUCB,
    "exp3": EXP3,
    "sh": SequentialHalving,
    "ucbspec": UCBSpec,
    "exp3spec": EXP3Spec,
    "fixed": FixedArm,
    "random": UniformRandom,
    "oracle": OracleFixedArm,
    "one-pass-oracle": OnePassOracle,
}


def make_selector(name: str, n_arms: int, **params) -> Selector:
    """Build a selector by name (see SELECTORS), e.g. make_selector("ucbspec", 3, max_len=4, delta=0.5)."""
    cls = SELECTORS.get(name)
    if cls is None:
        close = difflib.get_close_matches(str(name), SELECTORS, n=1, cutoff=0.0)
        raise InputError(
            f"unknown selector {name!r}; did you mean {close[0]!r}? (valid: {', '.join(SELECTORS)})"
        )
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "n_arms")]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise InputError(f"selector {name!r} does not take {', '.join(unknown)}; its parameters: {', '.join(accepted)}")
    required = [
        p.name
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.default is inspect.Parameter.empty and p.name not in ("self", "n_arms") and p.name not in params
    ]
    if required:
        hint = " (max_len is L, the maximum speculation length)" if "max_len" in required else ""
        raise InputError(f"selector {name!r} needs {', '.join(required)}{hint}")
    return cls(n_arms, **params)
