//! The example resources in `examples/` deserialize, and pass the schema defaults and CEL rules.

use kube::core::cel::Validator;

#[test]
fn examples_are_valid_resources() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let crds = ebb_api::crdgen::crds();
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let value: serde_json::Value =
            serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let kind = value["kind"].as_str().unwrap();
        match kind {
            "ScaleDownPolicy" => {
                drop(serde_json::from_value::<ebb_api::ScaleDownPolicy>(value.clone()).unwrap())
            }
            "PlacementHistory" => {
                drop(serde_json::from_value::<ebb_api::PlacementHistory>(value.clone()).unwrap())
            }
            other => panic!("{}: unexpected kind {other}", path.display()),
        }
        let crd = crds.iter().find(|c| c.spec.names.kind == kind).unwrap();
        let schema = serde_json::to_value(
            crd.spec.versions[0]
                .schema
                .as_ref()
                .unwrap()
                .open_api_v3_schema
                .as_ref()
                .unwrap(),
        )
        .unwrap();
        if let Err(errs) = Validator::new().validate(&schema, &value, None) {
            panic!("{}: {errs:?}", path.display());
        }
        seen += 1;
    }
    assert!(seen >= 3, "examples found: {seen}");
}
