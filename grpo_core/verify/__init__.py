"""Answer verification: extraction of a completion's final answer (extraction), bounds on
the time spent checking it (safe_eval: input limits and a deadline), math-verify called
under them (math_verify_adapter), gold answers parsed once and cached (gold), the
comparison of an answer with its gold (answers), and the GRPO reward functions and their
registry (rewards).

Lowest layer: imports only the top modules of grpo_core (and nothing of them today)."""
