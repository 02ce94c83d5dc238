"""Multi-drafter bandits: arm selectors (UCB, EXP3, SH, UCBSpec, EXP3Spec), their rewards, and the
speculator that runs one over drafter arms (MetaSD, BanditSpec)."""
