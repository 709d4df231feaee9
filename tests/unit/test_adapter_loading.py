"""How `--engine module:object` is found, and which processes a run starts for it."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from chaos.contract import ContractError, import_adapter, process_counts


def test_an_adapter_in_the_current_folder_is_found_as_python_m_would_find_it(tmp_path,
                                                                              monkeypatch):
    # the `ninelives` script, unlike `python -m`, does not put the current folder on the path
    (tmp_path / "myadapter_here.py").write_text("ENGINE = object()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "myadapter_here", raising=False)
    given, engine = import_adapter("myadapter_here:ENGINE")
    assert given == "myadapter_here:ENGINE" and engine is sys.modules["myadapter_here"].ENGINE
    assert sys.path[-1] == str(tmp_path)  # last: it shadows no installed module


def test_a_module_that_is_nowhere_is_still_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ContractError, match="no_such_adapter_module"):
        import_adapter("no_such_adapter_module:ENGINE")


def test_a_run_starts_senders_only_for_an_engine_with_an_outbox():
    run = SimpleNamespace(workers=3, senders=2)
    with_outbox = SimpleNamespace(capabilities=frozenset({"outbox", "fencing"}))
    without = SimpleNamespace(capabilities=frozenset({"fencing"}))
    assert process_counts(run, with_outbox) == {"worker": 3, "sender": 2}
    assert process_counts(run, without) == {"worker": 3, "sender": 0}
