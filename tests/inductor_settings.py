"""Inductor's settings for the suite's compiled runs, in the pytest process (conftest imports
this module) and in every rank (tests/dist.py's forkserver preloads it).

One compile thread: inductor's worker pool costs more than it saves on the 2-core CI machine
(a cold compile of the test model: 33 s instead of 43 s). Scalar C++ kernels (cpp.simdlen=1):
what the compile tests hold is the graph (dynamo's capture without breaks, the functional
collectives, the seeded dropout, recomputation around the compiled code), not the CPU's vector
code, which no GPU run uses (there inductor writes Triton); measured on the ModernBERT compile
row: 76 s -> 54 s, the Python code generation of vectorized kernels being the difference."""

import os

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch._inductor.config as inductor_config  # after the variable it reads

inductor_config.cpp.simdlen = 1
