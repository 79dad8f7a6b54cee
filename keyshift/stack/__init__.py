"""keyshift.stack."""
