"""Answer verification: extraction of a completion's final answer (extraction), safe
parsing and equivalence under a deadline (safe_eval), gold parsing and comparison
(answers), and the GRPO reward functions and their registry (rewards).

Lowest layer: imports only the top modules of grpo_core (and nothing of them today)."""
