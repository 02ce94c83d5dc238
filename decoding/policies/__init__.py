"""When to stop drafting: stopping policies (fixed K, SpecDec++ with its acceptance head, the hindsight
oracle), the Eq. 3.1 cost model, the batch-aware rule, the batched length bandit. A caller describes the
policy it wants as a `spec.PolicySpec` and builds it with `spec.build_policy`, the one constructor.
"""
