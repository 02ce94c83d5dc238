"""Several speculation settings ("arms") behind one `Speculator`: bandits over drafters, lengths and model-free arms.

An arm is any `Speculator` with a name: a drafter (optionally with its SpecDec++ head), a speculation
length gamma over a drafter (gamma = 0: propose nothing, i.e. a plain target step), or a model-free
speculator (prompt lookup, REST, suffix decoding: BanditSpec Table 1's arms). `decoding.speculators.arms` builds
the list from config entries. Arms of different cost compare by the throughput reward (BanditSpec §6.2)
with each arm's own cost per drafted token (`Arm.cost_ratio`).
One speculative-decoding round is one bandit round (MetaSD Alg. 2, BanditSpec Alg. 1):

    propose:  arm = selector.select(); the arm drafts at most n_max tokens
    (the loop verifies the draft with one target forward)
    observe:  reward from the round (block divergence, block efficiency or accepted length);
              selector.update(arm, reward)

Only one drafter is active per round. A drafter that sat out some rounds has not seen the tokens they
committed; when it is chosen again its KV cache catches up on them (prefill) in the draft's first
forward, the one that yields q_1 anyway, so a round of k candidates still costs k drafter forwards
(Lemma 3.1, `decoding.rounds.lengths`). That forward is timed on its own (`switch_seconds`; `switch_forwards`
counts such catch-ups), so the cost of switching can be reported next to the draft time it is part of.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdraft.decoding.compat import check_pair
from specdraft.core.errors import InputError, require_int
from specdraft.decoding.bandits.rewards import (accepted_length_reward, block_divergence_reward, block_efficiency_reward,
                              normalized_throughput, throughput_bounds)
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.bandits.selectors import EXP3, EXP3Spec, MetaSDUCB, SequentialHalving, UCBSpec
from specdraft.decoding.speculators.drafter import DrafterSpeculator
from specdraft.decoding.speculators.protocol import Draft, RoundOutcome, Speculator, common_prefix
from specdraft.decoding.policies.spec import PolicySpec, build_policy

REWARDS = ("bd", "bd-argmax", "be", "accepted", "throughput")


@dataclass
class Arm:
    name: str  # e.g. "math", "ofa", "lookup", "gamma=2"
    speculator: Speculator  # e.g. DrafterSpeculator(drafter, FixedK(4)), PromptLookupSpeculator()
    drafter_key: str | None = None  # arms sharing a drafter model share its KV cache state (gamma arms)
    # the throughput reward's cost of one drafted token in target forwards (t_draft / t_target); None:
    # the bandit's cost_ratio for an arm with a drafter model, 0 for a model-free one (no forward)
    cost_ratio: float | None = None


class NoDraftSpeculator:
    """gamma = 0: propose nothing, so the round is one plain target step (BanditSpec's gamma = 0 arm)."""

    def start(self, target: torch.nn.Module, eos: set[int]) -> None:
        pass

    def propose(
        self, context: list[int], max_tokens: int, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> Draft:
        return _empty_draft()

    def observe(self, outcome: RoundOutcome) -> None:
        pass


def gamma_arms(drafter: torch.nn.Module, gammas: list[int], key: str = "drafter") -> list[Arm]:
    """Speculation lengths as arms over one drafter (BanditSpec §5): "gamma=g" drafts exactly g tokens
    per round (g = 0 is plain decoding). The drafter arms share `key`, hence one KV cache."""
    if not gammas:
        raise InputError("gamma_arms needs at least one speculation length, e.g. [0, 1, 2, 3, 4]")
    arms = []
    for g in gammas:
        require_int(g, "speculation length gamma", minimum=0)
        spec = NoDraftSpeculator() if g == 0 else DrafterSpeculator(drafter, build_policy(PolicySpec("fixed", k=g)))
        arms.append(Arm(f"gamma={g}", spec, None if g == 0 else key))
    return arms


def _model_free_arms(arms: list[Arm]) -> bool:
    """Some arm drafts without a drafter model (prompt lookup, REST, suffix decoding): its rounds cost
    almost nothing, so accepted length would misjudge it against the drafters."""
    return any(getattr(a.speculator, "drafter", None) is None and not isinstance(a.speculator, NoDraftSpeculator)
               for a in arms)


def _length_arms(arms: list[Arm]) -> bool:
    """Arms that differ only in speculation length: every drafting arm wraps the same drafter model
    (plain-decoding arms allowed), and there are at least two arms."""
    drafting = [a.speculator for a in arms if not isinstance(a.speculator, NoDraftSpeculator)]
    drafters = {id(getattr(s, "drafter", None)) for s in drafting}
    return len(arms) > 1 and len(drafters) == 1 and id(None) not in drafters


def _empty_draft() -> Draft:
    return Draft(tokens=[], q=torch.empty(0, 0), n_forwards=0)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _check_arms(arms: list[Arm]) -> None:
    if not arms:
        raise InputError("the arm list is empty; give at least one drafter / speculation setting")
    for arm in arms:
        if not isinstance(arm, Arm):
            raise InputError(f"arms must be decoding.speculators.multi_drafter.Arm(name, speculator, drafter_key), got {type(arm).__name__}")
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise InputError(f"arm names must be unique, got {names}")


def _check_targets(arms: list[Arm], target: torch.nn.Module) -> None:
    """Every drafter matches the target's vocabulary; arms sharing a drafter_key share one drafter model."""
    shared: dict[str, torch.nn.Module] = {}
    for arm in arms:
        drafter = getattr(arm.speculator, "drafter", None)
        if drafter is not None:
            try:
                check_pair(target, drafter)
            except InputError as e:
                raise InputError(f"arm {arm.name!r}: {e}") from None
        if arm.drafter_key is not None:
            if not isinstance(arm.speculator, DrafterSpeculator):
                raise InputError(f"arm {arm.name!r} has drafter_key but no drafter to share; set drafter_key=None")
            first = shared.setdefault(arm.drafter_key, drafter)
            if first is not drafter:
                raise InputError(
                    f"arms with drafter_key {arm.drafter_key!r} wrap different drafter models; "
                    "give each drafter its own key"
                )


def _check_cost_ratio(arms: list[Arm], reward: str, cost_ratio: float | None) -> None:
    """The throughput reward prices every drafted token: an arm with a drafter model and no cost of its own
    needs the bandit's c. There is no default c: it is the bundle's measured one (`Bundle.defaults.cost_ratio`)."""
    if reward != "throughput" or cost_ratio is not None:
        return
    unpriced = [a.name for a in arms if a.cost_ratio is None and getattr(a.speculator, "drafter", None) is not None]
    if unpriced:
        raise InputError(f"the throughput reward needs cost_ratio (c = t_draft / t_target) for arms "
                         f"{', '.join(unpriced)}: pass the bundle's measured c (Bundle.defaults.cost_ratio)")


def bandit_reward(arms: list[Arm], selector, reward: str | None, n_max: int, cost_ratio: float | None) -> str:
    """The reward a bandit over `arms` learns from (None: the default, see MultiDrafterSpeculator), once
    its setup is checked: the constructor is where library users and the stages hand in these values, so
    every impossible combination is refused here with a one-line fix."""
    _check_arms(arms)
    for c in [c for c in [cost_ratio, *(a.cost_ratio for a in arms)] if c is not None]:
        if isinstance(c, bool) or not (isinstance(c, (int, float)) and 0 <= c < math.inf):
            raise InputError(f"cost_ratio (c = t_draft / t_target) must be a finite number >= 0, got {c!r}")
    if reward is None:
        reward = "throughput" if _length_arms(arms) or _model_free_arms(arms) else "bd"
    if reward not in REWARDS:
        raise InputError(f"unknown reward {reward!r}; use one of {', '.join(REWARDS)}")
    require_int(n_max, "n_max (the most draft tokens per round)")
    if getattr(selector, "n_arms", None) != len(arms):
        raise InputError(
            f"the selector has {getattr(selector, 'n_arms', None)} arms but {len(arms)} arms were given; "
            "build it with make_selector(name, len(arms))"
        )
    if isinstance(selector, (UCBSpec, EXP3Spec)):
        if reward not in ("accepted", "throughput"):
            raise InputError(f"{type(selector).__name__} takes rewards in [1, L + 1]; use reward='accepted' "
                             "or 'throughput'")
        if selector.max_len != n_max:
            raise InputError(f"selector max_len ({selector.max_len}) must equal n_max ({n_max})")
    if isinstance(selector, (MetaSDUCB, EXP3, SequentialHalving)) and reward == "accepted":
        raise InputError(
            f"{type(selector).__name__} takes rewards in [0, 1]; use reward='bd', 'bd-argmax', 'be' or 'throughput'"
        )
    _check_cost_ratio(arms, reward, cost_ratio)
    return reward


class MultiDrafterSpeculator:
    """A bandit over arms, one arm per round (implements `decoding.speculators.protocol.Speculator`).

    reward: "bd"       MetaSD Eq. 4 block divergence, mean over drafted positions of 1 - TV(p, q), in [0, 1]
            "bd-argmax" the same, but under greedy decoding on the one-hot verification distributions:
                       the fraction of drafted positions where draft and target argmax agree
            "be"       block efficiency N_acc / n_max, in [0, 1]
            "accepted" BanditSpec's accepted length Y = N_acc + 1 in [1, n_max + 1]
            "throughput" BanditSpec §6.2: the round's tokens per unit of cost, (N_acc + 1) / (1 + c_i k),
                       c_i the arm's cost per drafted token (`arm_cost`), mapped affinely onto the
                       selector's reward range ([0, 1], or [1, n_max + 1] for UCBSpec / EXP3Spec) by
                       the bounds over all arms' costs; the reward for arms of different cost
            None       (default) "throughput" for arms of different cost (length arms wrapping one
                       drafter model, e.g. `gamma_arms`, or model-free arms beside drafters), else "bd"
    n_max: the most tokens any arm drafts in a round (MetaSD's N_max = 5; BanditSpec's L); arms are
        capped at it so that rewards compare equal budgets.

    The BD reward is computed from the distributions the round was verified with (`RoundOutcome.p`,
    `Draft.q`) when sampling. Under greedy decoding those are one-hots (BD would only count argmax
    agreements), so it reads the models' own softmax distributions from the raw logits instead, as
    MetaSD defines alpha = 1 - TV(p, q) for T = 0 too (its Assumption 2); a model-free arm (prompt
    lookup) has no logits and keeps the one-hot form. The paper leaves room for both readings: its
    Table 2 calls BD "always nonzero" (softmax), while its Lemma 2 (maximising BD maximises accepted
    tokens) needs alpha to be the acceptance rate of the verification in use, which under greedy
    verification is argmax agreement ("bd-argmax"). The two can rank drafters differently.
    BD rates token agreement, not speed, and the accepted length grows with gamma whatever drafting
    costs: over gamma arms of one drafter the default is the throughput (BD scores gamma = 0 as 0).

    A round with no room to draft (the last token of a generation: max_tokens == 0) is no bandit round:
    no arm is chosen, nothing is learnt, nothing is appended to `history`.
    Per generation (reset in `start`): `history` (one dict per bandit round: arm, reward, accepted,
    drafted), `switch_seconds` and `switch_forwards` (the rounds whose first drafter forward also caught
    up on tokens committed while the drafter sat out, and that forward's time; no extra forward).
    """

    def __init__(self, arms: list[Arm], selector, reward: str | None = None, n_max: int = 5,
                 cost_ratio: float | None = None):
        reward = bandit_reward(arms, selector, reward, n_max, cost_ratio)
        self.arms = arms
        self.selector = selector
        self.reward = reward
        if reward == "bd":  # under greedy decoding BD reads the drafters' raw logits; nobody else needs them
            for arm in arms:
                if hasattr(arm.speculator, "keep_logits"):
                    arm.speculator.keep_logits = True
        self.n_max = n_max
        # None only where no arm needs it (bandit_reward checks): another reward, or every arm priced
        self.cost_ratio = None if cost_ratio is None else float(cost_ratio)
        self._spec_range = isinstance(selector, (UCBSpec, EXP3Spec))  # rewards in [1, L + 1], not [0, 1]
        # plain-decoding arms draft nothing (k = 0), so their cost never enters a round's throughput
        drafting = [i for i, a in enumerate(arms) if not isinstance(a.speculator, NoDraftSpeculator)]
        self._bounds = throughput_bounds(n_max, [self.arm_cost(i) for i in drafting] or [0.0]) \
            if reward == "throughput" else None
        self._reset()

    def arm_cost(self, i: int) -> float:
        """Arm i's cost per drafted token in target forwards: its own cost_ratio, else the bandit's for an
        arm with a drafter model, else 0 (a model-free arm drafts without a forward)."""
        arm = self.arms[i]
        if arm.cost_ratio is not None:
            return float(arm.cost_ratio)
        return self.cost_ratio if getattr(arm.speculator, "drafter", None) is not None else 0.0

    def _reset(self) -> None:
        self.history: list[dict] = []
        self.switch_seconds = 0.0
        self.switch_forwards = 0
        self._arm: int | None = None  # the arm of the round in flight
        self._greedy = False  # the round in flight decodes greedily
        self._last_key = None  # the drafter that drafted the previous round
        self._holder: dict[str, int] = {}  # drafter_key -> the arm whose speculator holds that cache

    def _key(self, i: int):
        return self.arms[i].drafter_key or ("arm", i)

    def start(self, target: torch.nn.Module, eos: set[int]) -> None:
        _check_targets(self.arms, target)
        for arm in self.arms:
            arm.speculator.start(target, eos)
        self.selector.start_query()
        self._reset()

    def _take_shared_cache(self, i: int) -> None:
        """Arms over one drafter model (gamma arms) hand its cache to each other instead of re-prefilling."""
        key = self.arms[i].drafter_key
        if key is None:
            return
        holder = self._holder.get(key)
        if holder is not None and holder != i:
            src, dst = self.arms[holder].speculator, self.arms[i].speculator
            dst.cache, dst.fed, dst._committed = src.cache, src.fed, src._committed
        self._holder[key] = i

    def _lags(self, spec, context: list[int]) -> bool:
        """Whether the drafter has missed committed tokens besides the last one (it sat out rounds)."""
        if hasattr(spec, "lags"):  # an EAGLE arm knows whether it drafted the previous round
            return spec.lags(context)
        return isinstance(spec, DrafterSpeculator) and common_prefix(spec.fed, context) < len(context) - 1

    def propose(
        self, context: list[int], max_tokens: int, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> Draft:
        if max_tokens <= 0:
            self._arm = None
            return _empty_draft()
        i = self._arm = self.selector.select()
        self._greedy = sampling.greedy
        spec = self.arms[i].speculator
        self._take_shared_cache(i)
        key = self._key(i)
        switched = self._last_key is not None and key != self._last_key and self._lags(spec, context)
        self._last_key = key
        draft = spec.propose(context, min(max_tokens, self.n_max), sampling, generator)
        if switched and draft.n_forwards:
            # the catch-up rode on the draft's first forward (the one that yields q_1): no extra forward,
            # so N_draft stays k per round (Lemma 3.1); that forward's time is the switch cost
            self.switch_seconds += spec.catch_up_seconds
            self.switch_forwards += 1
        return draft

    @property
    def needs_target_features(self) -> bool:
        """Whether an arm (an EAGLE drafter) reads the target's hidden states: then every round carries them."""
        return any(getattr(a.speculator, "needs_target_features", False) for a in self.arms)

    @property
    def target_feature_layers(self) -> tuple[int, ...]:
        """The union (in arm order) of the hidden states the EAGLE arms read; each takes its own columns."""
        layers: list[int] = []
        for arm in self.arms:
            if getattr(arm.speculator, "needs_target_features", False):
                for i in getattr(arm.speculator, "target_feature_layers", (-1,)):
                    if i not in layers:
                        layers.append(i)
        return tuple(layers) or (-1,)

    def _record_target(self, outcome: RoundOutcome, active: int | None) -> None:
        """EAGLE arms that sat this round out still keep the target's features of what it committed, so on
        a switch only their own layer's cache catches up (MetaSD App. F.11)."""
        for j, arm in enumerate(self.arms):
            if j != active and hasattr(arm.speculator, "record_target"):
                arm.speculator.record_target(outcome)

    def observe(self, outcome: RoundOutcome) -> None:
        i, self._arm = self._arm, None
        self._record_target(outcome, i)
        if i is None:
            return  # not a bandit round
        self.arms[i].speculator.observe(outcome)
        k = len(outcome.draft.tokens)
        n = outcome.verification.n_accepted
        p, q = outcome.p, outcome.draft.q
        if self.reward == "bd" and self._greedy and outcome.logits is not None and outcome.draft.logits is not None:
            # greedy verification distributions are one-hots; MetaSD's alpha = 1 - TV(p, q) is defined on
            # the models' own next-token distributions (its Assumption 2 covers T = 0 that way)
            p = outcome.logits[:k].float().softmax(-1).cpu()
            q = outcome.draft.logits.float().softmax(-1).cpu()
        reward = self.round_reward(p, q, k, n, arm=i)
        self.selector.update(i, reward)
        self.history.append({"arm": i, "reward": reward, "accepted": n, "drafted": k})

    def round_reward(self, p: torch.Tensor, q: torch.Tensor, k: int, n: int, arm: int = 0) -> float:
        """The configured reward of a round in which `arm` drafted k tokens and had n accepted
        (p: (k+1, V), q: (k, V))."""
        if self.reward in ("bd", "bd-argmax"):
            return float(block_divergence_reward(p[:k], q)) if k else 0.0
        if self.reward == "be":
            return float(block_efficiency_reward(n, self.n_max))
        if self.reward == "throughput":
            u = normalized_throughput(n, k, self.n_max, self.arm_cost(arm), bounds=self._bounds)
            return 1.0 + self.n_max * u if self._spec_range else u
        return float(accepted_length_reward(n, self.n_max))

    def counts(self) -> list[int]:
        """Rounds per arm in this generation's history."""
        out = [0] * len(self.arms)
        for h in self.history:
            out[h["arm"]] += 1
        return out
