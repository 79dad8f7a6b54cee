"""keyshift.placement."""
