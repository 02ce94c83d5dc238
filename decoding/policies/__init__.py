"""When to stop drafting and which arm drafts: stopping policies (fixed K, SpecDec++ with its acceptance
head, the hindsight oracle), the Eq. 3.1 cost model, bandit selectors and rewards, the batched length bandit.
"""
