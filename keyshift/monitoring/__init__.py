"""keyshift.monitoring."""
