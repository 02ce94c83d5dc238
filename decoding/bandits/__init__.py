"""Bandit algorithms: arm selectors (UCB, EXP3, SH, UCBSpec, EXP3Spec) and their rewards. Plain arithmetic
over arms and rewards, below what runs them: the speculator that bandits over drafter arms
(decoding/speculators/multi_drafter.py, MetaSD, BanditSpec) and the batched length bandit
(decoding/policies/batch_length_ucb.py)."""
