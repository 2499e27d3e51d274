//! Integration tests of the ground: the real control plane, scheduling onto TestNodes and
//! the local registry, all against the shared environment (one per test binary or CI run).

mod control_plane;
mod registry;
mod scheduling;
