"""PyTorch's CUDA caching allocator, replayed in Python: which blocks a sequence of requests
gets, and the figures `torch.cuda.max_memory_allocated` / `max_memory_reserved` report.

Every rule is read from c10/cuda/CUDACachingAllocator.cpp (pytorch/pytorch, the stored revision
001074d25084fdb87a799823e395a50f5ec044d3; the code these rules come from has been the same
since the 2.x releases; the device runs torch 2.11.0+cu130), default settings (no
PYTORCH_CUDA_ALLOC_CONF: max_split_size unlimited, no roundup_power2_divisions, no expandable
segments, one stream):

- `round_size`: requests under kMinBlockSize (512) take 512 bytes, others round up to a
  multiple of 512 (`round_size`; roundup_power2_divisions is 0 by default).
- `get_pool`: a rounded size <= kSmallSize (1 MiB) is served by the small pool, larger by the
  large pool.
- `get_free_block`: the pool is a std::set ordered by (stream, size, address)
  (`BlockComparatorSize`); `lower_bound` takes the smallest cached block >= the size, the
  lowest address among equals. The oversize checks never fire (max_split_size = SIZE_MAX).
- `get_allocation_size`: with no cached block, cudaMalloc a segment of kSmallBuffer (2 MiB)
  for small sizes, kLargeBuffer (20 MiB) for sizes < kMinLargeAlloc (10 MiB), else the size
  rounded up to kRoundLarge (2 MiB) (`alloc_block`, which adds the segment to reserved_bytes).
- `should_split`: a block from the small pool is split when >= 512 bytes would remain; one
  from the large pool only when more than kSmallSize (1 MiB) would remain. Unsplit, the whole
  block is handed out and counted: `alloc_found_block` adds block->size (not the request) to
  allocated_bytes, so a large request that lands in a cached block up to 1 MiB larger counts
  that block's size.
- `free` / `free_block`: allocated_bytes drops by the block's size; the block merges with a
  free neighbour in its segment (`try_merge_blocks`) and returns to its pool.
- `emptyCache` -> `release_cached_blocks` -> `release_blocks`: every cached block that is a
  whole segment (no prev/next) is cudaFree'd; partly used segments stay.
- `increase_stat` / `resetPeakStats`: the peak is the highest `current`; a reset sets it to
  `current`.

Segment addresses: cudaMalloc's are not knowable offline. New segments take increasing
addresses (what the device showed within one model's run); they only break ties between equal
free blocks.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

K_MIN_BLOCK = 512            # kMinBlockSize
K_SMALL_SIZE = 1 << 20       # kSmallSize: largest "small" allocation
K_SMALL_BUFFER = 2 << 20     # kSmallBuffer: small segments
K_MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
K_LARGE_BUFFER = 20 << 20    # kLargeBuffer: segments for 1-10 MiB requests
K_ROUND_LARGE = 2 << 20      # kRoundLarge


def round_size(size: int) -> int:
    """`round_size`: the block size a request of `size` bytes takes."""
    if size < K_MIN_BLOCK:
        return K_MIN_BLOCK
    return K_MIN_BLOCK * ((size + K_MIN_BLOCK - 1) // K_MIN_BLOCK)


def allocation_size(size: int) -> int:
    """`get_allocation_size`: the segment cudaMalloc'd for a rounded size with no free block."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


@dataclass(eq=False)
class Block:
    addr: int
    size: int
    small: bool
    allocated: bool = False
    requested: int = 0
    prev: "Block | None" = None
    next: "Block | None" = None

    @property
    def key(self) -> tuple[int, int]:
        return (self.size, self.addr)


@dataclass
class Stat:
    current: int = 0
    peak: int = 0

    def add(self, n: int) -> None:
        self.current += n
        self.peak = max(self.peak, self.current)

    def reset_peak(self) -> None:
        self.peak = self.current


