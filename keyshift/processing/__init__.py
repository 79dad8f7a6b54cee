"""keyshift.processing."""
