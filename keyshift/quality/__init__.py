"""keyshift.quality."""
