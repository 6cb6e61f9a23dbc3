"""Administration every transport offers (protocols.Transport): install, check, print-only
install, and what an unreachable service looks like to the runner."""

from __future__ import annotations

import pytest

from bridge.envelope import Envelope, Headers
from bridge.errors import TransportError, TransportUnavailable
from tests.conftest import unique
from tests.contract.conftest import Offline, Place, drain

pytestmark = pytest.mark.contract


def message(i: int) -> Envelope:
    return Envelope(Headers([("NServiceBus.MessageId", f"id-{i}")]), f"body-{i}".encode())


async def test_install_is_idempotent_and_check_finds_what_it_made(place: Place) -> None:
    names = [unique("sales"), unique("billing")]
    asked = [*names, names[0]]
    place.addresses.extend(names)
    first = await place.transport.install(asked)
    await place.send([message(1)], names[0])
    second = await place.transport.install(asked)
    variant = place.variant
    if variant.install_lines is not None:  # an address named twice is reported once
        assert first == [line for name in names for line in variant.install_lines(name)]
    again = variant.reinstall_lines
    assert second == (first if again is None else [x for n in names for x in again(n)])
    assert await place.transport.check(names) == []
    got, _ = await drain(place, 1, names[0])  # installing again kept what the queue held
    assert [e.message_id for e in got] == ["id-1"]


async def test_check_names_a_missing_address_and_does_not_create_it(place: Place) -> None:
    missing = unique("missing")
    place.addresses.append(missing)
    if not place.variant.check_finds_missing:
        assert await place.transport.check([place.address, missing]) == []
        return
    for _ in range(2):  # the first check created nothing
        with pytest.raises(TransportError, match=missing) as raised:
            await place.transport.check([place.address, missing])
        assert not raised.value.retriable
        assert place.address not in str(raised.value).replace(missing, "")


async def test_print_only_install_connects_to_nothing(offline: Offline) -> None:
    lines = await offline.transport.install(["sales", "sales", "billing"], print_only=True)
    expected = offline.variant.print_only_lines
    if expected is None:
        assert all(any(name in line for line in lines) for name in ("sales", "billing"))
    else:
        assert lines == [line for name in ("sales", "billing") for line in expected(name)]
    assert not (offline.tmp_path / "no").exists()  # SQLite made no directory and no file


async def test_an_unreachable_service_is_retriable(offline: Offline) -> None:
    """A server that is down may come back: retriable. A SQLite file whose directory does not
    exist will not (`Variant.offline_comes_back`): a TransportError naming the file."""
    transport = offline.transport
    sink = transport.sink("sales")
    source = transport.source("sales", group="g")
    comes_back = offline.variant.offline_comes_back
    kind = TransportUnavailable if comes_back else TransportError
    try:
        with pytest.raises(kind) as raised:
            await transport.check(["sales"])
        failures = [raised.value]
        with pytest.raises(kind) as raised:
            await sink.send([message(1)])
        failures.append(raised.value)
        with pytest.raises(kind) as raised:
            await source.receive_batch(10, 0.1)
        failures.append(raised.value)
        with pytest.raises(kind) as raised:
            await transport.peek("sales")
        failures.append(raised.value)
    finally:
        await sink.close()
        await source.close()
    for failure in failures:
        assert failure.retriable is comes_back
        if not comes_back:
            assert str(offline.tmp_path / "no" / "dir.db") in str(failure)
        assert "secret" not in str(failure)
        if offline.variant.names_connection_when_unreachable:
            assert "offline" in str(failure), failure
