"""Benchmarks: scripts that print tables. Nothing here asserts on time; tests never time anything.

Entry scripts (each runs as `python bench/NAME.py` or `python -m bench.NAME`):

    routes.py          every route through `bridge run`, against its raw legs and the baseline
    speedups.py        each speed-up seam on its route, on and off in turn
    kafka_hop.py       the Kafka hop alone on the local broker: send -> consumer, no route
    pg_insert.py       the PostgreSQL sink alone: executemany against the staged send
    tansu_producers.py does the local broker keep every record two producers write at once?
    migrate_vs_run.py  `bridge migrate` against `bridge run --until-idle` on one backlog
    pool.py            200 PostgreSQL routes in one process, and one busy route, before and
                       after the connection pool (on a PostgreSQL server of its own)

What they share:

    messages.py   the NServiceBus-shaped messages the bench writes, unique names
    machine.py    what the numbers were measured on, and the CPU each part of a run used
    legs/         where messages live (a SQL queue table, a Kafka topic, a RabbitMQ queue),
                  each written and read with its raw driver: one module per transport
    bridges.py    `python -m bridge run` processes and their /metrics
    baseline.py   one message per transaction, as the NServiceBus transports move them
    phases.py     a route's throughput phase and latency phase
    scenarios.py  the whole `routes.py` run: legs, baselines, routes
    report.py     the tables, and medians of saved runs
"""
