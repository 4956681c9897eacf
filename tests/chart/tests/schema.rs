//! `values.schema.json`, the chart's README.md and its CRDs are generated (from tests/chart/schema/base.json, values.yaml's
//! comments and each agent's configuration types): these tests fail when the committed files differ from what
//! the code generates. `cargo xtask schema` (which sets `KCP_KEEPER_BLESS=1`) writes them instead.

use anyhow::Result;
use chart::{chart_dir, readme, schema, template};
use serde_json::json;

fn check_or_write(file: &str, generated: &str) -> Result<()> {
    let path = chart_dir().join(file);
    if std::env::var_os("KCP_KEEPER_BLESS").is_some() {
        std::fs::write(&path, generated)?;
        return Ok(());
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let line = committed.lines().zip(generated.lines()).position(|(a, b)| a != b).map_or(0, |n| n + 1);
        panic!(
            "charts/kcp-keeper/{file} is not what the code generates (first difference near line {line}); run \
             `cargo xtask schema` and commit the result"
        );
    }
    Ok(())
}

#[test]
fn the_committed_values_schema_is_the_one_the_agents_configuration_types_generate() -> Result<()> {
    check_or_write("values.schema.json", &schema::render(&schema::generate()?))
}

#[test]
fn the_committed_crds_are_the_ones_etcd_snapshotters_object_types_generate() -> Result<()> {
    let header = "# EtcdSnapshot, EtcdShardBackup and EtcdSnapshotRequest: etcd-snapshotter's objects (`snapshotObjects`),\n\
                  # generated from its types by `cargo xtask schema`. Helm installs them before the release and never\n\
                  # deletes them.\n";
    check_or_write("crds/etcd-snapshotter.yaml", &format!("{header}{}", etcd_snapshotter::objects::crds_yaml()))
}

#[test]
fn the_committed_chart_readme_lists_every_value_with_its_default_and_description() -> Result<()> {
    let generated = readme::generate(&chart_dir(), &schema::generate()?)?;
    check_or_write("README.md", &generated)
}

#[test]
fn every_field_of_every_agents_configuration_has_a_description_in_the_schema() -> Result<()> {
    let generated = schema::generate()?;
    let defs = generated["$defs"].as_object().cloned().unwrap_or_default();
    let mut missing = Vec::new();
    for (key, _) in schema::agent_schemas() {
        schema::undescribed(
            &generated["properties"][key]["properties"]["config"],
            &defs,
            &format!("{key}.config"),
            &mut missing,
        );
    }
    assert!(missing.is_empty(), "fields without a doc comment (the schema's description): {missing:#?}");
    Ok(())
}

#[test]
fn a_switched_off_agent_may_keep_a_partial_config_and_an_enabled_one_needs_its_required_fields() {
    // etcd-snapshotter is off by default with `config: {}`; switched on, its required fields apply.
    template(&json!({}), &[]).expect("the defaults render");
    let err = template(&json!({"etcdSnapshotter": {"enabled": true, "s3Credentials": {"existingSecret": "s3"}}}), &[])
        .expect_err("an enabled etcd-snapshotter without shards or storage must fail");
    assert!(format!("{err:#}").contains("missing propert"), "{err:#}");
}
