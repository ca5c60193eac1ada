"""One catalog per folder.

A runner keeps what its streams leave behind in its catalog's folder, by stream name: their
Spark checkpoints and control files (`checkpoints/`), their logs and their row state. Two
catalog files in one folder would share all of it: a stream's first start in one would
remove the checkpoint of the other's stream of the same name, and the two would resume each
other's. So a catalog's first runner claims its folder (`.cdcflow-catalog.json`: the
catalog's id and file), made whole or not at all, and a runner of another catalog there is
refused before it touches anything, its message naming both files. A catalog moved or renamed
within its folder keeps the claim (its id is in its file); a copy beside the original shares
its id, and is refused as long as the original is there. The claim of a catalog whose file is
gone is taken over: its streams can start no more.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from cdcflow.errors import FailedPrecondition, Unavailable
from cdcflow.streams.catalog import Catalog
from cdcflow.table.writers import create_once

HOME_FILE = ".cdcflow-catalog.json"
"""In a catalog's folder: {"catalog": its id, "file": its path} of the catalog that keeps
its streams' checkpoints, logs and state there."""


def claim_home(home: Path, catalog: Catalog) -> None:
    """Claim `home` for `catalog`, or raise FailedPrecondition if another catalog (or a copy
    of this one) keeps its streams there (Unavailable: another runner is taking the claim
    over at this moment; try again)."""
    marker = home / HOME_FILE
    mine = {"catalog": catalog.identity, "file": str(Path(catalog.path).resolve())}
    home.mkdir(parents=True, exist_ok=True)
    held = _held(marker)
    if held is None:
        if create_once(marker, json.dumps(mine).encode()):
            return
        held = _held(marker)  # another runner made it at once
        if held is None:
            raise Unavailable(f"the claim '{marker}' was made and removed at once; try again")
    if held == mine:
        return
    if _still_there(held["file"], mine["file"]):
        raise FailedPrecondition(_refusal(marker, home, held, mine))
    _take_over(marker, held, mine)  # the earlier catalog's file is gone, or is this file


def _take_over(marker: Path, held: dict[str, str], mine: dict[str, str]) -> None:
    """Put `mine` in place of the claim `held`, compare-and-swap: the claim is moved aside
    (of runners taking it over at once, one moves it), and a claim the move found that is
    not `held` is put back and refused."""
    moved = marker.with_name(f"{HOME_FILE}.{secrets.token_hex(8)}.old")
    try:
        os.rename(marker, moved)
    except FileNotFoundError:
        raise Unavailable(f"the claim '{marker}' is being taken over by another runner; "
                          "try again") from None
    try:
        found = _held(moved)
        if found != held:
            create_once(marker, moved.read_bytes())
            raise Unavailable(f"the claim '{marker}' changed as this runner took it over; "
                              "try again")
        if not create_once(marker, json.dumps(mine).encode()):
            raise FailedPrecondition(_refusal(marker, marker.parent, _held(marker) or {}, mine))
    finally:
        moved.unlink(missing_ok=True)


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


def _still_there(held_file: str, my_file: str) -> bool:
    """Whether the catalog file the claim names is there and is not `my_file`."""
    try:
        return not os.path.samefile(held_file, my_file)
    except FileNotFoundError:
        return False


def _refusal(marker: Path, home: Path, held: dict[str, str], mine: dict[str, str]) -> str:
    copy = " (a copy of it: the two share one id)" if held.get("catalog") == mine["catalog"] \
        else ""
    return (f"the folder '{home}' keeps the checkpoints, logs and state of the streams of the "
            f"catalog '{held.get('file')}'{copy}, so the catalog '{mine['file']}' cannot keep "
            "its streams there too: the two would share them by stream name, and a stream's "
            "first start in one would remove the other's checkpoint; give this catalog a "
            f"folder of its own (or, if '{held.get('file')}' is not used any more, remove "
            f"'{marker}')")
