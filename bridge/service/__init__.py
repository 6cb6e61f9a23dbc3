"""The running service: how `bridge run` starts (launch), the routes of one process
(supervisor), worker processes (workers), the HTTP server (http), process tuning (tuning)."""
