// The C++ example server: tailmesh.examples.v1.Echo over Debian's gRPC 1.51.
//
// Works (busy or asleep) for each request message's `work_us` (Echo and its
// streaming forms), answers `fail_code` as the call's status when it is set,
// and reports the time left before the call's deadline and the `traceparent`
// it carried. Serves grpc.health.v1 (the default health service) and server
// reflection (v1alpha, all 1.51 has). See ../README.md for the flags and the
// environment.

#include <grpc/support/time.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "echo.grpc.pb.h"

namespace {

constexpr const char* kService = "tailmesh.examples.v1.Echo";

using tailmesh::examples::v1::EchoReply;
using tailmesh::examples::v1::EchoRequest;

struct Options {
  std::string host = "127.0.0.1";
  int port = 50051;
  uint32_t work_us = 0;
  bool sleep = false;
};

[[noreturn]] void Fail(const std::string& message) {
  std::cerr << "echo-server: " << message << std::endl;
  std::exit(2);
}

// A non-negative integer no larger than `max`, or exit 2 naming `what`.
uint64_t ParseUint(const std::string& what, const std::string& raw, uint64_t max) {
  if (raw.empty() || raw.find_first_not_of("0123456789") != std::string::npos || raw.size() > 10) {
    Fail(what + " \"" + raw + "\" is not a non-negative integer");
  }
  uint64_t v = std::stoull(raw);
  if (v > max) Fail(what + " " + raw + " is out of range (at most " + std::to_string(max) + ")");
  return v;
}

void Usage() {
  std::cout << "usage: echo-server [--host H] [--port P] [--work-us N] [--sleep]\n"
               "  --host H     address to listen on (env HOST; default 127.0.0.1)\n"
               "  --port P     port to listen on (env PORT; default 50051; 0 picks one)\n"
               "  --work-us N  work per call when the request's work_us is 0 (env WORK_US)\n"
               "  --sleep      sleep for the work time instead of spinning (env WORK_MODE=sleep)\n";
}

Options ParseOptions(int argc, char** argv) {
  Options o;
  if (const char* v = std::getenv("HOST"); v && *v) o.host = v;
  if (const char* v = std::getenv("PORT"); v && *v) o.port = ParseUint("PORT", v, 65535);
  if (const char* v = std::getenv("WORK_US"); v && *v) o.work_us = ParseUint("WORK_US", v, UINT32_MAX);
  if (const char* v = std::getenv("WORK_MODE"); v) o.sleep = std::string(v) == "sleep";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Fail(a + " needs a value");
      return argv[++i];
    };
    if (a == "--host") {
      o.host = value();
    } else if (a == "--port") {
      o.port = ParseUint("--port", value(), 65535);
    } else if (a == "--work-us") {
      o.work_us = ParseUint("--work-us", value(), UINT32_MAX);
    } else if (a == "--sleep") {
      o.sleep = true;
    } else if (a == "--help" || a == "-h") {
      Usage();
      std::exit(0);
    } else {
      Fail("unknown argument " + a + " (see --help)");
    }
  }
  return o;
}

class EchoService final : public tailmesh::examples::v1::Echo::Service {
 public:
  EchoService(uint32_t default_work_us, bool sleep) : default_work_us_(default_work_us), sleep_(sleep) {}

  grpc::Status Echo(grpc::ServerContext* ctx, const EchoRequest* req, EchoReply* reply) override {
    return Answer(Saw(ctx), *req, 1, reply);
  }

  grpc::Status EchoStream(grpc::ServerContext* ctx,
                          grpc::ServerReaderWriter<EchoReply, EchoRequest>* stream) override {
    const Seen seen = Saw(ctx);
    EchoRequest req;
    for (uint32_t received = 1; stream->Read(&req); ++received) {
      EchoReply reply;
      if (grpc::Status status = Answer(seen, req, received, &reply); !status.ok()) return status;
      stream->Write(reply);
    }
    return grpc::Status::OK;
  }

  grpc::Status EchoServerStream(grpc::ServerContext* ctx, const EchoRequest* req,
                                grpc::ServerWriter<EchoReply>* writer) override {
    const Seen seen = Saw(ctx);
    for (uint32_t i = 0; i < std::max<uint32_t>(1, req->replies()); ++i) {
      EchoReply reply;
      if (grpc::Status status = Answer(seen, *req, 1, &reply); !status.ok()) return status;
      writer->Write(reply);
    }
    return grpc::Status::OK;
  }

