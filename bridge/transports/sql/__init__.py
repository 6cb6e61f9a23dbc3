"""SQL queue tables: SQL Server (pyodbc), PostgreSQL (psycopg 3) and SQLite (sqlite3).

Layout and dialect are kept apart. A layout (`layout`: the base, the registry and the
NServiceBus row mapping; `nservicebus_sqlserver`, `nservicebus_postgresql`) says what a queue
table holds, writes its statements and maps rows to envelopes; the connection's `layout` key
picks it. A dialect (`dialect`; `sqlite`, `postgresql`, `sqlserver`) is the database flavour:
driver, names, error translation and the SQL primitives layouts write with. `queue` is the
transport itself, shared by every dialect; `connection` drives one database connection from its
own thread. `sqlite`, `postgresql` and `sqlserver` each export the `Transport` that
`bridge.transports.load` builds; `tsql` holds the text of every SQL Server statement.

Nothing is imported here, so loading SQLite never imports psycopg or pyodbc.
"""

__all__: list[str] = []
