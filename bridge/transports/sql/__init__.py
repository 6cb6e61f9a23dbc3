"""SQL queue tables: SQL Server (pyodbc), PostgreSQL (psycopg 3) and SQLite (sqlite3).

Layout and dialect are kept apart. `layout` says what a queue table holds and how a row maps
to an envelope (the NServiceBus layout, wire-format §1-§5); `dialect` is the database flavour
(driver, quoting, parameter style, error translation) that renders the layout's statements.
`queue` is the transport itself, shared by every dialect; `connection` drives one database
connection from its own thread. `sqlite`, `postgresql` and `sqlserver` each export the
`Transport` that `bridge.transports.load` builds; `tsql` holds every SQL Server statement.

Nothing is imported here, so loading SQLite never imports psycopg or pyodbc.
"""

__all__: list[str] = []
