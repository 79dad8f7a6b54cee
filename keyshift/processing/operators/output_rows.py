"""The stateful processor's output rows, gathered into one pandas frame per call.

transformWithStateInPandas turns every frame a handler yields into Arrow on its own
(`pyspark.sql.conversion.PandasToArrowConversion.convert`), column by column, at a fixed cost
of about 2 ms per frame for the engine's 25-column output schema on this machine, whatever the
frame's length (pandas' per-column overhead: `iloc`, a new Series, `isnull`). A key-mode slot
used to yield three to five frames per batch (load, late events, watermarks, closed windows,
dead letters), so the cost grew with the number of slots: at P = 32 the conversions took about
7 s of Python-worker time per 3,000,000 flights against 2 s at P = 8 (py-spy, issue 11).
The processors (`keyshift.processing.operators.processor`, `keyshift.processing.operators.key_window_processor`) now
build `OutputRows` (plain columns) and yield them as one frame per handler call (`one_frame`).

Columns one kind leaves NULL stay typed in the combined frame: an integer, float or boolean
column some pieces lack becomes a pandas masked array (`Int64`, `Float64`, `boolean`), which
Arrow takes without looking at each value; text columns are object arrays with None.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping, NamedTuple, Sequence

import numpy as np
from keyshift.deferred_import import deferred_module

pd = deferred_module("pandas")  # not imported by the pre-init process (keyshift.deferred_import)


class OutputRows(NamedTuple):
    """`n` output rows of one `kind`: the columns given (each of length `n`; lists, numpy arrays
    or Series), every other column of the schema NULL."""

    kind: str
    n: int
    columns: Mapping[str, Any]


_MASKED = {"i": "IntegerArray", "u": "IntegerArray", "f": "FloatingArray", "b": "BooleanArray"}
"""dtype kind -> the name of pandas' masked array for it (in `pd.arrays`)."""


def rows_frame(pieces: Sequence[OutputRows], column_names: Sequence[str]) -> pd.DataFrame:
    """One frame of all `pieces`, in order, with the columns `column_names` in that order.

    Args:
        pieces: output rows; their columns are a subset of `column_names`.
        column_names: the output schema's column names, in schema order; `kind` (added at the
            end when missing) holds each piece's kind.

    Returns:
        A frame of sum(piece.n) rows. A column no piece gives is an object array of None; one
        every piece gives with one numpy kind is their concatenation; otherwise it is a masked
        array when the pieces that give it agree on a kind (integers, floats, booleans: NULL
        where a piece lacks it), else an object array of their values and None, so that no
        value is converted (an integer stays exact) before Arrow casts it to the schema's type.

    Raises:
        ValueError: a piece's column whose length is not the piece's `n`.
    """
    total = sum(piece.n for piece in pieces)
    data: dict[str, Any] = {}
    for name in column_names:
        if name == "kind":
            data[name] = None  # filled below, in its place
            continue
        given = [(piece.n, _array(piece, name)) for piece in pieces]
        present = [values for _n, values in given if values is not None]
        if not present:
            data[name] = np.full(total, None, dtype=object)
        elif len(present) == len(given) and len({values.dtype.kind for values in present}) == 1:
            data[name] = present[0] if len(present) == 1 else np.concatenate(present)
        else:  # NULL in some pieces, or of different kinds (an int64 and a float64 would make float64)
            data[name] = _with_nulls(given, total)
    data["kind"] = np.concatenate([np.full(piece.n, piece.kind, dtype=object) for piece in pieces]) if pieces else \
        np.empty(0, dtype=object)
    return pd.DataFrame(data, copy=False)


def one_frame(pieces: Iterable[OutputRows], column_names: Sequence[str]) -> Iterator[pd.DataFrame]:
    """A stateful handler's output: all `pieces` (drained now) as one `rows_frame`, or nothing
    when there are none. Raises what `rows_frame` raises."""
    gathered = list(pieces)
    if gathered:
        yield rows_frame(gathered, column_names)


def _array(piece: OutputRows, name: str) -> np.ndarray | None:
    if name not in piece.columns:
        return None
    values = np.asarray(piece.columns[name])
    if values.dtype.kind in "US":
        values = values.astype(object)
    if len(values) != piece.n:
        raise ValueError(f"output column {name!r} of a {piece.kind!r} piece has {len(values)} values for {piece.n} rows")
    return values


def _with_nulls(given: list[tuple[int, np.ndarray | None]], total: int) -> Any:
    """One column from pieces some of which lack it (None): masked when every given piece is of
    one numeric or boolean kind, else object with None."""
    kinds = {values.dtype.kind for _n, values in given if values is not None}
    name = _MASKED.get(kinds.pop()) if len(kinds) == 1 else None
    masked = getattr(pd.arrays, name) if name else None
    if masked is not None:
        dtype = np.result_type(*[values.dtype for _n, values in given if values is not None])
        out, mask = np.zeros(total, dtype=dtype), np.ones(total, dtype=bool)
    else:
        out, mask = np.full(total, None, dtype=object), None
    at = 0
    for n, values in given:
        if values is not None:
            out[at:at + n] = values
            if mask is not None:
                mask[at:at + n] = False
        at += n
    return masked(out, mask) if masked is not None else out
