//! The behaviour of one hop as plain data: the `tailmesh-model` crate,
//! re-exported whole at its old path, so the services and the orchestrator
//! keep naming it `tailmesh_services::model`.

pub use tailmesh_model::*;
