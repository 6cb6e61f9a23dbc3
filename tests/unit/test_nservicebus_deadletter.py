"""The failure headers of every error copy the bridge writes (bridge/nservicebus/deadletter.py)
and the host id in them (bridge/nservicebus/host.py), against NServiceBus and ServiceControl.

Sources read: CORE = Particular/NServiceBus@1d53488 (src/NServiceBus.Core/), SC =
Particular/ServiceControl@2ebb08a.
"""

from __future__ import annotations

import hashlib
import re
import socket
import uuid
from pathlib import Path

import bridge
from bridge.envelope import Envelope, Headers
from bridge.nservicebus.deadletter import error_copy, failure_headers
from bridge.nservicebus.host import host_id, make_host_id

N_FORMAT = re.compile(r"[0-9a-f]{32}")


def test_the_failure_headers_are_the_ones_nservicebus_recoverability_writes() -> None:
    # CORE Recoverability/RecoverabilityComponent.cs:150-156: the static fault metadata is
    # ProcessingMachine, ProcessingEndpoint, $.diagnostics.hostid (HostId.ToString("N")) and
    # $.diagnostics.hostdisplayname; Recoverability/Faults/FaultMetadataExtractor.cs:15-46 adds
    # FailedQ, ExceptionType, Message, Source, StackTrace and TimeOfFailure.
    headers = dict(failure_headers(ValueError("bad"), "Sales@[dbo]@[shop]"))
    assert set(headers) == {
        "NServiceBus.FailedQ",
        "NServiceBus.ExceptionInfo.ExceptionType",
        "NServiceBus.ExceptionInfo.Message",
        "NServiceBus.ExceptionInfo.Source",
        "NServiceBus.ExceptionInfo.StackTrace",
        "NServiceBus.TimeOfFailure",
        "NServiceBus.ProcessingEndpoint",
        "NServiceBus.ProcessingMachine",
        "$.diagnostics.hostid",
        "$.diagnostics.hostdisplayname",
    }
    assert headers["NServiceBus.FailedQ"] == "Sales@[dbo]@[shop]"
    assert headers["NServiceBus.ProcessingEndpoint"] == "bridge"
    # CORE Support/RuntimeEnvironment.cs:14 (Environment.MachineName) for ProcessingMachine;
    # the display name defaults to it (Hosting/HostingComponent.Settings.cs:24).
    assert headers["NServiceBus.ProcessingMachine"] == socket.gethostname()
    assert headers["$.diagnostics.hostdisplayname"] == socket.gethostname()
    assert headers["$.diagnostics.hostid"] == host_id()


def test_servicecontrol_records_the_bridge_instance_with_a_host_id() -> None:
    # SC src/ServiceControl/Operations/EndpointDetailsParser.cs:40-53: the receiving endpoint is
    # Name = ProcessingEndpoint, Host = hostdisplayname (else ProcessingMachine), HostId =
    # Guid.TryParse(hostid) or Guid.Empty; Monitoring/DetectNewEndpointsFromErrorImportsEnricher.cs
    # :37-43 ignores an instance whose HostId is empty.
    headers = dict(failure_headers("refused", "Sales"))
    name = headers.get("NServiceBus.ProcessingEndpoint", "")
    host = headers.get("$.diagnostics.hostdisplayname") or headers.get(
        "NServiceBus.ProcessingMachine", ""
    )
    hostid = headers.get("$.diagnostics.hostid", "")
    assert name == "bridge" and host
    assert N_FORMAT.fullmatch(hostid)  # what Guid.TryParse reads in the "N" format
    assert uuid.UUID(hostid) != uuid.UUID(int=0)


def test_the_host_id_is_nservicebus_legacy_deterministic_guid_of_install_path_and_host() -> None:
    # CORE Hosting/HostingComponent.Settings.cs:126 GenerateHostId(path to the program, machine
    # name); :137-146 and AppContextSwitches.cs:29-43: the legacy algorithm unless a switch is
    # set; Utils/LegacyDeterminsticGuid.cs:28-51: MD5 over the UTF-8 of both joined, then
    # new Guid(hash), whose first three fields are little-endian; "N" = 32 hex digits.
    md5 = hashlib.md5(b"/opt/bridge" + "hôst-1".encode(), usedforsecurity=False).digest()
    dotnet_order = md5[3::-1] + md5[5:3:-1] + md5[7:5:-1] + md5[8:]
    assert make_host_id("/opt/bridge", "hôst-1") == dotnet_order.hex()

    installed = str(Path(bridge.__file__).resolve().parent)
    assert host_id() == make_host_id(installed, socket.gethostname())
    assert make_host_id(installed, "other-host") != host_id()