  grpc::Status EchoClientStream(grpc::ServerContext* ctx, grpc::ServerReader<EchoRequest>* reader,
                                EchoReply* reply) override {
    const Seen seen = Saw(ctx);
    EchoRequest req;
    std::string message;
    uint64_t worked_us = 0;
    uint32_t received = 0;
    while (reader->Read(&req)) {
      EchoReply one;
      if (grpc::Status status = Answer(seen, req, 0, &one); !status.ok()) return status;
      message += (received++ == 0 ? "" : " ") + req.message();
      worked_us += one.worked_us();
    }
    reply->set_message(message);
    reply->set_server("cpp");
    reply->set_deadline_left_us(seen.deadline_left_us);
    reply->set_traceparent(seen.traceparent);
    reply->set_worked_us(worked_us > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(worked_us));
    reply->set_received(received);
    return grpc::Status::OK;
  }

 private:
  // What a call saw when it came.
  struct Seen {
    int64_t deadline_left_us;
    std::string traceparent;
  };

  static Seen Saw(grpc::ServerContext* ctx) {
    Seen seen{DeadlineLeftUs(ctx), ""};
    const auto& md = ctx->client_metadata();
    if (auto it = md.find("traceparent"); it != md.end()) {
      seen.traceparent.assign(it->second.data(), it->second.size());
    }
    return seen;
  }

  // One request message's work, then its reply (`received`: the messages
  // the call has received), or its `fail_code` as the status.
  grpc::Status Answer(const Seen& seen, const EchoRequest& req, uint32_t received,
                      EchoReply* reply) const {
    const uint32_t work_us = req.work_us() ? req.work_us() : default_work_us_;
    const auto start = std::chrono::steady_clock::now();
    if (work_us > 0) {
      const auto end = start + std::chrono::microseconds(work_us);
      if (sleep_) {
        std::this_thread::sleep_until(end);
      } else {
        while (std::chrono::steady_clock::now() < end) {
          // Busy work: holds a thread as a CPU-bound handler would.
        }
      }
    }
    const auto worked = std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::steady_clock::now() - start)
                            .count();

    if (req.fail_code() != 0) {
      const uint32_t code = req.fail_code();
      if (code > 16) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "fail_code " + std::to_string(code) + " is not a gRPC status code (1..16)");
      }
      return grpc::Status(static_cast<grpc::StatusCode>(code),
                          "failed on request with code " + std::to_string(code));
    }
    reply->set_message(req.message());
    reply->set_server("cpp");
    reply->set_deadline_left_us(seen.deadline_left_us);
    reply->set_traceparent(seen.traceparent);
    reply->set_worked_us(worked > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(worked));
    reply->set_received(received);
    return grpc::Status::OK;
  }

  // The time left before the call's deadline, on the monotonic clock; -1
  // when the call has none.
  static int64_t DeadlineLeftUs(grpc::ServerContext* ctx) {
    gpr_timespec raw = ctx->raw_deadline();
    if (gpr_time_cmp(raw, gpr_inf_future(raw.clock_type)) == 0) return -1;
    gpr_timespec deadline = gpr_convert_clock_type(raw, GPR_CLOCK_MONOTONIC);
    gpr_timespec left = gpr_time_sub(deadline, gpr_now(GPR_CLOCK_MONOTONIC));
    int64_t us = static_cast<int64_t>(left.tv_sec) * 1000000 + left.tv_nsec / 1000;
    return us < 0 ? 0 : us;
  }

  uint32_t default_work_us_;
  bool sleep_;
};

}  // namespace

int main(int argc, char** argv) {
  const Options opts = ParseOptions(argc, argv);

  // SIGTERM and SIGINT are taken by one thread (sigwait), which shuts the
  // server down: blocked here, before gRPC starts its threads.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  EchoService service(opts.work_us, opts.sleep);
  grpc::ServerBuilder builder;
  const std::string host = opts.host.find(':') != std::string::npos ? "[" + opts.host + "]" : opts.host;
  const std::string address = host + ":" + std::to_string(opts.port);
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) Fail("cannot listen on " + address);
  auto* health = server->GetHealthCheckService();
  if (health == nullptr) Fail("the default health service is not there");
  health->SetServingStatus(true);
  health->SetServingStatus(kService, true);

  std::cout << "echo-cpp listening on " << opts.host << ":" << port << " (default work " << opts.work_us
            << " us, " << (opts.sleep ? "sleep" : "busy") << ")" << std::endl;

  std::thread stopper([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    health->SetServingStatus(false);
    // Calls in flight get a second to finish.
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  });
  server->Wait();
  stopper.join();
  std::cout << "echo-cpp stopped" << std::endl;
  return 0;
}
