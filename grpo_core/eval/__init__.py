"""Measuring models: benchmark evaluation (evaluation), statistics (metrics), the grammar
of metric names (metric_names), pass-rate intervals and bands (passrate), the difficulty
filter's pass-rate estimates (difficulty), how many samples each draws (adaptive: fixed k
or rounds until the band is decided), rollouts of a GRPO round as evidence for the next
filter (evidence), splitting filter/eval work into shards (shards), and the gate after
each round: which model what follows starts from (round_gate).

May import: the top modules, verify, data, modeling and generation."""
