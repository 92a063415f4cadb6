//! `docs/reference.md` is generated from the CRD schemas; this fails when it is stale and checks
//! that the reference shows fields, defaults and rules a user looks up.

fn path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/reference.md")
}

#[test]
fn reference_is_up_to_date() {
    let want = ebb_api::reference::markdown();
    if std::env::var_os("EBB_UPDATE_REFERENCE").is_some() {
        std::fs::create_dir_all(path().parent().unwrap()).unwrap();
        std::fs::write(path(), &want).unwrap();
        return;
    }
    let have = std::fs::read_to_string(path()).unwrap_or_default();
    assert!(
        have == want,
        "docs/reference.md is stale: regenerate with `EBB_UPDATE_REFERENCE=1 cargo test -p ebb-api --test reference`"
    );
}

/// Rows known from the types' documentation and defaults (not from the generator).
#[test]
fn reference_lists_known_fields_with_their_defaults() {
    let md = ebb_api::reference::markdown();
    for row in [
        "| `spec.mode` | string (one of `DryRun`, `Drain`, `DrainAndDelete`) | `DryRun` |",
        "| `spec.maxScaleDownParallelism` | integer (1 to 10000) | `10` |",
        "| `spec.evictionRetryInterval` | duration | `10s` |",
        "| `spec.budgets[].nodes` |",
        "| `spec.roles[].escalationTimeout` | duration | `30s` |",
        "| `spec.roleLabel` |",
        "| `status.removedTotal` |",
    ] {
        assert!(md.contains(row), "missing row starting {row:?}");
    }
    for heading in [
        "## ScaleDownPolicy",
        "### ScaleDownPolicy `spec`",
        "### ScaleDownPolicy `status`",
        "## PlacementHistory",
        "## NodeState",
    ] {
        assert!(
            md.lines().any(|l| l == heading),
            "missing heading {heading:?}"
        );
    }
    assert!(md.contains("- `spec.roles`: role names must be unique"));
    // ScaleDownPolicy comes first, NodeState last.
    let sdp = md.find("## ScaleDownPolicy").unwrap();
    let nst = md.find("## NodeState").unwrap();
    assert!(sdp < nst);
}

/// docs/troubleshooting.md says what to do about every reason a user can see: each one has a
/// table row of its own.
#[test]
fn troubleshooting_covers_every_reason() {
    let section = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/troubleshooting.md"),
    )
    .expect("docs/troubleshooting.md is readable");
    assert!(
        section.starts_with("# Troubleshooting\n"),
        "docs/troubleshooting.md starts with its title"
    );
    let mut missing = vec![];
    let names = ebb_api::reasons::UnremovableReason::ALL
        .iter()
        .map(|r| r.as_str())
        .chain(
            ebb_api::reasons::BlockingPodReason::ALL
                .iter()
                .map(|r| r.as_str()),
        )
        .chain(
            ebb_api::reasons::DegradedReason::ALL
                .iter()
                .map(|r| r.as_str()),
        )
        .chain(
            ebb_api::reasons::ThrottledReason::ALL
                .iter()
                .map(|r| r.as_str()),
        );
    for name in names {
        if !section.contains(&format!("| `{name}` |")) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "docs/troubleshooting.md lacks a row for {missing:?}"
    );
}
