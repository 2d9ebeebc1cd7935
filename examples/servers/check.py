#!/usr/bin/env python3
"""Checks the example servers with a Python gRPC client.

For each implementation: starts it on a free 127.0.0.1 port, waits for
grpc.health.v1 SERVING (with a deadline), then checks the echo, the work
time, a failure on request, the deadline it reports, the `traceparent` it
echoes, the streaming echoes, server reflection, and that SIGTERM stops
it. The Python server is
also checked to export its span under the incoming trace to an OTLP
collector this script runs, and to flush it on SIGTERM. Prints one line per
check and a closing "N passed, N failed"; exits 1 on any failure.

Run with the virtualenv setup.sh makes:
    examples/servers/.venv/bin/python examples/servers/check.py --all
"""

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
echo_pb2, echo_pb2_grpc = grpc.protos_and_services("echo.proto")

SERVICE = "tailmesh.examples.v1.Echo"
IMPLS = ("python", "node", "cpp")
# How long a server gets to become healthy, and to exit after SIGTERM.
START_DEADLINE_S = 60.0
# The servers' default work time (WORK_US), checked on a call that asks none.
DEFAULT_WORK_US = 1000
STOP_DEADLINE_S = 15.0
# A W3C trace context whose ids the Python server's span must carry on.
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"


def command(impl, port):
    if impl == "python":
        return [sys.executable, os.path.join(HERE, "python", "server.py"), "--port", str(port)]
    if impl == "node":
        return ["node", os.path.join(HERE, "node", "server.js"), "--port", str(port)]
    return [os.path.join(HERE, "cpp", "build", "echo-server"), "--port", str(port)]


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Results:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.skipped = 0

    def skip(self, impl, why):
        self.skipped += 1
        print(f"skip {impl:6} {why}", flush=True)

    def check(self, impl, name, ok, detail):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        print(f"{'ok  ' if ok else 'FAIL'} {impl:6} {name}: {detail}", flush=True)
        return ok


class Collector:
    """A minimal OTLP/gRPC trace collector that keeps the spans it receives."""

    def __init__(self):
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

        self.spans = []  # (service.name, span)
        self.cond = threading.Condition()
        outer = self

        class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):
                with outer.cond:
                    for rs in request.resource_spans:
                        name = next((a.value.string_value for a in rs.resource.attributes
                                     if a.key == "service.name"), "")
                        for ss in rs.scope_spans:
                            for span in ss.spans:
                                outer.spans.append((name, span))
                    outer.cond.notify_all()
                return trace_service_pb2.ExportTraceServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def wait_for(self, trace_id_hex, deadline_s):
        """The spans of one trace, waiting until one arrives or the deadline passes."""
        end = time.monotonic() + deadline_s
        with self.cond:
            while True:
                found = [(n, s) for n, s in self.spans if s.trace_id.hex() == trace_id_hex]
                left = end - time.monotonic()
                if found or left <= 0:
                    return found
                self.cond.wait(left)

    def stop(self):
        self.server.stop(0).wait()


class Server:
    def __init__(self, impl, env_extra=None):
        self.impl = impl
        self.port = free_port()
        env = dict(os.environ)
        for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_BSP_SCHEDULE_DELAY", "WORK_US", "WORK_MODE"):
            env.pop(k, None)
        # Every call without its own work_us works this long (the server's
        # default, from the environment).
        env["WORK_US"] = str(DEFAULT_WORK_US)
        env.update(env_extra or {})
        self.log = tempfile.TemporaryFile(mode="w+")
        cmd = command(impl, self.port)
        # Raises OSError when the program is missing; check_impl reports it.
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.echo = echo_pb2_grpc.EchoStub(self.channel)

    def output(self):
        self.log.seek(0)
        return self.log.read().strip()

    def wait_serving(self):
        """Polls grpc.health.v1 until SERVING; an error string if it never is."""
        stub = health_pb2_grpc.HealthStub(self.channel)
        end = time.monotonic() + START_DEADLINE_S
        last = "no answer"
        while time.monotonic() < end:
            code = self.proc.poll()
            if code is not None:
                return f"exited with {code} before it served: {self.output()}"
            try:
                # wait_for_ready: the call waits (up to its timeout) for the
                # server to accept connections rather than failing at once.
                r = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0,
                               wait_for_ready=True)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return None
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
                threading.Event().wait(0.05)
            except grpc.RpcError as e:
                last = f"{e.code().name}: {e.details()}"
        return f"not SERVING after {START_DEADLINE_S:.0f} s (last: {last})"

    def stop(self):
        """SIGTERM; the exit code, or None if it did not exit in time (then killed)."""
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None


