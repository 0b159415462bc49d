"""The performance simulator: device profiles (measured here or stated), the engine's step replayed on
them as discrete events, and the check of its predictions against measured runs (issue 22)."""
