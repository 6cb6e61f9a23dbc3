"""The running service: routes of one process, worker processes, the HTTP server, tuning."""
