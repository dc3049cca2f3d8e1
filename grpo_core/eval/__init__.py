"""Measuring models: benchmark evaluation (evaluation), statistics (metrics), pass-rate
intervals and bands (passrate), the difficulty filter's pass-rate estimates (difficulty),
and splitting filter/eval work into shards (shards).

May import: the top modules, verify, data, modeling and generation."""
