//! Steering replacements: which planned node a pod being created should prefer.
//! (The decision logic; the admission webhook in `crate::admission` asks it.)

/// Decides the steering of pods being created. Cheap to clone.
#[derive(Clone, Default)]
pub struct Steering {}

impl Steering {
    /// The JSON patch (RFC 6902 operations) to apply to `pod` as it is created, or `None` to
    /// leave it unchanged. Called on the admission path: must be fast (no API calls).
    pub fn admit(&self, pod: &k8s_openapi::api::core::v1::Pod) -> Option<json_patch::Patch> {
        let _ = pod;
        None
    }
}
