"""Column-wise input for transformWithStateInPandas on pyspark 4.2.0.

pyspark 4.2.0's `TransformWithStateInPandasSerializer.load_stream` turns every Arrow record batch
it receives into a pandas frame, walks that frame row by row (`itertuples`) to find where the
grouping key changes, and builds a new frame from the row tuples (`pd.DataFrame(rows)`). Its cost
grows with rows times columns: measured on this machine, about 0.74 s for one slot's 31,250
flights of a 250,000-flight micro-batch (13 columns) and 0.21 s for the same flights as 5,000
Local Merge partials, against 0.004 s and 0.07 s for the Arrow-to-pandas conversion alone. In a
keyed window job every stateful task holds one group (its slot token), so that walk only ever
finds one key.

`install` replaces the method by `load_stream_by_columns`, which does the same thing with
numpy: it converts each Arrow batch to pandas exactly as pyspark does, finds the rows where a
grouping key column changes, and yields slices of the frame. What the processor receives is the
same: per grouping key, in order, an iterator of `(key, frame)` pairs whose frames hold that
key's rows, every column, in arrival order, each at most one Arrow batch long. Only the dtypes
of some columns can differ (a slice keeps the Arrow conversion's dtype, where rebuilding a frame
from tuples re-infers it); keyshift's processors convert every column they read explicitly.

The replacement is installed only on the version it was written against (`PYSPARK_VERSION`) and
only when the method is still pyspark's own; otherwise pyspark's is left alone and a warning
says so. Setting `KEYSHIFT_TWS_INPUT=pyspark` in the workers' environment keeps pyspark's
(to compare, or to rule this out when something looks wrong). The processors install it when they are unpickled on a Python worker, which happens
before the worker reads its first input (`KeyedWindowProcessor.__setstate__`).
"""

from __future__ import annotations

import logging
import os
from itertools import groupby
from typing import Any, Iterator

import numpy as np

log = logging.getLogger(__name__)

ENV_SWITCH = "KEYSHIFT_TWS_INPUT"
"""Environment variable: `pyspark` keeps pyspark's row-by-row input; anything else (or unset)
installs the column-wise one."""

PYSPARK_VERSION = "4.2.0"
"""The pyspark release whose serializer `load_stream_by_columns` mirrors."""

pyspark_load_stream = None
"""pyspark's own `load_stream`, kept once `install` replaced it (tests compare the two)."""

_installed: bool | None = None
"""None: not tried in this process; True: installed; False: tried and left pyspark's."""


def key_runs(key_columns: list[np.ndarray], rows: int) -> list[tuple[int, int]]:
    """The runs of equal grouping keys in a frame: [(first row, end row), ...] in order.

    Args:
        key_columns: one array per grouping key column, each of `rows` elements.
        rows: the frame's row count (>= 0).

    Returns:
        Half-open row ranges covering 0..rows, a new range wherever any key column's value
        differs from the row before (None equals None; NaN starts a new run, as it never equals).
    """
    if rows == 0:
        return []
    change = np.zeros(rows, dtype=bool)
    change[0] = True
    for values in key_columns:
        if rows > 1:
            change[1:] |= np.asarray(values[1:] != values[:-1], dtype=bool)
    starts = np.flatnonzero(change)
    ends = np.append(starts[1:], rows)
    return list(zip(starts.tolist(), ends.tolist()))


def _python_scalar(value: Any) -> Any:
    """A numpy scalar as the Python value pyspark's row walk gives (pandas iterates to Python
    scalars), so the grouping key the state server receives has the same types."""
    return value.item() if isinstance(value, np.generic) else value


def load_stream_by_columns(self, stream) -> Iterator[tuple[Any, Any, Any]]:
    """`TransformWithStateInPandasSerializer.load_stream` without the row-by-row walk (module
    docstring): yields (PROCESS_DATA, key, iterator of (key, pandas frame)) per run of one
    grouping key, then (PROCESS_TIMER, None, None) and (COMPLETE, None, None), as pyspark's."""
    import pandas as pd
    from pyspark.sql.conversion import ArrowBatchTransformer
    from pyspark.sql.pandas.serializers import ArrowStreamPandasSerializer
    from pyspark.sql.streaming.stateful_processor_util import TransformWithStateInPandasFuncMode

    def frames(batches):
        for batch in batches:
            self._update_batch_size_stats(batch)
            if batch.num_rows == 0:
                continue
            columns = ArrowBatchTransformer.to_pandas(
                batch,
                timezone=self._timezone,
                schema=self._input_type,
                struct_in_pandas=self._struct_in_pandas,
                ndarray_as_list=self._ndarray_as_list,
                prefer_int_ext_dtype=self._prefer_int_ext_dtype,
                df_for_struct=self._df_for_struct,
            )
            frame = pd.concat(columns, axis=1)
            keys = [frame.iloc[:, offset].to_numpy() for offset in self.key_offsets]
            for start, end in key_runs(keys, len(frame)):
                key = tuple(_python_scalar(values[start]) for values in keys)
                yield key, frame.iloc[start:end].reset_index(drop=True)

    batches = super(ArrowStreamPandasSerializer, self).load_stream(stream)
    for key, pairs in groupby(frames(batches), key=lambda pair: pair[0]):
        yield (TransformWithStateInPandasFuncMode.PROCESS_DATA, key, pairs)
    yield (TransformWithStateInPandasFuncMode.PROCESS_TIMER, None, None)
    yield (TransformWithStateInPandasFuncMode.COMPLETE, None, None)


def install() -> bool:
    """Replace pyspark's row-by-row `load_stream` of transformWithStateInPandas by
    `load_stream_by_columns`, once per process.

    Returns:
        True when the column-wise input is in place (now or before), False when pyspark is not
        `PYSPARK_VERSION` or its method was already replaced by someone else (pyspark's is then
        kept, and a warning is logged once).
    """
    global _installed
    if _installed is not None:
        return _installed
    if os.environ.get(ENV_SWITCH, "columns") == "pyspark":
        log.info("%s=pyspark: transformWithStateInPandas input stays row by row", ENV_SWITCH)
        _installed = False
        return False
    import pyspark
    from pyspark.sql.pandas import serializers

    cls = serializers.TransformWithStateInPandasSerializer
    current = cls.__dict__.get("load_stream")
    if pyspark.__version__ != PYSPARK_VERSION or current is None or current.__module__ != serializers.__name__:
        log.warning("pyspark %s: transformWithStateInPandas input stays row by row (keyshift's column-wise input is for %s)",
                    pyspark.__version__, PYSPARK_VERSION)
        _installed = False
        return False
    global pyspark_load_stream
    pyspark_load_stream = current
    cls.load_stream = load_stream_by_columns
    _installed = True
    return True