def list_services(channel, version):
    """Service names through reflection `version` (v1 or v1alpha)."""
    # v1 and v1alpha have the same messages; only the service's package differs.
    call = channel.stream_stream(
        f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
    req = reflection_pb2.ServerReflectionRequest(list_services="")
    names = []
    for resp in call(iter([req]), timeout=5.0):
        if resp.HasField("error_response"):
            raise RuntimeError(resp.error_response.error_message)
        names.extend(s.name for s in resp.list_services_response.service)
    return names


def file_for_symbol(channel):
    """The descriptor of the file defining the Echo service (v1alpha)."""
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    req = reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE)
    for resp in stub.ServerReflectionInfo(iter([req]), timeout=5.0):
        if resp.HasField("error_response"):
            raise RuntimeError(resp.error_response.error_message)
        from google.protobuf import descriptor_pb2
        files = [descriptor_pb2.FileDescriptorProto.FromString(b)
                 for b in resp.file_descriptor_response.file_descriptor_proto]
        return files
    return []


def missing(impl):
    """Why `impl` cannot be started here (setup.sh not run, no toolchain); None if it can."""
    if impl == "cpp" and not os.path.exists(command(impl, 0)[0]):
        return "cpp/build/echo-server is missing (setup.sh builds it)"
    if impl == "node":
        if shutil.which("node") is None:
            return "no `node` command (setup.sh installs Node.js as root)"
        if not os.path.isdir(os.path.join(HERE, "node", "node_modules")):
            return "node/node_modules is missing (setup.sh runs npm ci)"
    return None


def check_impl(impl, res, skip_missing):
    why = missing(impl)
    if why is not None:
        if skip_missing:
            res.skip(impl, why)
        else:
            res.check(impl, "start", False, why)
        return
    collector = Collector() if impl == "python" else None
    env = {}
    if collector is not None:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.port}",
               "OTEL_SERVICE_NAME": "echo-python-check"}
    try:
        server = Server(impl, env)
    except OSError as e:
        res.check(impl, "start", False, f"{' '.join(command(impl, 0)[:2])}: {e}")
        if collector is not None:
            collector.stop()
        return
    try:
        t0 = time.monotonic()
        err = server.wait_serving()
        if not res.check(impl, "health SERVING", err is None,
                         err or f"after {time.monotonic() - t0:.2f} s on port {server.port}"):
            return
        checks(impl, server, res)
        if collector is not None:
            spans = collector.wait_for(TRACE_ID, 10.0)
            ok = any(n == "echo-python-check" and s.parent_span_id.hex() == PARENT_SPAN_ID
                     for n, s in spans)
            res.check(impl, "OTLP span under the incoming traceparent", ok,
                      f"{len(spans)} span(s) of trace {TRACE_ID[:8]}..: "
                      + ", ".join(f"{n}/{s.name} parent {s.parent_span_id.hex()}" for n, s in spans))
    finally:
        code = server.stop()
        res.check(impl, "SIGTERM stops it", code == 0,
                  "exited 0" if code == 0 else
                  (f"exit code {code}" if code is not None else
                   f"still running {STOP_DEADLINE_S:.0f} s after SIGTERM (killed)")
                  + ("" if code == 0 else f"; output: {server.output()}"))
        if collector is not None:
            collector.stop()
    if impl == "python":
        check_flush_on_sigterm(res)


