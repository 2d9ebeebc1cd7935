#!/usr/bin/env python3
"""The Python example server: tailmesh.examples.v1.Echo over grpcio.

Works (busy or asleep) for each request message's `work_us` (Echo and its
streaming forms), answers `fail_code` as the call's status when it is set,
and reports the time left before the call's deadline and the `traceparent`
it carried. Serves grpc.health.v1 and server reflection (v1alpha, what
grpcio offers). With OTEL_EXPORTER_OTLP_ENDPOINT
set it exports one OTLP/gRPC span per call, a child of the incoming
`traceparent`. See ../README.md for the flags and the environment.
"""

import argparse
import collections
import contextlib
import os
import signal
import sys
import threading
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.dirname(HERE)
SERVICE = "tailmesh.examples.v1.Echo"
METHOD = "/tailmesh.examples.v1.Echo/Echo"

# echo.proto is compiled when the server starts (grpcio-tools), so there are
# no generated files to keep in step with it.
sys.path.insert(0, PROTO_DIR)
echo_pb2, echo_pb2_grpc = grpc.protos_and_services("echo.proto")

# Time left beyond which a call is taken to have no deadline (about 30 years).
NO_DEADLINE_S = 1e9

STATUS_BY_CODE = {s.value[0]: s for s in grpc.StatusCode}

# What a call saw when it came, and its span (None without tracing).
Seen = collections.namedtuple("Seen", "deadline_left_us traceparent span")


def env_int(name, default):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        sys.exit(f"server.py: environment variable {name}={raw!r} is not an integer")


def parse_args():
    p = argparse.ArgumentParser(description="tailmesh example Echo server (Python, grpcio)")
    p.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"),
                   help="address to listen on (env HOST; default 127.0.0.1)")
    p.add_argument("--port", type=int, default=env_int("PORT", 50051),
                   help="port to listen on (env PORT; default 50051; 0 picks one)")
    p.add_argument("--work-us", type=int, default=env_int("WORK_US", 0),
                   help="work per call when the request's work_us is 0 (env WORK_US)")
    p.add_argument("--sleep", action="store_true",
                   default=os.environ.get("WORK_MODE", "busy") == "sleep",
                   help="sleep for the work time instead of spinning (env WORK_MODE=sleep)")
    p.add_argument("--threads", type=int, default=env_int("THREADS", 16),
                   help="calls served at once (env THREADS; default 16)")
    args = p.parse_args()
    if args.work_us < 0 or args.threads < 1 or not 0 <= args.port <= 65535:
        p.error("--work-us must be >= 0, --threads >= 1, --port in 0..65535")
    return args


def busy_work(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Tracing:
    """One OTLP span per call, when OTEL_EXPORTER_OTLP_ENDPOINT is set."""

    def __init__(self):
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        name = os.environ.get("OTEL_SERVICE_NAME") or "echo-python"
        self.provider = TracerProvider(resource=Resource.create({"service.name": name}))
        delay = env_int("OTEL_BSP_SCHEDULE_DELAY", 200)
        self.provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=delay))
        self.tracer = self.provider.get_tracer("tailmesh-echo-python")
        self.propagator = TraceContextTextMapPropagator()
        self.kind = trace.SpanKind.SERVER
        self.status = trace.Status
        self.status_code = trace.StatusCode

    def span(self, traceparent, method):
        carrier = {"traceparent": traceparent} if traceparent else {}
        ctx = self.propagator.extract(carrier)
        return self.tracer.start_as_current_span(
            f"{SERVICE}/{method}", context=ctx, kind=self.kind,
            attributes={"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": method})

    def shutdown(self):
        # Flushes the spans still queued.
        self.provider.shutdown()


