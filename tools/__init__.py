"""Programs for people running the app: `python -m tools.load` (the load generator) and
the live server it (and the tests) start."""
