"""SQL dialects: one module per database (`sqlite`, `postgresql`, `sqlserver`), the `Dialect`
abstractions in `base`, and `tsql`, the text of every SQL Server statement.

`bridge.transports.sql.transport.DIALECTS` picks one by the connection's `type`. A dialect
imports its driver only when it connects (sqlite3 is the standard library's).
"""