def test_error_copies_carry_the_host_too() -> None:
    original = Envelope(Headers([("NServiceBus.MessageId", "m-1")]), b"body")
    copy = error_copy(original, RuntimeError("no"), "Sales")
    assert copy.headers.get("$.diagnostics.hostid") == host_id()
    assert copy.headers.get("$.diagnostics.hostdisplayname") == socket.gethostname()
    assert copy.headers.get("NServiceBus.MessageId") == "m-1"


def test_an_error_copy_that_fails_again_keeps_its_own_failure_headers() -> None:
    """The Messaging Bridge writes its own failures under NServiceBus.MessagingBridge.*
    (RawEndpointErrorHandlingPolicy.cs:30-31, BridgeHeaders.cs:1-13 of
    Particular/NServiceBus.MessagingBridge@ef463cf); an error copy on its way to ServiceControl
    that the bridge cannot forward keeps the failed queue and exception it was sent with."""
    from bridge.envelope import Envelope, Headers
    from bridge.nservicebus.deadletter import error_copy

    original = [
        ("NServiceBus.MessageId", "m1"),
        ("NServiceBus.FailedQ", "Billing"),
        ("NServiceBus.ExceptionInfo.Message", "the endpoint's own failure"),
        ("NServiceBus.TimeOfFailure", "2026-01-01 00:00:00:000000 Z"),
    ]
    copy = error_copy(Envelope(Headers(original), b"{}"), ValueError("cannot translate"), "error")
    headers = copy.headers.to_dict()
    assert {k: headers[k] for k, _ in original} == dict(original)
    assert headers["NServiceBus.MessagingBridge.FailedQ"] == "error"
    assert headers["NServiceBus.MessagingBridge.ExceptionInfo.Message"] == "cannot translate"
    assert "NServiceBus.MessagingBridge.TimeOfFailure" in headers
    plain = error_copy(Envelope(Headers(original[:1]), b"{}"), ValueError("x"), "Sales")
    assert plain.headers.get("NServiceBus.FailedQ") == "Sales"
    assert not any(k.startswith("NServiceBus.MessagingBridge.") for k, _ in plain.headers)


def test_the_error_copy_of_a_delayed_message_keeps_its_delay_request() -> None:
    """A Kafka record's `NServiceBus.Bridge.DeliverAt` is removed when it is read (it becomes
    `deliver_at`); the error copy writes it again, so that a retry to the topic (the failure
    headers removed, as ServicePulse's retry sends it) is delayed as first asked. The copy
    itself is not delayed, neither when made nor when read back from a Kafka error topic on
    its way to ServiceControl: there the header is information."""
    from bridge.transports.kafka.headers import DELIVER_AT, incoming, outgoing

    due = 1_900_000_000.123456
    asked = incoming("t", 0, 7, None, b"{}", [(DELIVER_AT, b"2030-03-17T17:46:40.123456Z")])
    assert asked.deliver_at == due and DELIVER_AT not in asked.headers
    copy = error_copy(asked, "refused", "t")
    assert copy.deliver_at is None
    record = outgoing(copy, "none", due - 100)
    read_back = incoming("bridge.error", 0, 8, None, record.value, record.headers)
    assert read_back.deliver_at is None
    assert read_back.headers.get(DELIVER_AT) == copy.headers.get(DELIVER_AT)
    failure = ("NServiceBus.FailedQ", "NServiceBus.ExceptionInfo.", "NServiceBus.TimeOfFailure")
    retry = [(n, v) for n, v in record.headers if not n.startswith(failure)]
    retried = incoming("t", 0, 9, None, record.value, retry)
    assert retried.deliver_at == due
    plain = error_copy(Envelope(Headers([("NServiceBus.MessageId", "m")]), b""), "x", "t")
    assert DELIVER_AT not in plain.headers
