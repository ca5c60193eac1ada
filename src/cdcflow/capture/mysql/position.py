"""GTID positions, pure: MariaDB's GTID state (the last GTID per replication domain,
`d-s-n[,d-s-n...]`) and MySQL's GTID set (`uuid:1-5:7,...`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from cdcflow.errors import InvalidArgument

_GTID = re.compile(r"(\d+)-(\d+)-(\d+)")


@dataclass(frozen=True, slots=True)
class GtidState:
    """domain -> (server_id, sequence number) of the newest GTID seen in that domain."""

    domains: tuple[tuple[int, int, int], ...] = ()

    @classmethod
    def parse(cls, text: str) -> GtidState:
        state: dict[int, tuple[int, int]] = {}
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            found = _GTID.fullmatch(part)
            if found is None:
                raise InvalidArgument(f"GTID {part!r} is not domain-server-sequence")
            domain, server, sequence = (int(g) for g in found.groups())
            state[domain] = (server, sequence)
        return cls(tuple(sorted((d, s, n) for d, (s, n) in state.items())))

    def advanced(self, gtid: str) -> GtidState:
        """The state after the group `gtid` (it replaces its domain's entry)."""
        (domain, server, sequence), = GtidState.parse(gtid).domains
        rest = tuple(entry for entry in self.domains if entry[0] != domain)
        return GtidState(tuple(sorted((*rest, (domain, server, sequence)))))

    def text(self) -> str:
        return ",".join(f"{d}-{s}-{n}" for d, s, n in self.domains)


_UUID_SET = re.compile(r"([0-9a-fA-F-]{36})((?::\d+(?:-\d+)?)+)")


@dataclass(frozen=True, slots=True)
class MySqlGtidSet:
    """A MySQL GTID set, `uuid:1-5:7,uuid:1-3`: server uuid -> merged closed intervals."""

    servers: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = ()

    @classmethod
    def parse(cls, text: str) -> MySqlGtidSet:
        found: dict[str, list[tuple[int, int]]] = {}
        for part in (p.strip() for p in text.replace("\n", "").split(",")):
            if not part:
                continue
            matched = _UUID_SET.fullmatch(part)
            if matched is None:
                raise InvalidArgument(f"GTID set part {part!r} is not uuid:N[-M][:N[-M]...]")
            for interval in matched.group(2).split(":")[1:]:
                low, _, high = interval.partition("-")
                found.setdefault(matched.group(1).lower(), []).append(
                    (int(low), int(high or low)))
        return cls(tuple(sorted((uuid, _merged(spans)) for uuid, spans in found.items())))

    def added(self, gtid: str) -> MySqlGtidSet:
        """The set with one more transaction, `uuid:n`."""
        return MySqlGtidSet.parse(f"{self.text()},{gtid}")

    def contains(self, other: MySqlGtidSet) -> bool:
        mine = dict(self.servers)
        return all(any(lo <= low and high <= hi for lo, hi in mine.get(uuid, ()))
                   for uuid, spans in other.servers for low, high in spans)

    def text(self) -> str:
        return ",".join(uuid + "".join(f":{lo}" if lo == hi else f":{lo}-{hi}"
                                       for lo, hi in spans) for uuid, spans in self.servers)


def _merged(spans: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    merged: list[tuple[int, int]] = []
    for low, high in sorted(spans):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(high, merged[-1][1]))
        else:
            merged.append((low, high))
    return tuple(merged)


def after_group(state: GtidState | MySqlGtidSet, gtid: str) -> GtidState | MySqlGtidSet:
    """The GTID position after the group `gtid`; MySQL's anonymous groups (GTIDs off, or
    sequence 0) leave a GTID set as it is."""
    if isinstance(state, GtidState):
        return state.advanced(gtid)
    if not gtid or gtid.upper().startswith("ANONYMOUS") or gtid.endswith(":0"):
        return state
    return state.added(gtid)
