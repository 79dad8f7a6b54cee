"""Balance metrics of per-slot loads (paper 000, §3.3).

A load is what a slot processed in a span: events here (bytes or seconds where measured).
"""

from __future__ import annotations

from typing import Sequence


def balance_degree(loads: Sequence[float]) -> float:
    """Balance degree = min load / max load, in [0, 1] (paper 000, eq. 1).

    Args:
        loads: per-slot loads, one per slot (slots that processed nothing count as 0).

    Returns:
        1.0 for perfectly even loads; 0.0 when some slot got nothing while another got work;
        1.0 for all-zero loads (nothing to balance).

    Raises:
        ValueError: if `loads` is empty or has a negative value.
    """
    _check(loads)
    highest = max(loads)
    return 1.0 if highest == 0 else min(loads) / highest


def extra_compute_time(loads: Sequence[float]) -> float:
    """Extra compute time = (max − mean) / mean (paper 000, eq. 2); 0.0 for all-zero loads.

    Raises:
        ValueError: if `loads` is empty or has a negative value.
    """
    _check(loads)
    mean = sum(loads) / len(loads)
    return 0.0 if mean == 0 else (max(loads) - mean) / mean


def max_over_mean(loads: Sequence[float]) -> float:
    """Makespan over the ideal: max load / mean load (1.0 is perfect); 1.0 for all-zero loads.

    Raises:
        ValueError: if `loads` is empty or has a negative value.
    """
    return 1.0 + extra_compute_time(loads)


def _check(loads: Sequence[float]) -> None:
    if len(loads) == 0:
        raise ValueError("loads must name at least one slot")
    if min(loads) < 0:
        raise ValueError(f"loads must be >= 0, got {min(loads)}")
