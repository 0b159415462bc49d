"""Plain models (no parallel code) and their size/FLOPs arithmetic."""
