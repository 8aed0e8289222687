"""The `footnote` command line: runs the server and the workers, and calls the API."""

from footnote.cli.main import app

__all__ = ["app"]
