"""Partitions for a whole send at once, as the Kafka producers' default partitioner picks them.

A keyed record goes to `murmur2(key) & 0x7fffffff` modulo the topic's partition count (the Java
client's `Utils.murmur2`, which aiokafka, librdkafka's `murmur2_random` and the others match), so
a key keeps its partition whichever client wrote it. A record without a key goes to a random
available partition (any partition when none is available).

Speed-up seam `kafka_partitioner`: `partitions_for` is `fast_partitions_for`, which hashes the
keys of one send that have the same length (message ids are 36-character UUIDs) together as
numpy uint32 columns, because aiokafka's `DefaultPartitioner` hashes one key at a time in pure
Python; `plain_partitions_for` is that `DefaultPartitioner`, used when the seam is off or numpy
is not installed. Measured by `bench/speedups.py kafka_partitioner`; the two are held equal by
`tests/unit/test_kafka_partitioner.py`.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Sequence

from aiokafka.partitioner import DefaultPartitioner

from bridge.speedups import enabled

try:
    import numpy as np
except ModuleNotFoundError:  # numpy is optional: without it the plain partitioner is used
    np = None  # type: ignore[assignment]

__all__ = [
    "fast_partitions_for",
    "murmur2",
    "murmur2_same_length",
    "partitions_for",
    "plain_partitions_for",
]

#: (record keys, the topic's partitions sorted, the available ones) -> each record's partition
Partitioner = Callable[[Sequence[bytes | None], Sequence[int], Sequence[int]], list[int]]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF
#: Below this many keys of one length, the pure-Python loop is cheaper than numpy's overheads.
_VECTOR_FROM = 8


def plain_partitions_for(
    keys: Sequence[bytes | None], every: Sequence[int], available: Sequence[int]
) -> list[int]:
    """The partition of each record of one send, from aiokafka's own partitioner."""
    partitioner = DefaultPartitioner()
    return [partitioner(key, list(every), list(available)) for key in keys]


def murmur2(data: bytes) -> int:
    """The 32-bit murmur2 hash of `data` as Kafka computes it (unsigned)."""
    length = len(data)
    h = _SEED ^ length
    for k in struct.unpack_from(f"<{length >> 2}I", data):
        k = (k * _M) & _MASK
        k ^= k >> 24
        h = ((h * _M) & _MASK) ^ ((k * _M) & _MASK)
    rest = length & 3
    if rest:
        tail = length & ~3
        if rest == 3:
            h ^= data[tail + 2] << 16
        if rest >= 2:
            h ^= data[tail + 1] << 8
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    return h ^ (h >> 15)


def murmur2_same_length(keys: Sequence[bytes]) -> list[int]:
    """`murmur2` of each key, all of one length, computed column by column."""
    count, length = len(keys), len(keys[0])
    data = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(count, length)
    whole = length & ~3
    words = np.ascontiguousarray(data[:, :whole]).view("<u4")
    m32 = np.uint32(_M)
    h = np.full(count, (_SEED ^ length) & _MASK, dtype=np.uint32)
    for column in range(whole >> 2):
        k = words[:, column] * m32
        k ^= k >> 24
        k *= m32
        h *= m32
        h ^= k
    rest = length & 3
    if rest:
        if rest == 3:
            h ^= data[:, whole + 2].astype(np.uint32) << 16
        if rest >= 2:
            h ^= data[:, whole + 1].astype(np.uint32) << 8
        h ^= data[:, whole]
        h *= m32
    h ^= h >> 13
    h *= m32
    h ^= h >> 15
    return [int(value) for value in h.tolist()]


def fast_partitions_for(
    keys: Sequence[bytes | None], every: Sequence[int], available: Sequence[int]
) -> list[int]:
    """`plain_partitions_for`, hashing keys of one length together (needs numpy)."""
    chosen: list[int] = [0] * len(keys)
    by_length: dict[int, list[int]] = {}
    for index, key in enumerate(keys):
        if key is None:
            chosen[index] = random.choice(available or every)  # noqa: S311 - spreading, not secrecy
        else:
            by_length.setdefault(len(key), []).append(index)
    count = len(every)
    for indexes in by_length.values():
        group = [keys[i] or b"" for i in indexes]
        if len(group) >= _VECTOR_FROM:
            hashes = murmur2_same_length(group)
        else:
            hashes = [murmur2(key) for key in group]
        for index, value in zip(indexes, hashes, strict=True):
            chosen[index] = every[(value & 0x7FFFFFFF) % count]
    return chosen


partitions_for: Partitioner = (
    fast_partitions_for if np is not None and enabled("kafka_partitioner") else plain_partitions_for
)
