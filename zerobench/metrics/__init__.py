"""Ledgers and measurements: communication, memory, throughput."""
