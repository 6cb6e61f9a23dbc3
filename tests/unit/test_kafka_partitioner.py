"""Partitions chosen for a send are the ones the Kafka producers' default partitioner picks.

The `kafka_partitioner` seam: `fast_partitions_for` (numpy) and `plain_partitions_for`
(aiokafka's `DefaultPartitioner`) choose the same partitions, and both hash as the Java client.
"""

from __future__ import annotations

import random
import subprocess
import sys
import uuid
from collections.abc import Callable

import pytest
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as reference
from hypothesis import given
from hypothesis import strategies as st

from bridge.transports.kafka.partitioner import (
    fast_partitions_for,
    murmur2,
    murmur2_same_length,
    plain_partitions_for,
)

PARTITIONERS = [fast_partitions_for, plain_partitions_for]

#: From the Java client's own tests (UtilsTest.testMurmur2), as unsigned ints.
JAVA_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]


@given(st.binary(max_size=80))
def test_murmur2_is_kafkas(data: bytes) -> None:
    assert murmur2(data) == reference(data)


@pytest.mark.parametrize("length", range(0, 41))
def test_murmur2_of_many_keys_of_one_length_is_kafkas(length: int) -> None:
    rnd = random.Random(length)
    keys = [rnd.randbytes(length) for _ in range(50)]
    assert murmur2_same_length(keys) == [reference(key) for key in keys]


@pytest.mark.parametrize(
    "hash_of",
    [murmur2, lambda key: murmur2_same_length([key])[0], reference],
    ids=["murmur2", "murmur2_same_length", "aiokafka"],
)
def test_known_values(hash_of: Callable[[bytes], int]) -> None:
    for key, expected in JAVA_VECTORS:
        assert hash_of(key) & 0xFFFFFFFF == expected & 0xFFFFFFFF, key


@pytest.mark.parametrize("partitions", [1, 3, 7, 12])
def test_partitions_match_the_default_partitioner(partitions: int) -> None:
    rnd = random.Random(partitions)
    keys: list[bytes | None] = [
        str(uuid.UUID(int=rnd.getrandbits(128))).encode() for _ in range(100)
    ]
    keys += [rnd.randbytes(rnd.randrange(0, 20)) for _ in range(30)]  # mixed lengths, small groups
    every = list(range(partitions))
    expected = [DefaultPartitioner()(key, every, every) for key in keys]
    assert fast_partitions_for(keys, every, every) == expected
    assert plain_partitions_for(keys, every, every) == expected


#: Keys of one length, enough of them for the fast partitioner's vectorised path.
SAME_LENGTH = st.integers(0, 40).flatmap(
    lambda n: st.lists(st.binary(min_size=n, max_size=n), min_size=8, max_size=40)
)


@given(st.lists(st.binary(max_size=48), max_size=20), SAME_LENGTH, st.integers(1, 64))
def test_fast_and_plain_choose_the_same_partitions(
    mixed: list[bytes], grouped: list[bytes], partitions: int
) -> None:
    keys: list[bytes | None] = [*mixed, *grouped]
    every = list(range(partitions))
    available = every[::2]
    fast = fast_partitions_for(keys, every, available)
    assert fast == plain_partitions_for(keys, every, available)
    assert fast == [every[(reference(key or b"") & 0x7FFFFFFF) % partitions] for key in keys]


def test_without_numpy_the_plain_partitioner_is_used() -> None:
    probe = (
        "import sys; sys.modules['numpy'] = None; "
        "from bridge.transports.kafka import partitioner; "
        "print(partitioner.partitions_for.__name__)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.stdout.strip() == "plain_partitions_for", result.stderr


@pytest.mark.parametrize("partitions_for", PARTITIONERS)
def test_records_without_key_go_to_an_available_partition(
    partitions_for: Callable[..., list[int]],
) -> None:
    chosen = partitions_for([None] * 200, [0, 1, 2, 3], [1, 3])
    assert set(chosen) == {1, 3}
    assert set(partitions_for([None] * 50, [0, 1], [])) <= {0, 1}
