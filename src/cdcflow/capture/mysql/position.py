"""MariaDB GTID state: the last GTID per replication domain, as `d-s-n[,d-s-n...]`. Pure."""

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
