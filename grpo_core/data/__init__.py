"""Problems and where they come from: the Problem type, source adapters and readers, row
validation, synthetic problems, benchmarks, decontamination, the DuckDB store (db,
store, records), the store's pipeline lock (locks) and the training pool.

May import: the top modules and verify (gold parsing)."""
