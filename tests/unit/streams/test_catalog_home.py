"""One catalog per folder (`cdcflow.streams.home`): a runner keeps its streams' checkpoints,
logs and state in its catalog's folder by stream name, so a runner of a second catalog in
that folder is refused before it touches anything; a catalog moved or renamed in its folder
keeps it, a copy beside the original is refused, and a gone catalog's claim is taken over."""

from __future__ import annotations

import json
import multiprocessing
import shutil
from pathlib import Path
from typing import Any

import pytest

from cdcflow.errors import FailedPrecondition
from cdcflow.streams.catalog import Catalog
from cdcflow.streams.home import HOME_FILE, LOCK_FILE, claim_home, refuse_unmade
from cdcflow.streams.runner import Runner

pytestmark = pytest.mark.unit


def _claim(path: Path) -> None:
    claim_home(path.resolve().parent, Catalog(path))


def _held(folder: Path) -> dict[str, str]:
    held: dict[str, str] = json.loads((folder / HOME_FILE).read_bytes())
    return held


def test_a_second_catalogs_runner_in_one_folder_is_refused_naming_both(tmp_path: Path):
    first, second = tmp_path / "a.db", tmp_path / "b.db"
    Runner(first, spark=None)
    checkpoint = tmp_path / "checkpoints" / "lake"
    checkpoint.mkdir(parents=True)
    with pytest.raises(FailedPrecondition, match="a folder of its own") as refused:
        Runner(second, spark=None)
    assert str(first.resolve()) in str(refused.value)
    assert str(second.resolve()) in str(refused.value)
    assert not second.exists(), "the refused catalog was made"
    assert checkpoint.is_dir() and _held(tmp_path)["file"] == str(first.resolve())
    Runner(first, spark=None)  # its own catalog's runner goes on
    Runner(tmp_path / "elsewhere" / "b.db", spark=None)  # another folder: its own


def test_a_catalog_renamed_in_its_folder_keeps_it_and_a_copy_beside_it_is_refused(
        tmp_path: Path):
    path = tmp_path / "a.db"
    _claim(path)
    renamed = tmp_path / "renamed.db"
    path.rename(renamed)
    _claim(renamed)
    assert _held(tmp_path)["file"] == str(renamed.resolve())
    copy = tmp_path / "copy.db"
    shutil.copyfile(renamed, copy)
    with pytest.raises(FailedPrecondition, match="a copy of it"):
        _claim(copy)
    _claim(renamed)


def test_the_claim_of_a_catalog_whose_file_is_gone_is_taken_over(tmp_path: Path):
    gone = tmp_path / "old.db"
    _claim(gone)
    gone.unlink()
    new = tmp_path / "new.db"
    _claim(new)
    assert _held(tmp_path) == {"catalog": Catalog(new).identity, "file": str(new.resolve())}
    with pytest.raises(FailedPrecondition):
        _claim(gone)  # made again, it is another catalog (another id) now


def test_a_project_folder_copied_whole_is_claimed_by_its_copy(tmp_path: Path):
    """The copy's claim names the original's file, in another folder: taken over."""
    original = tmp_path / "project"
    _claim(original / "catalog.db")
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    _claim(copy / "catalog.db")
    assert _held(copy)["file"] == str((copy / "catalog.db").resolve())
    _claim(original / "catalog.db")  # the original keeps its own
    with pytest.raises(FailedPrecondition):
        _claim(copy / "other.db")


def test_a_catalog_not_made_yet_is_refused_in_another_catalogs_folder_and_not_made(
        tmp_path: Path):
    """`cdcflow run --catalog typo.db` beside a claimed catalog: refused before the file is
    made; a gone catalog's folder, or a copied project's, is free."""
    first, typo = tmp_path / "a.db", tmp_path / "typo.db"
    _claim(first)
    with pytest.raises(FailedPrecondition, match="a folder of its own") as refused:
        refuse_unmade(typo)
    assert str(first.resolve()) in str(refused.value) and str(typo.resolve()) in str(
        refused.value)
    assert not typo.exists()
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path, copy)  # its claim names a.db here; copy/a.db is its catalog
    with pytest.raises(FailedPrecondition, match="a folder of its own"):
        refuse_unmade(copy / "typo.db")
    (copy / "a.db").unlink()
    refuse_unmade(copy / "typo.db")  # the claimed catalog is gone: free
    refuse_unmade(tmp_path / "elsewhere" / "b.db")  # no claim there
    (tmp_path / HOME_FILE).write_text("{not json")
    with pytest.raises(FailedPrecondition, match=HOME_FILE):
        refuse_unmade(typo)


def test_a_damaged_claim_is_refused_naming_it(tmp_path: Path):
    (tmp_path / HOME_FILE).write_text("{not json")
    with pytest.raises(FailedPrecondition, match=HOME_FILE) as refused:
        _claim(tmp_path / "a.db")
    assert "remove it" in str(refused.value)
    assert (tmp_path / HOME_FILE).read_text() == "{not json"


def _claim_in_a_process(path: str, ready: Any, outcomes: Any) -> None:
    catalog = Catalog(path)
    ready.wait(60)  # every process here and past its imports: they claim at once
    try:
        claim_home(Path(path).resolve().parent, catalog)
        outcomes.put("claimed")
    except FailedPrecondition:
        outcomes.put("refused")


@pytest.mark.parametrize("claimed_by_a_gone_catalog", [False, True])
def test_of_six_catalogs_claiming_one_folder_at_once_one_wins(tmp_path: Path,
                                                               claimed_by_a_gone_catalog: bool):
    """Made at once, or taken over at once from a catalog whose file is gone."""
    if claimed_by_a_gone_catalog:
        _claim(tmp_path / "gone.db")
        (tmp_path / "gone.db").unlink()
    paths = [tmp_path / f"c{n}.db" for n in range(6)]
    for path in paths:
        Catalog(path)  # made beforehand: each claim then races only the others
    context = multiprocessing.get_context("spawn")
    outcomes, ready = context.Queue(), context.Barrier(len(paths))
    claimers = [context.Process(target=_claim_in_a_process, args=(str(p), ready, outcomes))
                for p in paths]
    for claimer in claimers:
        claimer.start()
    results = [outcomes.get(timeout=120) for _ in claimers]
    for claimer in claimers:
        claimer.join(60)
    assert sorted(results) == ["claimed"] + ["refused"] * 5
    winner = _held(tmp_path)["file"]
    assert winner in {str(p.resolve()) for p in paths}
    assert list(tmp_path.glob(f"*{HOME_FILE}.*")) == []  # nothing left aside
    for path in paths:  # every other catalog is refused afterwards; the winner is not
        if str(path.resolve()) != winner:
            with pytest.raises(FailedPrecondition):
                _claim(path)
    _claim(Path(winner))


def test_a_copied_folder_is_kept_for_the_copy_of_the_catalog_that_claimed_it(tmp_path: Path):
    """Another catalog in the copy is refused while the copied catalog is there: the copied
    checkpoints and state are that catalog's."""
    original = tmp_path / "project"
    _claim(original / "catalog.db")
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    with pytest.raises(FailedPrecondition, match="a folder of its own"):
        _claim(copy / "other.db")
    _claim(copy / "catalog.db")


def test_a_folder_that_cannot_be_claimed_is_a_typed_error(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    (home / LOCK_FILE).mkdir()  # the lock cannot be opened as a file
    with pytest.raises(FailedPrecondition, match="must be writable"):
        _claim(home / "catalog.db")
