"""The version a trace header, an export and a sweep cache record as the tool that wrote them."""
__version__ = "0.1.0"