class Echo(echo_pb2_grpc.EchoServicer):
    def __init__(self, default_work_us, sleep, tracing):
        self.default_work_us = default_work_us
        self.sleep = sleep
        self.tracing = tracing

    def Echo(self, request, context):
        with self.call(context, "Echo") as seen:
            return self.answer(request, context, seen, 1)

    def EchoStream(self, request_iterator, context):
        with self.call(context, "EchoStream") as seen:
            for received, request in enumerate(request_iterator, start=1):
                yield self.answer(request, context, seen, received)

    def EchoServerStream(self, request, context):
        with self.call(context, "EchoServerStream") as seen:
            for _ in range(max(1, request.replies)):
                yield self.answer(request, context, seen, 1)

    def EchoClientStream(self, request_iterator, context):
        with self.call(context, "EchoClientStream") as seen:
            messages, worked_us = [], 0
            for request in request_iterator:
                worked_us += self.answer(request, context, seen, 0).worked_us
                messages.append(request.message)
            return echo_pb2.EchoReply(
                message=" ".join(messages), server="python",
                deadline_left_us=seen.deadline_left_us, traceparent=seen.traceparent,
                worked_us=min(worked_us, 2**32 - 1), received=len(messages))

    @contextlib.contextmanager
    def call(self, context, method):
        """What a call saw when it came (its deadline, its `traceparent`),
        in a span of its own when tracing."""
        left = context.time_remaining()
        # grpcio gives the time to an infinite future (not None) for a call
        # without a deadline.
        if left is None or left > NO_DEADLINE_S:
            deadline_left_us = -1
        else:
            deadline_left_us = max(0, int(left * 1e6))
        traceparent = ""
        for key, value in context.invocation_metadata():
            if key == "traceparent":
                traceparent = value
        if self.tracing is None:
            yield Seen(deadline_left_us, traceparent, None)
            return
        with self.tracing.span(traceparent, method) as span:
            yield Seen(deadline_left_us, traceparent, span)

    def answer(self, request, context, seen, received):
        """One request message's work, then its reply, or its `fail_code`."""
        span = seen.span
        work_us = request.work_us or self.default_work_us
        start = time.perf_counter()
        if work_us:
            if self.sleep:
                time.sleep(work_us / 1e6)
            else:
                busy_work(work_us / 1e6)
        worked_us = int((time.perf_counter() - start) * 1e6)
        if span is not None:
            span.set_attribute("echo.worked_us", worked_us)
        if request.fail_code:
            status = STATUS_BY_CODE.get(request.fail_code)
            if status is None or status == grpc.StatusCode.OK:
                status = grpc.StatusCode.INVALID_ARGUMENT
                detail = f"fail_code {request.fail_code} is not a gRPC status code (1..16)"
            else:
                detail = f"failed on request with {status.name}"
            if span is not None:
                span.set_attribute("rpc.grpc.status_code", status.value[0])
                span.set_status(self.tracing.status(self.tracing.status_code.ERROR, detail))
            context.abort(status, detail)
        if span is not None:
            span.set_attribute("rpc.grpc.status_code", 0)
        return echo_pb2.EchoReply(
            message=request.message, server="python", deadline_left_us=seen.deadline_left_us,
            traceparent=seen.traceparent, worked_us=min(worked_us, 2**32 - 1), received=received)


def main():
    args = parse_args()
    tracing = Tracing() if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") else None

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=args.threads))
    echo_pb2_grpc.add_EchoServicer_to_server(Echo(args.work_us, args.sleep, tracing), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (echo_pb2.DESCRIPTOR.services_by_name["Echo"].full_name,
         health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME),
        server)
    address = f"{args.host}:{args.port}"
    if ":" in args.host:
        address = f"[{args.host}]:{args.port}"
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as e:
        sys.exit(f"server.py: cannot listen on {address}: {e}")
    server.start()
    for name in ("", SERVICE):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)

    stop = threading.Event()

    def on_signal(signum, _frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    mode = "sleep" if args.sleep else "busy"
    print(f"echo-python listening on {args.host}:{port} (default work {args.work_us} us, {mode})",
          flush=True)
    while not stop.wait(3600):
        pass
    for name in ("", SERVICE):
        health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    # Calls in flight get a second to finish.
    server.stop(1.0).wait()
    if tracing is not None:
        tracing.shutdown()
    print("echo-python stopped", flush=True)


if __name__ == "__main__":
    main()
