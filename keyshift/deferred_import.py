"""A module imported at its first use instead of when the importing module is.

Why: at every query start, so at every switch, transformWithState runs a new Python interpreter
on the driver (pyspark's `transform_with_state_driver_worker`, the "pre-init" process) that
unpickles the stateful processor and calls only its `init` to learn the state variables' schemas.
Unpickling imports the processor's module and what it imports. pandas was 0.30 to 0.60 s of that
process's life (0.6 to 1.2 s) on this project's 2-core machines, in every switch's pause, and
`init` never touches a frame. The operators therefore name pandas through `deferred_module`: the
pre-init process never imports it, and a Python worker that processes rows imports it at its
first frame (pyspark's Arrow serializer needs it there anyway).

Not `importlib.util.LazyLoader` (nor a library built on it): that one puts a half-made module in
`sys.modules`, and on Python 3.11 two threads that touch it at once can see it before it has run.
A `DeferredModule` is a name in its importer's namespace only; the import itself is
`importlib.import_module`, under the import system's per-module lock.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class DeferredModule:
    """Stands for the module `name` until an attribute is read, then imports it.

    After the import, the module's attributes are copied into this object, so later reads cost
    what a module attribute read costs (no `__getattr__` call). An attribute the module gains
    later (a submodule imported afterwards) is still found through `__getattr__`.

    Args:
        name: the module's absolute name, e.g. "pandas".

    Raises (at the first attribute read, not here):
        ImportError: the module cannot be imported, as a plain `import` would raise it.
    """

    def __init__(self, name: str) -> None:
        self.__dict__["_deferred_name"] = name

    def __getattr__(self, attribute: str) -> Any:  # called only for names not in __dict__
        module = self.module()
        return getattr(module, attribute)

    def module(self) -> ModuleType:
        """The module itself, imported now if it was not yet."""
        module = importlib.import_module(self.__dict__["_deferred_name"])
        if "__name__" not in self.__dict__:
            self.__dict__.update(vars(module))
        return module

    def __setattr__(self, attribute: str, value: Any) -> None:
        raise AttributeError(f"a deferred module ({self.__dict__['_deferred_name']}) is read-only")

    def __reduce__(self) -> tuple:
        # pickled (a closure that names it, by cloudpickle) as its name, as a module is
        return (DeferredModule, (self.__dict__["_deferred_name"],))

    def __repr__(self) -> str:
        state = "imported" if "__name__" in self.__dict__ else "not imported yet"
        return f"<deferred module {self.__dict__['_deferred_name']!r}, {state}>"


def deferred_module(name: str) -> DeferredModule:
    """`name` imported at the first attribute read of the returned object (see the module docstring).

    Use as `pd = deferred_module("pandas")` in place of `import pandas as pd`; code then reads
    `pd.DataFrame` as before. Annotations need `from __future__ import annotations`.

    Args:
        name: an absolute module name.

    Returns:
        A `DeferredModule`; no import happens here.
    """
    return DeferredModule(name)
