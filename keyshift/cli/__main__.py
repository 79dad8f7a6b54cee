"""`python -m keyshift.cli ...` = `keyshift ...` (for child processes of this interpreter)."""

from keyshift.cli import main

main()
