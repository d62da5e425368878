"""chatpage: a terminal chat app over its own paged-KV engine."""

import os

# OpenMP threads that wait for each other sleep instead of spinning (libgomp spins ~300k times by
# default): on a 2-core machine shared with other work, a decode step's many short parallel
# regions with spinning threads collapse (the default model, 128 tokens at batch 1 on 2 threads,
# load average ~7: 51-58 s spinning against 1.9-3.0 s passive; issue 46). It must be set before
# torch loads libgomp: chatpage's own entry points import this package first. A value the
# environment already has is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