def checks(impl, server, res):
    echo = server.echo
    try:
        r = health_pb2_grpc.HealthStub(server.channel).Check(
            health_pb2.HealthCheckRequest(service=SERVICE), timeout=5.0)
        res.check(impl, f"health of {SERVICE}", r.status == health_pb2.HealthCheckResponse.SERVING,
                  health_pb2.HealthCheckResponse.ServingStatus.Name(r.status))
    except grpc.RpcError as e:
        res.check(impl, f"health of {SERVICE}", False, f"{e.code().name}: {e.details()}")
    try:
        r = echo.Echo(echo_pb2.EchoRequest(message="hello", payload=b"x" * 100), timeout=10.0)
        res.check(impl, "echo", r.message == "hello" and r.server == impl,
                  f"message {r.message!r}, server {r.server!r}")
        res.check(impl, "default work (WORK_US)", r.worked_us >= DEFAULT_WORK_US,
                  f"WORK_US={DEFAULT_WORK_US}, worked {r.worked_us} us")
    except grpc.RpcError as e:
        res.check(impl, "echo", False, f"{e.code().name}: {e.details()}")

    for work_us in (20_000,):
        try:
            r = echo.Echo(echo_pb2.EchoRequest(message="w", work_us=work_us), timeout=10.0)
            res.check(impl, "work_us honored", r.worked_us >= work_us,
                      f"asked {work_us} us, worked {r.worked_us} us")
        except grpc.RpcError as e:
            res.check(impl, "work_us honored", False, f"{e.code().name}: {e.details()}")

    for code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
        try:
            echo.Echo(echo_pb2.EchoRequest(message="f", fail_code=code.value[0]), timeout=10.0)
            res.check(impl, f"fail_code {code.value[0]}", False, "answered OK")
        except grpc.RpcError as e:
            res.check(impl, f"fail_code {code.value[0]}", e.code() == code,
                      f"status {e.code().name} ({e.details()})")

    timeout_s = 5.0
    try:
        r = echo.Echo(echo_pb2.EchoRequest(message="d"), timeout=timeout_s)
        left = r.deadline_left_us
        # grpc-core writes the grpc-timeout header rounded up (a 5 s timeout
        # goes out as about 5.01 s): the bound is the client's timeout plus 1 %.
        bound = timeout_s * 1e6 * 1.01
        res.check(impl, "deadline_left_us", 0 < left <= bound,
                  f"{left} us left of a {timeout_s * 1e6:.0f} us timeout "
                  f"(at most {bound:.0f} us on the wire)")
    except grpc.RpcError as e:
        res.check(impl, "deadline_left_us", False, f"{e.code().name}: {e.details()}")
    # A call without a deadline; the check still waits for it only so long.
    fut = echo.Echo.future(echo_pb2.EchoRequest(message="n"))
    try:
        r = fut.result(timeout=10.0)
        res.check(impl, "no deadline: deadline_left_us -1", r.deadline_left_us == -1,
                  f"{r.deadline_left_us}")
    except grpc.FutureTimeoutError:
        fut.cancel()
        res.check(impl, "no deadline: deadline_left_us -1", False, "no answer in 10 s")
    except grpc.RpcError as e:
        res.check(impl, "no deadline: deadline_left_us -1", False, f"{e.code().name}: {e.details()}")

    try:
        r = echo.Echo(echo_pb2.EchoRequest(message="t"), timeout=10.0,
                      metadata=(("traceparent", TRACEPARENT),))
        res.check(impl, "traceparent echoed", r.traceparent == TRACEPARENT, repr(r.traceparent))
    except grpc.RpcError as e:
        res.check(impl, "traceparent echoed", False, f"{e.code().name}: {e.details()}")

    check_streams(impl, echo, res)

    try:
        names = list_services(server.channel, "v1alpha")
        files = file_for_symbol(server.channel)
        svc = [f"{f.package}.{s.name}" for f in files for s in f.service]
        res.check(impl, "reflection v1alpha", SERVICE in names and SERVICE in svc,
                  f"services {sorted(names)}; {SERVICE} defined in {[f.name for f in files]}")
    except (grpc.RpcError, RuntimeError) as e:
        res.check(impl, "reflection v1alpha", False, str(e))
    try:
        names = list_services(server.channel, "v1")
        res.check(impl, "reflection v1", SERVICE in names, f"services {sorted(names)}")
    except RuntimeError as e:
        res.check(impl, "reflection v1", False, str(e))
    except grpc.RpcError as e:
        if impl == "node":
            res.check(impl, "reflection v1", False, f"{e.code().name}: {e.details()}")
        else:
            # grpcio and Debian's C++ gRPC 1.51 serve v1alpha only.
            print(f"--   {impl:6} reflection v1: not served ({e.code().name}), v1alpha only",
                  flush=True)


