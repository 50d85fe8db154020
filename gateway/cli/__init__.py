"""The `gateway` command (`main.py`), its credential commands (`credentials.py`) and the
embedded development servers of `gateway serve --embedded` (`embedded.py`)."""
