"""Training rounds: GRPO with TRL plus its KL schedule, monitors and guards (grpo), and
the SFT cold start (sft, which builds on grpo).

May import: the top modules, verify, data, modeling and generation (not eval)."""
