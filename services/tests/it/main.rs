//! The services' integration tests on loopback, in one binary (one link
//! instead of one per file):
//!
//! - `broker`: every semantic the broker promises, through real gRPC;
//! - `chain`: a 3-hop chain: reply paths, slow flags, seeded schedules,
//!   errors and deadlines;
//! - `control`: the fault agent's API: its token and its validation;
//! - `endpoints`: a push client's endpoint health, peak-EWMA and keepalive
//!   against replicas that die, come back, are slow or black-holed;
//! - `limits`: servers at their limits: accept errors, idle connections,
//!   reflection, the `authorization` scheme;
//! - `service`: a hop whose work is a real gRPC service (a test server of
//!   echo.proto): reflection, .proto files, deadline, trace context, errors;
//! - `support`: what they share (a deadline for every wait, one polling
//!   helper, a server task).

mod broker;
mod chain;
mod control;
mod endpoints;
mod limits;
mod service;
mod support;
