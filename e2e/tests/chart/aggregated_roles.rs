//! The chart's aggregated ClusterRoles: `<fullname>-view` and `<fullname>-edit` give ebb's kinds
//! to the built-in view, edit and admin roles; on a real control plane a user bound to `view`
//! can list ScaleDownPolicies, and only what the roles say.

use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::Namespace;

use super::conventions::{object, render};
use super::*;

const AGGREGATE: &str = "rbac.authorization.k8s.io/aggregate-to-";

fn aggregates_to(role: &Value) -> BTreeSet<String> {
    role["metadata"]["labels"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, v)| k.starts_with(AGGREGATE) && **v == json!("true"))
        .map(|(k, _)| k.trim_start_matches(AGGREGATE).to_string())
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn view_and_edit_roles_aggregate_into_the_built_in_roles() {
    let docs = render(&json!({}));
    let view = object(&docs, "ClusterRole", "ebb-view");
    assert_eq!(aggregates_to(view), set(&["view", "edit", "admin"]));
    let view_rules: Vec<PolicyRule> = serde_json::from_value(view["rules"].clone()).unwrap();
    assert_eq!(
        flatten(&view_rules),
        expected(&[
            ("ebb.dev", "scaledownpolicies", "get,list,watch", ""),
            ("ebb.dev", "placementhistories", "get,list,watch", ""),
            ("ebb.dev", "nodestates", "get,list,watch", ""),
        ])
    );
    let edit = object(&docs, "ClusterRole", "ebb-edit");
    assert_eq!(aggregates_to(edit), set(&["edit", "admin"]));
    let edit_rules: Vec<PolicyRule> = serde_json::from_value(edit["rules"].clone()).unwrap();
    let writes = "create,delete,deletecollection,patch,update";
    assert_eq!(
        flatten(&edit_rules),
        expected(&[
            ("ebb.dev", "scaledownpolicies", writes, ""),
            ("ebb.dev", "placementhistories", writes, ""),
        ]),
        "no status (the controller's) and no NodeState (the agents')"
    );
    let off = render(&json!({"rbac": {"aggregatedRoles": false}}));
    assert!(
        !off.iter().any(|d| d["kind"] == "ClusterRole"
            && d["metadata"]["labels"]
                .as_object()
                .unwrap()
                .keys()
                .any(|k| k.starts_with(AGGREGATE))),
        "rbac.aggregatedRoles: false makes no aggregated role"
    );
}

/// Whether `user` may `verb` `resource` of ebb.dev (in `namespace`, when given), as the API
/// server's authorizer answers.
async fn allowed(
    c: &kube::Client,
    user: &str,
    verb: &str,
    resource: &str,
    namespace: Option<&str>,
) -> bool {
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "spec": {"user": user, "resourceAttributes": {
            "group": "ebb.dev", "resource": resource, "verb": verb, "namespace": namespace}}
    }))
    .unwrap();
    let answer = Api::<SubjectAccessReview>::all(c.clone())
        .create(&Default::default(), &review)
        .await
        .unwrap();
    answer.status.is_some_and(|s| s.allowed)
}

/// On a real control plane (its ClusterRole aggregation controller and RBAC authorizer): the
/// chart's roles applied, a user bound to the built-in `view` can list ScaleDownPolicies but not
/// write them; one bound to `edit` in a namespace writes PlacementHistories there only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_bound_to_view_can_list_scaledownpolicies_on_a_real_control_plane() {
    require_helm("a_user_bound_to_view_can_list_scaledownpolicies_on_a_real_control_plane");
    let env = TestEnv::start_on(Backend::Real, SimConfig::api_only(), 0)
        .await
        .unwrap();
    let c = env.client.clone();
    let docs = render(&json!({}));
    for name in ["ebb-view", "ebb-edit"] {
        let role: ClusterRole =
            serde_json::from_value(object(&docs, "ClusterRole", name).clone()).unwrap();
        Api::<ClusterRole>::all(c.clone())
            .create(&Default::default(), &role)
            .await
            .unwrap();
    }
    for ns in ["team-a", "team-b"] {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        Api::<Namespace>::all(c.clone())
            .create(&Default::default(), &ns)
            .await
            .unwrap();
    }
    let viewer: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "viewer-jane"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "jane"}],
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(c.clone())
        .create(&Default::default(), &viewer)
        .await
        .unwrap();
    let editor: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "editor-sam", "namespace": "team-a"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "sam"}],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(c.clone(), "team-a")
        .create(&Default::default(), &editor)
        .await
        .unwrap();

    // The aggregation controller copies the rules into view and edit within seconds.
    wait_for(
        "jane may list ScaleDownPolicies through view",
        Duration::from_secs(30),
        || async {
            allowed(&c, "jane", "list", "scaledownpolicies", None)
                .await
                .then_some(())
        },
    )
    .await
    .unwrap();
    wait_for(
        "sam may create PlacementHistories in team-a through edit",
        Duration::from_secs(30),
        || async {
            allowed(&c, "sam", "create", "placementhistories", Some("team-a"))
                .await
                .then_some(())
        },
    )
    .await
    .unwrap();
    assert!(allowed(&c, "jane", "watch", "nodestates", None).await);
    assert!(allowed(&c, "jane", "get", "placementhistories", Some("team-b")).await);
    assert!(
        !allowed(&c, "jane", "create", "scaledownpolicies", None).await,
        "view writes nothing"
    );
    assert!(!allowed(&c, "jane", "delete", "placementhistories", Some("team-a")).await);
    assert!(
        !allowed(&c, "sam", "create", "placementhistories", Some("team-b")).await,
        "edit in team-a only"
    );
    assert!(
        !allowed(&c, "sam", "create", "scaledownpolicies", None).await,
        "a namespaced edit binding grants no cluster-scoped policy"
    );
    assert!(
        !allowed(&c, "nobody", "list", "scaledownpolicies", None).await,
        "an unbound user gets nothing"
    );
}
