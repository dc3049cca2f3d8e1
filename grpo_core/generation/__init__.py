"""Generating completions: the rollout backends (HF, vLLM) and stop rules (rollout), and
seeded, reproducible sampling over them (sampling).

May import: the top modules, verify, data and modeling."""
