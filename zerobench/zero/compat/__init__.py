"""Compatibility layers over the core engine for users who bring another framework's interface. Nothing in
``zerobench.zero`` outside this package imports it (``tests/unit/test_architecture.py``)."""
