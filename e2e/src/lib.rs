//! ebb end-to-end: the in-memory Kubernetes API server `ebb-sim`, the harness that runs the real
//! binaries against it, and the demo.
