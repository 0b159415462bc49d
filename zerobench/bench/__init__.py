"""The benchmark harness: suites of runs, the sweep runner, and the max-model-size search."""
