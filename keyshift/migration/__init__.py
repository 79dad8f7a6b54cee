"""keyshift.migration."""
