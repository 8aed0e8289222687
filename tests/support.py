"""Helpers for tests that talk gRPC."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status


def bearer(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


def error_info(err: grpc.aio.AioRpcError | grpc.RpcError) -> error_details_pb2.ErrorInfo:
    """The ErrorInfo detail of a failed call; fails the test if there is none."""
    status = rpc_status.from_call(err)
    assert status is not None, "the error carries no google.rpc.Status"
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    raise AssertionError("the status carries no ErrorInfo")
