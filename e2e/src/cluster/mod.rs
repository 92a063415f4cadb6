//! The simulated cluster: scheduler, kubelet, workload controllers, PDB status and pod GC,
//! run as one tokio task driven by store changes and the sim clock.

use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::api::Api;

pub fn spawn(api: Arc<Api>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let _ = api;
    })
}
