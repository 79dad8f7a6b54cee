"""keyshift.data."""
