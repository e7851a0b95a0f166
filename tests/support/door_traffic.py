"""Transport-scale requests for the door's tests, streamed so no test builds them in memory whole.

Run as ``python -m support.door_traffic CASE HTTP GRPC`` (from tests/) it sends one of `CASES`
from its own process, as an outside client would: it builds the request, prints ``sending``,
sends it and prints the answer as one JSON line (status, error text, seconds).

``raw_post`` sends a POST over a plain socket — a declared ``Content-Length`` or chunked
transfer encoding — with the body written by a background thread from a repeated filler,
while the caller reads the answer: the time to the status line is what a client waits for
a refusal. ``bytes_tensor`` is Triton's serialized ``BYTES`` tensor for many equal entries
(4-byte little-endian length, then the bytes), built with numpy.
"""
from __future__ import annotations

import json
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass

import numpy as np

FILL_CHUNK = 1 << 20


@dataclass
class Answer:
    status: int
    body: bytes
    seconds: float   # from the first byte sent to the whole answer read
    sent: int        # body bytes the client managed to send meanwhile


def _read_answer(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"connection closed before an answer; got {data[:200]!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), None)
    while length is not None and len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, body


def raw_post(host_port: str, path: str, total: int, *, chunked: bool, prefix: bytes = b"",
             fill: bytes = b" ", headers: dict[str, str] | None = None, timeout_s: float = 120) -> Answer:
    """POST ``prefix`` then filler up to ``total`` body bytes; the answer and how long it took."""
    host, port = host_port.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    lines = [f"POST {path} HTTP/1.1", f"Host: {host_port}", "Content-Type: application/octet-stream"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    lines.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}")
    stop = threading.Event()
    sent = [0]
    filler = (fill * (FILL_CHUNK // len(fill) + 1))[:FILL_CHUNK]

    def send_body() -> None:
        try:
            piece = prefix[:FILL_CHUNK] or filler
            rest = prefix[FILL_CHUNK:]
            while sent[0] < total and not stop.is_set():
                piece = piece[: total - sent[0]]
                sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece)
                sent[0] += len(piece)
                piece, rest = (rest[:FILL_CHUNK], rest[FILL_CHUNK:]) if rest else (filler, b"")
            if chunked and not stop.is_set():
                sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the server closed the connection: the answer says why

    start = time.perf_counter()
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    sender = threading.Thread(target=send_body, daemon=True)
    sender.start()
    try:
        status, body = _read_answer(sock)
        seconds = time.perf_counter() - start
    finally:
        stop.set()
        sock.close()
        sender.join(timeout_s)
    return Answer(status, body, seconds, sent[0])


def bytes_tensor(count: int, entry: bytes = b"x") -> bytes:
    """Triton's serialized BYTES tensor of ``count`` copies of ``entry``."""
    row = np.frombuffer(len(entry).to_bytes(4, "little") + entry, dtype=np.uint8)
    return np.tile(row, count).tobytes()


PROMPT = "def add(a, b):\n    "
BIG_BODY = 400 * 10**6
TOKENS = 10**7
STOP_WORDS = 5 * 10**6


def tokens_http_header(count: int) -> bytes:
    """postprocessing's inputs as Triton's binary-tensor JSON header (TOKENS follows as binary)."""
    return json.dumps({"inputs": [
        {"name": "TOKENS", "shape": [1, count], "datatype": "INT32", "parameters": {"binary_data_size": count * 4}},
        {"name": "PREFIX_LEN", "shape": [1, 1], "datatype": "INT32", "data": [0]},
        {"name": "IS_FINAL", "shape": [1, 1], "datatype": "BOOL", "data": [True]},
        {"name": "ROUTING_STATS_IN", "shape": [1, 1], "datatype": "BYTES", "data": ["{}"]}]}).encode()


def infer_request(model: str, tensors: list[tuple[str, str, list[int], bytes]]):
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model)
    for name, datatype, shape, raw in tensors:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(raw)
    return request


def grpc_request(case: str):
    """(model, request, streaming?) of a gRPC case."""
    if case == "grpc-tokens":
        return infer_request("postprocessing", [
            ("TOKENS", "INT32", [1, TOKENS], np.ones(TOKENS, np.int32).tobytes()),
            ("PREFIX_LEN", "INT32", [1, 1], np.zeros(1, np.int32).tobytes()),
            ("IS_FINAL", "BOOL", [1, 1], np.ones(1, np.bool_).tobytes()),
            ("ROUTING_STATS_IN", "BYTES", [1, 1], bytes_tensor(1, b"{}"))]), False
    model = case.rsplit("-", 1)[1]
    first = (("text_input", "BYTES", [1, 1], bytes_tensor(1, PROMPT.encode())) if model == "tokenrouter"
             else ("INPUT_ID", "INT32", [1, 3], np.ones(3, np.int32).tobytes()))
    return infer_request(model, [first, ("stop_words", "BYTES", [1, STOP_WORDS], bytes_tensor(STOP_WORDS))]), True


def grpc_send(url: str, request, stream: bool) -> dict:
    import grpc

    with grpc.insecure_channel(url, options=[("grpc.max_send_message_length", -1)]) as channel:
        payload = request.SerializeToString()  # built before the clock starts, as a client would
        call = (channel.stream_stream if stream else channel.unary_unary)(
            f"/inference.GRPCInferenceService/{'ModelStreamInfer' if stream else 'ModelInfer'}")
        print("sending", flush=True)
        start = time.perf_counter()
        try:
            replies = call(iter([payload]), timeout=60) if stream else [call(payload, timeout=60)]
            for _ in replies:
                pass
            return {"status": "OK", "error": "", "seconds": time.perf_counter() - start}
        except grpc.RpcError as err:
            return {"status": err.code().name, "error": err.details(), "seconds": time.perf_counter() - start}


CASES = ("http-content-length", "http-chunked", "http-tokens", "grpc-tokens",
         "grpc-stop-words-tokenrouter", "grpc-stop-words-router")


def run_case(case: str, http: str, grpc_url: str) -> dict:
    if case.startswith("grpc-"):
        request, stream = grpc_request(case)
        return grpc_send(grpc_url, request, stream)
    if case == "http-tokens":
        header = tokens_http_header(TOKENS)
        args = dict(prefix=header, fill=b"\x01\x00\x00\x00",
                    headers={"Inference-Header-Content-Length": str(len(header))})
        path, total = "/v2/models/postprocessing/infer", len(header) + 4 * TOKENS
    else:
        args, path, total = {}, "/v2/models/tokenrouter/generate", BIG_BODY
    print("sending", flush=True)
    answer = raw_post(http, path, total, chunked=case == "http-chunked", **args)
    result = asdict(answer)
    body = result.pop("body")
    try:
        result["error"] = json.loads(body).get("error", "")
    except ValueError:
        result["error"] = body[:500].decode("utf-8", "replace")
    return result


if __name__ == "__main__":
    print(json.dumps(run_case(*sys.argv[1:4])), flush=True)
