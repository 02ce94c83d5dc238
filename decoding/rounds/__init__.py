"""The round machinery: the cache a forward writes into and rolls back, sampling transforms, one
verification step (one prompt or a batch, chain or tree), and the definitions of a round's length and
forward counts, and the shapes a round and a decode's caches take (shapes.py: widths, segments, feeds,
cache lengths). Pure functions over tensors; the only calls into a model are in kv.py and static_cache.py.
"""
