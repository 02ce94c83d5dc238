"""The round machinery: the cache a forward writes into and rolls back, sampling transforms, one
verification step (one prompt or a batch, chain or tree), and the definitions of a round's length and
forward counts. Pure functions over tensors; the only calls into a model are in kv.py and static_cache.py.
"""
