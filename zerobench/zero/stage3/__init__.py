"""Stage 3 (P_os+g+p): parameters partitioned, gathered per unit just in time and freed right after
(``gatherer``), a unit's flat buffer (``unit``), parameters read outside their unit (``escaped``) and units some
ranks skip (``skipped``)."""
