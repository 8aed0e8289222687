"""The `footnote` command line: runs the server and the workers, and calls the API."""

import os

# Before anything imports gRPC, which reads this once, as it is imported: `footnote dev` and
# `footnote demo` fork the embedded stack's children beside their own gRPC calls, and gRPC's
# fork handlers sometimes aborted a child before exec (devstack/processes.py). An explicit
# setting is kept.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from footnote.cli.main import app

__all__ = ["app"]
