#!/usr/bin/env node
// The Node.js example server: tailmesh.examples.v1.Echo over @grpc/grpc-js.
//
// Works (busy or asleep) for each request message's `work_us` (Echo and its
// streaming forms), answers `fail_code` as the call's status when it is set,
// and reports the time left before the call's deadline and the `traceparent`
// it carried. Serves grpc.health.v1 and server reflection (v1 and v1alpha).
// See ../README.md for the flags and the environment.
'use strict';

const path = require('path');
const { parseArgs } = require('util');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { ReflectionService } = require('@grpc/reflection');
const health = require('grpc-health-check');

const SERVICE = 'tailmesh.examples.v1.Echo';

function fail(message) {
  console.error(`server.js: ${message}`);
  process.exit(2);
}

function envInt(name, fallback) {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  if (!/^\d+$/.test(raw)) fail(`environment variable ${name}=${JSON.stringify(raw)} is not a non-negative integer`);
  return Number(raw);
}

function options() {
  let values;
  try {
    ({ values } = parseArgs({
      options: {
        host: { type: 'string' },
        port: { type: 'string' },
        'work-us': { type: 'string' },
        sleep: { type: 'boolean' },
        help: { type: 'boolean', short: 'h' },
      },
    }));
  } catch (e) {
    fail(e.message);
  }
  if (values.help) {
    console.log(`usage: node server.js [--host H] [--port P] [--work-us N] [--sleep]
  --host H     address to listen on (env HOST; default 127.0.0.1)
  --port P     port to listen on (env PORT; default 50051; 0 picks one)
  --work-us N  work per call when the request's work_us is 0 (env WORK_US)
  --sleep      sleep for the work time instead of spinning (env WORK_MODE=sleep)`);
    process.exit(0);
  }
  const int = (flag, raw) => {
    if (!/^\d+$/.test(raw)) fail(`--${flag} ${JSON.stringify(raw)} is not a non-negative integer`);
    return Number(raw);
  };
  const port = values.port !== undefined ? int('port', values.port) : envInt('PORT', 50051);
  if (port > 65535) fail(`port ${port} is out of range`);
  return {
    host: values.host ?? process.env.HOST ?? '127.0.0.1',
    port,
    workUs: values['work-us'] !== undefined ? int('work-us', values['work-us']) : envInt('WORK_US', 0),
    sleep: values.sleep ?? process.env.WORK_MODE === 'sleep',
  };
}

function nowUs() {
  return Number(process.hrtime.bigint() / 1000n);
}

function spinUntil(endUs) {
  while (nowUs() < endUs) {
    // Busy work: holds the event loop as a CPU-bound handler would.
  }
}

// Works `us` microseconds, then calls `done(workedUs)`.
function work(us, sleep, done) {
  const start = nowUs();
  const end = start + us;
  if (!sleep || us < 1000) {
    spinUntil(end);
    done(nowUs() - start);
    return;
  }
  // Timers have millisecond steps and may fire early: the rest is spun.
  setTimeout(() => {
    spinUntil(end);
    done(nowUs() - start);
  }, Math.floor(us / 1000));
}

function deadlineLeftUs(call) {
  const deadline = call.getDeadline();
  const at = deadline instanceof Date ? deadline.getTime() : Number(deadline);
  if (!Number.isFinite(at)) return -1;
  return Math.max(0, Math.round((at - Date.now()) * 1000));
}

