"""What the decoder serves with: the bundle directory and its bundle.json schema, model loading (dtype,
devices, quantization) and the prompt format. The decoding defaults it carries (decoding/defaults.py) and the
small-checkpoint format (decoding/checkpoint.py) live below it, with the rooms that read them.
"""
