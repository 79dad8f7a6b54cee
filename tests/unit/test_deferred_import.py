"""keyshift.deferred_import: a module imported at its first attribute read, and the operators'
use of it (transformWithState's pre-init process must not import pandas)."""
import pickle
import subprocess
import sys
import textwrap

import pytest

from keyshift.deferred_import import DeferredModule, deferred_module


@pytest.fixture
def fresh_module(tmp_path, monkeypatch):
    """A module nobody imported yet, whose import is counted."""
    (tmp_path / "ks_deferred_probe.py").write_text("import builtins\nbuiltins.ks_probe_imports = getattr(builtins, 'ks_probe_imports', 0) + 1\nVALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("ks_deferred_probe", None)
    import builtins

    monkeypatch.setattr(builtins, "ks_probe_imports", 0, raising=False)
    yield "ks_deferred_probe"
    sys.modules.pop("ks_deferred_probe", None)


def test_the_module_is_imported_at_the_first_attribute_read_and_only_once(fresh_module):
    import builtins

    probe = deferred_module(fresh_module)
    assert fresh_module not in sys.modules and builtins.ks_probe_imports == 0
    assert "not imported yet" in repr(probe)
    assert probe.VALUE == 42
    assert builtins.ks_probe_imports == 1 and fresh_module in sys.modules
    assert probe.VALUE == 42 and builtins.ks_probe_imports == 1
    assert "VALUE" in vars(probe)  # later reads are plain attribute reads
    assert probe.module() is sys.modules[fresh_module]


def test_a_missing_attribute_and_a_missing_module_raise_as_an_import_would(fresh_module):
    with pytest.raises(AttributeError):
        deferred_module(fresh_module).NOT_THERE
    with pytest.raises(ModuleNotFoundError):
        deferred_module("ks_no_such_module_anywhere").anything


def test_it_is_read_only_and_pickles_as_its_name(fresh_module):
    probe = deferred_module(fresh_module)
    with pytest.raises(AttributeError, match="read-only"):
        probe.VALUE = 1
    copy = pickle.loads(pickle.dumps(probe))
    assert isinstance(copy, DeferredModule) and copy.VALUE == 42


def test_importing_the_operators_does_not_import_pandas_or_pyarrow():
    """What transformWithState's pre-init process imports when it unpickles a processor (a new
    interpreter at every query start: pyarrow with pyarrow.compute cost it 0.1 to 0.2 s)."""
    code = textwrap.dedent("""
        import sys
        import keyshift.processing.operators.processor, keyshift.processing.operators.key_window_processor
        print("pandas" in sys.modules, "pyarrow" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False False"