class _Pool:
    """Free blocks ordered by (size, address), as `BlockComparatorSize` orders one stream's."""

    def __init__(self):
        self.keys: list[tuple[int, int]] = []
        self.blocks: dict[tuple[int, int], Block] = {}

    def add(self, b: Block) -> None:
        bisect.insort(self.keys, b.key)
        self.blocks[b.key] = b

    def remove(self, b: Block) -> None:
        self.keys.pop(bisect.bisect_left(self.keys, b.key))
        del self.blocks[b.key]

    def take_fit(self, size: int) -> "Block | None":
        """`lower_bound`: the smallest block of at least `size` bytes, lowest address first."""
        i = bisect.bisect_left(self.keys, (size, -1))
        if i == len(self.keys):
            return None
        return self.blocks.pop(self.keys.pop(i))

    def __iter__(self):
        return iter(list(self.blocks.values()))


@dataclass
class CachingAllocator:
    """One device's allocator on one stream. `malloc(n)` returns a Block, `free(block)` gives it
    back; `allocated` / `reserved` are the stats behind memory_allocated / memory_reserved."""

    allocated: Stat = field(default_factory=Stat)
    reserved: Stat = field(default_factory=Stat)
    next_addr: int = 1 << 40
    _pools: dict = field(default_factory=lambda: {True: _Pool(), False: _Pool()})
    segments: list = field(default_factory=list)

    # -- setup -------------------------------------------------------------------------------
    def add_segment(self, blocks: list[tuple[int, bool]], small: bool, addr: int | None = None
                    ) -> list[Block]:
        """A segment already there (a process's state): `blocks` as (size, allocated), in
        address order. Returns its blocks."""
        base = self._new_address(sum(s for s, _ in blocks)) if addr is None else addr
        out, prev, a = [], None, base
        for size, used in blocks:
            b = Block(a, size, small, used, size if used else 0, prev)
            if prev is not None:
                prev.next = b
            out.append(b)
            prev, a = b, a + size
            if used:
                self.allocated.add(size)
            else:
                self._pools[small].add(b)
        self.reserved.add(a - base)
        self.segments.append(out[0])
        return out

    def _new_address(self, size: int) -> int:
        addr = self.next_addr
        self.next_addr += size + K_ROUND_LARGE
        return addr

    # -- malloc / free -----------------------------------------------------------------------
    def malloc(self, orig_size: int) -> Block:
        size = round_size(orig_size)
        small = size <= K_SMALL_SIZE
        pool = self._pools[small]
        block = pool.take_fit(size)
        if block is None:
            seg = allocation_size(size)
            block = Block(self._new_address(seg), seg, small)
            self.reserved.add(seg)
            self.segments.append(block)
        remaining = block.size - size
        split = remaining >= K_MIN_BLOCK if small else remaining > K_SMALL_SIZE
        if split:
            rest = Block(block.addr + size, remaining, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            pool.add(rest)
        block.allocated = True
        block.requested = orig_size
        self.allocated.add(block.size)
        return block

    def free(self, block: Block) -> None:
        if not block.allocated:
            raise ValueError("double free")
        block.allocated = False
        self.allocated.add(-block.size)
        pool = self._pools[block.small]
        for other in (block.prev, block.next):
            if other is None or other.allocated:
                continue
            pool.remove(other)
            if other is block.prev:
                block.addr = other.addr
                block.prev = other.prev
                if block.prev is not None:
                    block.prev.next = block
                if other in self.segments:
                    self.segments[self.segments.index(other)] = block
            else:
                block.next = other.next
                if block.next is not None:
                    block.next.prev = block
            block.size += other.size
        pool.add(block)

    def empty_cache(self) -> None:
        """`release_cached_blocks`: cudaFree every free block that is a whole segment."""
        for small, pool in self._pools.items():
            for b in [b for b in pool if b.prev is None and b.next is None]:
                pool.remove(b)
                self.reserved.add(-b.size)
                self.segments.remove(b)

    def reset_peak(self) -> None:
        self.allocated.reset_peak()
        self.reserved.reset_peak()
