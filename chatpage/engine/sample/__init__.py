"""Sampling: per-row constraints (logit bias, grammar masks) and the sampler."""
