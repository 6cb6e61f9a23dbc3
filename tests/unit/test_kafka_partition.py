"""The Kafka sink picks partitions exactly as aiokafka's default partitioner would."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given
from hypothesis import strategies as st

from bridge.transports.kafka.sink import murmur2, partition_for


@given(st.binary(max_size=300))
def test_murmur2_is_aiokafkas(data: bytes) -> None:
    assert murmur2(data) == aiokafka_murmur2(data)


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=50))
def test_a_key_goes_where_the_default_partitioner_sends_it(key: bytes, count: int) -> None:
    every = list(range(count))
    assert partition_for(key, every, every) == DefaultPartitioner()(key, every, every)


def test_no_key_goes_to_an_available_partition() -> None:
    assert {partition_for(None, [0, 1, 2], [1]) for _ in range(20)} == {1}
    assert partition_for(None, [0, 1, 2], []) in {0, 1, 2}
