"""One catalog per folder.

A runner keeps what its streams leave behind in its catalog's folder, by stream name: their
Spark checkpoints and control files (`checkpoints/`), their logs and their row state. Two
catalog files in one folder would share all of it: a stream's first start in one would
remove the checkpoint of the other's stream of the same name, and the two would resume each
other's. So a catalog's first runner claims its folder (`.cdcflow-catalog.json`: the
catalog's id and file; runners claim one at a time, under a lock), and a runner of another
catalog there is refused before it starts any stream, its message naming both files. A
catalog moved or renamed within its folder keeps the claim (its id is in its file); a copy
beside the original shares its id, and is refused as long as the original is there. The
claim of a catalog whose file is gone is taken over (its streams can start no more), and so
is a claim that names a file in another folder: it came with a project folder copied or
moved whole.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from cdcflow.errors import FailedPrecondition
from cdcflow.streams.catalog import Catalog
from cdcflow.table.writers import replace_synced

HOME_FILE = ".cdcflow-catalog.json"
"""In a catalog's folder: {"catalog": its id, "file": its path} of the catalog that keeps
its streams' checkpoints, logs and state there."""
LOCK_FILE = ".cdcflow-catalog.lock"
"""Beside it: runners claim the folder one at a time, holding a lock on this file."""


def claim_home(home: Path, catalog: Catalog) -> None:
    """Claim `home` for `catalog`, or raise FailedPrecondition if another catalog (or a copy
    of this one) keeps its streams there. Runners claim one at a time (a lock beside it)."""
    marker = home / HOME_FILE
    mine = {"catalog": catalog.identity, "file": str(Path(catalog.path).resolve())}
    try:
        home.mkdir(parents=True, exist_ok=True)
        with open(home / LOCK_FILE, "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            held = _held(marker)
            if held == mine:
                return
            if held is not None and _still_there(held["file"], mine["file"], home):
                raise FailedPrecondition(_refusal(marker, home, held, mine))
            replace_synced(marker, json.dumps(mine).encode())  # none, a gone one's, or ours
    except OSError as error:
        raise FailedPrecondition(
            f"cannot claim the folder '{home}' for the catalog '{mine['file']}' ({error}): "
            f"a runner writes '{marker}' there, under a lock on '{home / LOCK_FILE}'; the "
            "folder must be writable and its file system must support file locks") from None


def _held(marker: Path) -> dict[str, str] | None:
    try:
        data = marker.read_bytes()
    except FileNotFoundError:
        return None
    try:
        held = json.loads(data)
    except ValueError:  # UnicodeDecodeError too
        held = None
    if not (isinstance(held, dict) and all(isinstance(held.get(k), str)
                                           for k in ("catalog", "file"))):
        raise FailedPrecondition(
            f"the claim '{marker}' is not the JSON object {{catalog, file}} that cdcflow "
            "writes there (damaged or edited by hand): remove it, and the next runner of a "
            "catalog in that folder claims it again")
    return held


def refuse_unmade(catalog_file: Path) -> None:
    """Before a catalog is opened: if its file does not exist yet, raise FailedPrecondition,
    and make nothing, when another catalog keeps its streams in its folder; `claim_home`
    decides under its lock once the file is made."""
    mine = Path(catalog_file).resolve()
    if mine.exists():
        return
    marker = mine.parent / HOME_FILE
    held = _held(marker)
    if held is not None and _claimed_file(held["file"], mine.parent).exists():
        raise FailedPrecondition(_refusal(marker, mine.parent, held,
                                          {"catalog": "", "file": str(mine)}))


def _still_there(held_file: str, my_file: str, home: Path) -> bool:
    """Whether the catalog the claim names is there and is not `my_file`."""
    try:
        return not os.path.samefile(_claimed_file(held_file, home), my_file)
    except FileNotFoundError:
        return False


def _claimed_file(held_file: str, home: Path) -> Path:
    """Where the catalog a claim names is. A claim naming a file in another folder came with
    a copied or moved folder: its catalog here is the file of that name in this folder."""
    try:
        here = os.path.samefile(Path(held_file).parent, home)
    except FileNotFoundError:
        here = False
    return Path(held_file) if here else home / Path(held_file).name


def _refusal(marker: Path, home: Path, held: dict[str, str], mine: dict[str, str]) -> str:
    copy = " (a copy of it: the two share one id)" if held.get("catalog") == mine["catalog"] \
        else ""
    return (f"the folder '{home}' keeps the checkpoints, logs and state of the streams of the "
            f"catalog '{held.get('file')}'{copy}, so the catalog '{mine['file']}' cannot keep "
            "its streams there too: the two would share them by stream name, and a stream's "
            "first start in one would remove the other's checkpoint; give this catalog a "
            f"folder of its own (or, if '{held.get('file')}' is not used any more, remove "
            f"'{marker}')")
