//! The `ebb-controller` command line: its flags (`args`) and one module per subcommand
//! (`run` the controller, `plan` the offline what-if, `crds` the CRD YAML).

pub mod args;
pub mod crds;
pub mod plan;
pub mod run;

pub use args::*;
