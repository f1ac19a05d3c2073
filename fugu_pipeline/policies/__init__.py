"""One package per kind of router, each whole (what it fits, how it routes, how it is evaluated and
entered in the contest), and the registry that composes them (`registry.py`)."""
