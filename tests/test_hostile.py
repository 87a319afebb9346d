"""The hostile-input corpus (tests/data/hostile/, INDEX.json says what each file is and what must
become of it) dropped into a store: discovery, recovery and doctor never crash; each file is
skipped, quarantined or repaired with an event; nothing else is touched. The 100 MB file and the
symlinks pointing outside the store are made at test time."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.torture import hostile

INDEX = hostile.load_index()
ALL = sorted(INDEX) + list(hostile.GENERATED)


def test_the_corpus_is_big_and_varied() -> None:
    assert len(ALL) >= 30
    assert {m["expect"] for m in INDEX.values()} == {"quarantined", "skipped", "repaired"}
    for rel in INDEX:
        assert (hostile.CORPUS / rel).is_file(), rel


def test_the_committed_corpus_is_what_the_generator_writes() -> None:
    """The files are committed (reviewable, stable); the generator documents how each was made."""
    made = {rel: data for rel, _, _, data in hostile.entries()}
    assert set(made) == set(INDEX)
    for rel, data in made.items():
        assert (hostile.CORPUS / rel).read_bytes() == data, rel


@pytest.mark.timeout(120)  # a FIFO once hung discovery forever: fail, don't hang
@pytest.mark.parametrize("rel", ALL)
def test_one_hostile_file(rel: str, tmp_path: Path) -> None:
    n, violations = hostile.survive(str(tmp_path), only=rel)
    assert n == 1
    assert violations == []


def test_the_whole_corpus_at_once(tmp_path: Path) -> None:
    n, violations = hostile.survive(str(tmp_path))
    assert n == len(ALL)
    assert violations == []
