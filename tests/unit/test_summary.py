"""The `--until-idle` summary: one line per route and a total; the workers' added up."""

from __future__ import annotations

from bridge.service.summary import RouteSummary, RunSummary
from bridge.service.workers import Workers


def test_workers_summaries_add_up_and_keep_each_routes_longest_time() -> None:
    first = RunSummary([RouteSummary("move", 700, 1, 2, 1.25), RouteSummary("other", 0)], 3.0)
    second = RunSummary([RouteSummary("move", 300, 0, 1, 2.5, failed=True)], 3.1)
    wire = RunSummary.from_json(second.to_json())  # as a worker hands it to the primary
    merged = RunSummary.merge([first, wire], ["move", "other", "idle"], 4.0)
    assert merged.describe().splitlines() == [
        "route move: 1000 forwarded, 1 expired, 3 to the error queue in 2.5 s (failed)",
        "route other: 0 forwarded, 0 expired, 0 to the error queue in 0.0 s",
        "route idle: 0 forwarded, 0 expired, 0 to the error queue in 0.0 s",
        "total: 1000 forwarded, 1 expired, 3 to the error queue; ran 4.0 s",
    ]


def test_a_worker_that_handed_in_no_summary_is_said_not_to_be_counted() -> None:
    workers = Workers(2, [], routes=["move"], http=None, until_idle=True)
    workers.workers[0].summary = RunSummary([RouteSummary("move", 10)], 1.0)
    workers.workers[1].exit_code = -9
    lines = workers.summary().describe().splitlines()
    assert lines[0].startswith("route move: 10 forwarded")
    assert lines[-1] == (
        "warning: worker 1 handed in no summary (it was killed by SIGKILL): its messages are "
        "not counted above"
    )
