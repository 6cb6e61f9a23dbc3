"""Partitions chosen for a send are the ones the Kafka producers' default partitioner picks."""

from __future__ import annotations

import random
import uuid

import pytest
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as reference
from hypothesis import given
from hypothesis import strategies as st

from bridge.transports.kafka.partition import murmur2, murmur2_same_length, partitions_for


@given(st.binary(max_size=80))
def test_murmur2_is_kafkas(data: bytes) -> None:
    assert murmur2(data) == reference(data)


@pytest.mark.parametrize("length", range(0, 41))
def test_murmur2_of_many_keys_of_one_length_is_kafkas(length: int) -> None:
    rnd = random.Random(length)
    keys = [rnd.randbytes(length) for _ in range(50)]
    assert murmur2_same_length(keys) == [reference(key) for key in keys]


def test_known_values() -> None:
    # From the Java client's own tests (UtilsTest.testMurmur2), as unsigned ints.
    assert murmur2(b"21") & 0xFFFFFFFF == -973932308 & 0xFFFFFFFF
    assert murmur2(b"foobar") & 0xFFFFFFFF == -790332482 & 0xFFFFFFFF
    assert murmur2(b"a-little-bit-long-string") & 0xFFFFFFFF == -985981536 & 0xFFFFFFFF
    assert murmur2(b"a-little-bit-longer-string") & 0xFFFFFFFF == -1486304829 & 0xFFFFFFFF
    assert murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") & 0xFFFFFFFF == (
        -58897971 & 0xFFFFFFFF
    )
    assert murmur2(b"abc") & 0xFFFFFFFF == 479470107


@pytest.mark.parametrize("partitions", [1, 3, 7, 12])
def test_partitions_match_the_default_partitioner(partitions: int) -> None:
    rnd = random.Random(partitions)
    keys: list[bytes | None] = [
        str(uuid.UUID(int=rnd.getrandbits(128))).encode() for _ in range(100)
    ]
    keys += [rnd.randbytes(rnd.randrange(0, 20)) for _ in range(30)]  # mixed lengths, small groups
    every = list(range(partitions))
    expected = [DefaultPartitioner()(key, every, every) for key in keys]
    assert partitions_for(keys, every, every) == expected


def test_records_without_key_go_to_an_available_partition() -> None:
    chosen = partitions_for([None] * 200, [0, 1, 2, 3], [1, 3])
    assert set(chosen) == {1, 3}
    assert set(partitions_for([None] * 50, [0, 1], [])) <= {0, 1}
