import os

# Tests must never reach a hub or the network, and must not write W&B runs anywhere but tmp dirs.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

# Tiny models run fastest on one thread, and tests that start subprocesses (ddp, sharded stages)
# must not oversubscribe the 2 cores of a CI box.
torch.set_num_threads(1)
