"""The runtime of a run: the driver's query loop and its side of a switch.

`driver.run_job` runs a job's queries one segment after another, carrying out the
switches asked for between two (`driver_switch`, `keyshift.migration`); everything it runs is the
engine's (`keyshift.processing`).
"""
