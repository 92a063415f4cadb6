//! What the controller's service account may do, asked of the API server (SelfSubjectAccessReview)
//! and cached for a minute, so a policy that could not finish its work is refused up front.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

/// How long an answer is trusted (RBAC changes with a `helm upgrade`).
const TTL: Duration = Duration::from_secs(60);

/// Whether Nodes may be deleted, as last answered.
#[derive(Debug, Default)]
pub struct NodeDeletion {
    cache: Mutex<Option<(Instant, Option<bool>)>>,
}

impl NodeDeletion {
    /// `Some(allowed)` from the API server; `None` when it cannot say (the review API is not
    /// served or fails): then nothing is refused up front and a `403` shows in the drain.
    pub async fn allowed(&self, client: &kube::Client) -> Option<bool> {
        if let Ok(cache) = self.cache.lock()
            && let Some((at, answer)) = *cache
            && at.elapsed() < TTL
        {
            return answer;
        }
        let answer = match review(client).await {
            Ok(allowed) => Some(allowed),
            Err(e) => {
                tracing::debug!(error = %e, "cannot ask whether Nodes may be deleted");
                None
            }
        };
        if let Ok(mut cache) = self.cache.lock() {
            *cache = Some((Instant::now(), answer));
        }
        answer
    }
}

async fn review(client: &kube::Client) -> Result<bool, kube::Error> {
    let ask = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some("delete".into()),
                resource: Some("nodes".into()),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &ask)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}
