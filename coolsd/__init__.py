"""Command-line front end of the coolsd toolkit (``coolsd --help``)."""
__version__ = "0.1.0"
