"""keyshift.eventtime."""
