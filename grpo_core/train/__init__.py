"""Training rounds: GRPO with TRL plus its KL schedule, monitors and guards (grpo, its
callbacks, the algorithms registry: ppo, rloo, vhead), and the SFT cold start (sft). Both
build their TRL trainer from `trainer`; it and `trainer_internals` (a trainer's internals
as functions) are the only modules touching TRL's private members.

May import: the top modules, verify, data, modeling and generation (not eval)."""
