"""Queue-table layouts: what a queue table holds, its statements, and rows <-> envelopes.

`base` holds the `Layout` class, the `LAYOUTS` table the connection's `layout` key is looked up
in, and the NServiceBus row mapping. `nservicebus_sqlserver` is the NServiceBus SQL Server
transport's table; `nservicebus_postgresql` the NServiceBus PostgreSQL transport's, which is
also SQLite's (SQLite has no NServiceBus transport of its own). `nginn` is NGinn.MessageBus's
table on all three databases (`nginn_sql`: its statements; `nginn_rows`: its rows <-> envelopes,
`nginn_incoming` and `nginn_outgoing` each way; `nginn_formats`: its headers, times and body).
"""
