"""Delta Lake deletion vectors: which rows of a data file are deleted, without rewriting it.

The format is the Delta protocol's ("Deletion Vector Format"): a 64-bit roaring bitmap of row
positions, after the magic number 1681511377, stored in a file `deletion_vector_<uuid>.bin`
that starts with a version byte, then per vector its size (4 bytes, big-endian), the bitmap
and a CRC-32 of the bitmap. Descriptors use storage type 'u': an optional folder prefix and
the file's UUID in Z85, so the table can move. pyroaring serialises the bitmap.
"""

from __future__ import annotations

import os
import struct
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pyroaring import BitMap64

from cdcflow.errors import DataLoss

MAGIC = 1681511377
FOLDER = "dv"  # the descriptors' prefix: vectors live under <root>/dv/
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUES = {c: i for i, c in enumerate(_Z85)}


def z85_encode(data: bytes) -> str:
    if len(data) % 4:
        raise ValueError(f"Z85 encodes whole 4-byte words; got {len(data)} bytes")
    out = []
    for (word,) in struct.iter_unpack(">I", data):
        chars = []
        for _ in range(5):
            word, digit = divmod(word, 85)
            chars.append(_Z85[digit])
        out.append("".join(reversed(chars)))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    if len(text) % 5:
        raise ValueError(f"Z85 text comes in 5-character groups; got {len(text)} characters")
    words = []
    for start in range(0, len(text), 5):
        word = 0
        for char in text[start:start + 5]:
            word = word * 85 + _Z85_VALUES[char]
        words.append(struct.pack(">I", word))
    return b"".join(words)


@dataclass(frozen=True, slots=True)
class DeletionVector:
    """A descriptor as the Delta log holds it (storage type 'u')."""

    path_or_inline: str
    offset: int
    size: int
    cardinality: int

    def to_json(self) -> dict[str, Any]:
        return {"storageType": "u", "pathOrInlineDv": self.path_or_inline,
                "offset": self.offset, "sizeInBytes": self.size,
                "cardinality": self.cardinality}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeletionVector:
        if data.get("storageType") != "u":
            raise DataLoss(f"deletion vector storage type {data.get('storageType')!r} is "
                           "not the 'u' cdcflow writes")
        return cls(data["pathOrInlineDv"], data["offset"], data["sizeInBytes"],
                   data["cardinality"])

    def file(self, root: Path) -> Path:
        prefix, encoded = self.path_or_inline[:-20], self.path_or_inline[-20:]
        name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
        return root / prefix / name if prefix else root / name


def write_vector(root: Path, positions: BitMap64) -> DeletionVector:
    """Write `positions` as a new deletion vector file under `root`/dv; return its descriptor."""
    bitmap = struct.pack("<I", MAGIC) + positions.serialize()
    identity = uuid.uuid4()
    descriptor = DeletionVector(FOLDER + z85_encode(identity.bytes), 1, len(bitmap),
                                len(positions))
    path = descriptor.file(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = b"\x01" + struct.pack(">I", len(bitmap)) + bitmap + struct.pack(
        ">I", zlib.crc32(bitmap))
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_bytes(body)
    os.replace(temporary, path)
    return descriptor


def read_vector(root: Path, descriptor: DeletionVector) -> BitMap64:
    """The deleted row positions; a vector whose checksum or size is wrong is DataLoss."""
    path = descriptor.file(root)
    with open(path, "rb") as handle:
        handle.seek(descriptor.offset)
        head = handle.read(4)
        bitmap = handle.read(descriptor.size)
        checksum = handle.read(4)
    if len(head) < 4 or struct.unpack(">I", head)[0] != descriptor.size \
            or len(checksum) < 4 or struct.unpack(">I", checksum)[0] != zlib.crc32(bitmap):
        raise DataLoss(f"deletion vector {path} is damaged: size or checksum does not match")
    if struct.unpack("<I", bitmap[:4])[0] != MAGIC:
        raise DataLoss(f"deletion vector {path} lacks the roaring bitmap magic number")
    positions = BitMap64.deserialize(bitmap[4:])
    if len(positions) != descriptor.cardinality:
        raise DataLoss(f"deletion vector {path} holds {len(positions)} positions; its "
                       f"descriptor says {descriptor.cardinality}")
    return positions


def kept_mask(rows: int, deleted: BitMap64) -> np.ndarray:
    """A boolean mask over `rows` rows, False where `deleted` holds the position."""
    mask = np.ones(rows, dtype=bool)
    if len(deleted):
        mask[np.frombuffer(deleted.to_array(), dtype=np.uint64).astype(np.int64)] = False
    return mask
