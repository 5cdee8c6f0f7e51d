"""The trace: the event vocabulary (events.py), the file format (tracelog.py), its deflate dictionary, and token ids that carry their encoding (encoded.py)."""
