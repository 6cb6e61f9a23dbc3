"""One route's path: the loops (runner), receive (receiver), one batch forwarded (forwarding),
header rules (rules), send with refusals (sending), states and failures (state), retry."""
