"""One route's path: receive (receiver), header rules (rules), send and commit (runner), retry."""
