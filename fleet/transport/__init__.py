"""Layer 4: the wire. The only package that imports zmq and msgpack.

A message is ``[msgpack header, *raw array frames]`` (``message``); servers bind a
ROUTER (``ServerSocket``, ``Request``), workers hold one DEALER per server (``Client``,
``request_all``, ``wait_for_servers``) and a ``Heartbeat`` that pings every server and
fails the worker's waits when one goes silent; CURVE keys (``CurveConfig``) make sockets
authenticated and encrypted. Workers among themselves form a ``WorkerGroup`` (``group``:
barrier, all_reduce, all_gather, broadcast, without servers). Environment variables:
``settings`` and docs/env.md.
"""
from fleet.transport.client import Client, Reply, request_all, wait_for_servers
from fleet.transport.curve import CurveConfig, generate_keys
from fleet.transport.group import WorkerGroup, group_from_env
from fleet.transport.heartbeat import Heartbeat
from fleet.transport.message import DTYPES, PROTOCOL_VERSION, Message, decode, encode
from fleet.transport.server import HEARTBEAT_OP, PING_OP, Request, ServerSocket, parse_endpoint, serving

__all__ = [
    "Client", "CurveConfig", "DTYPES", "HEARTBEAT_OP", "Heartbeat", "Message", "PING_OP", "PROTOCOL_VERSION",
    "Reply", "Request", "ServerSocket", "decode", "encode", "generate_keys", "parse_endpoint", "request_all",
    "serving", "wait_for_servers", "WorkerGroup", "group_from_env",
]
