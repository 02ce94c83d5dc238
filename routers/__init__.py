"""Routing baselines: a router picks one drafter per prompt (a centroid and a prompt classifier), their
checkpoints and the classifier's LightningModule."""
