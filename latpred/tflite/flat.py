"""Bounds-checked, fast access to the tables of a flatbuffer.

Python's flatbuffers runtime has no verifier: a corrupted file can point a vector at garbage with a
length of four billion, or make thousands of tables share one huge vector, and the generated
accessors would then iterate, allocate or read from the wrong end of the buffer (``struct`` accepts
negative offsets). Every access here checks its offsets against the buffer, and vector and string
reads draw from a budget proportional to the file size, so a hostile file costs at most a few
passes over its bytes. The generated accessors are also slow (several microseconds a field); this
reader is a few hundred nanoseconds a field, which is what lets a 200-op model read in a few ms.

Field slots are the field's index in the table of the TFLite schema (``schema.fbs``); the reader
tests check them against the generated object API on real models.
"""

from __future__ import annotations

import functools
import struct

import numpy as np

from latpred.errors import ModelFormatError

_U8 = struct.Struct("<B")
_I8 = struct.Struct("<b")
_I16 = struct.Struct("<h")
_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")

SCALARS = {"bool": _U8, "u8": _U8, "i8": _I8, "i16": _I16, "u16": _U16, "i32": _I32,
           "u32": _U32, "i64": _I64, "u64": _U64, "f32": _F32, "f64": _F64}


def corrupt(what: str) -> ModelFormatError:
    return ModelFormatError(f"The model file is corrupted or truncated: {what}.")


class FlatReader:
    """Reads tables of one flatbuffer by absolute position, checking every offset.

    `fields(table)` decodes a table's vtable once into the absolute positions of its fields
    (0 for an absent field); the other accessors take that tuple and a field slot.
    """

    __slots__ = ("buf", "size", "budget", "_vtables")

    def __init__(self, buf: bytes, budget: int | None = None) -> None:
        self.buf = buf
        self.size = len(buf)
        # Elements (and string bytes) that vector/string reads may still return. A well-formed
        # file stores each element once, so its total is below the byte size; aliasing garbage
        # runs out of budget instead of out of memory.
        self.budget = 2 * self.size + 1024 if budget is None else budget
        self._vtables: dict[int, tuple[int, ...]] = {}  # vtable position -> field offsets

    # -- raw reads ------------------------------------------------------------------------------
    # Positions handed around are never negative: a table is at 4 or more and every offset added
    # to it is unsigned, so the hot paths below only check the upper bound; a vtable position,
    # which subtracts a signed offset, is checked both ways.
    def _get(self, fmt: struct.Struct, pos: int) -> int:
        if pos < 0 or pos + fmt.size > self.size:
            raise corrupt(f"offset {pos} is outside the {self.size}-byte file")
        return fmt.unpack_from(self.buf, pos)[0]

    def root(self) -> Fields:
        return self.fields(self._get(_U32, 0))

    def fields(self, table: int) -> Fields:
        """Absolute positions of a table's fields by slot (0 when absent)."""
        if table < 4 or table + 4 > self.size:
            raise corrupt(f"a table starts at offset {table}, outside the file")
        vtable = table - _I32.unpack_from(self.buf, table)[0]
        # Writers share one vtable among tables of the same layout: decode each once.
        offs = self._vtables.get(vtable)
        if offs is None:
            offs = self._vtables[vtable] = self._vtable(vtable, table)
        return tuple([table + o if o else 0 for o in offs])

    def _vtable(self, vtable: int, table: int) -> tuple[int, ...]:
        if vtable < 0 or vtable + 4 > self.size:
            raise corrupt(f"the table at offset {table} has no valid field table")
        vlen = _U16.unpack_from(self.buf, vtable)[0]
        n = (vlen - 4) // 2
        if n <= 0:
            return ()
        if vtable + 4 + 2 * n > self.size:
            raise corrupt(f"the field table at offset {vtable} runs past the end of the file")
        return _u16s(n).unpack_from(self.buf, vtable + 4)

    # -- fields ---------------------------------------------------------------------------------
    def scalar(self, f: Fields, slot: int, kind: str, default):
        pos = f[slot] if slot < len(f) else 0
        if not pos:
            return default
        fmt = SCALARS[kind]
        if pos + fmt.size > self.size:
            raise corrupt(f"offset {pos} is outside the {self.size}-byte file")
        return fmt.unpack_from(self.buf, pos)[0]

    def table(self, f: Fields, slot: int) -> Fields | None:
        """The fields of a child table (None when absent)."""
        pos = self.table_pos(f, slot)
        return self.fields(pos) if pos else None

    def table_pos(self, f: Fields, slot: int) -> int:
        """Position of a child table (0 when absent)."""
        pos = f[slot] if slot < len(f) else 0
        if not pos:
            return 0
        if pos + 4 > self.size:
            raise corrupt(f"offset {pos} is outside the {self.size}-byte file")
        return pos + _U32.unpack_from(self.buf, pos)[0]

    def vector(self, f: Fields, slot: int, elem_size: int) -> tuple[int, int]:
        """(start, length) of a vector field; (0, 0) when absent. Checks bounds and budget."""
        pos = f[slot] if slot < len(f) else 0
        if not pos:
            return 0, 0
        buf, size = self.buf, self.size
        if pos + 4 > size:
            raise corrupt(f"offset {pos} is outside the {size}-byte file")
        head = pos + _U32.unpack_from(buf, pos)[0]
        start = head + 4
        if start > size:
            raise corrupt(f"offset {head} is outside the {size}-byte file")
        n = _U32.unpack_from(buf, head)[0]
        if start + n * elem_size > size:
            raise corrupt(f"a vector of {n} elements at offset {head} runs past the end of the file")
        self.budget -= n
        if self.budget < 0:
            raise corrupt("vectors overlap far more than any converter writes them")
        return start, n

    def ints(self, f: Fields, slot: int) -> tuple[int, ...] | None:
        """An int32 vector as a tuple (None when absent)."""
        start, n = self.vector(f, slot, 4)
        if not start:
            return None
        if n < len(_I32S):
            return _I32S[n].unpack_from(self.buf, start)
        return tuple(np.frombuffer(self.buf, dtype="<i4", count=n, offset=start).tolist())

    def array(self, f: Fields, slot: int, dtype: str) -> np.ndarray | None:
        """A vector of numbers as a read-only numpy view (None when absent)."""
        dt = np.dtype(dtype)
        start, n = self.vector(f, slot, dt.itemsize)
        if not start:
            return None
        return np.frombuffer(self.buf, dtype=dt, count=n, offset=start)

    def tables(self, f: Fields, slot: int) -> list[int]:
        """Positions of the tables in a vector-of-tables field."""
        start, n = self.vector(f, slot, 4)
        if not n:
            return []
        offsets = np.frombuffer(self.buf, dtype="<u4", count=n, offset=start).astype(np.int64)
        positions = offsets + (start + 4 * np.arange(n, dtype=np.int64))
        if positions.min() < 4 or positions.max() + 4 > self.size:
            raise corrupt("a table offset points outside the file")
        return positions.tolist()

    def string(self, f: Fields, slot: int) -> str | None:
        start, n = self.vector(f, slot, 1)
        if not start:
            return None
        try:
            return self.buf[start:start + n].decode("utf-8")
        except UnicodeDecodeError:
            raise corrupt("a name is not valid UTF-8") from None


Fields = tuple  # absolute field positions of one table, by slot


@functools.lru_cache(maxsize=128)
def _u16s(n: int) -> struct.Struct:
    return struct.Struct(f"<{n}H")


# Structs unpacking n int32s, for the short vectors (shapes, operands) read most often.
_I32S = tuple(struct.Struct(f"<{n}i") for n in range(65))
