"""Models: loading and fingerprinting (loading), the built-in tiny model (tiny) and the
Qwen2-shaped proxy (proxy), per-GPU memory plans (memory_plan), GPU memory hygiene (gpu).

May import: the top modules, verify and data."""
