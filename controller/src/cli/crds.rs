//! `ebb-controller crds`: print the CustomResourceDefinitions as one YAML stream, or write one
//! file per CRD into a directory.

use std::io::Write;

use anyhow::Context;

use super::CrdsArgs;

/// Runs the `crds` subcommand.
pub fn run(args: CrdsArgs) -> anyhow::Result<()> {
    match args.out_dir {
        None => {
            let yaml = ebb_api::crdgen::yaml_stream().context("serializing the CRDs")?;
            std::io::stdout()
                .write_all(yaml.as_bytes())
                .context("writing to stdout")?;
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for crd in ebb_api::crdgen::crds() {
                let path = dir.join(ebb_api::crdgen::file_name(&crd));
                let yaml = ebb_api::crdgen::to_yaml(&crd).context("serializing a CRD")?;
                std::fs::write(&path, yaml)
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
        }
    }
    Ok(())
}
