"""What the decoder serves with: the bundle directory and its bundle.json schema, the decoding defaults,
small checkpoints, model loading (dtype, devices, quantization) and the prompt format.
"""