function main() {
  const opts = options();
  const protoPath = path.join(__dirname, '..', 'echo.proto');
  // The health service's schema goes in too, so reflection lists it.
  const pkgDef = protoLoader.loadSync([protoPath, health.protoPath], {
    keepCase: true,
    longs: String,
    defaults: true,
  });
  const proto = grpc.loadPackageDefinition(pkgDef);

  // What a call saw when it came: its deadline and its `traceparent`.
  const seen = (call) => {
    const tp = call.metadata.get('traceparent');
    return {
      deadline_left_us: String(deadlineLeftUs(call)),
      traceparent: tp.length > 0 ? String(tp[0]) : '',
    };
  };

  // One request message's work, then `done(error, reply)`: its reply, or
  // its `fail_code` as the error.
  const answer = (req, saw, received, done) => {
    work(req.work_us || opts.workUs, opts.sleep, (workedUs) => {
      if (req.fail_code) {
        const valid = req.fail_code >= 1 && req.fail_code <= 16;
        const code = valid ? req.fail_code : grpc.status.INVALID_ARGUMENT;
        const details = valid
          ? `failed on request with ${grpc.status[code]}`
          : `fail_code ${req.fail_code} is not a gRPC status code (1..16)`;
        done({ code, details });
        return;
      }
      done(null, {
        message: req.message,
        server: 'node',
        ...saw,
        worked_us: Math.min(workedUs, 2 ** 32 - 1),
        received,
      });
    });
  };

  const echo = (call, callback) => answer(call.request, seen(call), 1, callback);

  // A stream's messages are worked on one after another, in order: the
  // next waits until the one before it is answered.
  const inOrder = (call, each, end) => {
    const queue = [];
    let busy = false;
    let ended = false;
    let failed = false;
    const next = () => {
      if (busy || failed) return;
      if (queue.length === 0) {
        if (ended) end();
        return;
      }
      busy = true;
      each(queue.shift(), (err) => {
        busy = false;
        if (err) {
          failed = true;
          return;
        }
        next();
      });
    };
    call.on('data', (req) => {
      queue.push(req);
      next();
    });
    call.on('end', () => {
      ended = true;
      next();
    });
  };

  const echoStream = (call) => {
    const saw = seen(call);
    let received = 0;
    inOrder(
      call,
      (req, done) => {
        received += 1;
        answer(req, saw, received, (err, reply) => {
          if (err) call.emit('error', err);
          else call.write(reply);
          done(err);
        });
      },
      () => call.end(),
    );
  };

  const echoServerStream = (call) => {
    const saw = seen(call);
    let left = Math.max(1, call.request.replies);
    const one = () => {
      answer(call.request, saw, 1, (err, reply) => {
        if (err) {
          call.emit('error', err);
          return;
        }
        call.write(reply);
        left -= 1;
        if (left > 0) one();
        else call.end();
      });
    };
    one();
  };

  const echoClientStream = (call, callback) => {
    const saw = seen(call);
    const messages = [];
    let workedUs = 0;
    inOrder(
      call,
      (req, done) => {
        answer(req, saw, 0, (err, reply) => {
          if (err) {
            callback(err);
          } else {
            messages.push(req.message);
            workedUs += reply.worked_us;
          }
          done(err);
        });
      },
      () =>
        callback(null, {
          message: messages.join(' '),
          server: 'node',
          ...saw,
          worked_us: Math.min(workedUs, 2 ** 32 - 1),
          received: messages.length,
        }),
    );
  };

  const server = new grpc.Server();
  server.addService(proto.tailmesh.examples.v1.Echo.service, {
    Echo: echo,
    EchoStream: echoStream,
    EchoServerStream: echoServerStream,
    EchoClientStream: echoClientStream,
  });
  const healthImpl = new health.HealthImplementation({ '': 'SERVING', [SERVICE]: 'SERVING' });
  healthImpl.addToServer(server);
  new ReflectionService(pkgDef).addToServer(server);

  const host = opts.host.includes(':') ? `[${opts.host}]` : opts.host;
  server.bindAsync(`${host}:${opts.port}`, grpc.ServerCredentials.createInsecure(), (err, port) => {
    if (err) fail(`cannot listen on ${host}:${opts.port}: ${err.message}`);
    console.log(`echo-node listening on ${opts.host}:${port} (default work ${opts.workUs} us, ${opts.sleep ? 'sleep' : 'busy'})`);
  });

  let stopping = false;
  const stop = () => {
    if (stopping) return;
    stopping = true;
    healthImpl.setStatus('', 'NOT_SERVING');
    healthImpl.setStatus(SERVICE, 'NOT_SERVING');
    // Calls in flight get a second to finish.
    const force = setTimeout(() => {
      server.forceShutdown();
      console.log('echo-node stopped (calls in flight cut)');
      process.exit(0);
    }, 1000);
    server.tryShutdown(() => {
      clearTimeout(force);
      console.log('echo-node stopped');
      process.exit(0);
    });
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

main();
