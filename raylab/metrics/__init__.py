"""raylab.metrics: the canonical metric schema, stats tracker, run directories and readers."""
