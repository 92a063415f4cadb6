//! Tells the tests whether Cluster Autoscaler can be had: `ebb_ca` is set when `EBB_CA_SOURCE`
//! (checkouts to build it from) or `EBB_CA_BIN` (a built binary) is in the environment.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(ebb_ca)");
    for var in ["EBB_CA_SOURCE", "EBB_CA_APIS_SOURCE", "EBB_CA_BIN"] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    if std::env::var_os("EBB_CA_SOURCE").is_some() || std::env::var_os("EBB_CA_BIN").is_some() {
        println!("cargo::rustc-cfg=ebb_ca");
    }
}
