"""The trace: the event vocabulary (events.py), the file format (tracelog.py) and its deflate dictionary."""