def check_streams(impl, echo, res):
    """The streaming echoes: each request message answered in order with
    its work, a server stream's `replies`, a client stream's one reply,
    and a message's `fail_code` ending the stream with its status."""
    md = (("traceparent", TRACEPARENT),)
    try:
        sent = [echo_pb2.EchoRequest(message=m, work_us=2000) for m in ("a", "b", "c")]
        got = list(echo.EchoStream(iter(sent), timeout=10.0, metadata=md))
        seen = [(r.message, r.received) for r in got]
        res.check(impl, "EchoStream answers each message in order",
                  seen == [("a", 1), ("b", 2), ("c", 3)]
                  and all(r.worked_us >= 2000 and r.traceparent == TRACEPARENT for r in got),
                  f"{seen}, worked {[r.worked_us for r in got]} us")
    except grpc.RpcError as e:
        res.check(impl, "EchoStream answers each message in order", False,
                  f"{e.code().name}: {e.details()}")
    try:
        got = list(echo.EchoServerStream(echo_pb2.EchoRequest(message="s", replies=3),
                                         timeout=10.0))
        res.check(impl, "EchoServerStream sends `replies` replies",
                  [r.message for r in got] == ["s"] * 3, f"{len(got)} replies")
    except grpc.RpcError as e:
        res.check(impl, "EchoServerStream sends `replies` replies", False,
                  f"{e.code().name}: {e.details()}")
    try:
        r = echo.EchoClientStream(iter([echo_pb2.EchoRequest(message=m) for m in ("p", "q")]),
                                  timeout=10.0)
        res.check(impl, "EchoClientStream answers once", r.message == "p q" and r.received == 2,
                  f"message {r.message!r}, received {r.received}")
    except grpc.RpcError as e:
        res.check(impl, "EchoClientStream answers once", False, f"{e.code().name}: {e.details()}")
    got = []
    try:
        failing = [echo_pb2.EchoRequest(message="a"),
                   echo_pb2.EchoRequest(message="b", fail_code=grpc.StatusCode.NOT_FOUND.value[0])]
        for r in echo.EchoStream(iter(failing), timeout=10.0):
            got.append(r.message)
        res.check(impl, "EchoStream fail_code ends the stream", False, f"answered OK: {got}")
    except grpc.RpcError as e:
        res.check(impl, "EchoStream fail_code ends the stream",
                  e.code() == grpc.StatusCode.NOT_FOUND and got == ["a"],
                  f"status {e.code().name} after replies {got}")


def check_flush_on_sigterm(res):
    """With a one-minute export delay, the span reaches the collector only
    through the flush on SIGTERM."""
    impl = "python"
    collector = Collector()
    server = Server(impl, {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.port}",
                           "OTEL_BSP_SCHEDULE_DELAY": "60000"})
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    try:
        err = server.wait_serving()
        if err is not None:
            res.check(impl, "spans flushed on SIGTERM", False, err)
            return
        server.echo.Echo(echo_pb2.EchoRequest(message="flush"), timeout=10.0,
                         metadata=(("traceparent", f"00-{trace_id}-b7ad6b7169203331-01"),))
    except grpc.RpcError as e:
        res.check(impl, "spans flushed on SIGTERM", False, f"{e.code().name}: {e.details()}")
        return
    finally:
        code = server.stop()
    spans = collector.wait_for(trace_id, 5.0)
    collector.stop()
    res.check(impl, "spans flushed on SIGTERM", code == 0 and len(spans) == 1,
              f"exit code {code}; {len(spans)} span(s) of the last call "
              f"(service.name {spans[0][0] if spans else '-'})")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--all", action="store_true", help="check the three implementations")
    g.add_argument("--impl", choices=IMPLS, action="append", help="check one (repeatable)")
    p.add_argument("--skip-missing", action="store_true",
                   help="skip (not fail) an implementation that is not built or whose toolchain is absent")
    args = p.parse_args()
    impls = IMPLS if args.all else args.impl
    res = Results()
    for impl in impls:
        check_impl(impl, res, args.skip_missing)
    skipped = f", {res.skipped} skipped" if res.skipped else ""
    print(f"{res.passed} passed, {res.failed} failed{skipped}", flush=True)
    sys.exit(1 if res.failed else 0)


if __name__ == "__main__":
    main()
