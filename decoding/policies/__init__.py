"""When to stop drafting: stopping policies (fixed K, SpecDec++ with its acceptance head, the hindsight
oracle), the Eq. 3.1 cost model, the batch-aware rule, the batched length bandit.
"""
