"""Faults: the disk refuses an operation. Each gives a typed error, the last committed state stays
readable and nothing half-written appears under a final name.

* ENOSPC / EIO / EACCES / EROFS at every step of every commit path: injected through ``_fsio``'s
  recorder (it raises ``OSError`` just before the operation).
* EACCES for real: the tests run as root, which ignores permission bits, so the child process
  runs with EVERY capability dropped (``setpriv --bounding-set=-all``): as the files' owner it then
  meets the mode bits like any user.
* a read-only store for real: a read-only bind mount (root); without root the recorder's EROFS
  scenarios above stand in.
* a lock held by a process that was SIGKILLed, and by one that hangs (SIGSTOP).

The real-world ones live in tests/torture/faults.py (``run_real``) so that
``python -m tests.torture`` counts them too.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from fsdurable import StorageError, Store
from tests.torture import faults

from .conftest import skip_or_fail


@pytest.mark.parametrize("sc", faults.scenarios(), ids=lambda sc: sc.name)
def test_injected_fault(sc: faults.Scenario, root: Path) -> None:
    assert faults.run_scenario(sc, str(root)) == []


def test_an_event_log_that_cannot_be_written_never_fails_a_commit(root: Path) -> None:
    import errno

    st = Store(root)
    st.create("a")
    with faults.failing("append", errno.ENOSPC, where="events") as fired:
        s = st.begin_turn("a", "hi")  # its turn_started event hits ENOSPC
    assert fired and s.in_progress
    assert Store(root).load("a").in_progress


@pytest.mark.parametrize("name", faults.REAL)
def test_real_fault(name: str, tmp_path: Path) -> None:
    violations = faults.run_real(name, str(tmp_path))
    if violations is None:
        skip_or_fail(f"{name}: this machine cannot stage it (needs root with setpriv/mount); "
                    "the recorder's EACCES/EROFS scenarios stand in")
    assert violations == []


def test_storage_error_is_typed_and_carries_errno(root: Path) -> None:
    import errno

    st = Store(root)
    st.create("a")
    with faults.failing("fsync", errno.EIO, where="sessions"), pytest.raises(OSError) as e:
        st.patch("a", lambda s: attrs.evolve(s, metadata={"k": 1}))
    assert isinstance(e.value, StorageError) and e.value.errno == errno.EIO
    assert e.value.path and e.value.path.endswith("a.json")
    assert Store(root).load("a").version == 1
