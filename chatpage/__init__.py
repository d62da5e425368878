"""chatpage: a terminal chat app over its own paged-KV engine."""

import os

# OpenMP threads that wait for each other spin 1000 times, then sleep (libgomp spins ~300k times
# by default). A decode step is a few hundred short parallel regions: on a 2-core machine shared
# with other work, long spins take the core the other thread needs (the default model at batch 1
# on 2 threads beside 3 busy processes: 19.6 tok/s at libgomp's default, 50.8 at 1000 spins, 60.5
# sleeping at once), while sleeping at once costs a quiet machine a futex wake per region (quiet:
# 175 tok/s passive against 246-256 spinning, 1000 spins included; issue 46, docs/kernels.md).
# It must be set before torch loads libgomp: chatpage's own entry points import this package
# first. A wait policy or spin count the environment already has is kept.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "1000"
