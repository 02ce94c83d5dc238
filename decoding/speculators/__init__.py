"""What proposes draft tokens: the `Speculator` seam (protocol.py) and everything behind it - the
drafter chain, EAGLE, SpecTr's i.i.d. drafts, a bandit over arms (multi_drafter, arms), and the model-free speculators.
"""
