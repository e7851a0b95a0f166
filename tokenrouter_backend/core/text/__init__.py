"""Text helpers: incremental detokenization and stop strings matched on text."""
