"""Shared test settings."""

import os

# inductor (trainer.compile tests): one compile thread; its worker pool costs more than it
# saves on the 2-core CI machine (cold compile of the test model: 33 s instead of 43 s)
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch

torch.set_num_threads(1)
