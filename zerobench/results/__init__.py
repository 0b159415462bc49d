"""Results as data: one JSON row per (run, metric) with provenance."""
