"""The pure library: no Prefect, no MLflow.

Modules are layered by concern; imports point one way, down the layers:

- top modules (config, progress, workspace, prompts, versions, driver, redaction): the base
  any layer may import. config is a package (its sections in modules); the others are modules. They
  import no layer. Exception, by design: config's validators import three modules late (inside
  the validator, not at import time): `data.benchmarks` (is_eval_split), `verify.rewards`
  (REWARDS) and `eval.metric_names` (the metric grammar), to refuse bad configs by name.
- verify/: answer extraction, comparison and rewards.
- data/: problems, sources, the DuckDB store and its pipeline lock.
- modeling/: model loading, the built-in tiny and proxy models, memory plans, GPU hygiene.
- generation/: rollout backends and seeded sampling.
- eval/: evaluation, pass-rate estimation (difficulty filter), metrics, sharded work.
- train/: GRPO and SFT rounds.

Each layer may import the top modules and any earlier layer in LAYERS, never a later
one, at module level or inside functions (tests/test_import_graph.py checks it).

Importing this package is cheap: it imports nothing."""

LAYERS = ("verify", "data", "modeling", "generation", "eval", "train")
"""Subpackages, lowest first: each may import the top modules and the ones before it."""

TOP_MODULES = ("config", "progress", "workspace", "prompts", "versions", "driver", "redaction",
               "findings")
"""The base modules at the top of grpo_core (no layer imports, see CONFIG_LATE_IMPORTS);
config is a package, the one top module that is."""

CONFIG_LATE_IMPORTS = ("grpo_core.data.benchmarks", "grpo_core.verify.rewards",
                       "grpo_core.eval.metric_names")
"""The only layer modules a top module imports: config (any of its modules), inside its
validators."""
