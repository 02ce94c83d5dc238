"""The bottom layer: what every other package may import and that imports none of them.

errors (InputError), content hashing and seeds, tokenizer fingerprints and the vocabulary check, device
resolution. Standard library, torch and transformers only.
"""
